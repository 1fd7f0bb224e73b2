"""Real sessions on real namespaces try what they must not, and what they need.

Every probe runs twice: on the coder session's real plan, where it must come out as expected,
and on a weakened plan (a bind exposing the secret, or the needed entry removed), where it must
flip. A probe that cannot flip proves nothing, so its twin is part of the proof.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

from nsconfine import _selftest
from nsconfine._bwrap_args import (
    ARGS_FD,
    FIRST_DATA_FD,
    bwrap_command_line,
    bwrap_options,
    encode_options,
)
from nsconfine._executor import Sandbox, open_entry_fds
from nsconfine._plan import Plan
from nsconfine._preflight import proven_bwrap
from nsconfine._selftest import World, run_probe, run_script, unexplained_mounts

if TYPE_CHECKING:
    from nsconfine._executor import Stdio

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """A fresh stand-in host with its tool socket served and its secret fd leaked."""
    with World(str(tmp_path)).running() as running:
        yield running


def _probe_names() -> list[str]:
    # Names are fixed by the catalogue; a throwaway world lists them for parametrization.
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        return [probe.name for probe in World(root).probes()]


def _probe(world: World, name: str) -> _selftest.Probe:
    return next(probe for probe in world.probes() if probe.name == name)


def naive_launch(
    plan: Plan, argv: Sequence[str], *, stdout: Stdio = None, stderr: Stdio = None
) -> Sandbox:
    """bwrap on the same options, started the naive way: os.posix_spawn, every inheritable fd
    passed on, no PDEATHSIG and no --die-with-parent, no namespace check: what nsconfine's
    executor exists to avoid."""
    import nsconfine._syscalls as syscalls

    options = bwrap_options(plan)
    for option in ("--info-fd", "--block-fd"):
        at = options.index(option)
        del options[at : at + 2]
    options.remove("--die-with-parent")
    sources = [syscalls.memfd_sealed("args", encode_options(options))]
    open_entry_fds(plan, sources)
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in sources]
    targets = [ARGS_FD, *range(FIRST_DATA_FD, FIRST_DATA_FD + len(sources) - 1)]
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in zip(high, targets, strict=True)]
    for number, stream in ((1, stdout), (2, stderr)):
        if stream is not None:
            fd = stream if isinstance(stream, int) else stream.fileno()
            actions.append((os.POSIX_SPAWN_DUP2, fd, number))
    bwrap = proven_bwrap()
    pid = os.posix_spawn(bwrap, bwrap_command_line(bwrap, argv), {}, file_actions=actions)
    for fd in [*sources, *high]:
        os.close(fd)
    return Sandbox(pid, 0)


@pytest.mark.parametrize("name", _probe_names())
def test_probe_holds_on_the_real_plan(world: World, name: str) -> None:
    """Each refusal is refused and each need is met, judged by the host's own files."""
    probe = _probe(world, name)
    allowed, outcome = run_probe(world.plan(), probe)
    assert allowed == probe.expect_allowed, outcome


@pytest.mark.parametrize("name", _probe_names())
def test_probe_flips_on_a_weakened_plan(world: World, name: str) -> None:
    """The same probe comes out the other way once the plan exposes the secret or loses the
    entry the need depends on: the check can fail."""
    probe = _probe(world, name)
    plan = world.plan()
    launcher: _selftest.Launcher = _selftest.unchecked_launcher
    if name == "use an fd the launcher leaked":
        launcher = naive_launch  # the weakening is a launcher that passes fds on
    if name == "write /usr" and os.geteuid() != 0:
        # Unprivileged, the host's own permissions refuse too: that is what must hold here.
        assert not os.access("/usr", os.W_OK)
        return
    weakened = probe.weaken(plan)
    assert weakened != plan or launcher is naive_launch
    try:
        allowed, outcome = run_probe(weakened, probe, launcher)
    finally:
        if name == "write /usr":
            Path(f"/usr/nsconfine-probe-{world.token}").unlink(missing_ok=True)
    assert allowed != probe.expect_allowed, outcome


