"""Whom a session runs as: never host uid 0, holding no capability, and the manifest says so;
for a root launcher, only an account named for it; and what only root can set up (a file of
another account, a chroot).

Tests that hold only for a root launcher are marked `root`: skipped when the suite does not run
as root (CI runs it as root and again as an unprivileged user), and such a skip is not a
failure with NSCONFINE_MUST_WORK=1. The rest hold for any launcher.
"""

from __future__ import annotations

import errno
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    IS_ROOT,
    SESSION_USER,
    cli,
    give_to_session_user,
    pids_with,
    session,
    session_uid,
)

import nsconfine
from nsconfine._plan.credential import read_credential
from nsconfine._session import build_plan


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_the_session_never_holds_host_uid_0(plan: nsconfine.Plan) -> None:
    """Every process of the session runs, on the host, as the session user (never uid 0),
    and holds no capability."""
    marker = f"nsconfine-uid-{os.urandom(6).hex()}"
    script = f'/bin/sh -c "sleep 600 # {marker}" & wait # {marker}'
    with nsconfine.spawn(plan, ["/bin/sh", "-c", script]) as sandbox:
        deadline = time.monotonic() + 60
        while len(pids := pids_with(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        statuses: list[dict[str, str]] = []
        for pid in [sandbox.pid, sandbox.child_pid, *pids]:
            with open(f"/proc/{pid}/status") as lines:
                statuses.append(dict(line.split(":", 1) for line in lines))
    assert len(statuses) >= 4
    for status in statuses:
        assert status["Uid"].split() == [str(session_uid())] * 4
        assert status["CapEff"].strip() == "0000000000000000"
    if IS_ROOT:
        assert session_uid() != 0


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_the_manifest_names_the_user(plan: nsconfine.Plan) -> None:
    """The manifest shows whom the session runs as."""
    assert f"uid {session_uid()}" in plan.manifest()
    assert plan.to_json()["user"]["uid"] == session_uid()


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_user_zero_is_refused_as_uid_0() -> None:
    """`--user 0` is refused as uid 0, not as an unknown account."""
    result = cli("plan", "--user", "0", "--workspace", "/tmp", "--run-dir", "/tmp")
    assert result.returncode == 64
    assert "uid 0" in result.stderr


@pytest.mark.root
def test_an_account_whose_group_is_root_s_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """As root, a session account whose primary group is gid 0 is refused as uid 0 is: its
    sessions would write what root's group may (no such account here: the password database's
    answer is made up)."""
    from nsconfine._kernel.accounts import run_as

    wheel = pwd.struct_passwd(("agent", "x", 4242, 0, "", "/nonexistent", "/bin/sh"))
    monkeypatch.setattr(pwd, "getpwnam", lambda name: wheel)
    with pytest.raises(nsconfine.UsageError, match="gid 0"):
        run_as("agent")


@pytest.mark.root
@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_root_launch_without_user_is_refused(ws_run: tuple[Path, Path]) -> None:
    """As root, a session that names no --user is refused and runs nothing."""
    marker = ws_run[0] / "ran"
    plan = nsconfine.Session(workspace=ws_run[0], run_dir=ws_run[1]).plan()
    with pytest.raises(nsconfine.SandboxUnavailable, match="--user"):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {marker}"])
    assert not marker.exists()


@pytest.mark.root
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


@pytest.mark.root
def test_the_run_dirs_must_be_writable_by_the_user(tmp_path: Path) -> None:
    """As root, a workspace the session user cannot write is refused by name."""
    workspace, run_dir = tmp_path / "ws", tmp_path / "run"
    workspace.mkdir()
    run_dir.mkdir()
    give_to_session_user(run_dir)
    with pytest.raises(nsconfine.PlanError, match=f"workspace {workspace}"):
        session(workspace, run_dir).plan()


@pytest.mark.root
def test_the_session_account_s_home_is_denied(ws_run: tuple[Path, Path]) -> None:
    """As root, the home of the account the session runs as is denied with its stores."""
    assert SESSION_USER is not None
    home = pwd.getpwnam(SESSION_USER).pw_dir
    made = build_plan(session(*ws_run), environ={})
    assert any(rule.path.startswith(home) and "--user" in rule.origin for rule in made.deny)


@pytest.mark.root
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


@pytest.mark.root
def test_probe_user_namespace_names_unshare_when_refused(tmp_path: Path) -> None:
    """A chrooted process may not create a user namespace: the probe blames unshare, EPERM."""
    helper = subprocess.run(
        [sys.executable, "-c", _PROBE_IN_A_CHROOT, str(tmp_path)],
        capture_output=True, text=True, cwd="/", check=True,
    )  # fmt: skip
    syscall = "unshare(CLONE_NEWUSER)"
    assert helper.stdout.strip() == f"{errno.EPERM}|{syscall}|{syscall}: Operation not permitted"


@pytest.mark.root
def test_the_canary_world_stays_root_s_and_what_it_gives_away_is_given_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root gives what the canary's world holds to the canary's account (nobody), each thing
    after everything inside it, and follows no symlink doing so: a process of that account
    that swaps what the runner directory holds for a symlink the moment the directory is its
    own cannot have root chown what the symlink names. The world itself stays root's (0755),
    so that the next launcher removes it if this one is killed (attackers' pass, stop 43)."""
    from nsconfine._preflight import checks as _checks

    victim = tmp_path / "victim"
    victim.mkdir()
    world = tmp_path / "world"
    world.mkdir(mode=0o700)
    real_chown = os.chown

    def chown(path: str, uid: int, gid: int, *, follow_symlinks: bool = True) -> None:
        real_chown(path, uid, gid, follow_symlinks=follow_symlinks)
        runner = world / "runner"
        if os.fspath(path) == str(runner) and not (runner / "marker").is_symlink():
            (runner / "marker").unlink()  # the account's own now: it swaps what is inside
            (runner / "marker").symlink_to(victim)

    monkeypatch.setattr(os, "chown", chown)
    _checks.canary_plan(str(world), _checks.canary_account(), "token")
    assert victim.stat().st_uid == 0
    assert (world / "runner" / "marker").is_symlink()  # the swap did happen
    assert (world.stat().st_uid, world.stat().st_mode & 0o777) == (0, 0o755)


@pytest.mark.root  # only a root launcher gives what it makes away
@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_kept_home_a_killed_launcher_left_root_s_is_given_to_the_session(
    ws_run: tuple[Path, Path],
) -> None:
    """A root launcher killed between making RUN/home and giving it to the session's account
    left it root's and empty: every later session ran with a HOME it could not write, and
    nothing said why (attacker's pass on shared state, stop 33: SIGKILL on the mkdir). The
    next launch gives it, as the killed one would have; a HOME with something in it stays as
    it is (the twin: root's own, never taken)."""
    home = ws_run[1] / "home"
    home.mkdir()
    assert home.stat().st_uid == 0
    plan = session(*ws_run).plan()
    with nsconfine.spawn(plan, ["/bin/sh", "-c", 'echo x > "$HOME/f"']) as sandbox:
        assert sandbox.wait(60) == 0
    assert home.stat().st_uid == session_uid()
    other = ws_run[1] / "other-run"
    other.mkdir()
    give_to_session_user(other)
    (other / "home").mkdir()
    (other / "home" / "root-s").write_text("kept\n")
    with nsconfine.spawn(session(ws_run[0], other).plan(), ["/bin/true"]) as sandbox:
        assert sandbox.wait(60) == 0
    assert (other / "home").stat().st_uid == 0
