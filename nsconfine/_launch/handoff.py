"""The hand-off: a staged sandbox (nsconfine._launch.stage) gets its command.

The command is checked and encoded for the exec shim before any sandbox is taken for it
(prepare_launch), with the pipes and /dev/null its stdio asks for (subprocess.PIPE, DEVNULL,
STDOUT), made here close-on-exec; hand_off sends it, its stdio (unless it gets a terminal of
its own) and its environment over the shim's socket, with a fresh error pipe: EOF on that
pipe means the exec succeeded; else the shim reports the errno, the sandbox is torn down, and
the launch raises OSError. The launched sandbox is a Sandbox handle, which keeps the
launcher's ends of the pipes; the launch closes the session's ends once the shim has them, so
that nothing but the session holds them.
"""

from __future__ import annotations

# The C module socket.py wraps (see nsconfine/_launch/stage.py).
import _socket as socket

# Here, not where they are used: a module loaded at a launch takes an fd, and a launcher out of
# fds must be refused there as any other launch is (an ImportError left the sandbox behind).
import _thread
import array
import fcntl
import os
import select
import struct
import termios
from collections.abc import Mapping, Sequence

from nsconfine._errors import SandboxUnavailable, UsageError, refuse_if_short_of_fds
from nsconfine._kernel import syscalls as _syscalls
from nsconfine._kernel import terminal as _terminal
from nsconfine._launch.programs import (
    SHIM_CLOSE_MASK,
    SHIM_EXEC_STAGE,
    SHIM_EXECUTING,
    SHIM_HEADER,
    SHIM_MAGIC,
    SHIM_MAX_BODY,
    SHIM_REPORT,
    SHIM_STAGES,
    SHIM_TTY,
)
from nsconfine._launch.sandbox import Sandbox, reap_abandoned
from nsconfine._launch.stage import Staged, hold_closed_stdio, launcher_lacks, stdio_fd, teardown
from nsconfine._text import encodable, is_env_name

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import TypedDict

    from nsconfine._launch.stage import Stdio

    class LaunchOptions(TypedDict, total=False):
        """The keywords spawn and Pool.launch take after argv, for the fronts that pass
        them on (nsconfine.aio): mypy checks each, and they are declared here once."""

        env: Mapping[str, str] | None
        stdin: Stdio
        stdout: Stdio
        stderr: Stdio
        tty: bool


class StagedGone(Exception):
    """The staged sandbox ended before it took its command (expired or killed)."""


def _receive_terminal(staged: Staged, report_read: int) -> int:
    """The controller of the command's new terminal, sent by the shim ('T' and the fd), sized
    as the launcher's own terminal (else 24x80), after which the shim is told to go on ('G').
    -1 if the shim reported a failure (or ended) first."""
    poller = select.poll()
    for fd in (staged.sock.fileno(), report_read, staged.command_pidfd):
        poller.register(fd, select.POLLIN)
    if staged.sock.fileno() not in dict(poller.poll()):
        return -1
    fds = array.array("i")
    # SO_PASSCRED is on: the credentials come along with the fd.
    space = socket.CMSG_SPACE(4) + socket.CMSG_SPACE(12)
    data, ancillary, _flags, _address = staged.sock.recvmsg(1, space)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if data != b"T" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise SandboxUnavailable("the exec shim did not send the command's terminal")
    controller = fds[0]
    size = struct.pack("HHHH", 24, 80, 0, 0)
    try:
        size = fcntl.ioctl(0, termios.TIOCGWINSZ, size)
    except OSError:
        pass  # the launcher has no terminal: the default
    try:
        os.set_inheritable(controller, False)
        fcntl.ioctl(controller, termios.TIOCSWINSZ, size)
        staged.sock.sendall(b"G", socket.MSG_NOSIGNAL)
    except BaseException as error:
        os.close(controller)
        if isinstance(error, (BrokenPipeError, ConnectionResetError)):
            raise StagedGone from None  # the shim died between 'T' and 'G'
        raise
    return controller


