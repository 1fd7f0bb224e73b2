"""Faults the soak benchmark found (nsconfine.bench._faults), kept as tests: a launch that
meets a fault ends in a clear refusal or runs its command, never a handle for a command that
never ran."""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

import psutil
import pytest

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


def test_spawn_short_of_fds_refuses_and_leaves_no_fd_or_mount_point(
    plan: nsconfine.Plan, ws_run: tuple[Path, Path]
) -> None:
    """With 0 to 80 fds free below RLIMIT_NOFILE, each spawn runs or is refused with
    nsconfine's error, and leaves no fd open and no mount point in the workspace."""
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
            for _ in range(free):
                os.close(ballast.pop())
            try:
                outcome = str(nsconfine.spawn(plan, ["/bin/true"]).wait())
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
