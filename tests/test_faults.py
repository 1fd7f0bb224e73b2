"""Faults the soak benchmark found (nsconfine.bench._faults), kept as tests: a launch that
meets a fault ends in a clear refusal or runs its command, never a handle for a command that
never ran."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
from pathlib import Path

import psutil
import pytest
from helpers import read_to_eof

import nsconfine

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


def staged_bwrap(pool: nsconfine.Pool) -> psutil.Process:
    """bwrap's outer process (its monitor) of the pool's one staged sandbox."""
    [monitor] = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.name() == "bwrap" and (parent := p.parent()) is not None and parent.name() != "bwrap"
    ]
    return monitor


@pytest.mark.parametrize("refill", ["background", "inline"])
def test_launch_after_the_staged_bwrap_was_killed_runs_the_command(
    plan: nsconfine.Plan, refill: str
) -> None:
    """A staged sandbox whose bwrap was killed is not handed a command: launch takes another
    (or refuses), and never returns a handle whose command never ran."""
    outcomes = []
    for _ in range(5):  # its reaper's teardown is a race the launch must not lose
        with nsconfine.Pool(plan, refill=refill) as pool:  # type: ignore[arg-type]
            assert pool.wait_staged(30)
            monitor = staged_bwrap(pool)
            monitor.kill()
            monitor.wait(5)
            read_end, write_end = os.pipe()
            try:
                sandbox = pool.launch(["/bin/sh", "-c", "echo ran; exit 3"], stdout=write_end)
            finally:
                os.close(write_end)
            with os.fdopen(read_end, "rb") as output:
                printed = output.read()
            outcomes.append((sandbox.wait(timeout=30), printed))
    assert outcomes == [(3, b"ran\n")] * 5


@pytest.mark.parametrize("refill", ["background", "inline"])
def test_launch_out_of_fds_refuses_and_leaves_no_sandbox(plan: nsconfine.Plan, refill: str) -> None:
    """A Pool launch in a launcher with no fd free is refused with nsconfine's error, and the
    staged sandbox it took is torn down, not left running."""
    with nsconfine.Pool(plan, refill=refill) as pool:  # type: ignore[arg-type]
        assert pool.wait_staged(30)
        staged = psutil.Process().children(recursive=True)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        ballast: list[int] = []
        try:
            with contextlib.suppress(OSError):
                while True:
                    ballast.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            with pytest.raises(nsconfine.NsconfineError):
                pool.launch(["/bin/true"])
        finally:
            for fd in ballast:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        pool.close()
    alive = psutil.wait_procs(staged, timeout=10)[1]
    assert alive == []


@pytest.mark.parametrize("pipes", [False, True], ids=["inherited-stdio", "pipes"])
def test_spawn_short_of_fds_refuses_and_leaves_no_fd_or_mount_point(
    plan: nsconfine.Plan, ws_run: tuple[Path, Path], pipes: bool
) -> None:
    """With 0 to 80 fds free below RLIMIT_NOFILE, each spawn (with its stdio the launcher's,
    or three pipes) runs or is refused with nsconfine's error, and leaves no fd open and no
    mount point in the workspace."""
    stdio = subprocess.PIPE if pipes else None
    workspace = ws_run[0]
    nsconfine.spawn(plan, ["/bin/true"]).wait()  # warm: the proof, the lifeline
    before = len(os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    found = []
    try:
        for free in range(81):
            ballast: list[int] = []
            with contextlib.suppress(OSError):
                while True:
                    ballast.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            # (A thread left by an earlier test may hold fds for a moment: fewer are free.)
            for _ in range(min(free, len(ballast))):
                os.close(ballast.pop())
            try:
                argv = ["/bin/true"]
                with nsconfine.spawn(
                    plan, argv, stdin=stdio, stdout=stdio, stderr=stdio
                ) as sandbox:
                    outcome = str(sandbox.wait())
            except nsconfine.NsconfineError as error:
                outcome = error.code
            except OSError as error:
                outcome = f"bare {error!r}"
            finally:
                for fd in ballast:
                    os.close(fd)
            held = len(os.listdir("/proc/self/fd")) - before
            left = sorted(os.listdir(workspace))
            if outcome.startswith("bare") or held or left:
                found.append((free, outcome, held, left))
                break
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert found == []


IN_FLIGHT_CYCLE = """
import array, os, socket, time
a, b = socket.socketpair()
fds = array.array("i", [b.fileno(), 1, 2])
a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
os.close(1)
os.close(2)
a.close()
time.sleep(0.5)
"""


def test_a_pipe_left_in_flight_by_the_session_reaches_eof(plan: nsconfine.Plan) -> None:
    """A session whose last process sends its stdout and stderr (a caller's pipe) and one end
    of a socketpair over that pair, then closes them: a unix-socket cycle the kernel's garbage
    collector frees only when some unix socket is closed, anywhere (b's last close, at exit,
    starts none). Once the session has ended the pipe reaches EOF (it stayed open until another
    process's close: 0.1 s to 97 s)."""
    for _ in range(3):  # another process's close starts a collection now and then
        read_end, write_end = os.pipe()
        try:
            try:
                sandbox = nsconfine.spawn(
                    plan, ["python3", "-c", IN_FLIGHT_CYCLE], stdout=write_end, stderr=write_end
                )
            finally:
                os.close(write_end)
            assert sandbox.wait(timeout=30) == 0
            assert read_to_eof(read_end, 5) == b""
        finally:
            os.close(read_end)
