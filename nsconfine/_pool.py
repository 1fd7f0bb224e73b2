"""Pre-staged sandboxes: bwrap builds a plan's namespaces and mounts ahead of need, and a small
exec shim (csrc/shim.c) holds inside until a launch hands it the command.

A staged sandbox is launched exactly as nsconfine.spawn launches one (policy lint, harness pins,
a proven bwrap, the namespace check from /proc, then the block byte), except that its command
is the shim, with one more fd: a unix socket placed right after the data and copy fds
(FIRST_DATA_FD + len(fd_entries(plan))). The shim writes 'R' on it once it runs, then waits
for one launch message: the caller's argv, extra environment variables, and by SCM_RIGHTS the
fds for 0, 1 and 2 plus the write end of a fresh O_CLOEXEC error pipe. A warm launch is that one
sendmsg and a read of the error pipe: EOF means the payload's execve succeeded; otherwise the
shim wrote {errno, stage} there and exits 127, and the launch raises OSError.

A staged sandbox lives at most idle_timeout seconds (the shim exits, bwrap follows, the pool
reaps it); the launcher dying takes them all (PDEATHSIG on bwrap, --die-with-parent inside, and
EOF on the shim's socket). Linux sends PDEATHSIG when the *thread* that spawned bwrap ends, so
in the default "background" mode every bwrap is spawned by the pool's own stager thread, which
stays alive until the pool is closed and every sandbox it started has ended.
"""

from __future__ import annotations

import array
import os
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from nsconfine import _syscalls
from nsconfine._bwrap_args import FIRST_DATA_FD, fd_entries
from nsconfine._errors import PlanError, SandboxUnavailable, UsageError

# The executor's private helpers, on purpose: a pool's stdio arguments mean what spawn's do, and
# a staged sandbox is killed and reaped the way a failed launch is.
from nsconfine._executor import Sandbox, _kill_and_reap, _stdio_fd, launch
from nsconfine._pins import file_sha256, verify_pins
from nsconfine._plan import Entry, Kind, Plan, ro_bind
from nsconfine._policy import check_plan
from nsconfine._preflight import proven_bwrap

if TYPE_CHECKING:
    from nsconfine._executor import Stdio

SHIM_PATH: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim")
SHIM_DEST: Final = "/run/nsconfine/shim"
SHIM_REASON: Final = "nsconfine's exec shim: waits for the launcher's command, then execs it"
SHIM_START_TIMEOUT_SECONDS: Final = 10.0

_MAGIC: Final = 0x6E736331  # "nsc1", as in csrc/shim.c
_HEADER: Final = struct.Struct("=5I")  # magic, fd_mask, argc, envc, body size
_REPORT: Final = struct.Struct("=ii")  # errno, stage
_MAX_BODY: Final = 64 << 20
_SHIM_STAGES: Final = {
    1: "recvmsg",
    2: "launch message",
    3: "dup2",
    4: "putenv",
    5: "close_range",
    6: "execvp",
}
_EXEC_STAGE: Final = 6

Refill = Literal["background", "inline"]


def pool_plan(plan: Plan, shim: str = SHIM_PATH) -> Plan:
    """plan with the exec shim bound read-only at SHIM_DEST and pinned to its current digest."""
    for entry in plan.entries:
        below = entry.dest == SHIM_DEST or entry.dest.startswith(SHIM_DEST + "/")
        above = SHIM_DEST.startswith(entry.dest.rstrip("/") + "/")
        if below or (above and entry.kind in (Kind.BIND, Kind.SYMLINK)):
            raise PlanError(
                f"the plan's entry at {entry.dest} is where a pool puts its exec shim "
                f"({SHIM_DEST}): move that entry elsewhere to use the plan in a Pool"
            )
    if not os.access(shim, os.R_OK | os.X_OK):
        raise SandboxUnavailable(
            f"nsconfine's exec shim {shim} is missing or not executable: reinstall nsconfine "
            "(pip install, which compiles csrc/shim.c; a C compiler is needed)"
        )
    entry = ro_bind(shim, SHIM_DEST, SHIM_REASON, sha256=file_sha256(shim))
    return Plan.of([*plan.entries, entry], env=plan.env, chdir=plan.chdir, deny=plan.deny)


def _check_pool_plan(plan: Plan, shim_entry: Entry) -> None:
    """The launch checks, with the shim's own refusal said plainly."""
    try:
        check_plan(plan)
    except PlanError as error:
        if shim_entry.source in error.message:
            raise PlanError(
                f"nsconfine's exec shim {shim_entry.source} lies in a path no session may see "
                f"({error.message}); install nsconfine outside the home's credential stores, "
                "e.g. in a venv elsewhere"
            ) from None
        raise
    verify_pins(plan)


