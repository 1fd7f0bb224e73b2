"""The Sandbox handle's Popen-shaped contract, on real sessions: wait(timeout) raises
TimeoutExpired and the session goes on (however long the timeout); leaving a `with` block kills
and reaps it and closes its pipes; PIPE, DEVNULL, STDOUT and communicate() are Popen's; env=
is for one launch; each handle carries its launch's timings; none is made by hand, and none
answers outside the process that launched it."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import (
    HAND_OUT,
    SESSION_USER,
    Flood,
    holder_socket,
    outcome_without_hanging,
    python_child,
    receive_fd,
    session,
)

import nsconfine

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


def test_wait_timeout_raises_timeout_expired_and_the_session_goes_on(
    plan: nsconfine.Plan,
) -> None:
    """wait(timeout) raises TimeoutExpired (a TimeoutError, carrying the pid and the timeout)
    while the session runs on, and a later wait() gives its status."""
    sandbox = nsconfine.spawn(plan, ["/bin/sleep", "60"])
    try:
        with pytest.raises(nsconfine.TimeoutExpired) as raised:
            sandbox.wait(timeout=0.2)
        assert isinstance(raised.value, TimeoutError)
        assert (raised.value.pid, raised.value.timeout) == (sandbox.pid, 0.2)
        assert sandbox.poll() is None  # still running
    finally:
        sandbox.kill()
    assert sandbox.wait(timeout=30) == -9


def test_leaving_the_with_block_kills_and_reaps(plan: nsconfine.Plan) -> None:
    """Leaving the `with` block kills the session and reaps it: its status is -9 and its
    command's pid is gone."""
    with nsconfine.spawn(plan, ["/bin/sleep", "60"]) as sandbox:
        assert sandbox.returncode is None
    assert sandbox.returncode == -9
    with pytest.raises(ProcessLookupError):
        os.kill(sandbox.command_pid, 0)


