"""Each fallback path, forced on this host, and what holds in it.

Without `--bind-fd` (an older bwrap) binds name their sources and bwrap opens them; without
Landlock scopes (a kernel before 6.12) the session runs under the other layers: in both modes a
stand-in secret stays unreadable (and is read once a plan binds it: the check can fail) and a
workspace write lands. Without pidfds (nsconfine needs pidfd_open to watch what it starts)
there is no fallback: the launch is refused with a message and leaves nothing running.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from helpers import (
    catalogue_probe,
    python_child,
    session_options,
    unchecked_launcher,
    wait_until_gone,
)

import nsconfine
from nsconfine._kernel import layers as _layers
from nsconfine._launch import stage as _stage
from nsconfine._preflight import checks as _checks
from nsconfine._selftest.report import run_probe
from nsconfine._selftest.world import World

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]

SECRET = "read ~/.ssh/id_ed25519"


def assert_still_confined(world: World) -> None:
    """In the mode the test forced: the stand-in ~/.ssh key is not read and the workspace
    write lands; the same read on a plan that binds the key gets it (the check can fail)."""
    plan = world.plan()
    for name in (SECRET, "write its workspace"):
        allowed, outcome = run_probe(plan, catalogue_probe(world, name))
        assert allowed == catalogue_probe(world, name).expect_allowed, (name, outcome)
    secret = catalogue_probe(world, SECRET)
    allowed, outcome = run_probe(secret.weaken(plan), secret, unchecked_launcher)
    assert allowed, outcome


def bwrap_options_seen(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The option vectors launches hand bwrap from now on (recorded, not changed)."""
    seen: list[list[str]] = []
    compile_options = _stage.compiled_options

    def recorded(*arguments: object, **keywords: object) -> bytes:
        encoded = compile_options(*arguments, **keywords)  # type: ignore[arg-type]
        seen.append(encoded.decode().split("\0"))
        return encoded

    monkeypatch.setattr(_stage, "compiled_options", recorded)
    return seen


def binds_by_fd(options: list[str]) -> bool:
    return "--bind-fd" in options or "--ro-bind-fd" in options


# ------------------------------------------------------------------ no --bind-fd


def test_without_bind_fd_bwrap_binds_paths_and_still_confines(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --bind-fd ignored (nsconfine._preflight.checks's test-only door), every bind names its
    source, and the session is as confined."""
    monkeypatch.setattr(_checks, "IGNORE_BIND_FD", True)
    seen = bwrap_options_seen(monkeypatch)
    assert_still_confined(world)
    assert seen
    assert not any(binds_by_fd(options) for options in seen)
    assert all("--ro-bind" in options and "--bind" in options for options in seen)


def test_by_default_bwrap_is_handed_bind_sources_by_fd(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: where bwrap takes --bind-fd, a launch hands it every bind source by fd,
    so the test above really forced the other path."""
    if not _checks.takes_bind_fds(_checks.proven_bwrap()):
        pytest.skip("this bwrap has no --bind-fd: every launch here is the fallback")
    seen = bwrap_options_seen(monkeypatch)
    assert_still_confined(world)
    assert seen
    assert all(binds_by_fd(options) for options in seen)


# ------------------------------------------------------------------ no Landlock


def test_without_landlock_sessions_are_still_confined(
    world: World, without: Callable[..., None]
) -> None:
    """With the Landlock scopes off (the test-only door in nsconfine._kernel.layers), as on a
    kernel before 6.12: the plan lists no landlock layer, a host abstract socket is reached
    (the layer is really off), and the session is otherwise as confined."""
    abstract = (
        catalogue_probe(world, "connect to a host abstract socket")
        if _layers.landlock_abi() >= _layers.LANDLOCK_SCOPES_ABI
        else None
    )
    without("landlock")
    assert "landlock" not in _layers.active(world.plan().nested_userns is not None)
    if abstract is not None:  # (on the host's network: a namespace of its own also cuts it)
        assert run_probe(abstract.weaken(world.plan()), abstract)[0]
    assert_still_confined(world)


# ------------------------------------------------------------------ no pidfd


def _no_pidfd(pid: int, flags: int = 0) -> int:
    raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))


def _descendants() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _left_running(before: set[int]) -> set[int]:
    """This process's descendants not in before that still run after up to a minute."""
    deadline = time.monotonic() + 60
    while True:
        left = set()
        for pid in _descendants() - before:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.add(pid)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_without_pidfd_a_spawn_is_refused_and_leaves_nothing(
    plan: nsconfine.Plan, ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pidfd_open failing with ENOSYS (a kernel before 5.3) refuses spawn with
    SandboxUnavailable naming pidfd_open: the command never runs and no process is left."""
    marker = ws_run[0] / "ran"
    tag = f"nsconfine-no-pidfd-{os.urandom(6).hex()}"
    before = _descendants()
    monkeypatch.setattr(os, "pidfd_open", _no_pidfd)
    with pytest.raises(nsconfine.SandboxUnavailable, match="pidfd_open"):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {marker} # {tag}"])
    monkeypatch.undo()
    assert wait_until_gone(tag) == []
    assert not marker.exists()
    assert _left_running(before) == set()


def test_without_pidfd_a_pool_is_refused_and_leaves_nothing(
    plan: nsconfine.Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Pool cannot stage without pidfds either: refused with the same message, nothing
    staged left behind."""
    before = _descendants()
    monkeypatch.setattr(os, "pidfd_open", _no_pidfd)
    refused = pytest.raises(nsconfine.SandboxUnavailable, match="pidfd_open")
    with refused, nsconfine.Pool(plan, size=1) as pool:
        pool.launch(["/bin/true"]).wait(timeout=60)
    monkeypatch.undo()
    assert _left_running(before) == set()


_RUN_WITHOUT_PIDFD = """
import errno
def no_pidfd(pid, flags=0):
    raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
os.pidfd_open = no_pidfd
from nsconfine._cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_pidfd_the_cli_says_so_in_one_line(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine run` on such a host exits 69 with one `sandbox-unavailable` line naming
    pidfd_open, and no traceback."""
    marker = ws_run[0] / "ran"
    child = python_child(
        _RUN_WITHOUT_PIDFD,
        "run", *session_options(*ws_run),
        "--", "/bin/sh", "-c", f"touch {marker}",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = child.communicate(timeout=120)
    assert child.returncode == nsconfine.SandboxUnavailable.exit_status, err
    assert err.startswith("nsconfine: sandbox-unavailable: "), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err + out
    assert "pidfd_open" in err
    assert not marker.exists()
