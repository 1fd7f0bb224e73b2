"""The handle of a running session, shaped like subprocess.Popen.

    pid          the launcher's child: nsconfine's reaper, which runs bwrap (what wait() reaps)
    args         the argv it was launched with
    stdin, stdout, stderr
                 for each stdio launched with subprocess.PIPE, the launcher's end as a binary
                 file object (stdin written to, stdout and stderr read from), as Popen's; None
                 for any other. The launch closed its copies of the session's ends: EOF comes
                 once the session has ended, as nothing of it outlives its reaper (unless the
                 session handed its end to a process outside, over a socket it was given: as
                 with Popen and a daemon, reading to EOF then waits for that process).
    child_pid    the sandbox's init, bwrap's child, in the launcher's pid namespace
    command_pid  the command, in the launcher's pid namespace
    returncode   None while it runs; then the command's exit status, 128+N if the command was
                 killed by signal N, or -N if the sandbox itself was (kill())
    sentinel     an fd that becomes readable once the session has ended, for a launcher's own
                 poll or event loop (as multiprocessing.Process.sentinel); wait() then reaps
    tty          for a launch with tty=True: the controller of the command's terminal (a pty of
                 the sandbox's own, its controlling terminal), which the caller reads and
                 writes; -1 otherwise. It stays open after the session's end (what it wrote
                 last is read then) until the handle's `with` ends or the handle is dropped.
    timings      seconds from the launch's start to each stage: "started" (bwrap's reaper
                 running), "linted" (the plan's checks passed, while bwrap builds),
                 "namespaces" (checked), "built" (bwrap done, the shim waiting), "confirmed"
                 (mounts checked), "exec"
    plan         the plan the launch ran: its protected paths as found at that launch
    untrusted_config
                 once the session has ended: the host paths the host runs or trusts (a
                 repository's .git/config and hooks, an .envrc, …) that the session could write
                 and that were not read-only during it (a repository it made, say), for a
                 broker to refuse to run git there before a person has looked; None while the
                 session runs

Signals go to the command (send_signal, terminate); kill() ends the whole sandbox at once, and
leaving a `with` block kills it, waits and closes its pipes. communicate(input, timeout) is
Popen's: it feeds stdin, reads stdout and stderr and waits, all in one poll loop (so large
output both ways never deadlocks); once the session has ended it takes what its pipes hold and
stops, so it never waits on a copy of a pipe held outside the session. Every wait polls
pidfds, never select(): a launcher with thousands of fds is fine. Only nsconfine makes these
handles, and only the process that launched a session can wait for it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time

# signal's own C module: importing signal imports enum (~1-2 ms of every command line's start)
from _signal import SIGKILL, SIGTERM, pidfd_send_signal  # type: ignore[import-not-found]
from _thread import RLock
from _weakrefset import WeakSet  # (weakref's own, loaded at every start)

from nsconfine._errors import UsageError, checked_timeout
from nsconfine._interrupts import CtrlCHeld
from nsconfine._kernel import terminal as _terminal
from nsconfine._kernel.syscalls import poll_ms, wait_fd
from nsconfine._launch import sources as _sources
from nsconfine._plan.protect import Seen, written_config

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import IO, NoReturn

    from nsconfine._kernel.terminal import Saved
    from nsconfine._launch.egress import Egress
    from nsconfine._launch.sources import Stub
    from nsconfine._launch.stage import Staged
    from nsconfine._plan.model import Plan


class Sandbox:
    """A running confined session (made by spawn and Pool.launch, never by hand)."""

    __slots__ = (
        "__weakref__",  # (_live)
        "_bound",
        "_busy",
        "_command_pidfd",
        "_done",
        "_egress",
        "_exchange",
        "_init_pidfd",
        "_lock",
        "_owner",
        "_reaper_pidfd",
        "_seen",
        "_since",
        "_stubs",
        "_terminals",
        "_untrusted",
        "args",
        "child_pid",
        "command_pid",
        "pid",
        "plan",
        "returncode",
        "stderr",
        "stdin",
        "stdout",
        "timings",
        "tty",
    )
    pid: int
    args: Sequence[str]
    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None
    plan: Plan
    child_pid: int
    command_pid: int
    returncode: int | None
    timings: dict[str, float]
    tty: int
    _reaper_pidfd: int
    _init_pidfd: int
    _command_pidfd: int
    _terminals: list[Saved]
    _stubs: list[Stub]
    _egress: Egress | None
    _lock: RLock
    _busy: bool
    _done: bool
    _owner: int
    _untrusted: list[str] | None
    _bound: dict[str, tuple[int, int, int]]
    _since: float
    _seen: Seen
    _exchange: _Exchange | None

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        raise TypeError("Sandbox handles come from nsconfine.spawn or Pool.launch")

    @classmethod
    def _launched(
        cls,
        staged: Staged,
        terminals: list[Saved],
        tty: int,
        args: Sequence[str],
        streams: tuple[int, int, int],
    ) -> Sandbox:
        self = object.__new__(cls)
        self.args = args
        # Buffered, as Popen's default: the launcher's ends of the pipes (see prepare_launch).
        stdin, stdout, stderr = streams
        self.stdin = open(stdin, "wb") if stdin >= 0 else None  # noqa: SIM115 (the handle's)
        self.stdout = open(stdout, "rb") if stdout >= 0 else None  # noqa: SIM115
        self.stderr = open(stderr, "rb") if stderr >= 0 else None  # noqa: SIM115
        self._exchange = None
        self.plan = staged.plan
        self._untrusted = None
        self._bound = staged.bound
        self._seen = staged.seen
        # What the session could write is looked for in files changed since it began (a
        # second early: file times are the kernel's coarse clock).
        self._since = time.time() - 1.0
        self.pid = staged.reaper
        self.child_pid = staged.init_pid
        self.command_pid = staged.command_pid
        self.returncode = None
        self.timings = dict(staged.timings)
        self.tty = tty
        self._reaper_pidfd = staged.reaper_pidfd
        self._init_pidfd = staged.init_pidfd
        self._command_pidfd = staged.command_pidfd
        self._terminals = terminals
        self._stubs, staged.stubs = staged.stubs, []
        self._egress, staged.egress = staged.egress, None
        # Reentrant: a signal handler of the launcher's own may call the handle (kill() on
        # SIGTERM, poll() on SIGCHLD) while the thread it interrupts holds the lock, in poll();
        # it waited for ever on a plain lock. _busy: a call is under way in the thread that
        # holds it, and a poll() that comes in (a handler's) reaps nothing meanwhile: it would
        # close the pidfds that call is using, whose numbers a new fd could take. _done: the
        # end is wholly kept (what _ended does, each step once).
        self._lock = RLock()
        self._busy = False
        self._done = False
        self._owner = os.getpid()
        _live.add(self)
        return self

    def __repr__(self) -> str:
        return f"<Sandbox pid={self.pid} returncode={self.returncode}>"

    @property
    def sentinel(self) -> int:
        """An fd readable once the session has ended (the reaper's pidfd). The handle owns it
        and closes it once it has reaped the session (returncode set)."""
        return self._reaper_pidfd

    @property
    def untrusted_config(self) -> list[str] | None:
        """What the host runs or trusts that the session could write while it was not
        protected (see the module's docstring), looked for once the session has ended; None
        while it runs."""
        if self.returncode is None and self.poll() is None:
            return None
        if self._untrusted is None:
            self._untrusted = written_config(self.plan, self._bound, self._since, self._seen)
        return list(self._untrusted)

    def poll(self) -> int | None:
        """The exit status if the session has ended, else None. RuntimeError in another
        process than the one that launched it (a fork), which cannot wait for its reaper."""
        if os.getpid() != self._owner:
            raise RuntimeError(
                f"this session was launched by process {self._owner}: only it can wait for "
                "the session (a forked child may still kill() it)"
            )
        with self._lock:
            if not self._done and not self._busy:
                self._busy = True
                try:
                    # A Ctrl-C as the end is kept would lose the pidfds and the workspace's
                    # mount points: held until it is done.
                    with CtrlCHeld():
                        self._reap()
                finally:
                    self._busy = False
            return self.returncode

    def _reap(self) -> None:
        """Keep the session's end, if it has come: its status looked at without reaping the
        reaper, then the reaper reaped, then what the handle holds let go (_ended). A handler
        of the caller's that raises anywhere between (a SIGTERM's sys.exit) leaves the rest
        to the next poll(), and loses no status. The reaper is waited for by its pidfd, never
        its pid: a later look can reap no other child that took the pid."""
        if self.returncode is None:
            try:
                ended = os.waitid(
                    os.P_PIDFD, self._reaper_pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT
                )
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): lost
                self.returncode = 0
            else:
                if ended is None:
                    return  # it runs
                killed = ended.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
                self.returncode = -ended.si_status if killed else ended.si_status
        if self._reaper_pidfd >= 0:  # (not yet let go: so not yet reaped either)
            with contextlib.suppress(ChildProcessError):  # (reaped by a look cut short)
                os.waitid(os.P_PIDFD, self._reaper_pidfd, os.WEXITED | os.WNOHANG)
        self._ended()
        self._done = True

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the session to end and return its status (see the module's docstring).
        Raises TimeoutExpired (subprocess's, and a TimeoutError) if it still runs after
        timeout seconds."""
        timeout = checked_timeout(timeout)
        watch = -1
        try:
            try:
                with CtrlCHeld():  # (see _watch)
                    watch = self._watch()
            except OSError:  # out of fds: looked at every 20 ms instead
                ended = self._poll_until(timeout)
            else:
                ended = watch < 0 or wait_fd(watch, timeout)
        finally:
            if watch >= 0:
                os.close(watch)
        if not ended and self.poll() is None:
            assert timeout is not None  # an unbounded wait returns only once it has ended
            self._timed_out(timeout)
        status = self.poll()  # the reaper has exited: this reaps it (or another thread did)
        if status is None:  # (the reaper has exited: only this thread is reaping it, below)
            raise UsageError(
                "wait() in a signal handler that came in as this thread reaped the session: "
                "call poll() or kill() there, and wait() once the handler has returned"
            )
        return status

    def _watch(self) -> int:
        """A copy of the sentinel while the session runs, for the caller to wait on and close;
        -1 once it has ended. Taken under the lock its end closes the sentinel under: between
        a look at returncode and a wait on the sentinel itself, another thread could reap the
        session and close it, and a new fd take its number (a wait then watched a socket).
        The caller takes it with a Ctrl-C held (CtrlCHeld), inside the try that closes it: a
        KeyboardInterrupt between the dup and the caller's hold on the copy left it open for
        good (stop 43's attackers: 3 in 300 random Ctrl-Cs). OSError (EMFILE) for a launcher
        out of fds."""
        with self._lock:
            return -1 if self.returncode is not None else os.dup(self._reaper_pidfd)

    def _poll_until(self, timeout: float | None) -> bool:
        """Has the session ended within timeout (None: no limit), looking every 20 ms?"""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            time.sleep(0.02 if left is None else min(0.02, left))
        return True

    def communicate(
        self, input: bytes | None = None, timeout: float | None = None
    ) -> tuple[bytes | None, bytes | None]:
        """Send input to stdin (then close it), read stdout and stderr to their end, wait for
        the session; (stdout, stderr), each None unless launched with PIPE. TimeoutExpired
        if it still runs after timeout seconds: nothing is lost, and a later communicate()
        (after kill(), say) goes on where this one stopped and returns all of it."""
        timeout = checked_timeout(timeout)
        if self._exchange is None:
            if input is not None and self.stdin is None:
                raise UsageError("communicate(input=...) needs a launch with stdin=PIPE")
            if input is not None and self.stdin is not None and self.stdin.closed:
                raise UsageError("communicate(input=...): the caller closed the stdin pipe")
            if input is not None and not isinstance(input, bytes | bytearray | memoryview):
                raise UsageError("communicate's input must be bytes")
            self._exchange = _Exchange(self, input)
        elif input is not None:
            raise UsageError("communicate() took its input in an earlier call: give none now")
        deadline = None if timeout is None else time.monotonic() + timeout
        watch, owned = -1, False
        try:
            try:
                with CtrlCHeld():  # (see _watch)
                    watch = self._watch()  # (-1: ended)
                    owned = watch >= 0
            except OSError:  # out of fds: the sentinel itself, as this thread alone reaps here
                watch = -1 if self.returncode is not None else self._reaper_pidfd
            exchanged = self._exchange.run(watch, deadline)
        finally:
            if owned:
                os.close(watch)
        if not exchanged:
            assert timeout is not None
            self._timed_out(timeout)
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0))
        return self._exchange.outputs()

    def _timed_out(self, timeout: float) -> NoReturn:
        from nsconfine._timeout import TimeoutExpired

        raise TimeoutExpired(self.args, timeout, self.pid)

    def send_signal(self, number: int) -> None:
        """Send signal number to the command (nothing once the session has ended)."""
        if isinstance(number, bool) or not isinstance(number, int) or not 0 < number < 65:
            raise UsageError(f"send_signal takes a signal number (1 to 64), not {number!r}")
        with self._lock:
            if self.returncode is None:
                busy, self._busy = self._busy, True
                try:
                    _send(self._command_pidfd, number)
                finally:
                    self._busy = busy

    def terminate(self) -> None:
        """SIGTERM to the command."""
        self.send_signal(SIGTERM)

    def kill(self) -> None:
        """End the whole sandbox now: the reaper tears down bwrap and anything it left, and
        SIGKILL to its init ends every process inside at once. The reaper is told first: with
        its init killed, bwrap exits 137 on its own, and a reaper that reaped it before its
        SIGTERM came would pass that on as the session's status instead of -9."""
        with self._lock:
            if self.returncode is None:
                busy, self._busy = self._busy, True
                try:
                    _send(self._reaper_pidfd, SIGTERM)
                    _send(self._init_pidfd, SIGKILL)
                finally:
                    self._busy = busy

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Kill the session, wait for it, and close its pipes and its terminal."""
        self.kill()
        self.wait()
        for stream in (self.stdout, self.stderr, self.stdin):
            if stream is not None:
                _close(stream)
        self.close_tty()

    def close_tty(self) -> None:
        """Close the terminal's controller (tty=True), if it is still open; `with` does. It
        outlives the session (what the session wrote last is read after its end is seen, as an
        event loop reads it), and goes with the handle otherwise."""
        tty, self.tty = getattr(self, "tty", -1), -1
        if tty >= 0:
            with contextlib.suppress(OSError):
                os.close(tty)

    def __del__(self) -> None:
        self.close_tty()  # (nobody can read it now)
        # Dropped unwaited: reaped by a later launch (_abandoned), not here. A finalizer runs
        # in whichever thread the collector does, the proxy's own among them, perhaps holding
        # a lock that the end of a session (its stubs, its proxy socket) takes.
        if not getattr(self, "_done", True) and getattr(self, "_owner", 0) == os.getpid():
            # Whole, a Ctrl-C held: one that ended it midway left the handle out of the list
            # (its reaper a zombie, its stubs for good) or its pipes open (a session writing to
            # one blocked for good). A Ctrl-C that came is raised at its end, where Python
            # reports it as an exception its finalizer ignored.
            with CtrlCHeld():
                self._exchange = None  # (a communicate() that timed out held the streams too)
                # Its pipes that nobody else holds are closed (one the caller kept is the
                # caller's), so that a session writing to one meets EPIPE and ends, rather than
                # blocking for good on a pipe nobody reads.
                for name in ("stdin", "stdout", "stderr"):
                    stream = getattr(self, name, None)
                    setattr(self, name, None)
                    if stream is not None and sys.getrefcount(stream) <= 2:  # (here, the call)
                        with contextlib.suppress(OSError):
                            stream.close()
                    del stream
                _abandoned.append(self)

    def _ended(self) -> None:
        # Called with the lock held, returncode kept and the reaper reaped: the pidfds go,
        # the caller's terminal comes back, and the empty mount points made for the launch
        # are removed (the session's own terminal stays, for what it wrote last: close_tty).
        # Each is taken from the handle before it is undone, so that none is undone twice by
        # the next poll() (an fd closed twice could be another's by then): a step a raising
        # handler cut short is left undone (api.md says so).
        for name in ("_reaper_pidfd", "_init_pidfd", "_command_pidfd"):
            fd = getattr(self, name)
            setattr(self, name, -1)
            if fd >= 0:
                os.close(fd)
        terminals, self._terminals = self._terminals, []
        _terminal.restore(terminals)
        stubs, self._stubs = self._stubs, []
        _sources.remove(stubs)
        egress, self._egress = self._egress, None
        if egress is not None:
            egress.close()


# Handles dropped unwaited: reaped at a later launch, as subprocess reaps the Popen objects it
# was left (its _cleanup), so that a launcher that forgets a handle keeps no zombie and no
# pidfd for it. A list's append and pop need no lock (a lock taken in __del__ could be this
# thread's own, held where the collector ran it).
_abandoned: list[Sandbox] = []
# Every handle not yet collected (a dropped one stays while the list above holds it), for
# the interpreter's exit.
_live: WeakSet[Sandbox] = WeakSet()


def _end_at_exit() -> None:
    """The interpreter exits: end each session this process has a handle of (kept, or dropped
    unwaited), as its death would (their reapers watch its lifeline), but whole: reaped, and
    the mount points made in their workspaces removed, which its death leaves behind. Not in
    a forked child, which runs this as it exits too: they are its parent's."""
    for sandbox in list(_live):
        if sandbox._owner != os.getpid() or sandbox._done:
            continue
        with contextlib.suppress(Exception):
            sandbox.kill()
            sandbox.wait(timeout=10)


