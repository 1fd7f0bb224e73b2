"""nsconfine.aio, the asyncio front, on real sessions: many sessions from one loop with no
thread each, streams for the pipes, a Pool front, a cancelled launch that leaves nothing, and
`import nsconfine` that brings no asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import HAND_OUT, Flood, holder_socket, pids_with, receive_fd, wait_until_gone

import nsconfine
import nsconfine.aio
from nsconfine._pool import MAX_SIZE

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]

PIPE = asyncio.subprocess.PIPE
# Reads a line, answers it with its own number, exits with a status of its own: every session
# differs, and each waits for its line, so all are running at once until they get it.
ANSWER = 'read line; echo "$line $1"; exit $(($1 % 7))'


@pytest.fixture
def fds_for_64_sessions() -> Iterator[None]:
    """A soft RLIMIT_NOFILE that 64 live sessions fit in (each holds about 30 fds in the
    launcher, one per protected path it stubs: a broker raises its limit the same way, as
    examples/systemd's unit does), up to the hard limit; restored afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.usefixtures("fds_for_64_sessions")
def test_64_sessions_run_at_once_from_one_loop_with_no_thread_each(plan: nsconfine.Plan) -> None:
    """64 aio.spawn calls gathered on one loop all run at once (each waits for its input),
    hold no thread while they run (only the executor's few, made for the launches), and each
    gives its own output and status to communicate()."""
    count = 64

    async def main() -> tuple[list[int | None], int, list[tuple[bytes | None, bytes | None]]]:
        before = threading.active_count()
        launched = await asyncio.gather(
            *(
                nsconfine.aio.spawn(
                    plan, ["/bin/sh", "-c", ANSWER, "sh", str(n)], stdin=PIPE, stdout=PIPE
                )
                for n in range(count)
            ),
            return_exceptions=True,
        )
        processes = [one for one in launched if isinstance(one, nsconfine.aio.Process)]
        async with contextlib.AsyncExitStack() as ending:  # a failed check leaves none running
            for process in processes:
                await ending.enter_async_context(process)
            assert len(processes) == count, [str(one) for one in launched if one not in processes]
            running = [process.returncode for process in processes]
            threads = threading.active_count() - before
            outputs = await asyncio.gather(
                *(
                    process.communicate(f"line{n}".encode() + b"\n")
                    for n, process in enumerate(processes)
                )
            )
            statuses = [process.returncode for process in processes]
        assert statuses == [n % 7 for n in range(count)]
        return running, threads, outputs

    running, threads, outputs = asyncio.run(main())
    assert running == [None] * count  # every one still waiting for its line
    assert threads <= min(32, (os.cpu_count() or 1) + 4)  # the default executor's most
    assert outputs == [(f"line{n} {n}\n".encode(), None) for n in range(count)]


def test_the_streams_are_asyncio_streams(plan: nsconfine.Plan) -> None:
    """PIPE gives a StreamWriter for stdin and StreamReaders for stdout and stderr; the
    handle has pid, args, and wait(), kill() and the other signals as asyncio's Process."""
    argv = ["/bin/sh", "-c", "read line; echo out $line; echo err >&2; read again; exit 5"]

    async def main() -> list[object]:
        seen: list[object] = []
        process = await nsconfine.aio.spawn(plan, argv, stdin=PIPE, stdout=PIPE, stderr=PIPE)
        async with process:
            assert process.stdin is not None
            assert process.stdout is not None
            assert process.stderr is not None
            seen += [process.args, process.pid == process.sandbox.pid, process.returncode]
            process.stdin.write(b"one\n")
            await process.stdin.drain()
            seen += [await process.stdout.readline(), await process.stderr.readline()]
            process.stdin.write(b"two\n")
            process.stdin.close()
            seen.append(await process.wait())
        killed = await nsconfine.aio.spawn(plan, ["/bin/sleep", "600"])
        killed.kill()
        seen.append(await killed.wait())
        return seen

    assert asyncio.run(main()) == [argv, True, None, b"out one\n", b"err\n", 5, -9]


def test_an_aio_pool_s_size_is_a_number_up_to_its_bound(plan: nsconfine.Plan) -> None:
    """aio.Pool checks its options as nsconfine.Pool does: a size of True, or past the bound
    (thousands of sandboxes of one account, staged once it was entered), is refused as it is
    made."""
    for size in (True, 0, MAX_SIZE + 1, 10**9):
        with pytest.raises(nsconfine.UsageError, match=f"from 1 to {MAX_SIZE}"):
            nsconfine.aio.Pool(plan, size=size)
    with pytest.raises(nsconfine.UsageError, match="idle_timeout"):
        nsconfine.aio.Pool(plan, idle_timeout=True)
    assert nsconfine.aio.Pool(plan, size=MAX_SIZE).size == MAX_SIZE  # never entered: none staged


def test_a_pool_closed_before_its_first_use_launches_nothing(plan: nsconfine.Plan) -> None:
    """An aio.Pool closed before it was entered or launched from is closed: a launch raises
    UsageError, as nsconfine.Pool's after close() does (it made its Pool there and ran the
    command: an attacker's pass), nothing is staged, and entering it stages nothing; one
    closed after use likewise refuses a launch."""

    async def main() -> tuple[bool, bool]:
        never_used = nsconfine.aio.Pool(plan)
        used = nsconfine.aio.Pool(plan)
        try:
            await never_used.aclose()
            with pytest.raises(nsconfine.UsageError, match="the pool is closed"):
                await never_used.launch(["true"])
            staged = await never_used.wait_staged(0)
            async with never_used:
                pass
            async with used:
                pass
            with pytest.raises(nsconfine.UsageError, match="the pool is closed"):
                await used.launch(["true"])
            return staged, never_used._pool is None
        finally:
            await never_used.aclose()  # what the code before made, if it made one
            await used.aclose()

    assert asyncio.run(main()) == (False, True)


def test_a_pool_launches_from_the_loop(plan: nsconfine.Plan) -> None:
    """aio.Pool stages through nsconfine.Pool and launches from the loop, each launch with
    its own env; a bad option is refused as the pool is made, before anything is staged."""
    with pytest.raises(nsconfine.UsageError, match="size"):
        nsconfine.aio.Pool(plan, size=0)

    async def main() -> list[tuple[bytes | None, bytes | None]]:
        async with nsconfine.aio.Pool(plan, size=2) as pool:
            assert await pool.wait_staged(60)
            processes = await asyncio.gather(
                *(
                    pool.launch(["/bin/sh", "-c", "echo $N"], env={"N": str(n)}, stdout=PIPE)
                    for n in range(8)
                )
            )
            return [await process.communicate() for process in processes]

    assert asyncio.run(main()) == [(f"{n}\n".encode(), None) for n in range(8)]


def test_untrusted_config_as_another_thread_reaps_the_session(plan: nsconfine.Plan) -> None:
    """untrusted_config() read the session's sentinel after another thread (a poll() of the
    Sandbox, as the module allows) had reaped the session and let it go: a ValueError for a
    -1, or a look at whatever fd took the number (the review of 78da4fb, stop 41). The
    reap is made to come there by a trace hook at the line that looks; the report is given."""
    import linecache

    async def main() -> list[str] | None:
        process = await nsconfine.aio.spawn(plan, ["/bin/true"])
        async with process:
            while not _ended(process.sandbox):
                await asyncio.sleep(0.01)
            fired: list[bool] = []

            def traced(frame: Any, event: str, arg: Any) -> Any:
                if (
                    frame.f_code.co_name != "untrusted_config"
                    or "aio" not in frame.f_code.co_filename
                ):
                    return None

                def line(frame: Any, event: str, arg: Any) -> Any:
                    here = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
                    if event == "line" and "self.sandbox" in here and not fired:
                        fired.append(True)
                        process.sandbox.poll()  # (another thread's, at this very moment)
                    return line

                return line

            sys.settrace(traced)
            try:
                return await process.untrusted_config()
            finally:
                sys.settrace(None)

    assert asyncio.run(main()) == []


def _ended(sandbox: nsconfine.Sandbox) -> bool:
    """Has sandbox's session ended (its reaper a zombie), without reaping it?"""
    return os.waitid(os.P_PID, sandbox.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def test_untrusted_config_is_awaited_off_the_loop(
    plan: nsconfine.Plan, ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session that made a repository in its workspace: the report that names its config
    (a rescan of the workspace and, for an index, the host's git: seconds, in the worst case)
    is awaited from the loop and made in the executor, never on the loop's own thread; None
    while the session runs, as the Sandbox's."""
    from nsconfine._plan.protect import written_config

    workspace = ws_run[0]
    made_in: list[threading.Thread] = []

    def recorded(*args: object) -> list[str]:
        made_in.append(threading.current_thread())
        return written_config(*args)  # type: ignore[arg-type]

    monkeypatch.setattr("nsconfine._launch.sandbox.written_config", recorded)
    script = (
        f"read line; mkdir -p {workspace}/app/.git && echo '[core]' > {workspace}/app/.git/config"
    )

    async def main() -> tuple[list[str] | None, list[str] | None]:
        process = await nsconfine.aio.spawn(plan, ["/bin/sh", "-c", script], stdin=PIPE)
        async with process:
            running = await process.untrusted_config()
            await process.communicate(b"go\n")
            return running, await process.untrusted_config()

    running, ended = asyncio.run(main())
    assert running is None
    assert str(workspace / "app" / ".git" / "config") in (ended or [])
    assert made_in
    assert threading.main_thread() not in made_in


def test_a_cancelled_launch_leaves_nothing_running(plan: nsconfine.Plan, tmp_path: Path) -> None:
    """A launch whose caller is cancelled while the executor runs it: the session it started
    is killed and reaped (asyncio.run waits for the executor before it returns)."""
    marker = f"nsconfine-cancelled-{os.getpid()}"

    async def main() -> None:
        launch = asyncio.ensure_future(
            nsconfine.aio.spawn(plan, ["/bin/sh", "-c", "exec sleep 600", marker])
        )
        await asyncio.sleep(0)  # the launch is in the executor now
        launch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await launch

    asyncio.run(main())
    assert wait_until_gone(marker) == []
    assert pids_with(marker) == []


def test_a_pool_whose_first_launch_is_cancelled_is_closed_whole(plan: nsconfine.Plan) -> None:
    """The first launch of an aio.Pool makes its Pool in the executor; cancelled meanwhile,
    the Pool made was dropped, with its staged sandboxes and its refill thread, and aclose()
    closed nothing. It is kept, and aclose() tears it down: nothing of it is left."""
    import psutil

    before = {child.pid for child in psutil.Process().children(recursive=True)}

    async def main() -> None:
        pool = nsconfine.aio.Pool(plan, size=2)
        launch = asyncio.ensure_future(pool.launch(["/bin/sleep", "600"]))
        await asyncio.sleep(0)  # making the Pool, in the executor
        launch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await launch
        await asyncio.sleep(0.5)  # staging, were the Pool lost
        await pool.aclose()

    asyncio.run(main())
    left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    assert left == []
    assert not [t for t in threading.enumerate() if t.name == "nsconfine-pool"]


def test_bad_arguments_are_a_usage_error_from_the_await(plan: nsconfine.Plan) -> None:
    """What spawn refuses, aio.spawn refuses the same way, and input without a stdin pipe."""

    async def main() -> None:
        with pytest.raises(nsconfine.UsageError, match="argv"):
            await nsconfine.aio.spawn(plan, "/bin/true")
        with pytest.raises(nsconfine.UsageError, match="tty=True"):
            await nsconfine.aio.spawn(plan, ["/bin/true"], stdout=PIPE, tty=True)
        async with await nsconfine.aio.spawn(plan, ["/bin/true"]) as process:
            with pytest.raises(nsconfine.UsageError, match="stdin=PIPE"):
                await process.communicate(b"lost")
        # input that is no bytes, as Sandbox.communicate refuses it (attackers' pass: an
        # AssertionError from asyncio's transport, and `cat` left waiting for good)
        async with await nsconfine.aio.spawn(plan, ["cat"], stdin=PIPE) as process:
            with pytest.raises(nsconfine.UsageError, match="bytes"):
                await process.communicate("text")  # type: ignore[arg-type]

    asyncio.run(main())


def test_communicate_ends_a_pipe_held_outside_once_the_session_has_ended(
    ws_run: tuple[Path, Path], plan: nsconfine.Plan
) -> None:
    """Process.communicate, as Sandbox.communicate: the stdout the session handed to the
    test (which keeps it open) gives what the session wrote and then ends with the session,
    with no EOF from the test's copy."""
    address = str(ws_run[0] / "holder.sock")

    async def main() -> tuple[bytes | None, bytes | None]:
        with holder_socket(address) as server:
            server.setblocking(False)
            argv = ["python3", "-c", HAND_OUT, address]
            process = await nsconfine.aio.spawn(plan, argv, stdout=PIPE)
            loop = asyncio.get_running_loop()
            connection, _ = await loop.sock_accept(server)
            with connection:
                held = await loop.run_in_executor(None, receive_fd, connection)
                try:
                    return await asyncio.wait_for(process.communicate(), 60)
                finally:
                    os.close(held)

    assert asyncio.run(main()) == (b"handed out\n", None)


def test_communicate_stops_feeding_a_stdin_held_outside_once_the_session_has_ended(
    ws_run: tuple[Path, Path], plan: nsconfine.Plan
) -> None:
    """Process.communicate(input=...), as Sandbox.communicate: a session that hands its stdin
    to a process outside (which keeps it, reading nothing) and ends: the input left unwritten
    is dropped once the session has ended, and communicate returns (attackers' pass: it
    waited on the full pipe for as long as the holder lived)."""
    address = str(ws_run[0] / "holder.sock")
    hand_out_stdin = HAND_OUT.replace('array.array("i", [1])', 'array.array("i", [0])')
    assert hand_out_stdin != HAND_OUT

    async def main() -> tuple[bytes | None, bytes | None]:
        with holder_socket(address) as server:
            server.setblocking(False)
            argv = ["python3", "-c", hand_out_stdin, address]
            process = await nsconfine.aio.spawn(plan, argv, stdin=PIPE, stdout=PIPE)
            loop = asyncio.get_running_loop()
            connection, _ = await loop.sock_accept(server)
            with connection:
                held = await loop.run_in_executor(None, receive_fd, connection)
                try:
                    return await asyncio.wait_for(process.communicate(b"z" * (1 << 20)), 20)
                finally:
                    os.close(held)

    assert asyncio.run(main()) == (b"handed out\n", None)


def test_communicate_takes_no_more_than_a_pipe_held_outside_held_at_the_end(
    ws_run: tuple[Path, Path], plan: nsconfine.Plan
) -> None:
    """Process.communicate, as Sandbox.communicate: a process outside that keeps filling the
    stdout the session handed it gets EPIPE once the session has ended and its output is
    read, and the loop reports no error meanwhile (the transport was left reading after its
    reader's EOF: each later chunk an AssertionError the loop logged, 87,670 in ten seconds
    in an attacker's pass)."""
    address = str(ws_run[0] / "holder.sock")
    errors: list[dict[str, object]] = []

    async def main() -> tuple[bytes | None, bytes | None]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        with holder_socket(address) as server:
            server.setblocking(False)
            argv = ["python3", "-c", HAND_OUT, address]
            process = await nsconfine.aio.spawn(plan, argv, stdout=PIPE)
            connection, _ = await loop.sock_accept(server)
            with connection:
                held = await loop.run_in_executor(None, receive_fd, connection)
            flood = Flood(held)
            try:
                await process.wait()
                assert process.sandbox.stdout is not None
                read_end = process.sandbox.stdout.fileno()
                await loop.run_in_executor(None, flood.until_full, read_end)
                outputs = await asyncio.wait_for(process.communicate(), 60)
                ended = await loop.run_in_executor(None, flood.ended)
                assert ended, "communicate left its end of the pipe open"
                await asyncio.sleep(0.2)  # what the loop would report, if anything
                return outputs
            finally:
                flood.stop()
                os.close(held)
                await process.__aexit__(None, None, None)

    stdout, _stderr = asyncio.run(main())
    assert stdout is not None
    assert stdout.startswith(b"handed out\n")
    # What the pipe held at the end, and what the loop had read before (its reader pauses the
    # transport past twice its 64 KiB limit; the transport reads 256 KiB at a time).
    assert len(stdout) <= len(b"handed out\n") + (1 << 20) + (512 << 10), len(stdout)
    assert errors == []


def test_import_nsconfine_brings_no_asyncio_or_subprocess() -> None:
    """`import nsconfine` (and a spawn's modules) loads neither asyncio nor subprocess (a
    launcher's start-up pays for what it uses); nsconfine.aio brings asyncio, and naming
    nsconfine.TimeoutExpired brings subprocess, whose TimeoutExpired it subclasses."""
    probe = (
        "import sys, nsconfine, nsconfine._gate\n"
        "print(sorted(m for m in ('asyncio', 'subprocess') if m in sys.modules))\n"
        "assert issubclass(nsconfine.TimeoutExpired, __import__('subprocess').TimeoutExpired)\n"
        "import nsconfine.aio\n"
        "print(sorted(m for m in ('asyncio', 'subprocess') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", check=True
    )
    assert result.stdout.split("\n")[:2] == ["[]", "['asyncio', 'subprocess']"]


def test_a_session_s_end_is_reaped_off_the_loop(plan: nsconfine.Plan) -> None:
    """A session's end takes the lock of its account's mount-point records (its stubs go) and
    ends its proxy session (which waits for its connections): seconds, if another launcher of
    the account holds that lock or a connection is stuck in a name lookup. It is reaped in the
    executor, and the loop runs on meanwhile: here a ticker, ticking while another holder has
    the lock, is what lets it go. Reaped on the loop, the end stalled it for as long as the
    lock was held (attacker's pass, stop 33: 2.1 s; 7.7 s for two proxy sessions' ends)."""
    from nsconfine._kernel import stub_records

    held, let_go = threading.Event(), threading.Event()
    released: list[bool] = []

    def holder() -> None:
        with stub_records.records_locked():
            held.set()
            released.append(let_go.wait(30))  # (the ticker lets it go, if the loop runs)

    async def main() -> tuple[int, int]:
        process = await nsconfine.aio.spawn(plan, ["/bin/true"])
        thread = threading.Thread(target=holder)
        thread.start()
        held.wait(30)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while ticks < 20:
                await asyncio.sleep(0.01)
                ticks += 1
            let_go.set()

        ticking = asyncio.ensure_future(ticker())
        status = await process.wait()
        await ticking
        thread.join()
        return status, ticks

    assert asyncio.run(main()) == (0, 20)
    assert released == [True], "the loop stood still until the lock's holder gave up"


def test_a_sandbox_reaped_under_a_pending_wait_leaves_that_wait_and_the_next_whole(
    plan: nsconfine.Plan,
) -> None:
    """The caller reaps the session itself (sandbox.poll(), or untrusted_config) while a
    wait() watches its sentinel: that wait returns the status, and the next session's, whose
    sentinel takes the same fd number, does too. The loop watched the closed fd: both waits
    hung for good (attacker's pass, stop 33)."""

    async def main() -> tuple[int, int]:
        process = await nsconfine.aio.spawn(plan, ["/bin/sh", "-c", "exit 7"])
        waiting = asyncio.ensure_future(process.wait())
        await asyncio.sleep(0)  # (the watch is set)
        assert process.sandbox.wait(30) == 7  # (blocking the loop: reaped under the watch)
        first = await asyncio.wait_for(waiting, 30)
        second = await nsconfine.aio.spawn(plan, ["/bin/sh", "-c", "exit 5"])
        return first, await asyncio.wait_for(second.wait(), 30)

    assert asyncio.run(main()) == (7, 5)


def test_async_with_closes_the_session_s_terminal(plan: nsconfine.Plan) -> None:
    """`async with` a tty session's Process ends with the terminal's controller closed, as
    `with` a Sandbox does: a broker keeping its sessions' handles kept one fd each (attacker's
    pass, stop 33)."""

    def controllers() -> int:
        fds = os.listdir("/proc/self/fd")
        return sum(1 for fd in fds if _link(f"/proc/self/fd/{fd}").endswith("ptmx"))

    async def main() -> nsconfine.aio.Process:
        async with await nsconfine.aio.spawn(plan, ["/bin/true"], tty=True) as process:
            assert process.sandbox.tty >= 0
        return process  # (kept, as a broker keeps its sessions' records)

    before = controllers()
    kept = asyncio.run(main())
    assert controllers() == before, kept


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def test_limit_sets_what_a_stream_reads_in_a_line(plan: nsconfine.Plan) -> None:
    """A line longer than asyncio's 64 KiB default (an agent's JSON event, say) is read whole
    with limit= raised, from aio.spawn and from an aio.Pool's launch, as from asyncio's own
    create_subprocess_exec; a limit that is no size is a usage error, and nothing runs
    (attacker's pass, stop 33: there was no limit=, and every readline() of such a line
    raised ValueError)."""
    line = ["python3", "-c", "print('x' * 300_000)"]

    async def main() -> tuple[int, int]:
        spawned = await nsconfine.aio.spawn(plan, line, stdout=PIPE, limit=1 << 20)
        assert spawned.stdout is not None
        first = len(await spawned.stdout.readline())
        await spawned.wait()
        async with nsconfine.aio.Pool(plan) as pool:
            launched = await pool.launch(line, stdout=PIPE, limit=1 << 20)
            assert launched.stdout is not None
            second = len(await launched.stdout.readline())
            await launched.wait()
            for bad in (0, -1, "big", True):
                with pytest.raises(nsconfine.UsageError, match="limit"):
                    await pool.launch(line, limit=bad)  # type: ignore[arg-type]
        with pytest.raises(nsconfine.UsageError, match="limit"):
            await nsconfine.aio.spawn(plan, ["touch", "ran"], limit=0)
        return first, second

    assert asyncio.run(main()) == (300_001, 300_001)
    assert not os.path.exists(os.path.join(plan.chdir, "ran"))


def test_kill_while_an_end_is_reaped_does_not_stall_the_loop(plan: nsconfine.Plan) -> None:
    """The session has ended and its end is being reaped in the executor (waiting for the
    records' lock another launcher holds): kill(), which a caller whose wait_for timed out
    calls next, returns at once (the session has ended: nothing to signal). It waited for the
    handle's lock, which the reap holds, on the loop (hostile review, stop 33); here a ticker
    that lets the lock's holder go must get to run."""
    from nsconfine._kernel import stub_records

    held, let_go = threading.Event(), threading.Event()
    released: list[bool] = []

    def holder() -> None:
        with stub_records.records_locked():
            held.set()
            released.append(let_go.wait(30))

    async def main() -> int:
        process = await nsconfine.aio.spawn(plan, ["/bin/true"])
        thread = threading.Thread(target=holder)
        thread.start()
        held.wait(30)
        waiting = asyncio.ensure_future(process.wait())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiting), 0.5)  # (its reap waits: the lock)
        process.kill()
        process.terminate()
        process.send_signal(15)

        async def ticker() -> None:
            for _ in range(5):
                await asyncio.sleep(0.01)
            let_go.set()

        await ticker()
        status = await waiting
        thread.join()
        return status

    assert asyncio.run(main()) == 0
    assert released == [True], "the loop stood still until the lock's holder gave up"


def test_a_loop_closed_while_it_watched_a_session_keeps_no_fd_of_it(
    plan: nsconfine.Plan,
) -> None:
    """A loop per job, whose wait timed out and which killed its session and closed: the copy
    of the sentinel it watched goes with the handle, and a session ending as the loop shuts
    its executor down is reaped all the same, without a traceback. Each such job kept a pidfd
    for good (hostile review, stop 33)."""

    def pidfds() -> int:
        fds = os.listdir("/proc/self/fd")
        return sum(1 for fd in fds if _link(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]")

    async def one() -> None:
        process = await nsconfine.aio.spawn(plan, ["/bin/sleep", "0.5"])
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(process.wait(), 0.1)
        process.kill()

    before = pidfds()
    for _ in range(5):
        asyncio.run(one())
    import gc

    gc.collect()
    nsconfine.spawn(plan, ["/bin/true"]).wait()  # (reaps the handles dropped unwaited)
    gc.collect()
    assert pidfds() == before


@contextlib.contextmanager
def _no_fd_free() -> Iterator[None]:
    """The block runs with no fd free: the soft RLIMIT_NOFILE just above the highest fd open,
    and every number below it taken by /dev/null; all given back after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    try:
        top = max(map(int, os.listdir("/proc/self/fd")))
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 8, hard))
        with contextlib.suppress(OSError):
            while True:
                fillers.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_wait_short_of_fds_leaves_the_loop_running(plan: nsconfine.Plan) -> None:
    """wait() watches a copy of the session's sentinel; a launcher out of fds cannot make one.
    That was taken for "reaped just now", and the session then waited for on the loop's own
    thread, which stopped every other coroutine until it ended (attacker's pass, stop 39: a
    session that never ends froze the broker for good). Here the loop itself must end the
    session it waits for; a timer thread (which then fails the test) is the guard."""

    async def main() -> tuple[int, bool]:
        process = await nsconfine.aio.spawn(plan, ["sleep", "1000"])
        guard_fired = threading.Event()

        def guard() -> None:
            guard_fired.set()
            process.sandbox.kill()

        timer = threading.Timer(60, guard)
        timer.start()
        try:
            with _no_fd_free():
                waiting = asyncio.ensure_future(process.wait())
                await asyncio.sleep(0.2)  # the wait has started, short of fds
            process.kill()  # only if the loop still runs
            status = await waiting
        finally:
            timer.cancel()
        return status, guard_fired.is_set()

    status, guard_fired = asyncio.run(main())
    assert not guard_fired, "the loop stood still in wait() until the guard ended the session"
    assert status == -9


def test_a_wait_short_of_fds_holds_no_executor_thread(plan: nsconfine.Plan) -> None:
    """A wait that could not copy the sentinel (the launcher out of fds) waited in the
    executor, a thread for the session's whole life: a few such sessions took every thread of
    the default executor, which launches and reaps need (its review, stop 39). It holds none:
    with an executor of one thread, the loop's next call there is done while the session still
    runs."""
    from concurrent.futures import ThreadPoolExecutor

    async def main() -> tuple[bool, int]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        process = await nsconfine.aio.spawn(plan, ["sleep", "1000"])
        guard = threading.Timer(60, process.sandbox.kill)
        guard.start()
        with _no_fd_free():
            waiting = asyncio.ensure_future(process.wait())
            await asyncio.sleep(0.2)  # the wait has started, short of fds
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: None)
        still_running = process.returncode is None
        process.kill()
        status = await waiting
        guard.cancel()
        return still_running, status

    still_running, status = asyncio.run(main())
    assert still_running, "the executor's one thread was held by the wait until the session ended"
    assert status == -9


def _out_of_epoll_watches(*_args: object) -> None:
    raise OSError(28, "No space left on device")  # epoll_ctl: fs.epoll.max_user_watches spent


def test_a_loop_out_of_epoll_watches_still_sees_the_session_end(plan: nsconfine.Plan) -> None:
    """A loop that cannot watch the session's sentinel (its account's epoll watches all taken,
    by a session of the same account: an unprivileged launcher's sessions run as itself)
    looks for the end without it, and wait() gives the status (it raised the loop's OSError:
    the broker could not wait for the session that held them; attacker's pass, stop 42)."""

    async def main() -> int:
        process = await nsconfine.aio.spawn(plan, ["/bin/sh", "-c", "exit 7"])
        loop = asyncio.get_running_loop()
        loop.add_reader = _out_of_epoll_watches  # type: ignore[method-assign,assignment]
        return await asyncio.wait_for(process.wait(), 60)

    assert asyncio.run(main()) == 7


@pytest.mark.parametrize("pipe", ["stdout", "stdin"])
def test_a_loop_out_of_epoll_watches_refuses_a_piped_launch(
    plan: nsconfine.Plan, pipe: str
) -> None:
    """A loop that cannot watch a session's pipes refuses the launch with a stable code, saying
    why, and the session is killed (the pipe was left unwatched, its output never read, and
    the loop logged the OSError; stdin, a review of the fix: communicate() raised it)."""
    marker = f"nsconfine-unwatched-{os.getpid()}"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for name in ("add_reader", "_add_reader", "add_writer", "_add_writer"):
            setattr(loop, name, _out_of_epoll_watches)
        stdin, stdout = (subprocess.PIPE, None) if pipe == "stdin" else (None, subprocess.PIPE)
        with pytest.raises(nsconfine.SandboxUnavailable, match="epoll watches"):
            await nsconfine.aio.spawn(
                plan, ["/bin/sh", "-c", "exec sleep 600", marker], stdin=stdin, stdout=stdout
            )

    asyncio.run(main())  # (it waits for the executor, which discards the session)
    assert wait_until_gone(marker) == []