def test_host_secrets_are_really_there(world: World) -> None:
    """The refusals mean something: the launcher itself can read every stand-in secret."""
    for path in world.secrets.values():
        assert world.token in Path(path).read_text()


def test_every_mount_is_a_plan_entry(world: World) -> None:
    """/proc/self/mountinfo inside the session lists only mounts the plan accounts for."""
    plan = world.plan()
    mountinfo = run_script(plan, "cat /proc/self/mountinfo").stdout
    assert mountinfo.count("\n") >= len([e for e in plan.entries if e.kind != "symlink"]) - 5
    assert unexplained_mounts(mountinfo, plan) == []


def test_an_unlisted_mount_is_caught(world: World) -> None:
    """The whole-truth check fails when the sandbox has a mount the plan does not list."""
    plan = world.plan()
    mountinfo = run_script(plan, "cat /proc/self/mountinfo").stdout
    assert unexplained_mounts(mountinfo, plan.without(world.workspace)) == [world.workspace]


def test_session_cannot_gain_privileges_as_root(world: World) -> None:
    """The session holds no capabilities, even when the launcher is root."""
    outcome = run_script(world.plan(), "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")
    values = {line.split()[1] for line in outcome.stdout.splitlines()}
    assert values == {"0000000000000000"}, outcome


def test_environment_is_only_the_plan(world: World) -> None:
    """The session's environment is exactly the plan's variables (and bwrap's PWD)."""
    os.environ["NSCONFINE_TEST_LEAK"] = "leaked"
    try:
        plan = world.plan()
        outcome = run_script(plan, "env")
    finally:
        del os.environ["NSCONFINE_TEST_LEAK"]
    names = {line.split("=", 1)[0] for line in outcome.stdout.splitlines()}
    assert names == {v.name for v in plan.env} | {"PWD"}


def _sleeping_session(tmp_path: Path, *, naive: bool) -> tuple[subprocess.Popen[str], int]:
    """A launcher process that starts a session running sleep; it prints bwrap's pid."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from nsconfine import Session, spawn
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        plan = Session(workspace={str(tmp_path / "ws")!r}, run_dir={str(tmp_path / "run")!r}).plan()
        if {naive!r}:
            from test_confinement import naive_launch
            sandbox = naive_launch(plan, ["/bin/sleep", "600"])
        else:
            sandbox = spawn(plan, ["/bin/sleep", "600"])
        print(sandbox.pid, flush=True)
        time.sleep(600)
        """
    )
    (tmp_path / "ws").mkdir()
    (tmp_path / "run").mkdir()
    launcher = subprocess.Popen(  # not from the source tree: it would shadow the install
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    assert launcher.stdout is not None
    return launcher, int(launcher.stdout.readline())


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _tree_after_launcher_dies(launcher: subprocess.Popen[str], bwrap_pid: int) -> list[int]:
    bwrap = psutil.Process(bwrap_pid)
    deadline = time.monotonic() + 10
    tree: list[psutil.Process] = []
    while time.monotonic() < deadline:  # wait until sleep has exec'd inside the sandbox
        tree = [bwrap, *bwrap.children(recursive=True)]
        if any(p.name() == "sleep" for p in tree):
            break
        time.sleep(0.01)
    assert any(p.name() == "sleep" for p in tree)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    assert launcher.stdout is not None
    launcher.stdout.close()
    _, alive = psutil.wait_procs(tree, timeout=5)
    survivors = [p.pid for p in alive if _running(p)]
    for process in alive:  # killing bwrap first may already have ended the rest
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    return survivors


def test_killing_the_launcher_kills_the_session(tmp_path: Path) -> None:
    """SIGKILL of the launcher leaves no process of its session alive."""
    launcher, bwrap_pid = _sleeping_session(tmp_path, naive=False)
    assert _tree_after_launcher_dies(launcher, bwrap_pid) == []


def test_a_naive_launch_outlives_its_launcher(tmp_path: Path) -> None:
    """The same check fails for bwrap started without PDEATHSIG: the check can fail."""
    launcher, bwrap_pid = _sleeping_session(tmp_path, naive=True)
    assert _tree_after_launcher_dies(launcher, bwrap_pid) != []