def _unread_by_peer(sock: socket.socket) -> int:
    """Bytes sent on sock that its peer has not read yet (SIOCOUTQ)."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])


# subprocess's stdio values, by number: subprocess.PIPE (and asyncio's) work here without
# every launcher importing subprocess.
PIPE = -1
STDOUT = -2  # stderr only: where stdout goes
DEVNULL = -3


class Launch:
    """A command checked and encoded for the shim, before any sandbox is taken for it, and the
    pipes and /dev/null its stdio asked for. Used as a context manager around the hand-off:
    leaving it closes the session's ends (the shim has its own copies by then), and after a
    failed launch the launcher's ends too (a launched Sandbox has taken them)."""

    __slots__ = ("_opened", "argv", "bwrap_stderr", "fds", "message", "streams", "tty")

    def __init__(self, argv: Sequence[str], tty: bool) -> None:
        self.argv = argv
        self.message = b""  # the header and the NUL-separated argv and env
        self.fds: list[int] | None = None  # the stdio fds it carries; None: a terminal instead
        self.tty = tty  # the command gets a new terminal (and the launcher its controller)
        self.bwrap_stderr = -1  # for a spawn's bwrap: where the command's stderr goes, or -1
        self.streams = (-1, -1, -1)  # the launcher's end of each PIPE (stdin, stdout, stderr)
        self._opened: list[int] = []  # every fd the launch opened and still holds

    def place_stdio(self, stdio: Sequence[Stdio], special: Sequence[int]) -> int:
        """Open what stdio asks for and list the fds the command gets; the shim's fd mask."""
        mask = 0
        devnull = -1
        streams = [-1, -1, -1]
        placed = [-1, -1, -1]  # the fd each of the command's stdio gets, -1: closed
        self.fds = []
        try:
            for number, given in enumerate(stdio):
                if special[number] == STDOUT:
                    fd = placed[1]
                elif special[number] == PIPE:
                    read_end, write_end = os.pipe2(os.O_CLOEXEC)
                    self._opened += (read_end, write_end)
                    fd, streams[number] = (
                        (read_end, write_end) if number == 0 else (write_end, read_end)
                    )
                elif special[number] == DEVNULL:
                    if devnull < 0:  # one for all three, as Popen opens it
                        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                        self._opened.append(devnull)
                    fd = devnull
                else:
                    name = ("stdin", "stdout", "stderr")[number]
                    fd = stdio_fd(given, name)
                    # None: the launcher's own fd, as spawn's bwrap would inherit it, checked
                    # as a given one is; one the launcher lacked is closed there too.
                    if fd < 0 and not launcher_lacks(number):
                        fd = stdio_fd(number, f"{name} (None: the launcher's own)")
                placed[number] = fd
                if fd < 0:
                    mask |= SHIM_CLOSE_MASK & (0x10 << number)
                else:
                    mask |= 1 << number
                    self.fds.append(fd)
        except BaseException as error:
            self.__exit__()
            if isinstance(error, OSError):
                refuse_if_short_of_fds(error)
            raise
        self.streams = (streams[0], streams[1], streams[2])
        self.bwrap_stderr = placed[2] if stdio[2] is not None else -1
        return mask

    def take_streams(self) -> tuple[int, int, int]:
        """The launcher's ends of the pipes, now the caller's to close."""
        streams, self.streams = self.streams, (-1, -1, -1)
        self._opened = [fd for fd in self._opened if fd not in streams]
        return streams

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        opened, self._opened = self._opened, []
        self.streams = (-1, -1, -1)
        for fd in opened:
            os.close(fd)


