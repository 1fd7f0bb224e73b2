"""What a live session costs its launcher in fds: a few, whatever its plan (the holds on its
mount points live in its reaper), so that a broker under the usual limit of 1,024 runs many."""

from __future__ import annotations

import errno
import resource
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import give_to_session_user, open_fds, read_until, session, session_dirs

import nsconfine

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]

SESSIONS = 6


def _fds_per_live_session(plan: nsconfine.Plan) -> float:
    nsconfine.spawn(plan, ["/bin/true"]).wait(timeout=60)  # the lifeline and the like, once
    before = len(open_fds())
    sandboxes = [nsconfine.spawn(plan, ["sleep", "60"]) for _ in range(SESSIONS)]
    try:
        return (len(open_fds()) - before) / SESSIONS
    finally:
        for sandbox in sandboxes:
            sandbox.kill()
            sandbox.wait(timeout=60)


def test_a_live_session_holds_three_fds_in_its_launcher(ws_run: tuple[Path, Path]) -> None:
    """A session whose workspace holds two repositories (a score of protected mount points,
    each held while it runs) costs its launcher its three pidfds: the reaper's, its init's
    and its command's."""
    workspace = ws_run[0]
    for repository in (workspace, workspace / "vendor" / "lib"):
        repository.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", str(repository)], check=True)
    give_to_session_user(workspace)
    plan = session(*ws_run).plan()
    assert len(plan.protection.entries if plan.protection else ()) > 10
    assert _fds_per_live_session(plan) == 3


def test_a_proxy_session_holds_one_more_its_proxy_socket(ws_run: tuple[Path, Path]) -> None:
    """A "proxy" session costs one fd more: the listening socket of its way out."""
    plan = session(*ws_run, allow_hosts=["mirror.test:1=127.0.0.1"]).plan()
    assert _fds_per_live_session(plan) == 4


FILL_IN_FLIGHT = """
import array, os, socket, sys
sending, _ = socket.socketpair()  # never read: every fd sent stays counted
fds = array.array("i", [0] * 250)
try:
    while True:
        sending.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
except OSError as error:
    print(error.errno, flush=True)
sys.stdin.read()
"""


@contextmanager
def _fds_in_flight_filled(plan: nsconfine.Plan) -> Iterator[int]:
    """A session of plan's account holding as many fds in flight as it can, never read, while
    this launcher's soft fd limit is the usual 1,024; the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    holder = nsconfine.spawn(
        plan, ["python3", "-c", FILL_IN_FLIGHT], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == f"{errno.ETOOMANYREFS}\n".encode()
        yield hard
    finally:
        holder.kill()
        holder.communicate(timeout=60)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.unprivileged  # root's sends are never counted
def test_a_session_holding_fds_in_flight_does_not_stop_the_next_launch(
    ws_run: tuple[Path, Path],
) -> None:
    """Each account has one count of the fds sent over unix sockets and not yet received, and
    a send fails (ETOOMANYREFS) once it passes the sender's own fd limit. A session filled it
    to about its open_files (1,024) and never read them; the hand-off passes the command's
    stdio that way, so every launch of a launcher under the usual soft limit of 1,024 failed
    (as exec-failed) while that session lived. The launcher now raises its soft limit to its
    hard one for that send, and puts it back; a launcher whose hard limit is too low is
    refused, saying so."""
    plan = session(*ws_run).plan()
    with _fds_in_flight_filled(plan) as hard:
        if hard < 2048:  # no room to raise the soft limit into: refused, saying why
            with pytest.raises(nsconfine.SandboxUnavailable, match="ETOOMANYREFS"):
                nsconfine.spawn(plan, ["true"])
        else:
            assert nsconfine.spawn(plan, ["true"]).wait(timeout=60) == 0
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (min(1024, hard), hard)


def test_a_session_holding_fds_in_flight_does_not_stop_a_tty_launch(
    ws_run: tuple[Path, Path],
) -> None:
    """With a terminal of its own, the command's pty is sent back by the shim, which runs as
    the session's account, root launcher or not: the shim too raises its soft fd limit for
    that send (and puts it back before the command runs)."""
    plan = session(*ws_run).plan()
    with _fds_in_flight_filled(plan) as hard:
        if hard >= 2048:
            launched = nsconfine.spawn(plan, ["sh", "-c", "ulimit -Sn"], tty=True)
            output = read_until(launched.tty, b"\n", 60)
            assert launched.wait(timeout=60) == 0
            assert output.split() == [str(min(1024, hard)).encode()]


def test_a_launcher_out_of_fds_while_checking_a_protected_directory_is_told_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk of a protected directory (the workspace's .vscode) running out of fds is the
    launcher's shortage, not a plan to refuse: it was `plan-refused`, "…/.vscode cannot be
    checked (Too many open files) … make it readable, or remove it" (attacker's pass, stop
    39), which a broker takes for a permanent error and whose advice is wrong."""
    from nsconfine._kernel import walk as _walk

    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    (workspace / ".vscode").mkdir()
    give_to_session_user(workspace / ".vscode")
    plan = session(workspace, run_dir).plan()

    def out_of_fds(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
        raise OSError(errno.EMFILE, "Too many open files", top)
        yield  # a generator, as walk is

    monkeypatch.setattr(_walk, "walk", out_of_fds)
    with pytest.raises(nsconfine.SandboxUnavailable, match="ran out of file descriptors"):
        nsconfine.spawn(plan, ["true"])