atexit.register(_end_at_exit)


def reap_abandoned() -> None:
    """Reap the dropped handles whose sessions have ended; keep the others for next time."""
    for _ in range(len(_abandoned)):
        try:
            sandbox = _abandoned.pop(0)
        except IndexError:
            return
        try:
            sandbox.poll()
        except Exception:  # (nothing a later launch could do better)
            continue
        if not sandbox._done:
            _abandoned.append(sandbox)


def _send(pidfd: int, number: int) -> None:
    try:
        pidfd_send_signal(pidfd, number)
    except ProcessLookupError:
        pass


class _Exchange:
    """What communicate() has sent and read so far, kept between calls (a timeout, then a
    kill and another call, returns everything)."""

    def __init__(self, sandbox: Sandbox, input: bytes | bytearray | memoryview | None) -> None:
        self.input = memoryview(input or b"").cast("B")
        self.sent = 0
        # A pipe the caller closed itself is left out, as Popen leaves it (read of it: b"").
        self.stdin = sandbox.stdin if sandbox.stdin is None or not sandbox.stdin.closed else None
        # What is read from stdout and stderr (None: not a pipe), and each pipe still open.
        self.read: list[list[bytes] | None] = [None, None]
        self.open: dict[int, tuple[int, IO[bytes]]] = {}  # fd -> (0 stdin, 1 stdout, 2 stderr)
        # Once the session has ended: what is left to read of each output pipe.
        self.left: dict[int, int] = {}
        # What the caller wrote to stdin itself goes first, as the pipe takes it: all of it
        # now, or from run() (a full pipe a process outside holds never takes it: waiting for
        # room that never comes would hold the launcher for good).
        self.flushed = True
        if self.stdin is not None:
            self.flushed = _flush_now(self.stdin)
            if self.input or not self.flushed:
                self.open[self.stdin.fileno()] = (0, self.stdin)
            else:
                _close(self.stdin)
        for number, stream in ((1, sandbox.stdout), (2, sandbox.stderr)):
            if stream is not None:
                self.read[number - 1] = []
                if not stream.closed:
                    self.open[stream.fileno()] = (number, stream)

    def outputs(self) -> tuple[bytes | None, bytes | None]:
        stdout, stderr = (None if chunks is None else b"".join(chunks) for chunks in self.read)
        return stdout, stderr

    def run(self, sentinel: int, deadline: float | None) -> bool:
        """Feed and read the pipes until each is done; False if the deadline comes first.
        sentinel: the reaper's pidfd, or -1 once the session has been reaped. Once it has
        ended, what its pipes hold then is read, and no more, and they are closed: nothing of
        the session is left to write, and only a process outside it could hold their other
        ends, and fill them for as long as it likes."""
        import select

        # A pipe the caller closed since the last call is left out: its number may be another
        # file's now (one of the caller's, or the sentinel's copy).
        for fd, (_number, stream) in list(self.open.items()):
            if stream.closed:
                del self.open[fd]
        poller = select.poll()
        for fd, (number, _stream) in self.open.items():
            poller.register(fd, select.POLLOUT if number == 0 else select.POLLIN)
        ended = sentinel < 0
        if ended:
            self._take_what_is_held()
        else:
            poller.register(sentinel, select.POLLIN)
        stdin = self.stdin if self.stdin is not None and not self.stdin.closed else None
        if stdin is not None:
            os.set_blocking(stdin.fileno(), False)  # a full pipe takes what fits
        try:
            while self.open:
                left = None if deadline is None else deadline - time.monotonic()
                if not ended and left is not None and left <= 0:
                    return False
                events = poller.poll(0 if ended else poll_ms(left))
                if not events and ended:
                    break
                for fd, _event in events:
                    if fd == sentinel:
                        ended = True
                        poller.unregister(fd)
                        self._take_what_is_held()
                    elif self._move(fd):
                        poller.unregister(fd)
                        _close(self.open.pop(fd)[1])
        finally:
            if stdin is not None and not stdin.closed:
                os.set_blocking(stdin.fileno(), True)
        for _number, stream in self.open.values():
            _close(stream)
        self.open.clear()
        return True

    def _take_what_is_held(self) -> None:
        for fd, (number, _stream) in self.open.items():
            if number != 0 and fd not in self.left:
                self.left[fd] = bytes_held(fd)

    def _move(self, fd: int) -> bool:
        """Write the next part of the input to fd, or read what fd holds (once the session has
        ended, up to what it held then); whether that pipe is done (all written, its reader
        gone, EOF, or all it held at the end read)."""
        number, stream = self.open[fd]
        if number == 0:
            try:
                if not self.flushed:
                    stream.flush()  # (non-blocking here: what fits, the rest kept)
                    self.flushed = True
                self.sent += os.write(fd, self.input[self.sent : self.sent + 65536])
            except BlockingIOError:
                return False
            except BrokenPipeError:  # the command stopped reading: the rest has no reader
                return True
            return self.sent >= len(self.input)
        left = self.left.get(fd)
        chunk = os.read(fd, 65536 if left is None else min(left, 65536)) if left != 0 else b""
        chunks = self.read[number - 1]
        assert chunks is not None
        chunks.append(chunk)
        if left is not None:
            self.left[fd] = left - len(chunk)
        return not chunk or self.left.get(fd) == 0


def bytes_held(fd: int) -> int:
    """How many bytes the pipe at fd holds (FIONREAD)."""
    import fcntl
    import sys
    import termios

    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, bytes(4)), sys.byteorder)


def _flush_now(stream: IO[bytes]) -> bool:
    """Write what stream (stdin) buffers as far as its pipe takes it now; whether all went
    (or its reader is gone)."""
    os.set_blocking(stream.fileno(), False)
    try:
        stream.flush()
    except BlockingIOError:
        return False
    except BrokenPipeError:
        pass
    finally:
        os.set_blocking(stream.fileno(), True)
    return True


def _close(stream: IO[bytes]) -> None:
    """Close stream; what a writer (stdin) still buffers goes as far as its pipe takes it
    now, and the rest is dropped: its reader is gone, or a process outside the session holds
    the pipe and may never read (the pipe is closed all the same)."""
    if not stream.closed and stream.writable():
        os.set_blocking(stream.fileno(), False)
    try:
        stream.close()
    except (BrokenPipeError, BlockingIOError):
        pass