def prepare_launch(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    stdio: Sequence[Stdio] = (None, None, None),
    tty: bool = False,
) -> Launch:
    """Check argv and env and encode them for the shim (UsageError: nothing was staged yet).
    Each of stdio is None (the launcher's own fd now), an fd, a file, PIPE or DEVNULL (or for
    stderr STDOUT), as subprocess takes them; the pipes and /dev/null are opened here,
    close-on-exec, and the Launch holds them. tty: the command's stdio is a new terminal
    instead (stderr may still name where a spawn's bwrap writes its messages)."""
    hold_closed_stdio()
    reap_abandoned()  # what earlier handles dropped unwaited left, as Popen() does
    if not isinstance(tty, bool):
        raise UsageError(f"tty is True or False, not {tty!r}")
    if (
        isinstance(argv, str | bytes)
        or not isinstance(argv, Sequence)
        or not argv
        or not all(isinstance(arg, str | bytes | os.PathLike) for arg in argv)
    ):
        raise UsageError(
            "argv must be a non-empty list of strings (or bytes, or paths, as subprocess takes "
            "them), the command and its args"
        )
    if env is not None and not isinstance(env, Mapping):
        raise UsageError(f"env must be a mapping of names to values, not {type(env).__name__}")
    items = []
    for number, arg in enumerate(argv):
        try:
            items.append(os.fsencode(arg))
        except UnicodeEncodeError:  # a lone surrogate, which surrogateescape did not make
            raise UsageError(
                f"argument {number} holds a character no command line can hold: {arg!r}"
            ) from None
    for name, value in (env or {}).items():
        if not is_env_name(name) or not isinstance(value, str) or "\0" in value:
            raise UsageError(f"environment variable {name!r} has an invalid name or value")
        if not encodable(value):
            raise UsageError(
                f"environment variable {name!r}: its value holds a character no environment "
                "can hold (a lone surrogate)"
            )
        items.append(os.fsencode(f"{name}={value}"))
    body = b"\0".join(items) + b"\0"
    if body.count(0) != len(items):
        raise UsageError("an argument or environment value holds a NUL byte")
    if len(body) > SHIM_MAX_BODY:
        raise UsageError(f"argv and env take {len(body)} bytes; at most {SHIM_MAX_BODY}")
    special = _special_stdio(stdio, tty)
    launch = Launch(argv, tty)
    if tty:
        mask = SHIM_TTY
        launch.bwrap_stderr = stdio_fd(stdio[2], "stderr")
    else:
        mask = launch.place_stdio(stdio, special)
    header = SHIM_HEADER.pack(SHIM_MAGIC, mask, len(argv), len(items) - len(argv), len(body))
    launch.message = header + body
    return launch


def _special_stdio(stdio: Sequence[Stdio], tty: bool) -> list[int]:
    """Which of stdio are PIPE, DEVNULL or STDOUT (0 for the others); UsageError for one
    that cannot be (STDOUT but for stderr, any of them with tty, an unknown negative)."""
    special = []
    for number, (given, name) in enumerate(zip(stdio, ("stdin", "stdout", "stderr"), strict=True)):
        value = given if isinstance(given, int) and given < 0 else 0
        if value == STDOUT and number != 2:
            raise UsageError(f"{name}: subprocess.STDOUT is for stderr only")
        if value not in (0, PIPE, DEVNULL, STDOUT):
            raise UsageError(
                f"{name} must be None, an fd, a file object, subprocess.PIPE or "
                f"subprocess.DEVNULL{' (or subprocess.STDOUT)' if number == 2 else ''}"
            )
        if value and tty:
            raise UsageError(
                f"{name}: tty=True gives the command a terminal for its stdio; "
                "PIPE, DEVNULL and STDOUT apply only without it"
            )
        special.append(value)
    return special