def test_kill_reports_sigkill_even_if_the_launcher_stalls_between_its_signals(
    plan: nsconfine.Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill() ends the session as killed by SIGKILL (-9), however the launcher is scheduled
    while it sends its signals. Preempted right after killing the sandbox's init, before
    telling the reaper (here: a pause there), the launcher let bwrap exit 137 on its own and
    the reaper pass that on as the status: 2 of 150 sessions in a CI soak ended 137."""
    from nsconfine._launch import sandbox as _sandbox

    send = _sandbox._send

    def send_then_stall(pidfd: int, number: int) -> None:
        send(pidfd, number)
        time.sleep(0.3)  # the scheduler's worst: every other process runs meanwhile

    monkeypatch.setattr(_sandbox, "_send", send_then_stall)
    sandbox = nsconfine.spawn(plan, ["/bin/sleep", "60"])
    sandbox.kill()
    assert sandbox.wait(timeout=30) == -9


def test_each_handle_carries_its_launch_timings_in_order(plan: nsconfine.Plan) -> None:
    """A spawned and a pooled handle each carry the time of every stage of its launch, in
    order."""
    with nsconfine.spawn(plan, ["/bin/true"]) as spawned:
        spawned.wait(timeout=30)
    with nsconfine.Pool(plan, refill="inline") as pool:
        launched = pool.launch(["/bin/true"])
        launched.wait(timeout=30)
    stages = ["started", "linted", "namespaces", "built", "confirmed", "exec"]
    for timings in (spawned.timings, launched.timings):
        assert list(timings) == stages
        values = [timings[stage] for stage in stages]
        assert values == sorted(values)
        assert values[0] >= 0


def test_handles_cannot_be_made_by_hand() -> None:
    """Sandbox has no public constructor: only a launch makes one."""
    with pytest.raises(TypeError):
        nsconfine.Sandbox()


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


# One script, run by subprocess.Popen on the host and by nsconfine.spawn in a session: what
# it reads, writes to each stream and exits with does not depend on where it runs.
ECHO_BOTH_WAYS = "cat; echo to-stderr >&2; exit 3"
# Output before input, both larger than a pipe holds: a communicate() that wrote all of its
# input before reading would wait forever on a command blocked writing its stdout.
LARGE_BOTH_WAYS = (
    "head -c 3000000 /dev/zero | tr '\\0' o; head -c 2000000 /dev/zero | tr '\\0' e >&2; "
    "cat | sha256sum; exit 4"
)
# For a timeout: its output is written before it says so in a file, then it waits.
STARTED_THEN_WAITS = "echo started; : > started; exec sleep 600"

PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT


@pytest.mark.parametrize(
    ("script", "stdio", "given"),
    [
        (ECHO_BOTH_WAYS, (PIPE, PIPE, STDOUT), b"input\n"),
        (ECHO_BOTH_WAYS, (PIPE, PIPE, PIPE), b"input\n"),
        (ECHO_BOTH_WAYS, (DEVNULL, PIPE, PIPE), None),
        (ECHO_BOTH_WAYS, (PIPE, DEVNULL, PIPE), b"unseen\n"),
        (ECHO_BOTH_WAYS, (DEVNULL, PIPE, DEVNULL), None),
        (LARGE_BOTH_WAYS, (PIPE, PIPE, PIPE), bytes(range(256)) * 16384),
    ],
    ids=["stderr-to-stdout", "three-pipes", "devnull-in", "devnull-out", "devnull-err", "large"],
)
def test_communicate_gives_what_popen_gives(
    ws_run: tuple[Path, Path],
    script: str,
    stdio: tuple[int, int, int],
    given: bytes | None,
) -> None:
    """spawn takes PIPE, DEVNULL and STDOUT as Popen does, and communicate(input) returns
    the same (stdout, stderr) and status as Popen's for the same script, large output both
    ways included; the handle's args are the argv."""
    argv = ["/bin/sh", "-c", script]
    stdin, stdout, stderr = stdio
    with subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr) as host:
        expected = (*host.communicate(given, timeout=120), host.returncode)
    plan = session(*ws_run).plan()
    with nsconfine.spawn(plan, argv, stdin=stdin, stdout=stdout, stderr=stderr) as sandbox:
        assert sandbox.args == argv
        got = (*sandbox.communicate(given, timeout=120), sandbox.returncode)
    assert got == expected
    assert (got[0] is None, got[1] is None) == (stdout != PIPE, stderr != PIPE)


