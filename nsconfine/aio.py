"""nsconfine for asyncio: spawn and Pool for a launcher that is an event loop (a broker).

    process = await nsconfine.aio.spawn(plan, ["make", "test"], stdout=asyncio.subprocess.PIPE)
    output, _ = await process.communicate()

    async with nsconfine.aio.Pool(plan, size=4) as pool:
        process = await pool.launch(["make", "test"])
        status = await process.wait()

A thin front, no second way in: aio.spawn calls nsconfine.spawn and aio.Pool's launch a
nsconfine.Pool's, through the same gate. How the loop is never stalled:
- The blocking part of a launch (staging: the gate's checks while bwrap builds the sandbox and
  the launcher checks it, tens of ms; or a pool's hand-off, a few ms, and its inline refill)
  runs in the loop's default executor (loop.run_in_executor), as do a Pool's start and close.
- A running session holds no thread: its end is awaited with loop.add_reader on a copy of the
  handle's sentinel (the reaper's pidfd, readable once the session has ended), and it is then
  reaped in the executor (its mount points removed under a lock its account's launchers share,
  its proxy session ended); its pipes are the loop's own pipe transports, as
  asyncio.StreamWriter (stdin) and asyncio.StreamReader (stdout, stderr).
What stall is left is the executor threads' turns at the GIL (the Python half of staging):
benchmarks/bench_aio.py measures the loop's worst stall with launches made either way.

A launch whose caller is cancelled leaves nothing running: the session it started, if it got
that far, is killed and reaped in the executor. Only callers that import nsconfine.aio import
asyncio (`import nsconfine` does not).
"""

from __future__ import annotations

import asyncio
import functools
import os
import select
import signal
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from nsconfine import _pool
from nsconfine._errors import SandboxUnavailable, UsageError
from nsconfine._gate import spawn as _spawn
from nsconfine._launch.sandbox import bytes_held

if TYPE_CHECKING:
    from typing import IO, Unpack

    from nsconfine._launch.handoff import LaunchOptions
    from nsconfine._launch.sandbox import Sandbox
    from nsconfine._plan.model import Plan
    from nsconfine._pool import Refill

__all__ = ["Pool", "Process", "spawn"]


# What a stream reader buffers at most, as asyncio.subprocess's: readline() refuses a longer
# line (ValueError); limit= raises it (an agent's JSON event lines run longer).
STREAM_LIMIT = 2**16


async def spawn(
    plan: Plan, argv: Sequence[str], *, limit: int = STREAM_LIMIT, **options: Unpack[LaunchOptions]
) -> Process:
    """nsconfine.spawn for asyncio: run argv confined by plan, return once it has exec'd.
    The keywords are spawn's (env, stdin, stdout, stderr, tty); a stdio given as PIPE
    (subprocess's or asyncio.subprocess's) is the handle's stream, whose buffer limit is limit
    (as asyncio.create_subprocess_exec's)."""
    limit = _checked_limit(limit)
    return await _launched(functools.partial(_spawn, plan, argv, **options), limit)