def hand_off(staged: Staged, launch: Launch) -> Sandbox:
    """Give a staged sandbox its command; return once the command has exec'd.

    OSError (errno, "execvp", argv[0]) if it cannot be exec'd: the sandbox is then gone.
    StagedGone if the sandbox ended before it took the command; SandboxUnavailable if the
    launcher has no fd left for the hand-off. Either way nothing is left half-launched."""
    if staged.ended():  # its shim could still take the command, and die with its sandbox
        teardown(staged)
        raise StagedGone
    message, fds = launch.message, launch.fds or []
    # What the session holds of the caller's: the command's stdio, and bwrap's stderr.
    try:
        terminals = _terminal.save([*fds, staged.stderr if staged.stderr >= 0 else 2])
    except BaseException:
        teardown(staged)  # a half-launched sandbox is never left behind
        raise
    controller = -1  # the command's terminal, for a launch with tty

    def abandon() -> None:  # a half-launched sandbox is never left behind
        _terminal.restore(terminals)
        teardown(staged)
        if controller >= 0:
            os.close(controller)

    try:
        report_read, report_write = os.pipe2(os.O_CLOEXEC)
    except OSError as error:
        abandon()
        refuse_if_short_of_fds(error)
        raise SandboxUnavailable(
            f"cannot make the launch's pipe ({error.strerror}); nothing was run"
        ) from error
    try:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [report_write, *fds]))]
        try:
            sent = _send_with_rights(staged.sock, message, rights)
            if sent < len(message):  # a stream socket may take a large message in parts
                staged.sock.sendall(memoryview(message)[sent:], socket.MSG_NOSIGNAL)
        except (BrokenPipeError, ConnectionResetError):
            raise StagedGone from None
        finally:
            os.close(report_write)  # now only the shim holds it: EOF comes with its exec
        if launch.tty:
            controller = _receive_terminal(staged, report_read)
        report = _read_report(staged, report_read)
    except BaseException:
        abandon()
        raise
    finally:
        os.close(report_read)
    # "X" then EOF: exec'd. {errno, stage} (after "X" if exec itself failed): refused. EOF
    # alone: the shim was killed before it got that far, and its sandbox with it.
    executing = report[:1] == SHIM_EXECUTING
    failure = report[1:] if executing else report
    if executing and not failure:
        os.close(staged.bwrap_pidfd)  # the handle watches the reaper, init and command
        staged.bwrap_pidfd = -1
        staged.stop_watching_mounts()
        staged.close_socket()
        staged.mark("exec")
        return Sandbox._launched(staged, terminals, controller, launch.argv, launch.take_streams())
    abandon()
    if not failure:
        raise StagedGone
    err, stage_number = SHIM_REPORT.unpack(failure.ljust(SHIM_REPORT.size, b"\0")[:8])
    syscall = SHIM_STAGES.get(stage_number, f"shim stage {stage_number}")
    filename = launch.argv[0] if stage_number == SHIM_EXEC_STAGE else None
    raise _syscalls.SyscallError(err, syscall, filename)


# One raise of the fd limit at a time, and its putting back. _thread's lock: importing threading
# would cost every `nsconfine run` its quick exit (nsconfine._cli.main.console_main).
_raised_limit = _thread.allocate_lock()


def _send_with_rights(
    sock: socket.socket, message: bytes, rights: list[tuple[int, int, array.array[int]]]
) -> int:
    """sock.sendmsg of message and rights. Every account has one count of the fds sent over
    unix sockets and not yet received, and an unprivileged sender's send fails (ETOOMANYREFS)
    once it passes the sender's own soft fd limit: a session of the launcher's account can fill
    it to its own open_files and never read them. The send is then tried again with the soft
    limit raised to the hard one, which is put back after (the launcher's own programs keep
    the limit they were written for); past that, the launch is refused."""
    import errno
    import resource

    try:
        return sock.sendmsg([message], rights, socket.MSG_NOSIGNAL)
    except OSError as error:
        if error.errno != errno.ETOOMANYREFS:
            raise
    with _raised_limit:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            try:
                return sock.sendmsg([message], rights, socket.MSG_NOSIGNAL)
            except OSError as again:
                if again.errno != errno.ETOOMANYREFS:
                    raise
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    raise SandboxUnavailable(
        "this account's count of fds passed over unix sockets and not yet received is full "
        "(ETOOMANYREFS), past this launcher's fd limit: a session of the account holds them; "
        "end it, raise the launcher's hard fd limit (LimitNOFILE=) well above the sessions' "
        "open_files, or run sessions as an account of their own (--user)"
    )


def _read_report(staged: Staged, report_read: int) -> bytes:
    """What the shim writes on the error pipe, up to its EOF. If the shim died with the message
    still queued on its socket, the pipe's write end would sit in that queue and EOF would
    never come: its pidfd says it is gone, and the unread bytes say it never took the message."""
    poller = select.poll()
    # No POLLIN: the pipe wakes this launcher once, at its EOF (POLLHUP, always reported), not
    # again for the bytes the shim writes before (its "X", or a report).
    poller.register(report_read, 0)
    poller.register(staged.command_pidfd, select.POLLIN)
    while True:
        events = dict(poller.poll())
        if report_read in events:
            report = b""
            while chunk := os.read(report_read, SHIM_REPORT.size + 1):
                report += chunk
            return report
        if events:
            if _unread_by_peer(staged.sock) > 0:
                raise StagedGone
            # It took the message: EOF comes (another thread's spawn child may hold a
            # copy of the write end for the instant before its exec).
            poller.unregister(staged.command_pidfd)
