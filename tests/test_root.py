"""What holds only for a root launcher (sessions never hold host uid 0), and what only root can
set up (a file of another account, a chroot): every root-only test of the suite is here.

Every test here is marked `root`: skipped when the suite does not run as root (CI runs it as
root and again as an unprivileged user), and such a skip is not a failure with
NSCONFINE_MUST_WORK=1. Elsewhere no test depends on being root.
"""

from __future__ import annotations

import errno
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SESSION_USER, cli, give_to_session_user, session

import nsconfine
from nsconfine._plan.credential import read_credential
from nsconfine._session import build_plan

pytestmark = pytest.mark.root


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_root_launch_without_user_is_refused(ws_run: tuple[Path, Path]) -> None:
    """As root, a session that names no --user is refused and runs nothing."""
    marker = ws_run[0] / "ran"
    plan = nsconfine.Session(workspace=ws_run[0], run_dir=ws_run[1]).plan()
    with pytest.raises(nsconfine.SandboxUnavailable, match="--user"):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {marker}"])
    assert not marker.exists()


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_cli_root_launch_without_user_exits_69(ws_run: tuple[Path, Path]) -> None:
    """The CLI says the same in one line and exits 69."""
    marker = ws_run[0] / "ran"
    result = cli("run", "--workspace", str(ws_run[0]), "--run-dir", str(ws_run[1]), "--",
                 "/bin/sh", "-c", f"touch {marker}")  # fmt: skip
    assert result.returncode == 69, result.stderr
    assert result.stderr.count("\n") == 1
    assert "--user" in result.stderr
    assert not marker.exists()


def test_the_run_dirs_must_be_writable_by_the_user(tmp_path: Path) -> None:
    """As root, a workspace the session user cannot write is refused by name."""
    workspace, run_dir = tmp_path / "ws", tmp_path / "run"
    workspace.mkdir()
    run_dir.mkdir()
    give_to_session_user(run_dir)
    with pytest.raises(nsconfine.PlanError, match=f"workspace {workspace}"):
        session(workspace, run_dir).plan()


def test_the_session_account_s_home_is_denied(ws_run: tuple[Path, Path]) -> None:
    """As root, the home of the account the session runs as is denied with its stores."""
    assert SESSION_USER is not None
    home = pwd.getpwnam(SESSION_USER).pw_dir
    made = build_plan(session(*ws_run), environ={})
    assert any(rule.path.startswith(home) and "--user" in rule.origin for rule in made.deny)


def test_a_credential_owned_by_another_uid_is_insecure(tmp_path: Path) -> None:
    """A 0600 credential file owned by someone else is refused, naming the owner's uid."""
    path = tmp_path / "agent.env"
    path.write_text("A=1\n")
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(nsconfine.CredentialInsecure, match="owned by uid 65534") as refused:
        read_credential(str(path))
    assert str(path) in refused.value.message


_PROBE_IN_A_CHROOT = """if 1:
    import os, sys
    from nsconfine._kernel.syscalls import SyscallError, probe_user_namespace
    os.chroot(sys.argv[1])
    try:
        probe_user_namespace()
    except SyscallError as e:
        print(e.errno, e.syscall, e.strerror, sep="|")
"""


def test_probe_user_namespace_names_unshare_when_refused(tmp_path: Path) -> None:
    """A chrooted process may not create a user namespace: the probe blames unshare, EPERM."""
    helper = subprocess.run(
        [sys.executable, "-c", _PROBE_IN_A_CHROOT, str(tmp_path)],
        capture_output=True, text=True, cwd="/", check=True,
    )  # fmt: skip
    syscall = "unshare(CLONE_NEWUSER)"
    assert helper.stdout.strip() == f"{errno.EPERM}|{syscall}|{syscall}: Operation not permitted"


def test_the_canary_world_goes_to_its_account_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root gives the canary's world to the canary's account (nobody) after everything in it,
    and follows no symlink doing so: a process of that account that swaps the world's runner
    directory for a symlink the moment the world is its own cannot have root chown what the
    symlink names."""
    import shutil

    from nsconfine._preflight import checks as _checks

    victim = tmp_path / "victim"
    victim.mkdir()
    world = tmp_path / "world"
    world.mkdir()
    real_chown = os.chown

    def chown(path: str, uid: int, gid: int, *, follow_symlinks: bool = True) -> None:
        real_chown(path, uid, gid, follow_symlinks=follow_symlinks)
        runner = world / "runner"
        if os.fspath(path) == str(world) and not runner.is_symlink():
            shutil.rmtree(runner)  # the account's own now: it swaps what is inside
            runner.symlink_to(victim)

    monkeypatch.setattr(os, "chown", chown)
    _checks.canary_plan(str(world), _checks.canary_account(), "token")
    assert victim.stat().st_uid == 0
    assert (world / "runner").is_symlink()  # the swap did happen
