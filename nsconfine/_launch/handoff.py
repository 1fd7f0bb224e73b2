"""The hand-off: a staged sandbox (nsconfine._launch.stage) gets its command.

The command is checked and encoded for the exec shim before any sandbox is taken for it
(prepare_launch); hand_off sends it, its stdio (unless it gets a terminal of its own) and (for
a pool) its environment over the shim's socket, with a fresh error pipe: EOF on that pipe means
the exec succeeded; else the shim reports the errno, the sandbox is torn down, and the launch
raises OSError. The launched sandbox is a Sandbox handle.
"""

from __future__ import annotations

# The C module socket.py wraps (see nsconfine/_launch/stage.py).
import _socket as socket
import os
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
from nsconfine._launch.sandbox import Sandbox
from nsconfine._launch.stage import Staged, hold_closed_stdio, launcher_lacks, stdio_fd, teardown
from nsconfine._text import is_env_name

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from nsconfine._launch.stage import Stdio


class StagedGone(Exception):
    """The staged sandbox ended before it took its command (expired or killed)."""


def _receive_terminal(staged: Staged, report_read: int) -> int:
    """The controller of the command's new terminal, sent by the shim ('T' and the fd), sized
    as the launcher's own terminal (else 24x80), after which the shim is told to go on ('G').
    -1 if the shim reported a failure (or ended) first."""
    import array
    import fcntl
    import select
    import struct
    import termios

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
    import fcntl
    import struct
    import termios

    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])


class Launch:
    """A command checked and encoded for the shim, before any sandbox is taken for it."""

    __slots__ = ("argv", "fds", "message", "tty")

    def __init__(
        self, argv: Sequence[str], message: bytes, fds: list[int] | None, tty: bool = False
    ) -> None:
        self.argv = argv
        self.message = message  # the header and the NUL-separated argv and env
        self.fds = fds  # the stdio fds it carries; None: it gets a terminal of its own
        self.tty = tty  # the command gets a new terminal (and the launcher its controller)


def prepare_launch(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    stdio: Sequence[Stdio] = (None, None, None),
    tty: bool = False,
) -> Launch:
    """Check argv and env and encode them for the shim (UsageError: nothing was staged yet).
    Each of stdio is None (the launcher's own fd now), an fd or a file. tty: the command's
    stdio is a new terminal instead."""
    hold_closed_stdio()
    if (
        isinstance(argv, str | bytes)
        or not argv
        or not all(isinstance(arg, str | bytes | os.PathLike) for arg in argv)
    ):
        raise UsageError("argv must be a non-empty list of strings, the command and its args")
    items = [os.fsencode(arg) for arg in argv]
    for name, value in (env or {}).items():
        if not is_env_name(name) or not isinstance(value, str) or "\0" in value:
            raise UsageError(f"environment variable {name!r} has an invalid name or value")
        items.append(os.fsencode(f"{name}={value}"))
    body = b"\0".join(items) + b"\0"
    if body.count(0) != len(items):
        raise UsageError("an argument or environment value holds a NUL byte")
    if len(body) > SHIM_MAX_BODY:
        raise UsageError(f"argv and env take {len(body)} bytes; at most {SHIM_MAX_BODY}")
    mask = SHIM_TTY if tty else 0
    fds: list[int] = []
    if not tty:
        for number, (given, name) in enumerate(
            zip(stdio, ("stdin", "stdout", "stderr"), strict=True)
        ):
            fd = stdio_fd(given, name)
            if fd < 0:  # None: the launcher's own fd, as spawn's bwrap would inherit it
                if launcher_lacks(number):
                    mask |= SHIM_CLOSE_MASK & (0x10 << number)  # closed here: closed there too
                    continue
                fd = number
            mask |= 1 << number
            fds.append(fd)
    header = SHIM_HEADER.pack(SHIM_MAGIC, mask, len(argv), len(items) - len(argv), len(body))
    return Launch(argv, header + body, None if tty else fds, tty)


def hand_off(staged: Staged, launch: Launch) -> Sandbox:
    """Give a staged sandbox its command; return once the command has exec'd.

    OSError (errno, "execvp", argv[0]) if it cannot be exec'd: the sandbox is then gone.
    StagedGone if the sandbox ended before it took the command; SandboxUnavailable if the
    launcher has no fd left for the hand-off. Either way nothing is left half-launched."""
    import array

    if staged.ended():  # its shim could still take the command, and die with its sandbox
        teardown(staged)
        raise StagedGone
    message, fds = launch.message, launch.fds or []
    # What the session holds of the caller's: the command's stdio, and bwrap's stderr.
    terminals = _terminal.save([*fds, staged.stderr if staged.stderr >= 0 else 2])
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
        ) from None
    try:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [report_write, *fds]))]
        try:
            sent = staged.sock.sendmsg([message], rights, socket.MSG_NOSIGNAL)
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
        staged.sock.close()
        staged.mark("exec")
        return Sandbox._launched(staged, terminals, controller)
    abandon()
    if not failure:
        raise StagedGone
    err, stage_number = SHIM_REPORT.unpack(failure.ljust(SHIM_REPORT.size, b"\0")[:8])
    syscall = SHIM_STAGES.get(stage_number, f"shim stage {stage_number}")
    filename = launch.argv[0] if stage_number == SHIM_EXEC_STAGE else None
    raise _syscalls.SyscallError(err, syscall, filename)


def _read_report(staged: Staged, report_read: int) -> bytes:
    """What the shim writes on the error pipe, up to its EOF. If the shim died with the message
    still queued on its socket, the pipe's write end would sit in that queue and EOF would
    never come: its pidfd says it is gone, and the unread bytes say it never took the message."""
    import select

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