class Process:
    """A running session for asyncio, shaped like asyncio.subprocess.Process (made by
    aio.spawn and aio.Pool.launch, never by hand).

    pid, args, returncode   as the Sandbox's (returncode: None until wait() has seen the end)
    stdin                   an asyncio.StreamWriter for a stdin launched with PIPE, else None
    stdout, stderr          asyncio.StreamReaders for those launched with PIPE, else None
    sandbox                 the Sandbox beneath, for its timings, plan, child_pid,
                            command_pid and tty; its wait, communicate and untrusted_config
                            block, so a loop awaits these instead

    `async with` kills the session on the way out, waits for it and closes its streams.
    """

    __slots__ = (
        "_end_was_seen",
        "_ended",
        "_loop",
        "_read_fds",
        "_transports",
        "_watched",
        "sandbox",
        "stderr",
        "stdin",
        "stdout",
    )
    sandbox: Sandbox
    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None
    stderr: asyncio.StreamReader | None
    _loop: asyncio.AbstractEventLoop
    _ended: asyncio.Future[None] | None
    _watched: _Watch | None  # the loop's copy of the sentinel, while it watches it
    _end_was_seen: bool  # the loop has seen the session's end (it is being reaped, or was)
    _read_fds: list[tuple[asyncio.StreamReader, int, asyncio.ReadTransport]]
    _transports: list[asyncio.BaseTransport]

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        raise TypeError("Process handles come from nsconfine.aio.spawn or Pool.launch")

    @classmethod
    async def _connected(cls, sandbox: Sandbox, limit: int) -> Process:
        """The handle of a launched sandbox, its pipes connected to the running loop."""
        self = object.__new__(cls)
        self.sandbox = sandbox
        self._loop = asyncio.get_running_loop()
        self._ended = None
        self._watched = None
        self._end_was_seen = False
        self._read_fds = []
        self._transports = []  # the loop's, which own the pipes from here on
        self.stdin = self.stdout = self.stderr = None
        try:
            if sandbox.stdin is not None:
                # The stream protocol gives drain() its flow control and wait_closed() its
                # end; its reader is never fed (a write pipe has nothing to read).
                protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())
                stdin = sandbox.stdin.fileno()
                _refuse_unwatchable(self._loop.add_writer, self._loop.remove_writer, stdin)
                transport, _ = await self._loop.connect_write_pipe(lambda: protocol, sandbox.stdin)
                self._transports.append(transport)
                self.stdin = asyncio.StreamWriter(transport, protocol, None, self._loop)
            if sandbox.stdout is not None:
                self.stdout = await self._reader(sandbox.stdout, limit)
            if sandbox.stderr is not None:
                self.stderr = await self._reader(sandbox.stderr, limit)
        except BaseException:
            self._close_streams()
            raise
        return self

    async def _reader(self, pipe: IO[bytes], limit: int) -> asyncio.StreamReader:
        reader = asyncio.StreamReader(limit)
        protocol = asyncio.StreamReaderProtocol(reader)
        fd = pipe.fileno()
        _refuse_unwatchable(self._loop.add_reader, self._loop.remove_reader, fd)
        transport, _ = await self._loop.connect_read_pipe(lambda: protocol, pipe)
        self._transports.append(transport)
        self._read_fds.append((reader, fd, transport))
        return reader

    def _close_streams(self) -> None:
        for transport in self._transports:
            transport.close()

    def __repr__(self) -> str:
        return f"<nsconfine.aio.Process pid={self.pid} returncode={self.returncode}>"

    @property
    def pid(self) -> int:
        return self.sandbox.pid

    @property
    def args(self) -> Sequence[str]:
        return self.sandbox.args

    @property
    def returncode(self) -> int | None:
        return self.sandbox.returncode

    async def wait(self) -> int:
        """Wait for the session to end; its status (as Sandbox.wait's)."""
        if self.sandbox.returncode is None:
            if self._ended is None:
                self._ended = self._loop.create_future()
                try:
                    # A copy: the handle closes its sentinel when it reaps the session, which
                    # the caller may make it do meanwhile (sandbox.poll()); the loop must never
                    # watch a closed fd, nor a later one that took its number.
                    watch = self.sandbox._watch()  # -1: reaped by another thread just now
                except OSError:  # the launcher is out of fds
                    watch = -1
                if watch < 0:
                    # Looked for every 50 ms, holding no thread (one in the executor for each
                    # such session took every thread launches and reaps need).
                    self._look_for_the_end()
                else:
                    self._watched = _Watch(watch)
                    try:
                        self._loop.add_reader(self._watched.fd, self._end_seen)
                    except OSError:  # no epoll watch left (a session of the account took all)
                        self._watched.close()
                        self._watched = None
                        self._look_for_the_end()
            await asyncio.shield(self._ended)  # a cancelled wait leaves the watch to others
        return self.sandbox.wait()  # reaped by _end_seen: at once

    def _look_for_the_end(self) -> None:
        """Has the session's reaper exited (asked without reaping it, and without an fd)? Then
        it is reaped as _end_seen reaps it; else asked again in 50 ms."""
        assert self._ended is not None
        if self._ended.done():
            return
        try:
            exited = self.sandbox.returncode is not None or (
                os.waitid(os.P_PID, self.sandbox.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                is not None
            )
        except ChildProcessError:  # reaped by another thread meanwhile
            exited = True
        if exited:
            self._reap()
        else:
            self._loop.call_later(0.05, self._look_for_the_end)

    def _end_seen(self) -> None:
        assert self._watched is not None
        self._loop.remove_reader(self._watched.fd)
        self._watched.close()
        self._watched = None
        self._reap()

    def _reap(self) -> None:
        self._end_was_seen = True
        # Reaped in the executor, whatever waits (a waiter cancelled since must not leave a
        # zombie): a session's end removes its mount points, under a lock its account's
        # launchers share, and ends its proxy session, which waits for its connections.
        # Milliseconds, or seconds, that would stall every other session of the loop.
        try:
            reaped = self._loop.run_in_executor(None, self.sandbox.poll)
        except RuntimeError:  # the loop is shutting its executor down: reaped here, then
            reaped = self._loop.create_future()
            try:
                reaped.set_result(self.sandbox.poll())
            except Exception as error:
                reaped.set_exception(error)
        reaped.add_done_callback(self._reaped)

    def _reaped(self, reaped: asyncio.Future[int | None]) -> None:
        assert self._ended is not None
        if not self._ended.done():
            error = reaped.exception()
            if error is None:
                self._ended.set_result(None)
            else:
                self._ended.set_exception(error)

    async def communicate(self, input: bytes | None = None) -> tuple[bytes | None, bytes | None]:
        """Send input to stdin (then close it), read stdout and stderr to their end, wait for
        the session; (stdout, stderr), each None unless launched with PIPE. Once the session
        has ended, a pipe whose other end a process outside it still holds (handed over a
        socket) is read as far as it holds, not waited for. For a timeout, wrap it in
        asyncio.wait_for(), as asyncio's own communicate (what it had read is then lost)."""
        if input is not None and self.stdin is None:
            raise UsageError("communicate(input=...) needs a launch with stdin=PIPE")
        if input is not None and not isinstance(input, bytes | bytearray | memoryview):
            raise UsageError("communicate's input must be bytes")  # as Sandbox.communicate
        stdout, stderr, _fed, _ended = await asyncio.gather(
            _read_all(self.stdout), _read_all(self.stderr), self._feed(input), self._end_reads()
        )
        return stdout, stderr

    async def _feed(self, input: bytes | None) -> None:
        if self.stdin is None:
            return
        try:
            if input:
                self.stdin.write(input)
                await self.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the command stopped reading: the rest has no reader, as with Popen
        self.stdin.close()

    async def _end_reads(self) -> None:
        """Once the session has ended, stop feeding its stdin, and give each reader what its
        pipe holds then, and no more, and close the pipe (its reader then sees EOF): nothing of
        the session is left to write, so only a process outside it holds the other end, and
        could fill it for as long as it liked."""
        await self.wait()
        if self.stdin is not None and not self.stdin.is_closing():
            # Nothing of the session reads its stdin now: the input not yet taken is dropped
            # (its feed ends), as Sandbox.communicate stops writing, or a process outside
            # that holds the pipe and reads nothing would hold communicate for good.
            self.stdin.transport.abort()
        for reader, fd, transport in self._read_fds:
            if reader.at_eof() or transport.is_closing():
                continue
            transport.pause_reading()
            left = bytes_held(fd)
            while left > 0 and (chunk := os.read(fd, min(left, 65536))):
                reader.feed_data(chunk)
                left -= len(chunk)
            transport.close()  # (its protocol feeds the reader EOF)

    async def untrusted_config(self) -> list[str] | None:
        """The Sandbox's untrusted_config, made in the loop's executor (a rescan of the
        workspace, and the host's git for an index the session wrote: seconds at the worst);
        None while the session runs."""
        if self.returncode is None:
            try:  # a copy: another thread may reap the session, and close its sentinel, now
                watch = self.sandbox._watch()
            except OSError:  # the launcher is out of fds
                running = self.sandbox.poll() is None
            else:
                try:
                    running = watch >= 0 and not _poll_now(watch) & select.POLLIN
                finally:
                    if watch >= 0:
                        os.close(watch)
            if running:
                return None
            await self.wait()  # ended: reaped as wait() does, the loop's watch undone first
        return await self._loop.run_in_executor(None, lambda: self.sandbox.untrusted_config)

    # Once the loop has seen the session's end, there is nothing to signal; and the reap in
    # the executor holds the handle's lock, for as long as the mount points' removal and the
    # proxy session's end take, which a signal would wait for on the loop.

    def send_signal(self, number: int) -> None:
        """Send signal number to the command (nothing once the session has ended)."""
        if not self._end_was_seen:
            self.sandbox.send_signal(number)

    def terminate(self) -> None:
        """SIGTERM to the command."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """End the whole sandbox now (as Sandbox.kill)."""
        if not self._end_was_seen:
            self.sandbox.kill()

    async def __aenter__(self) -> Process:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Kill the session, wait for it, and close its streams and its terminal's controller
        (as `with` a Sandbox does)."""
        self.kill()
        await self.wait()
        self._close_streams()
        self.sandbox.close_tty()


class _Watch:
    """The copy of a session's sentinel a loop watches: closed once the loop has seen it,
    or with its Process (a loop closed while it watched, as asyncio.run after a timed-out
    wait leaves it: nothing else would ever close it)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class Pool:
    """nsconfine.Pool for asyncio: sandboxes of one plan staged ahead of need (by the pool's
    own thread, refill="background"), each launch a hand-off run in the executor.

    Its nsconfine.Pool is made when it is entered (`async with`) or first launched from, so
    a plan or host that cannot confine is refused there."""

    def __init__(
        self,
        plan: Plan,
        *,
        size: int = 1,
        idle_timeout: float = 300.0,
        refill: Refill = "background",
    ) -> None:
        _pool.check_options(size, idle_timeout, refill)
        self.plan = plan
        self.size = size
        self.idle_timeout = idle_timeout
        self.refill: Refill = refill
        self._pool: _pool.Pool | None = None
        self._closed = False  # by aclose(): its Pool, if it had none yet, is never made
        self._opening = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<nsconfine.aio.Pool {self._pool!r}>"

    async def __aenter__(self) -> Pool:
        await self._opened()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def staged(self) -> int:
        """How many sandboxes are staged right now."""
        return 0 if self._pool is None else self._pool.staged

    async def launch(
        self, argv: Sequence[str], *, limit: int = STREAM_LIMIT, **options: Unpack[LaunchOptions]
    ) -> Process:
        """nsconfine.Pool.launch for asyncio: run argv in a staged sandbox, return once it
        has exec'd (the keywords are Pool.launch's: env, stdin, stdout, stderr, tty; limit:
        as aio.spawn's)."""
        limit = _checked_limit(limit)
        pool = await self._opened()
        if pool is None:
            raise UsageError("the pool is closed")  # as a closed nsconfine.Pool's launch
        return await _launched(functools.partial(pool.launch, argv, **options), limit)

    async def wait_staged(self, timeout: float | None = None) -> bool:
        """Wait until `size` sandboxes are staged; False on timeout, a staging failure or close."""
        pool = await self._opened()
        if pool is None:
            return False  # closed: nothing will be staged
        return await asyncio.get_running_loop().run_in_executor(None, pool.wait_staged, timeout)

    async def aclose(self) -> None:
        """Tear down every staged sandbox (launched ones keep running). Idempotent."""
        async with self._opening:
            self._closed = True
            if self._pool is not None:
                await asyncio.get_running_loop().run_in_executor(None, self._pool.close)

    async def _opened(self) -> _pool.Pool | None:
        """Its Pool, made on first use; None if it was closed before it had one."""
        async with self._opening:
            if self._pool is None and not self._closed:
                make = functools.partial(
                    _pool.Pool,
                    self.plan,
                    size=self.size,
                    idle_timeout=self.idle_timeout,
                    refill=self.refill,
                )
                making = asyncio.get_running_loop().run_in_executor(None, make)
                cancelled = False
                while not making.done():  # a Pool made is kept, for aclose() to close
                    try:
                        await asyncio.shield(making)
                    except asyncio.CancelledError:
                        cancelled = True
                self._pool = making.result()
                if cancelled:
                    raise asyncio.CancelledError
            return self._pool


async def _read_all(reader: asyncio.StreamReader | None) -> bytes | None:
    if reader is None:
        return None
    chunks = []
    while chunk := await reader.read(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _refuse_unwatchable(
    watch: Callable[[int, Callable[[], None]], None], unwatch: Callable[[int], bool], fd: int
) -> None:
    """SandboxUnavailable if the loop cannot watch a session's pipe (fd): a transport starts
    watching it in a callback, whose failure the loop only logs (the output would never be
    read, the input never written). Asked first, here, where it can be told."""
    try:
        watch(fd, _nothing)
    except OSError as error:
        raise SandboxUnavailable(
            f"the event loop cannot watch the session's pipes ({error.strerror}): the "
            "launcher's account has no epoll watches left (fs.epoll.max_user_watches), a "
            "session of the same account may hold them all; the session was killed. Run "
            "sessions as an account no launcher shares (a root launcher's --user)"
        ) from None
    unwatch(fd)


def _nothing() -> None:
    pass


def _poll_now(fd: int) -> int:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return next((events for _fd, events in poller.poll(0)), 0)


def _checked_limit(limit: object) -> int:
    """limit, checked before anything is launched."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise UsageError(f"limit is a stream buffer's size in bytes, at least 1, not {limit!r}")
    return limit


async def _launched(call: Callable[[], Sandbox], limit: int) -> Process:
    """Run a blocking launch in the loop's executor; its handle for the loop (its stream
    readers' buffer limit: limit)."""
    loop = asyncio.get_running_loop()
    handover = _Handover(call)
    try:
        sandbox = await loop.run_in_executor(None, handover.run)
    except asyncio.CancelledError:
        handover.abandon(loop)
        raise
    try:
        return await Process._connected(sandbox, limit)
    except BaseException:
        loop.run_in_executor(None, _discard, sandbox)
        raise


class _Handover:
    """A launch running in the executor, and whether its caller still wants it: one whose
    caller was cancelled is discarded by whichever side finishes second."""

    def __init__(self, call: Callable[[], Sandbox]) -> None:
        self.call = call
        self.lock = threading.Lock()
        self.abandoned = False
        self.sandbox: Sandbox | None = None

    def run(self) -> Sandbox:
        sandbox = self.call()
        with self.lock:
            self.sandbox = sandbox
            if not self.abandoned:
                return sandbox
        _discard(sandbox)  # its caller is gone
        return sandbox

    def abandon(self, loop: asyncio.AbstractEventLoop) -> None:
        with self.lock:
            self.abandoned = True
            launched = self.sandbox  # the launch ended just before its caller was cancelled
        if launched is not None:
            loop.run_in_executor(None, _discard, launched)


def _discard(sandbox: Sandbox) -> None:
    """Kill and reap a session nobody will wait for, and close its pipes."""
    with sandbox:
        pass
