"""The Sandbox handle's Popen-shaped contract, on real sessions: wait(timeout) raises
TimeoutExpired and the session goes on; leaving a `with` block kills and reaps it; each
handle carries its launch's timings, in order."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import SESSION_USER, python_child, session, session_dirs

import nsconfine

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


@pytest.fixture
def sleeper_plan(tmp_path: Path) -> nsconfine.Plan:
    return session(*session_dirs(tmp_path, "ws", "run")).plan()


def test_wait_timeout_raises_timeout_expired_and_the_session_goes_on(
    sleeper_plan: nsconfine.Plan,
) -> None:
    sandbox = nsconfine.spawn(sleeper_plan, ["/bin/sleep", "60"])
    try:
        with pytest.raises(nsconfine.TimeoutExpired) as raised:
            sandbox.wait(timeout=0.2)
        assert isinstance(raised.value, TimeoutError)
        assert (raised.value.pid, raised.value.timeout) == (sandbox.pid, 0.2)
        assert sandbox.poll() is None  # still running
    finally:
        sandbox.kill()
    assert sandbox.wait(timeout=30) == -9


def test_leaving_the_with_block_kills_and_reaps(sleeper_plan: nsconfine.Plan) -> None:
    with nsconfine.spawn(sleeper_plan, ["/bin/sleep", "60"]) as sandbox:
        assert sandbox.returncode is None
    assert sandbox.returncode == -9
    with pytest.raises(ProcessLookupError):
        os.kill(sandbox.command_pid, 0)


def test_each_handle_carries_its_launch_timings_in_order(sleeper_plan: nsconfine.Plan) -> None:
    with nsconfine.spawn(sleeper_plan, ["/bin/true"]) as spawned:
        spawned.wait(timeout=30)
    with nsconfine.Pool(sleeper_plan, refill="inline") as pool:
        launched = pool.launch(["/bin/true"])
        launched.wait(timeout=30)
    stages = ["started", "linted", "namespaces", "built", "confirmed", "exec"]
    for timings in (spawned.timings, launched.timings):
        assert list(timings) == stages
        values = [timings[stage] for stage in stages]
        assert values == sorted(values)
        assert values[0] >= 0


def test_handles_cannot_be_made_by_hand() -> None:
    with pytest.raises(TypeError):
        nsconfine.Sandbox()


# Ways a launcher comes to ignore SIGCHLD: through Python, or behind its back (C code, which
# signal.getsignal cannot see).
IGNORE_SIGCHLD = {
    "python": "signal.signal(signal.SIGCHLD, signal.SIG_IGN)",
    "c": "ctypes.CDLL(None).signal(int(signal.SIGCHLD), ctypes.c_void_p(1))  # SIG_IGN",
}


@pytest.mark.parametrize("how", sorted(IGNORE_SIGCHLD))
def test_a_launcher_that_ignores_sigchld_is_refused(ws_run: tuple[Path, Path], how: str) -> None:
    """With SIGCHLD set to SIG_IGN the kernel reaps the launcher's children itself, and every
    status is lost (`exit 7` came back as 0, a failed exec as a raw ChildProcessError with
    fds and mount points left behind): refused before anything runs, saying what to fix."""
    child = python_child(
        f"""
        import ctypes, signal
        {IGNORE_SIGCHLD[how]}
        plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3])
        try:
            print("status", nsconfine.spawn(plan, ["/bin/sh", "-c", "exit 7"]).wait())
        except nsconfine.NsconfineError as refused:
            print(refused.code, refused.message)
        """,
        str(ws_run[0]), str(ws_run[1]), SESSION_USER or "",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = child.communicate(timeout=60)
    assert out.startswith("sandbox-unavailable"), out + err
    assert "SIGCHLD" in out
    assert sorted(ws_run[0].iterdir()) == []


def test_a_handle_answers_only_in_the_process_that_launched(ws_run: tuple[Path, Path]) -> None:
    """After os.fork(), the child's poll() of its parent's session said 0 while the session
    ran (it cannot wait for a process that is not its child): it raises instead. (In a fresh,
    single-threaded interpreter: a fork of the test runner's threads can deadlock under ASan.)"""
    child = python_child(
        """
        import os
        plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3])
        with nsconfine.spawn(plan, ["/bin/sleep", "60"]) as sandbox:
            pid = os.fork()
            if pid == 0:
                try:
                    sandbox.poll()
                    os._exit(1)
                except RuntimeError:
                    os._exit(0)
                except BaseException:
                    os._exit(2)
            print("forked child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
            print("parent", sandbox.poll())
        """,
        str(ws_run[0]), str(ws_run[1]), SESSION_USER or "",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = child.communicate(timeout=60)
    assert out.splitlines() == ["forked child 0", "parent None"], out + err


def test_concurrent_launches_of_one_workspace_all_run_and_leave_nothing_there(
    ws_run: tuple[Path, Path],
) -> None:
    """16 spawns at once (an account's 1,024 fds allow them) of one workspace's plan, 6 times:
    each runs, and once they have ended no mount point they made is left (a launch that saw
    another's stub before its record was written took it for the session's own directory and
    made stubs inside it)."""
    import threading

    plan = session(*ws_run).plan()
    failures: list[str] = []

    def launch() -> None:
        try:
            status = nsconfine.spawn(plan, ["/bin/true"]).wait()
        except nsconfine.NsconfineError as error:
            failures.append(str(error))
        else:
            if status != 0:
                failures.append(f"status {status}")

    for _ in range(6):
        threads = [threading.Thread(target=launch) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures[:3]
        assert os.listdir(ws_run[0]) == []