def _launch_message(
    argv: Sequence[str], env: Mapping[str, str] | None, stdio: Sequence[Stdio]
) -> tuple[bytes, list[int]]:
    """The shim's launch message (header and body) and the stdio fds it carries, in order."""
    if isinstance(argv, str | bytes) or not argv:
        raise UsageError("argv must be a non-empty list of strings, the command and its args")
    items = [os.fsencode(arg) for arg in argv]
    for name, value in (env or {}).items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise UsageError(f"environment variable {name!r} has an invalid name or value")
        items.append(os.fsencode(f"{name}={value}"))
    body = b"\0".join(items) + b"\0"
    if body.count(0) != len(items):
        raise UsageError("an argument or environment value holds a NUL byte")
    if len(body) > _MAX_BODY:
        raise UsageError(f"argv and env take {len(body)} bytes; the shim takes at most 64 MiB")
    mask = 0
    fds = []
    names = ("stdin", "stdout", "stderr")
    for number, (given, stream) in enumerate(zip(stdio, names, strict=True)):
        fd = _stdio_fd(given, stream)
        if fd < 0:  # None: the launcher's own fd, as spawn's bwrap would inherit it
            try:
                os.get_inheritable(number)
            except OSError:
                continue  # closed here: closed in the payload too
            fd = number
        mask |= 1 << number
        fds.append(fd)
    header = _HEADER.pack(_MAGIC, mask, len(argv), len(items) - len(argv), len(body))
    return header + body, fds


@dataclass(slots=True)
class _Staged:
    """A sandbox whose shim is waiting for its command."""

    pid: int  # bwrap
    child_pid: int  # the sandbox's init
    sock: socket.socket  # the launcher's end of the shim's socket
    pidfd: int  # bwrap's, to notice its end without reaping it
    usable_until: float  # time.monotonic(): after this, the shim may be timing out


class _StagedGone(Exception):
    """The staged sandbox ended before it took the message (expired or killed)."""


def _stage(bwrap: str, plan: Plan, timeout: float) -> _Staged:
    """Start bwrap on plan with the shim as its command; return once the shim is running.

    nsconfine._executor.launch, with the shim's socket as its one extra fd. Spawned from the
    calling thread, whose end sends bwrap its PDEATHSIG.
    """
    started = time.monotonic()
    launcher_end, shim_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    shim_fd = FIRST_DATA_FD + len(fd_entries(plan))
    argv = [SHIM_DEST, str(shim_fd), str(int(timeout * 1000))]
    try:
        sandbox = launch(bwrap, plan, argv, extra_fds=[shim_end.fileno()])
    except BaseException:
        launcher_end.close()
        raise
    finally:
        shim_end.close()
    pid, child_pid = sandbox.pid, sandbox.child_pid
    pidfd = -1
    try:
        pidfd = os.pidfd_open(pid)
        ready = select.poll()
        ready.register(launcher_end.fileno(), select.POLLIN)
        ready.register(pidfd, select.POLLIN)
        if not ready.poll(SHIM_START_TIMEOUT_SECONDS * 1000):
            raise SandboxUnavailable(
                f"nsconfine's exec shim did not start within {SHIM_START_TIMEOUT_SECONDS:g} s"
            )
        if launcher_end.recv(1) != b"R":
            raise SandboxUnavailable(
                f"{bwrap} ran the sandbox, but the exec shim did not start in it; its message "
                "is on the launcher's stderr"
            )
    except BaseException:
        launcher_end.close()
        if pidfd >= 0:
            os.close(pidfd)
        sandbox.kill()
        sandbox.wait()
        raise
    margin = min(1.0, timeout / 10)
    return _Staged(pid, child_pid, launcher_end, pidfd, started + timeout - margin)


def _handoff(staged: _Staged, message: bytes, fds: Sequence[int], command: str) -> Sandbox:
    """Send the launch message; return once the payload has exec'd (OSError if it cannot)."""
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    try:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [report_write, *fds]))]
        try:
            sent = staged.sock.sendmsg([message], rights, socket.MSG_NOSIGNAL)
            if sent < len(message):  # a stream socket may take a large message in parts
                staged.sock.sendall(memoryview(message)[sent:], socket.MSG_NOSIGNAL)
        finally:
            os.close(report_write)  # now only the shim holds it: EOF comes with its exec
        report = b""
        while chunk := os.read(report_read, _REPORT.size):
            report += chunk
    except (BrokenPipeError, ConnectionResetError):
        raise _StagedGone from None  # the caller discards it and takes another
    except BaseException:
        _discard(staged)  # a half-launched sandbox is never left behind
        raise
    finally:
        os.close(report_read)
    staged.sock.close()
    if report:
        _kill_and_reap(staged.pid)
        err, stage = _REPORT.unpack(report.ljust(_REPORT.size, b"\0")[: _REPORT.size])
        syscall = _SHIM_STAGES.get(stage, f"shim stage {stage}")
        raise _syscalls.SyscallError(err, syscall, command if stage == _EXEC_STAGE else None)
    return Sandbox(staged.pid, staged.child_pid)


