"""`nsconfine run`'s side of a running session: signals passed on, and (--tty) the terminal.

Signals: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and SIGWINCH that reach the launcher
go to the command (its traps run), and the launcher exits with its status. The first of the
ending ones (INT, TERM, HUP, QUIT) also starts a grace period: if the session has not ended when
it is over, or at a second such signal, the whole session is killed. The handlers only wake the
loop below (the wakeup fd carries the signal numbers): no work, and no lock, inside a handler.

With --tty the command has a terminal of its own (a pty of the sandbox's, its controlling
terminal: job control, /dev/tty, Ctrl-C and Ctrl-Z for its foreground job). The launcher's own
terminal is put in raw mode, so that every key reaches the session's terminal, and bytes are
copied both ways; a window-size change (SIGWINCH) is copied to the session's terminal, whose
kernel tells its foreground job. The launcher's terminal is put back as it was at the end.
Input goes to the session's terminal only as fast as it takes it (the launcher stops reading
its stdin meanwhile): a session that never reads its input cannot block the launcher, which
goes on relaying output and signals, and returns when the session ends.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

from nsconfine._syscalls import poll_ms, wait_fd

TYPE_CHECKING = False  # see nsconfine/_executor.py
if TYPE_CHECKING:
    from nsconfine._sandbox import Sandbox

ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
FORWARDED_SIGNALS = (*ENDING_SIGNALS, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH)
_CHUNK = 65536


class _Terminal:
    """The copying between the launcher's stdin/stdout and the session's terminal."""

    def __init__(self, controller: int) -> None:
        import termios
        import tty

        self.controller = controller
        os.set_blocking(controller, False)  # see from_stdin
        self.open = True  # until the session's side of its terminal is closed
        self.reading_stdin = True
        self.pending = b""  # input read from stdin, not yet taken by the session's terminal
        self.saved = None
        if os.isatty(0):
            self.saved = termios.tcgetattr(0)
            tty.setraw(0, termios.TCSANOW)
        self.resize()

    def resize(self) -> None:
        """The launcher's window size, onto the session's terminal."""
        import fcntl
        import termios

        for fd in (0, 1):
            try:
                size = fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
            except OSError:
                continue
            fcntl.ioctl(self.controller, termios.TIOCSWINSZ, size)
            return

    def events(self) -> dict[int, int]:
        """What to wait for: the session's output (and room for pending input) while its
        terminal is open; more input only once the session has taken what was read."""
        wanted = {}
        if self.open:
            wanted[self.controller] = select.POLLIN | (select.POLLOUT if self.pending else 0)
        if self.reading_stdin and not self.pending:
            wanted[0] = select.POLLIN
        return wanted

    def from_stdin(self) -> None:
        self.pending = os.read(0, _CHUNK)
        if not self.pending:
            self.reading_stdin = False
        self.to_session()

    def to_session(self) -> None:
        """As much pending input as the session's terminal takes now, without waiting: a
        session that does not read would otherwise block the launcher in its write for good."""
        try:
            self.pending = self.pending[os.write(self.controller, self.pending) :]
        except BlockingIOError:
            pass
        except OSError:  # EIO: the session's end is gone, and its input with it
            self.pending = b""

    def to_stdout(self) -> bool:
        """Copy what the session wrote; False once its terminal is closed on its side."""
        try:
            data = os.read(self.controller, _CHUNK)
        except BlockingIOError:
            return True  # woken for room to write, or nothing after all
        except OSError:  # EIO: no process holds the session's end any more
            return False
        if not data:
            return False
        _write_all(1, data)
        return True

    def drain(self) -> None:
        """What the session wrote before it ended, to the end of its terminal: once no process
        holds the session's side, a read gives what is left and then EIO (so waiting is safe:
        nobody can write any more, and bytes still on their way through the terminal arrive)."""
        os.set_blocking(self.controller, True)
        while self.to_stdout():
            pass

    def restore(self) -> None:
        import termios

        if self.saved is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, self.saved)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            wait_fd(fd, None, writable=True)


@contextmanager
def held_signals() -> Iterator[int]:
    """From before the launch until the session is over: the forwarded signals only wake the
    launcher (their numbers on the fd this yields), so one that arrives while the sandbox is
    still being built is passed on once it runs, not lost by killing the launcher. The
    handlers and wakeup fd before are put back after."""
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous_fd = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    previous = {number: signal.signal(number, _wake_only) for number in FORWARDED_SIGNALS}
    try:
        yield wake_read
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        signal.set_wakeup_fd(previous_fd)
        os.close(wake_read)
        os.close(wake_write)


@contextmanager
def kept_stdio_flags() -> Iterator[None]:
    """The file status flags of the launcher's fds 0-2, put back when the session is over: a
    session shares their open files, and one that left O_NONBLOCK on a pipe would cut short
    the output of the caller's next writer to it (EAGAIN). Terminals get more: see
    nsconfine/_terminal.py."""
    import fcntl

    flags = {}
    for fd in (0, 1, 2):
        try:
            flags[fd] = fcntl.fcntl(fd, fcntl.F_GETFL)
        except OSError:
            continue  # closed
    try:
        yield
    finally:
        for fd, kept in flags.items():
            try:
                fcntl.fcntl(fd, fcntl.F_SETFL, kept)
            except OSError:
                pass


def _wake_only(_number: int, _frame: object) -> None:
    pass  # the wakeup fd has the number; run_session acts on it


def run_session(sandbox: Sandbox, grace: float, wake_read: int) -> int:
    """Wait for the session, passing on the signals held_signals() collects on wake_read (and
    copying its terminal, if it has one); its status."""
    terminal = _Terminal(sandbox.tty) if sandbox.tty >= 0 else None
    try:
        _relay(sandbox, terminal, grace, wake_read)
        if terminal is not None and terminal.open:
            terminal.drain()  # before the handle reaps the session, which closes its terminal
    except BaseException:  # the launcher is leaving (its stdout gone): the session goes first
        sandbox.kill()
        sandbox.wait()
        raise
    finally:
        if terminal is not None:
            terminal.restore()
    return sandbox.wait()


def _relay(sandbox: Sandbox, terminal: _Terminal | None, grace: float, wake_read: int) -> None:
    """Until the session has ended (its sentinel readable; not yet reaped): signals passed
    on, the grace period kept, and its terminal copied both ways."""
    deadline: float | None = None
    signalled = False
    while True:
        poller = select.poll()
        poller.register(sandbox.sentinel, select.POLLIN)
        poller.register(wake_read, select.POLLIN)
        if terminal is not None:
            for fd, wanted in terminal.events().items():
                poller.register(fd, wanted)
        timeout = None if deadline is None else poll_ms(deadline - time.monotonic())
        events = dict(poller.poll(timeout))
        if sandbox.sentinel in events:
            return
        if not events:  # the grace period is over
            sandbox.kill()
            deadline = None
            continue
        if terminal is not None:
            if events.get(0, 0) & (select.POLLIN | select.POLLHUP):
                terminal.from_stdin()
            if events.get(terminal.controller, 0) & select.POLLOUT:
                terminal.to_session()
            if terminal.controller in events and not terminal.to_stdout():
                terminal.open = terminal.reading_stdin = False
        if wake_read not in events:
            continue
        for received in os.read(wake_read, 64):
            if received == signal.SIGWINCH and terminal is not None:
                terminal.resize()  # the session's terminal tells its foreground job
            elif received not in ENDING_SIGNALS:
                sandbox.send_signal(received)  # passed on, nothing more
            elif signalled:
                sandbox.kill()
                deadline = None
            else:
                signalled = True
                sandbox.send_signal(received)
                deadline = time.monotonic() + grace