def test_communicate_after_a_timeout_and_a_kill_returns_all_as_popen_does(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """communicate(timeout) raises TimeoutExpired (caught as subprocess's) while the command
    runs and loses nothing: after kill() a second communicate() returns the output written
    before the timeout and the status, as Popen's does."""
    argv = ["/bin/sh", "-c", STARTED_THEN_WAITS]
    outcomes: list[tuple[bytes | None, bytes | None, int | None]] = []
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    with subprocess.Popen(argv, stdout=PIPE, stderr=DEVNULL, cwd=host_dir) as host:
        wait_for_file(host_dir / "started")
        with pytest.raises(subprocess.TimeoutExpired):
            host.communicate(timeout=0.2)
        host.kill()
        outcomes.append((*host.communicate(), host.returncode))
    plan = session(*ws_run).plan()
    with nsconfine.spawn(plan, argv, stdout=PIPE, stderr=DEVNULL) as sandbox:
        wait_for_file(ws_run[0] / "started")
        with pytest.raises(subprocess.TimeoutExpired) as raised:
            sandbox.communicate(timeout=0.2)
        error = raised.value
        assert isinstance(error, nsconfine.TimeoutExpired)
        assert isinstance(error, TimeoutError)
        assert (error.cmd, error.timeout, error.pid) == (argv, 0.2, sandbox.pid)
        assert sandbox.returncode is None
        sandbox.kill()
        outcomes.append((*sandbox.communicate(), sandbox.returncode))
    assert outcomes == [(b"started\n", None, -9)] * 2


def wait_for_file(path: Path) -> None:
    """Wait (a minute at most) until path exists."""
    for _ in range(3000):
        if path.exists():
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def test_spawn_adds_env_for_its_command_only(plan: nsconfine.Plan) -> None:
    """spawn(env=...) adds variables to the plan's environment (or replaces one), as
    Pool.launch does; the plan itself is unchanged."""
    show = ["/bin/sh", "-c", 'echo "$ADDED $HOME"']
    with nsconfine.spawn(plan, show, env={"ADDED": "yes", "HOME": "/elsewhere"}, stdout=PIPE) as s:
        assert s.communicate() == (b"yes /elsewhere\n", None)
    with nsconfine.spawn(plan, show, stdout=PIPE) as sandbox:
        out, _ = sandbox.communicate()
    assert out is not None
    assert not out.startswith(b"yes")


def test_leaving_the_with_block_closes_the_pipes(plan: nsconfine.Plan) -> None:
    """The handle's pipes are file objects, as Popen's, closed when the `with` block ends;
    the session is killed first, so a stdin whose pipe is full (the command reads nothing)
    and whose buffer holds more cannot block that."""
    with nsconfine.spawn(plan, ["/bin/sleep", "600"], stdin=PIPE, stdout=PIPE) as sandbox:
        assert sandbox.stdin is not None
        assert sandbox.stdout is not None
        assert sandbox.stderr is None
        os.set_blocking(sandbox.stdin.fileno(), False)
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(sandbox.stdin.fileno(), b"x" * 4096)
        os.set_blocking(sandbox.stdin.fileno(), True)
        sandbox.stdin.write(b"still buffered")
    assert sandbox.stdin.closed
    assert sandbox.stdout.closed
    assert sandbox.returncode == -9


@pytest.mark.parametrize(
    ("stdio", "words"),
    [
        ({"stdout": STDOUT}, "STDOUT is for stderr only"),
        ({"stdin": -7}, "stdin must be None"),
        ({"stdout": PIPE, "tty": True}, "tty=True"),
        ({"stderr": DEVNULL, "tty": True}, "tty=True"),
        ({"stdout": 2**31}, "not an open file descriptor"),
        ({"stdout": 1 << 20}, "not an open file descriptor"),
        ({"stderr": "log.txt"}, "stderr must be None"),
        ({"stdin": True}, "stdin must be None"),
        ({"stdout": "closed file"}, "is closed"),
        ({"stdout": "fileno gives a str"}, "has no fd"),
        ({"stdout": "fileno raises AttributeError"}, "has no fd"),
    ],
)
def test_stdio_that_cannot_be_is_a_usage_error(
    plan: nsconfine.Plan, stdio: dict[str, Any], words: str
) -> None:
    """STDOUT but for stderr, an unknown negative value, a pipe for a command that gets a
    terminal, an fd that is not open (or past any fd), an object that is no file, or a closed
    file is refused with one line, before anything is staged, and opens nothing (an fd past
    a C int was refused only after the sandbox was staged, which was left behind)."""
    if stdio.get("stdout") == "closed file":
        closed = open(os.devnull, "wb")  # noqa: SIM115 (closed at once: that is the case)
        closed.close()
        stdio = {"stdout": closed}
    elif str(stdio.get("stdout")).startswith("fileno"):
        gives_a_str = "str" in stdio["stdout"]

        class Odd:
            def fileno(self) -> int:
                if gives_a_str:
                    return "1"  # type: ignore[return-value]
                raise AttributeError("no fd here")

        stdio = {"stdout": Odd()}
    before = sorted(os.listdir("/proc/self/fd"))
    children = psutil.Process().children()
    with pytest.raises(nsconfine.UsageError, match=words):
        nsconfine.spawn(plan, ["/bin/true"], **stdio)
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert psutil.Process().children() == children


def _reaching_fd(kind: str, workspace: Path) -> int:
    """An fd of kind that would reach past the sandbox from inside it, as a session's stdio."""
    if kind == "directory":
        return os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if kind == "path-only":
        return os.open(workspace, os.O_PATH | os.O_CLOEXEC)
    if kind == "pidfd":
        return os.pidfd_open(os.getpid())
    if kind == "proc-file":  # (/proc/self/mem would be the launcher's memory to write)
        return os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
    return os.eventfd(0, os.EFD_CLOEXEC)


@pytest.mark.parametrize("launch", ["spawn", "pool"])
@pytest.mark.parametrize("kind", ["directory", "path-only", "pidfd", "eventfd", "proc-file"])
def test_a_stdio_fd_that_reaches_past_the_sandbox_is_refused_and_nothing_runs(
    ws_run: tuple[Path, Path], plan: nsconfine.Plan, kind: str, launch: str
) -> None:
    """A directory's fd (or an O_PATH one) as stdio would let the session open what lies
    around it on the host (openat(fd, "../..")), outside its mount namespace and its binds; a
    pidfd would let it signal the launcher; an fd of no file at all is no stream either, nor a
    file of /proc (the launcher's /proc/self/mem would be its memory to write). Each
    is refused, naming the argument, and the command never runs (attackers' pass, stop 43: a
    workspace's directory fd as stdin listed the host's / and wrote into /tmp as the
    session)."""
    marker = ws_run[0] / "ran"
    argv = ["/bin/sh", "-c", f"touch {marker}"]
    reaching = _reaching_fd(kind, ws_run[0])
    try:
        with contextlib.ExitStack() as stack:
            if launch == "pool":
                pool = stack.enter_context(nsconfine.Pool(plan))
                start: Any = pool.launch
            else:
                start = functools.partial(nsconfine.spawn, plan)
            with pytest.raises(nsconfine.UsageError, match="stdin"):
                start(argv, stdin=reaching)
    finally:
        os.close(reaching)
    assert not marker.exists()


@pytest.mark.parametrize("launch", ["spawn", "pool"])
def test_a_launchers_own_stdin_that_reaches_past_the_sandbox_is_not_inherited(
    ws_run: tuple[Path, Path], plan: nsconfine.Plan, launch: str
) -> None:
    """stdin=None gives the session the launcher's own fd 0: a directory there (a broker's
    dup2, a service's odd stdin) is refused as the same directory given as stdin is."""
    marker = ws_run[0] / "ran"
    argv = ["/bin/sh", "-c", f"touch {marker}"]
    saved = os.dup(0)
    try:
        with contextlib.ExitStack() as stack:
            start: Any = (
                stack.enter_context(nsconfine.Pool(plan)).launch
                if launch == "pool"
                else functools.partial(nsconfine.spawn, plan)
            )
            directory = os.open(ws_run[0], os.O_RDONLY | os.O_DIRECTORY)
            os.dup2(directory, 0)
            os.close(directory)
            with pytest.raises(nsconfine.UsageError, match="stdin"):
                start(argv)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert not marker.exists()


def test_the_launchers_end_of_a_staged_sandbox_is_no_stdio(
    ws_run: tuple[Path, Path], plan: nsconfine.Plan
) -> None:
    """The launcher's end of a staged sandbox's shim socket, given as stdio (a caller's stale
    fd number that nsconfine's next socket took), is refused: the session could have handed
    that sandbox a command of its own, under the other plan and past the launch's checks
    (attackers' pass, stop 43: it read the other pool's workspace and used its network)."""
    marker = ws_run[0] / "ran"
    with nsconfine.Pool(plan) as pool:
        assert pool.wait_staged(60)
        staged_end = pool._staged[0].sock.fileno()  # (a test's reach into the pool)
        for start in (pool.launch, functools.partial(nsconfine.spawn, plan)):
            with pytest.raises(nsconfine.UsageError, match="stdout"):
                start(["/bin/sh", "-c", f"touch {marker}"], stdout=os.dup(staged_end))
        assert not marker.exists()
        with pool.launch(["/bin/true"]) as sandbox:  # the staged sandbox is whole
            assert sandbox.wait() == 0


def test_launch_arguments_of_the_wrong_kind_are_usage_errors(
    ws_run: tuple[Path, Path], plan: nsconfine.Plan
) -> None:
    """A Session where a Plan is meant, an env that is no mapping, argv that is no list (a
    generator was refused as holding a NUL byte), a timeout that is no number or NaN: each a
    UsageError saying so, before anything runs (they were AttributeErrors, or poll()'s
    ValueError)."""
    with pytest.raises(nsconfine.UsageError, match="a Plan"):
        nsconfine.spawn(session(*ws_run), ["/bin/true"])  # type: ignore[arg-type]
    with pytest.raises(nsconfine.UsageError, match="a Plan"):
        nsconfine.Pool(None)  # type: ignore[arg-type]
    with pytest.raises(nsconfine.UsageError, match="env must be a mapping"):
        nsconfine.spawn(plan, ["/bin/true"], env=[("A", "B")])  # type: ignore[arg-type]
    with pytest.raises(nsconfine.UsageError, match="argv must be a non-empty list"):
        nsconfine.spawn(plan, (arg for arg in ["/bin/true"]))  # type: ignore[arg-type]
    with nsconfine.spawn(plan, ["/bin/true"]) as sandbox:
        for timeout in (float("nan"), "1"):
            with pytest.raises(nsconfine.UsageError, match="timeout"):
                sandbox.wait(timeout)  # type: ignore[arg-type]
            with pytest.raises(nsconfine.UsageError, match="timeout"):
                sandbox.communicate(timeout=timeout)  # type: ignore[arg-type]
        assert sandbox.wait(float("inf")) == 0
    # tty was taken as true when it was any true value; a signal number out of range, or no
    # number, was the kernel's OSError or a TypeError; a Pool's idle time too short to launch
    # from staged sandboxes that all expired at once (an attacker's pass)
    with pytest.raises(nsconfine.UsageError, match="tty is True or False"):
        nsconfine.spawn(plan, ["/bin/true"], tty="yes")  # type: ignore[arg-type]
    with nsconfine.spawn(plan, ["sleep", "60"]) as sandbox:
        for number in (999, -1, 0, "x", True):
            with pytest.raises(nsconfine.UsageError, match="signal number"):
                sandbox.send_signal(number)  # type: ignore[arg-type]
    with pytest.raises(nsconfine.UsageError, match=r"from 0\.1"):
        nsconfine.Pool(plan, idle_timeout=0.0005)


def test_a_pool_waits_for_ever_when_told_inf(plan: nsconfine.Plan) -> None:
    """Pool.wait_staged(float("inf")) waits as long as it takes, as Sandbox.wait(inf) does
    (it raised OverflowError); NaN is a UsageError."""
    with nsconfine.Pool(plan) as pool:
        assert pool.wait_staged(float("inf"))
        with pytest.raises(nsconfine.UsageError, match="timeout"):
            pool.wait_staged(float("nan"))


def test_communicate_does_not_wait_on_a_pipe_held_outside(
    ws_run: tuple[Path, Path], plan: nsconfine.Plan
) -> None:
    """A session that hands its stdout to a process outside it (over a socket it was given)
    ends; communicate() then returns what the session wrote, rather than wait for EOF from
    that process (the test itself here, which holds the copy throughout)."""
    with _stdout_handed_out(ws_run, plan) as (sandbox, _held):
        assert sandbox.communicate(timeout=60) == (b"handed out\n", None)


@pytest.mark.parametrize("how", ["communicate", "with"])
def test_what_the_caller_wrote_to_a_stdin_held_outside_never_holds_the_launcher(
    ws_run: tuple[Path, Path], plan: nsconfine.Plan, how: str
) -> None:
    """A session hands its stdin to a process outside (the test, which reads nothing) and
    ends, while the caller's own writes fill that pipe and leave some in stdin's buffer:
    communicate(timeout=3), and the end of `with sandbox:`, return rather than wait for room
    that never comes (attackers' pass: both flushed stdin blocking, for good)."""
    import threading

    address = str(ws_run[0] / "holder.sock")
    hand_out_stdin = HAND_OUT.replace('array.array("i", [1])', 'array.array("i", [0])')
    with holder_socket(address) as server:
        argv = ["python3", "-c", hand_out_stdin, address]
        sandbox = nsconfine.spawn(plan, argv, stdin=PIPE, stdout=PIPE)
        connection, _ = server.accept()
        with connection:
            held = receive_fd(connection)
        try:
            sandbox.wait(timeout=60)
            assert sandbox.stdin is not None
            sandbox.stdin.write(b"x" * 65536)  # straight to the pipe: fills it
            sandbox.stdin.write(b"tail")  # stays in the buffer
            done = threading.Event()

            def finish() -> None:
                if how == "communicate":
                    sandbox.communicate(timeout=3)
                else:
                    with sandbox:
                        pass
                done.set()

            threading.Thread(target=finish, daemon=True).start()
            assert done.wait(20), f"{how} waited on the pipe held outside"
        finally:
            os.close(held)  # (frees a thread still waiting, if the test failed)


@contextlib.contextmanager
def _stdout_handed_out(
    ws_run: tuple[Path, Path], plan: nsconfine.Plan
) -> Iterator[tuple[nsconfine.Sandbox, int]]:
    """A session that has handed its stdout (a pipe) to the test over a socket in its
    workspace, and the test's copy of that pipe's write end."""
    address = str(ws_run[0] / "holder.sock")
    with holder_socket(address) as server:
        argv = ["python3", "-c", HAND_OUT, address]
        with nsconfine.spawn(plan, argv, stdout=PIPE) as sandbox:
            connection, _ = server.accept()
            with connection:
                held = receive_fd(connection)
            try:
                yield sandbox, held
            finally:
                os.close(held)


def test_communicate_takes_no_more_than_a_pipe_held_outside_held_at_the_end(
    ws_run: tuple[Path, Path], plan: nsconfine.Plan
) -> None:
    """A process outside the session that keeps filling the stdout the session handed it
    (another session of the workspace can, over a socket there): once the session has ended,
    communicate() returns what it wrote and what the pipe held then (a pipe holds 1 MiB at
    most), and closes its end (the writer gets EPIPE). It read for as long as the writer
    wrote: an attacker's pass had it buffer 2 GiB."""
    with _stdout_handed_out(ws_run, plan) as (sandbox, held):
        flood = Flood(held)
        try:
            assert sandbox.wait(60) == 0
            assert sandbox.stdout is not None
            flood.until_full(sandbox.stdout.fileno())
            outcome = outcome_without_hanging(
                lambda: sandbox.communicate(timeout=60), "a pipe filled from outside"
            )
            assert flood.ended(), "communicate left its end of the pipe open"
        finally:
            flood.stop()
    assert isinstance(outcome, tuple), outcome
    stdout, _stderr = outcome
    assert stdout is not None
    assert stdout.startswith(b"handed out\n")
    assert len(stdout) <= len(b"handed out\n") + (1 << 20), len(stdout)


def test_communicate_input_needs_a_stdin_pipe(plan: nsconfine.Plan) -> None:
    """Input for a command whose stdin is no pipe is refused, not dropped."""
    with nsconfine.spawn(plan, ["/bin/true"], stdout=PIPE) as sandbox:
        with pytest.raises(nsconfine.UsageError, match="stdin=PIPE"):
            sandbox.communicate(b"lost")
        assert sandbox.communicate() == (b"", None)


@pytest.mark.parametrize("closed", ["stdin", "stdout", "stderr"])
def test_communicate_after_the_caller_closed_a_pipe_is_popen_s(
    plan: nsconfine.Plan, closed: str
) -> None:
    """An output pipe of the handle the caller closed itself is left out, as Popen leaves it
    (what is read of it: b""), and so is a stdin it closed (where Popen's raises): it raised a
    bare ValueError (attacker's pass, stop 41). Input for a stdin the caller closed is
    refused, not dropped."""
    argv = ["/bin/sh", "-c", "sleep 0.5; echo out; echo err >&2"]  # (the pipe closed by then)
    expected = (b"out\n", b"err\n")
    if closed != "stdin":
        with subprocess.Popen(argv, stdin=PIPE, stdout=PIPE, stderr=PIPE) as host:
            getattr(host, closed).close()
            expected = host.communicate(timeout=60)
    with nsconfine.spawn(plan, argv, stdin=PIPE, stdout=PIPE, stderr=PIPE) as sandbox:
        getattr(sandbox, closed).close()
        if closed == "stdin":
            with pytest.raises(nsconfine.UsageError, match="closed"):
                sandbox.communicate(b"lost")
        assert sandbox.communicate(timeout=60) == expected


def test_a_pipe_closed_between_two_communicate_calls_is_left_out(plan: nsconfine.Plan) -> None:
    """communicate() timed out, the caller closed the handle's stdout, and a file of its own
    took the number: the next communicate() read that file into the session's output (or, of
    stdin, wrote the session's input into it; or raised on the sentinel's copy, which took
    the number) (the review of c4250d7, stop 41). A pipe closed since is left out."""
    argv = ["/bin/sh", "-c", "echo out; exec sleep 60"]
    with nsconfine.spawn(plan, argv, stdout=PIPE) as sandbox:
        with pytest.raises(subprocess.TimeoutExpired):
            sandbox.communicate(timeout=1)
        assert sandbox.stdout is not None
        number = sandbox.stdout.fileno()
        sandbox.stdout.close()
        read_end, write_end = os.pipe()  # the caller's own, at the number if it is free
        os.write(write_end, b"FOREIGN\n")
        taken = os.dup2(read_end, number) if read_end != number else number
        try:
            sandbox.kill()
            out, _ = sandbox.communicate(timeout=60)
        finally:
            for fd in {read_end, write_end, taken}:
                os.close(fd)
    assert out == b"out\n"


def test_a_wait_longer_than_poll_can_count_waits() -> None:
    """wait_fd (Sandbox.wait's, and the CLI's) with a timeout past poll()'s int of ms (a
    broker's float('inf'), `--grace 1e300` once a signal came) waits: no OverflowError."""
    from nsconfine._kernel.syscalls import wait_fd

    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"x")
        assert wait_fd(read_end, float("inf"))
        assert wait_fd(read_end, 1e300)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_wait_is_not_misled_by_another_thread_reaping_the_session(plan: nsconfine.Plan) -> None:
    """wait() looked at returncode, then waited on the sentinel itself: another thread that
    reaped the session in between closed it, and a socket opened then took its number, on
    which wait() then waited for good (its review, stop 39). It waits on a copy taken under
    the lock the end closes the sentinel under. A trace hook holds the waiting thread at its
    wait, while this one reaps and opens a socket pair."""
    import socket
    import sys
    import threading

    sandbox = nsconfine.spawn(plan, ["true"])
    while not os.waitid(os.P_PID, sandbox.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
        time.sleep(0.01)  # ended, not reaped yet
    at_wait, go_on = threading.Event(), threading.Event()
    result: list[int] = []

    def held_at_the_wait(frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_name == "wait_fd" and not at_wait.is_set():
            at_wait.set()
            go_on.wait(30)
        return None

    def waiter() -> None:
        sys.settrace(held_at_the_wait)
        result.append(sandbox.wait())

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert at_wait.wait(5)
    assert sandbox.poll() == 0  # reaped here: its sentinel closed, its number free
    pair = socket.socketpair()
    go_on.set()
    thread.join(20)
    for end in pair:
        end.close()
    assert result == [0], "wait() was left waiting on a socket that took the sentinel's number"