def _discard(staged: _Staged) -> None:
    """Kill and reap a staged sandbox (its pidfd is closed by whoever polls it)."""
    staged.sock.close()
    _kill_and_reap(staged.pid)


def _has_ended(pidfd: int) -> bool:
    """Has the process exited (without reaping it)? A pidfd turns readable when it does."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


class Pool:
    """Sandboxes of one plan, staged ahead of need; `launch` hands one its command.

    `Pool(plan, size=1, idle_timeout=300.0, refill="background")`. The pool's own plan
    (`pool.plan`) is plan plus a read-only, pinned bind of the exec shim at SHIM_DEST; every
    staged sandbox passes spawn's checks on it when it is staged. A staged sandbox unused for
    idle_timeout seconds ends and is reaped, and is replaced only at the next launch.

    refill="background": a stager thread owned by the pool spawns every bwrap (PDEATHSIG follows
    it, so it lives until the pool is closed and all its sandboxes have ended) and refills after
    each launch while the payload runs. refill="inline": the calling thread stages, at creation
    and after each launch before returning (so launch from a long-lived thread, as with spawn,
    and from one thread only); an expired sandbox is then reaped when the pool is next used.
    """

    def __init__(
        self,
        plan: Plan,
        size: int = 1,
        idle_timeout: float = 300.0,
        *,
        refill: Refill = "background",
    ) -> None:
        if not isinstance(size, int) or size < 1:
            raise UsageError("size must be a positive number of staged sandboxes")
        if not 0 < idle_timeout < 1e7:
            raise UsageError("idle_timeout must be a positive number of seconds")
        if refill not in ("background", "inline"):
            raise UsageError('refill must be "background" or "inline"')
        check_plan(plan)  # the caller's own refusals first, worded as spawn's
        self.plan = pool_plan(plan)
        self.size = size
        self.idle_timeout = float(idle_timeout)
        self.refill: Refill = refill
        self._shim_entry = next(e for e in self.plan.entries if e.dest == SHIM_DEST)
        _check_pool_plan(self.plan, self._shim_entry)
        proven_bwrap()
        self._staged: deque[_Staged] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._fill = True  # stage up to size; cleared when a staged sandbox expires
        self._error: Exception | None = None  # the stager's last staging failure
        self._launched: list[int] = []  # pidfds of launched sandboxes (background mode)
        self._to_close: list[int] = []  # pidfds the stager closes on its next turn
        self._in_flight = 0  # taken from _staged, not yet launched or retired
        self._drained = threading.Event()
        self._stager: threading.Thread | None = None
        self._wake_read = self._wake_write = -1
        if refill == "inline":
            try:
                self._refill_inline()
            except BaseException:
                self.close()
                raise
            return
        self._wake_read, self._wake_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._stager = threading.Thread(target=self._run, name="nsconfine-pool", daemon=True)
        self._stager.start()

    def __repr__(self) -> str:
        return f"<Pool size={self.size} staged={len(self._staged)} closed={self._closed}>"

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def staged(self) -> int:
        """How many sandboxes are staged right now."""
        return len(self._staged)

    def wait_staged(self, timeout: float | None = None) -> bool:
        """Wait until `size` sandboxes are staged; False on timeout, a staging failure or close."""
        with self._cond:
            self._fill = True
            self._wake()
            self._cond.wait_for(
                lambda: len(self._staged) >= self.size or self._error or self._closed, timeout
            )
            return len(self._staged) >= self.size and not self._closed

    def launch(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: Stdio = None,
        stdout: Stdio = None,
        stderr: Stdio = None,
    ) -> Sandbox:
        """Run argv in a staged sandbox; return once it has exec'd.

        argv[0] is resolved inside the sandbox as execvp does: a name with a slash is a path
        (relative to the plan's chdir), else it is searched in the PATH of the payload's
        environment. That environment is the plan's (exactly what spawn gives), with env's
        variables added or replacing the plan's. Each stdio is None (the launcher's own fd at
        this call), an fd or a file object. An exec failure raises OSError with the errno
        (spawn instead reports it as bwrap's exit status 1)."""
        message, fds = _launch_message(argv, env, (stdin, stdout, stderr))
        for _attempt in range(3):
            staged = self._take()
            try:
                sandbox = _handoff(staged, message, fds, argv[0])
            except _StagedGone:
                _discard(staged)
                self._retire(staged.pidfd)
                continue
            except BaseException:
                self._retire(staged.pidfd)
                raise
            self._launched_one(staged.pidfd)
            return sandbox
        raise SandboxUnavailable(
            "staged sandboxes kept ending before their launch: something kills them"
        )

    def close(self) -> None:
        """Kill and reap every staged sandbox (launched ones keep running). Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            self._wake()
            staged = list(self._staged) if self._stager is None else []
            if self._stager is None:
                self._staged.clear()
        for one in staged:
            _discard(one)
            os.close(one.pidfd)
        if self._stager is not None:
            self._drained.wait()

    # ------------------------------------------------------------ taking and giving back

    def _take(self) -> _Staged:
        if self._stager is None:
            return self._take_inline()
        with self._cond:
            while True:
                if self._closed:
                    raise UsageError("the pool is closed")
                if self._staged:
                    staged = self._staged.popleft()
                    self._in_flight += 1
                    if time.monotonic() < staged.usable_until:
                        return staged
                    # Near its idle timeout the shim may be exiting: never race it.
                    self._cond.release()
                    try:
                        _discard(staged)
                    finally:
                        self._cond.acquire()
                    self._in_flight -= 1
                    self._to_close.append(staged.pidfd)
                    continue
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                self._fill = True
                self._wake()
                self._cond.wait()

    def _take_inline(self) -> _Staged:
        if self._closed:
            raise UsageError("the pool is closed")
        while self._staged:
            staged = self._staged.popleft()
            if time.monotonic() < staged.usable_until and not _has_ended(staged.pidfd):
                return staged
            _discard(staged)
            os.close(staged.pidfd)
        return self._stage_one()

    def _stage_one(self) -> _Staged:
        _check_pool_plan(self.plan, self._shim_entry)
        return _stage(proven_bwrap(), self.plan, self.idle_timeout)

    def _refill_inline(self) -> None:
        while len(self._staged) < self.size:
            self._staged.append(self._stage_one())

    def _retire(self, pidfd: int) -> None:
        if self._stager is None:
            os.close(pidfd)
            return
        with self._cond:
            self._in_flight -= 1
            self._to_close.append(pidfd)
            self._wake()

    def _launched_one(self, pidfd: int) -> None:
        if self._stager is None:
            os.close(pidfd)  # this thread spawned it; the caller reaps it through Sandbox
            try:
                self._refill_inline()
            except Exception:
                pass  # the payload runs: the next launch stages afresh and raises this
            return
        with self._cond:
            self._in_flight -= 1
            self._launched.append(pidfd)
            self._fill = True
            self._wake()

    def _wake(self) -> None:
        # Called with the lock held; the stager closes the pipe (and sets -1) under it too.
        if self._wake_write >= 0:
            try:
                os.write(self._wake_write, b"w")
            except BlockingIOError:
                pass  # a wake-up is pending already

    # ------------------------------------------------------------ the stager thread

    def _run(self) -> None:
        try:
            while self._turn():
                pass
        finally:
            with self._cond:
                staged = list(self._staged)
                self._staged.clear()
            for one in staged:
                _discard(one)
                os.close(one.pidfd)
            self._drained.set()

    def _turn(self) -> bool:
        """One round of the stager: False once it may end (closed, and nothing of its alive)."""
        with self._cond:
            for fd in self._to_close:
                os.close(fd)
            self._to_close.clear()
            for one in list(self._staged):
                if self._closed or _has_ended(one.pidfd):  # closed, or idle timeout (or killed)
                    self._staged.remove(one)
                    _discard(one)
                    os.close(one.pidfd)
                    self._fill = False  # replaced at the next launch, not now
            if self._closed:
                self._drained.set()
                # Sandboxes it launched die when this thread ends (PDEATHSIG): outlive them.
                if not self._launched and not self._in_flight:
                    os.close(self._wake_read)
                    os.close(self._wake_write)
                    self._wake_read = self._wake_write = -1
                    return False
            need = (
                not self._closed
                and self._fill
                and self._error is None
                and len(self._staged) < self.size
            )
            watched = [self._wake_read, *(one.pidfd for one in self._staged), *self._launched]
        if need:
            try:
                staged = self._stage_one()
            except Exception as error:
                with self._cond:
                    self._error = error
                    self._fill = False
                    self._cond.notify_all()
                return True
            with self._cond:
                self._staged.append(staged)  # closed meanwhile: the next turn discards it
                self._cond.notify_all()
            return True
        poller = select.poll()
        for fd in watched:
            poller.register(fd, select.POLLIN)
        for fd, _events in poller.poll():
            if fd == self._wake_read:
                try:
                    os.read(self._wake_read, 4096)
                except BlockingIOError:
                    pass
                continue
            with self._cond:
                if fd in self._launched:  # ended; Sandbox.wait reaps it, never the stager
                    self._launched.remove(fd)
                    os.close(fd)
        return True
