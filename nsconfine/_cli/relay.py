"""`nsconfine run`'s side of a running session: signals passed on, the caller's terminal
relayed, and (--tty) the session's own terminal.

Signals: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and SIGWINCH that reach the launcher
go to the command (its traps run), and the launcher exits with its status. The first of the
ending ones (INT, TERM, HUP, QUIT) also starts a grace period: if the session has not ended when
it is over, or at a second such signal, the whole session is killed. SIGCONT (the launcher was
stopped and is continued: `fg`) is held too: the launcher may be the foreground job again, and
(--tty) its terminal is made raw again. The handlers only wake the loop below (the wakeup fd
carries the signal numbers): no work, and no lock, inside a handler.

The caller's terminal is never the session's to read. Without --tty, each of the launcher's fds
0-2 that is a terminal reaches the session as a pipe the launcher relays (stdout and stderr on
one terminal share one pipe, so that their order holds): a session holding that terminal could
read it while its output went there, and went on reading it when a Ctrl-Z stopped the launcher
(a session of its own, outside job control, it is not stopped with it): what the user typed at
the shell next was the session's. Input is read only while the launcher is in the foreground:
stopped or in the background, it leaves what is typed to the shell. Output to a regular file is
relayed too (a pipe each, or one for both): handed over as it was, the session could re-open it
through /proc/self/fd, to read a log's earlier lines, and truncate it. Pipes, FIFOs, sockets
and input that is no terminal are handed over as they are (nothing of run's stands between
the session and them). What the session wrote to a terminal is the terminal's to act on, so
when it wrote an escape, its modes go off and its queries' answers are dropped at its end, as
for --tty. With
--tty, only bwrap's stderr is relayed (the command has its own terminal).

With --tty the command has a terminal of its own (a pty of the sandbox's, its controlling
terminal: job control, /dev/tty, Ctrl-C and Ctrl-Z for its foreground job). The launcher's own
terminal is put in raw mode, so that every key reaches the session's terminal, and bytes are
copied both ways; a window-size change (SIGWINCH) is copied to the session's terminal, whose
kernel tells its foreground job. Input goes to the session's terminal only as fast as it takes
it (the launcher stops reading its stdin meanwhile): a session that never reads its input cannot
block the launcher, which goes on relaying output and signals, and returns when the session ends.
When the command stops itself, or asks to (a TUI at Ctrl-Z: see _Terminal.to_suspend), the
launcher puts its terminal back and stops too, a job of the caller's shell; continued, it makes
the terminal raw again, copies its size and continues the command's group. (The command is not
the launcher's child: its state is read in /proc, every second and just after it was sent a
suspend character.) When the session ends, the modes a TUI sets (mouse reporting, the alternate
screen, …) are turned off, the answers to queries the session left on their way are read and
dropped, and the terminal's settings are put back.

What the session wrote is copied to the caller's fds without waiting on them (_Output): a
reader that stops (a pager paused, a stalled log pipe) holds the session's output back, never
the loop, which goes on hearing signals: the second ending one, or the grace period over, kills
the session and ends run (what the caller had not taken by then is dropped).

Once the session has ended, what it wrote is copied to the end of each pipe and of its terminal,
or until nothing came for DRAIN_IDLE_SECONDS: an end the session left in flight in a unix socket
is held until the kernel's collector frees it (the reaper starts one), never for good. A slow
reader of the caller's gets all of it, until an ending signal comes.
"""

from __future__ import annotations

# signal's own C module: importing signal imports enum (~1-2 ms of every command line's start)
import _signal  # type: ignore[import-not-found]
import errno
import os
import select
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from nsconfine._kernel.syscalls import poll_ms, wait_fd

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    import socket
    from typing import Any, TypeVar

    from nsconfine._launch.sandbox import Sandbox

    T = TypeVar("T")

ENDING_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)
FORWARDED_SIGNALS = (*ENDING_SIGNALS, _signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGWINCH)
HELD_SIGNALS = (*FORWARDED_SIGNALS, _signal.SIGCONT)
_CHUNK = 65536
DRAIN_IDLE_SECONDS = 0.5
# What an ended session wrote is copied while waiting for it takes DRAIN_SECONDS at most in all
# (the time the caller's stdout takes to take it is not counted: a slow reader gets it all), and
# DRAIN_MOST_SECONDS however it comes: a write end it handed to another session (through a socket
# in their workspace) can be written to for as long as that one lives, slowly or in a flood.
DRAIN_SECONDS = 2.0
DRAIN_MOST_SECONDS = 30.0
STATE_CHECK_SECONDS = 1.0  # how often a launcher in the background, or a --tty command, is
# looked at again (in the foreground now? stopped?)
SUSPEND_CHECK_SECONDS = 0.05  # how often, for SUSPEND_WINDOW_SECONDS after a suspend character
SUSPEND_WINDOW_SECONDS = 0.5
ANSWER_SECONDS = 0.5  # how long the caller's terminal may take to answer a status query

# What a TUI may leave on in the caller's terminal, turned off: first a control string left
# open (DCS, OSC, APC, PM, SOS: the terminal would swallow all that follows) ended; mouse
# reporting (X10, normal, highlight, button, any motion, UTF-8, SGR, urxvt, SGR pixels), focus
# events, bracketed paste, the alternate screen (the cursor saved first: leaving a screen never
# entered then moves nothing), application cursor keys and keypad, every kitty keyboard-protocol
# push (99 popped: an emptied stack stays empty), xterm's modifyOtherKeys; the scroll region made
# the whole screen with the cursor kept where it was (saved and restored around it; the restore
# brings back origin mode, harmless with no margins), left and right margins, autowrap back on,
# insert mode off; the palette and the default colours back to the terminal's own (text drawn
# in its background's colour is unseen); G0 and G1 back to ASCII with G0 shifted in (the
# line-drawing set garbles a prompt); then the cursor shown, SGR reset (last: a terminal that
# reads `CSI > 4 m` as SGR underlines nothing after it). What run prints next (the warnings
# about what the session wrote) must be seen: the session chose the state it ended in.
TUI_RESET = (
    b"\033\\"
    b"\033[?9l\033[?1000l\033[?1001l\033[?1002l\033[?1003l\033[?1005l\033[?1006l\033[?1015l"
    b"\033[?1016l\033[?1004l\033[?2004l\0337\033[?1049l\033[?1l\033>\033[<99u\033[>4m"
    b"\0337\033[r\0338\033[?69l\033[?7h\033[4l"
    b"\033]104\033\\\033]110\033\\\033]111\033\\\033]112\033\\"
    b"\033(B\033)B\017\033[?25h\033[0m"
)
# Device status: the terminal answers ESC [ 0 n, after its answers to every earlier query.
STATUS_QUERY = b"\033[5n"
STATUS_ANSWER = b"\033[0n"


class _Occurrences:
    """How many times a sequence came in a stream read in pieces, one split between two
    pieces counted too. (Its 7-bit form only: a UTF-8 terminal takes no 8-bit CSI, and the
    byte is in UTF-8 text: "ě5n".)"""

    def __init__(self, sequence: bytes) -> None:
        self.sequence = sequence
        self.count = 0
        self.tail = b""  # the last bytes seen, too few to hold a whole sequence

    def see(self, data: bytes) -> None:
        joined = self.tail + data
        self.count += joined.count(self.sequence)
        self.tail = joined[-(len(self.sequence) - 1) :]


# For _StatusQueries, how a terminal's parser reads each byte inside a sequence: _STOPS marks
# with "S" what ends or cuts one short (a final byte, ESC, CAN, SUB); _PASSED_OVER is what it
# goes on past (a C0 control, acted on; DEL; a byte past 0x7F, which tmux and the VT500 parser
# skip there).
_STOPS = bytes(
    ord("S") if 0x40 <= byte <= 0x7E or byte in (0x1B, 0x18, 0x1A) else ord(".")
    for byte in range(256)
)
_PASSED_OVER = bytes(byte for byte in range(256) if byte < 0x20 or byte >= 0x7F)


class _StatusQueries:
    """How many device status queries (CSI 5 n, answered CSI 0 n) a stream read in pieces
    holds, as a terminal's parser takes them (ECMA-48, the VT500 parser xterm and tmux follow):
    a first parameter of 5 however many zeros lead it, whatever parameters follow; a C0
    control within is acted on and the sequence goes on (a NUL is dropped), as is a byte past
    0x7F; CAN or SUB cuts it short, ESC starts another. Counting "ESC [ 5 n" alone, a session's
    "ESC [ 0 5 n" was answered uncounted, and run stopped dropping answers one early
    (attacker's pass, stop 38). When in doubt (a parameter past 64 bytes) a query is counted:
    one answer too many waited for costs run a timeout, one too few gives the shell what
    follows. 7-bit CSI only, as _Occurrences. Each sequence is looked through in C (a TUI
    writes megabytes of them)."""

    __slots__ = ("_escape", "_parameters", "_sequence", "count")

    def __init__(self) -> None:
        self.count = 0
        self._escape = False  # an ESC seen, what follows it not yet
        self._sequence = False  # within a CSI sequence
        # its bytes so far, those passed over left out: 64 at most, a 65th saying there were more
        self._parameters = b""

    def see(self, data: bytes) -> None:
        stops = None
        at, end = 0, len(data)
        while at < end:
            if self._sequence:
                if stops is None:
                    stops = data.translate(_STOPS)
                stop = stops.find(b"S", at)
                final = -1 if stop < 0 else data[stop]
                if final in (-1, 0x6E) and len(self._parameters) <= 64:  # (only n asks)
                    taken = data[at : end if stop < 0 else stop].translate(None, _PASSED_OVER)
                    self._parameters = (self._parameters + taken)[:65]
                if stop < 0:
                    return
                self._sequence, at = False, stop + 1
                if final == 0x1B:
                    self._escape = True
                elif final == 0x6E and self._asks_status():
                    self.count += 1
            elif self._escape:
                byte = data[at]
                at += 1
                if byte == 0x5B:
                    self._escape, self._sequence, self._parameters = False, True, b""
                elif byte in (0x18, 0x1A) or 0x20 <= byte < 0x7F:
                    self._escape = False  # cut short, or another kind of escape
            else:
                at = data.find(b"\033", at)  # text is skipped in C
                if at < 0:
                    return
                self._escape, at = True, at + 1

    def _asks_status(self) -> bool:
        """Do the parameters read (no private marker, no intermediate byte) ask the status?"""
        parameters = self._parameters
        if len(parameters) > 64:
            return True
        if parameters.translate(None, b"0123456789;:"):
            return False
        return parameters.split(b";")[0].split(b":")[0].lstrip(b"0") == b"5"


# What may turn a mode on or ask the terminal a question in what a session wrote: ESC, the
# 8-bit introducers (DCS, SOS, CSI, ST, OSC, PM, APC), ENQ (answered with an answerback message)
# and SO (shifts to G1, the line-drawing set where a terminal starts with it there).
# (Deleted with bytes.translate to find one: no regular expression, nor `re`, on run's way.)
_ESCAPES = b"\x05\x0e\x1b\x90\x98\x9b\x9c\x9d\x9e\x9f"


def leave_tui_modes(out: int, limit: DrainLimit, queries: int) -> None:
    """Turn off the modes a TUI may have left on in the terminal at fd out (the caller's), and
    read the answers still coming to the queries it sent, up to the answer to a query of our
    own (answers come in order; queries: the session's own status queries, whose answers come
    first), so that none is typed into the caller's shell. The answers
    are read from fd 0 where it is that terminal, else from that terminal opened again
    (run's stdin elsewhere: </dev/null, a pipe), echo and line editing off meanwhile (a
    cooked terminal holds a partial line back; its echo would print them). A launcher in the
    background can do neither: the answers then reach the job that reads the terminal."""
    if not os.isatty(out) or not _in_foreground(out):
        return
    _write_all(out, TUI_RESET, limit)
    reader = _reader_of(out)
    if reader < 0:
        return  # the answers go to a terminal the launcher cannot read
    try:
        _drop_answers(out, reader, limit, queries + 1)
    finally:
        if reader != 0:
            os.close(reader)


def _reader_of(out: int) -> int:
    """An fd to read the terminal at out from: 0 if it is that terminal, else the terminal
    opened again by its name (the caller closes it); -1 if it cannot be."""
    terminal = os.fstat(out).st_rdev
    if os.isatty(0) and os.fstat(0).st_rdev == terminal:
        return 0
    try:
        reader = os.open(os.ttyname(out), os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return -1
    if os.fstat(reader).st_rdev != terminal:  # (renamed meanwhile: not the one)
        os.close(reader)
        return -1
    return reader


def _drop_answers(out: int, reader: int, limit: DrainLimit, expected: int) -> None:
    """Read and drop what the terminal at reader sends until the expected-th status answer
    (the last one run's own), or ANSWER_SECONDS pass."""
    import termios

    saved = termios.tcgetattr(reader)
    quiet = termios.tcgetattr(reader)
    quiet[3] &= ~(termios.ICANON | termios.ECHO)
    quiet[6][termios.VMIN], quiet[6][termios.VTIME] = 1, 0
    termios.tcsetattr(reader, termios.TCSANOW, quiet)
    try:
        _write_all(out, STATUS_QUERY, limit)
        answers = _Occurrences(STATUS_ANSWER)
        deadline = time.monotonic() + ANSWER_SECONDS
        while answers.count < expected:
            if not wait_fd(reader, deadline - time.monotonic()):
                termios.tcflush(reader, termios.TCIFLUSH)  # no answer: what is on its way goes
                return
            try:
                chunk = os.read(reader, 4096)
            except OSError:
                return
            if not chunk:
                return
            answers.see(chunk)
    finally:
        termios.tcsetattr(reader, termios.TCSANOW, saved)


def _in_foreground(fd: int = 0) -> bool:
    """Is the launcher the foreground job of the terminal at fd (so that reading it, or
    writing to it, stops no one)?"""
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:  # not its controlling terminal: no job control applies
        return True


class _TerminalGone(Exception):
    """The caller's terminal hung up (closed under the launcher)."""


# What a call on a terminal that hung up fails with.
_HUNG_UP = frozenset({errno.EIO, errno.ENXIO, errno.ENOTTY, errno.EBADF})


def _has_a_controlling_terminal() -> bool:
    """Has the launcher a controlling terminal (of which a shell's job control is made)?"""
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC))
    except OSError:  # ENXIO: none
        return False
    return True


def _on_terminal(call: Callable[..., T], *args: object) -> T:
    """call(*args), a termios call on the caller's terminal, again when a signal interrupts it
    (termios does not retry: a launcher continued by `fg` while `bg` had it stopped setting
    the terminal's modes); _TerminalGone once that terminal has hung up."""
    import termios

    while True:
        try:
            return call(*args)
        except termios.error as error:
            if error.args[0] == errno.EINTR:
                continue
            if error.args[0] in _HUNG_UP:
                raise _TerminalGone from None
            raise


class _Terminal:
    """The copying between the launcher's stdin/stdout and the session's terminal. Once the
    caller's terminal has hung up, the session's output goes nowhere and its input has ended
    (the hangup itself is passed on, as a signal)."""

    def __init__(self, controller: int, command_pid: int) -> None:
        import termios

        self.controller = controller
        os.set_blocking(controller, False)  # see from_stdin
        self.open = True  # until the session's side of its terminal is closed
        self.reading_stdin = True
        self.pending = b""  # input read from stdin, not yet taken by the session's terminal
        self.line_ended = True  # the input so far ends with a whole line (or is none)
        self.caller_gone = False  # the caller's terminal hung up
        self.output = _Output(1)  # what the session wrote that stdout has not taken yet
        # The status queries the session wrote to the caller's terminal, and the answers that
        # reached it through stdin: those left are answered before run's own.
        self.status_queries = _StatusQueries()
        self.status_answers = _Occurrences(STATUS_ANSWER)
        self.saved: list[Any] | None = None  # its modes, to put back
        try:
            if os.isatty(0):
                try:
                    self.saved = _on_terminal(termios.tcgetattr, 0)
                except _TerminalGone:
                    self._hung_up()
            self.raw()
            self.resize()
        except BaseException:
            self.output.close()
            raise
        try:  # the command's state, as the kernel shows it (it is not the launcher's child)
            self.command_stat = os.open(f"/proc/{command_pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # already gone
            self.command_stat = -1
        self.command_pid = command_pid
        self.next_check = time.monotonic() + STATE_CHECK_SECONDS
        self.quick_until = 0.0  # after a suspend character: look sooner, until then
        self.modes_at_suspend = 0  # the session's terminal's local modes before it

    def raw(self) -> None:
        import termios
        import tty

        if self.saved is not None and not self.caller_gone:
            try:
                _on_terminal(tty.setraw, 0, termios.TCSANOW)
            except _TerminalGone:
                self._hung_up()

    def _hung_up(self) -> None:
        # (its modes are still put back if it takes them: EIO also comes to an orphaned
        # background job, the terminal alive)
        self.caller_gone = True
        self.reading_stdin = False
        self.pending = b""
        self.output.pending = b""

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
        if self.output.pending:  # its terminal is looked at again once stdout took that
            wanted[1] = select.POLLOUT
        elif self.open:
            wanted[self.controller] = select.POLLIN | (select.POLLOUT if self.pending else 0)
        if self.reading_stdin and not self.pending:
            wanted[0] = select.POLLIN
        return wanted

    def handle(self, events: dict[int, int]) -> None:
        if events.get(0, 0) & (select.POLLIN | select.POLLHUP):
            self.from_stdin()
        if 1 in events:
            self.flush()
        if events.get(self.controller, 0) & select.POLLOUT:
            self.to_session()
        if self.controller in events:
            self.copy_out()

    def copy_out(self) -> None:
        if not self.to_stdout():
            self.open = self.reading_stdin = False

    def from_stdin(self) -> None:
        try:
            self.pending = os.read(0, _CHUNK)
        except OSError as error:
            if error.errno not in _HUNG_UP:
                raise
            self._hung_up()
            return
        if not self.pending:
            self.reading_stdin = False
            if self.saved is None:
                self.pending = self._end_of_file()
        else:
            self.status_answers.see(self.pending)
            self.line_ended = self.pending.endswith((b"\n", b"\r"))
            self._note_suspend(self.pending)
        self.to_session()

    def _end_of_file(self) -> bytes:
        """The end of a stdin that is no terminal, as the session's terminal takes it: its EOF
        character (Ctrl-D), twice after a partial line (the first ends the line), as `script`
        passes it on; a terminal can be told no other way."""
        import termios

        try:
            eof = termios.tcgetattr(self.controller)[6][termios.VEOF]
        except (OSError, termios.error):
            return b""  # the session's end is gone
        eof = eof if isinstance(eof, bytes) and eof != b"\0" else b"\x04"
        return eof if self.line_ended else eof * 2

    def _note_suspend(self, data: bytes) -> None:
        """If data holds the session's terminal's suspend character (Ctrl-Z) and the command's
        own group reads that terminal (not a job of a shell inside, whose job control works),
        look at the command soon, with the terminal's local modes as they were before."""
        import termios

        try:
            attributes = termios.tcgetattr(self.controller)  # the session's side's settings
            suspend = attributes[6][termios.VSUSP]
            if (suspend if suspend != b"\0" else b"\x1a") not in data:
                return
            if os.tcgetpgrp(self.controller) != self.command_pid:  # in our pid numbers
                return
        except (OSError, termios.error):
            return
        now = time.monotonic()
        self.quick_until = now + SUSPEND_WINDOW_SECONDS
        self.next_check = now + SUSPEND_CHECK_SECONDS
        self.modes_at_suspend = attributes[3]

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
        if not self.caller_gone:
            self.status_queries.see(data)
            self.output.pending += data
            self.flush()
        return True

    def flush(self) -> None:
        """What stdout takes now of what the session wrote."""
        try:
            self.output.write_some()
        except OSError as error:
            if error.errno not in _HUNG_UP:
                raise  # (EPIPE: run ends as a writer to a closed pipe does)
            self._hung_up()

    def check_due(self) -> float:
        """Seconds until the command's state is to be looked at next."""
        return self.next_check - time.monotonic()

    def to_suspend(self) -> tuple[bool, bool]:
        """Is the session to be suspended, and must the launcher stop the command's group
        itself? The next check is due then.

        The command stopped (SIGSTOP): yes. But the kernel drops a SIGTSTP in the command's
        group (a session leader's, whose parent is in another session: an orphaned group), so
        just after a suspend character it reads, the launcher stands in for it: when the
        command, raw, left raw mode (a TUI puts its terminal back, then sends its group
        SIGTSTP: Claude Code, Codex), or when the terminal's kernel sent its group SIGTSTP,
        which it neither catches nor ignores (cat)."""
        import termios

        now = time.monotonic()
        soon = now < self.quick_until
        self.next_check = now + (SUSPEND_CHECK_SECONDS if soon else STATE_CHECK_SECONDS)
        try:
            if os.pread(self.command_stat, 1024, 0).rsplit(b")", 1)[1].split()[0] == b"T":
                return True, False
            if not soon or os.tcgetpgrp(self.controller) != self.command_pid:
                return False, False
            modes = termios.tcgetattr(self.controller)[3]
        except (OSError, IndexError, termios.error):  # gone
            return False, False
        before = self.modes_at_suspend
        if not before & termios.ICANON and modes & termios.ICANON:
            return True, True
        if before & termios.ISIG and self._tstp_default():
            return True, True
        return False, False

    def _tstp_default(self) -> bool:
        """Is the command's SIGTSTP neither caught nor ignored?"""
        bit = 1 << (_signal.SIGTSTP - 1)
        try:
            with open(f"/proc/{self.command_pid}/status", "rb") as status:
                masks = dict(line.split(b":", 1) for line in status if b":" in line)
            return not (int(masks[b"SigIgn"], 16) | int(masks[b"SigCgt"], 16)) & bit
        except (OSError, KeyError, ValueError):
            return False

    def suspend(self, sandbox: Sandbox, stop_it: bool) -> None:
        """The session asked to be suspended: the command's group stopped (stop_it), the
        caller's terminal back, the launcher stopped as a job of the caller's shell until it
        is continued (`fg`), then the command's group continued. SIGTSTP, not SIGSTOP, stops
        the launcher's process group (a script that ran it too, as Ctrl-Z would): outside job
        control (an orphaned group, which no shell would continue) the kernel drops it, and
        all goes on at once. A launcher without a controlling terminal (a service's, a
        script's background job) is outside job control too, but in a group the kernel may
        stop: it is not stopped at all."""
        while self.open and wait_fd(self.controller, 0):
            self.copy_out()  # what the command wrote as it stopped ("suspended")
        if stop_it:
            _signal_group(sandbox, _signal.SIGSTOP)
        # As at the session's end: its modes off, and the answers still coming to its queries
        # dropped, or the shell the terminal goes back to reads them as typed (a session may
        # stop itself at will, just after asking for a title it chose).
        limit = DrainLimit(caller_deadline=time.monotonic() + DRAIN_IDLE_SECONDS)
        while self.output.pending and limit.writable(1):
            self.flush()
        self.leave_tui_modes(limit)
        self.restore()
        if _has_a_controlling_terminal():  # the whole job, as Ctrl-Z stops it (a script's too)
            os.killpg(0, _signal.SIGTSTP)
        self.resume()
        _signal_group(sandbox, _signal.SIGCONT)
        self.quick_until = 0.0

    def resume(self) -> None:
        """Continued: the terminal raw again (a launcher continued in the background is
        stopped here again, by SIGTTOU, until it is in the foreground), and its size copied."""
        self.raw()
        self.resize()

    def drain(self, limit: DrainLimit) -> None:
        """What the session wrote before it ended, to the end of its terminal: once no process
        holds the session's side, a read gives what is left and then EIO; within limit (a side
        left in flight in a unix socket, or held by another session)."""
        while True:
            if self.output.pending:
                if not limit.writable(1):
                    return
                self.flush()
            elif self.open and limit.ready([self.controller]):
                self.copy_out()
            else:
                return

    def leave_tui_modes(self, limit: DrainLimit) -> None:
        """Turn off the modes a TUI may have left on in the caller's terminal, and drop the
        answers still coming to the queries it sent (see leave_tui_modes)."""
        if not self.caller_gone:
            answered = self.status_answers.count if _same_file(0, 1) else 0
            leave_tui_modes(1, limit, max(self.status_queries.count - answered, 0))

    def restore(self) -> None:
        import termios

        if self.saved is not None:
            try:
                _on_terminal(termios.tcsetattr, 0, termios.TCSADRAIN, self.saved)
            except _TerminalGone:
                self._hung_up()

    def close(self) -> None:
        if self.command_stat >= 0:
            os.close(self.command_stat)
            self.command_stat = -1
        self.output.close()


class StdioRelay:
    """The launcher's terminals among its fds 0-2, and its output files, given to the session
    as pipes, and the copying through them (see the module's docstring). `given` is what the
    session gets for each of 0-2: a pipe's end, or None (the launcher's own fd as it is);
    `failed`, each output file that took no more, and why."""

    def __init__(self, tty: bool, owner: tuple[int, int] | None = None) -> None:
        """owner: the session's account (uid, gid), when it is not the launcher's: its pipes
        are made its own, so that it may open /dev/stdout and the like as it could the fds
        they stand for."""
        self.given: list[int | None] = [None, None, None]
        self.failed: dict[int, OSError] = {}  # output files that could not be written, and why
        self.stdin_pipe = -1  # the launcher's end of the session's stdin
        self.pending = b""  # input read from the terminal, not yet taken by the pipe
        self.outputs: dict[int, int] = {}  # the launcher's read end -> the fd it copies to
        self.writers: dict[int, _Output] = {}  # that fd -> what it has not taken yet
        self.in_background = False  # not reading stdin for it: looked at again every second
        self.escaped: set[int] = set()  # the terminals among 1 and 2 a session wrote an escape to
        # The status queries the session wrote to each of them, and the answers that reached
        # it through stdin (the terminal at fd 0): those left are answered before run's own.
        self.status_queries: dict[int, _StatusQueries] = {}
        self.status_answers = _Occurrences(STATUS_ANSWER)
        terminals = [fd for fd in ((2,) if tty else (0, 1, 2)) if os.isatty(fd)]
        self.terminals = set(terminals)
        # An output file handed over as it is would be the session's to re-open through
        # /proc/self/fd: to read a log's earlier lines back, or truncate it. (Not a pipe: a
        # write to one may block, and a reader that stops would stop this loop, signals and
        # all; the session may re-open a pipe, but not what was written through it before.)
        # (Nor the input file itself, given as output too: the session reads it anyway, and a
        # tool that sees it is writing its input refuses, where relayed it grew it for good.)
        files = [
            fd
            for fd in ((2,) if tty else (1, 2))
            if fd not in terminals and _is_file(fd) and not (_is_file(0) and _same_file(0, fd))
        ]
        try:
            for fd in [*terminals, *files]:
                if fd == 0:
                    read_end, self.stdin_pipe = os.pipe2(os.O_CLOEXEC)
                    os.set_blocking(self.stdin_pipe, False)
                    self.given[0] = read_end
                elif fd == 2 and self.given[1] is not None and _same_file(1, 2):
                    self.given[2] = self.given[1]  # one pipe: the order of their bytes holds
                else:
                    read_end, self.given[fd] = os.pipe2(os.O_CLOEXEC)
                    os.set_blocking(read_end, False)
                    self.outputs[read_end] = fd
                    self.writers[fd] = _Output(fd)
            if owner is not None:
                for given in {fd for fd in self.given if fd is not None}:
                    os.fchown(given, *owner)
        except BaseException:
            self.launched()
            self.close()
            raise

    def launched(self) -> None:
        """The session has its ends (or its launch failed): the launcher's copies go."""
        for fd in {fd for fd in self.given if fd is not None}:
            os.close(fd)
        self.given = [None, None, None]

    def events(self) -> dict[int, int]:
        wanted: dict[int, int] = {}
        for read_end, target in self.outputs.items():
            if self.writers[target].pending:  # read again once the target took that
                wanted[target] = select.POLLOUT
            else:
                wanted[read_end] = select.POLLIN
        self.in_background = False
        if self.stdin_pipe >= 0:
            if self.pending:
                wanted[self.stdin_pipe] = select.POLLOUT
            elif _in_foreground():
                wanted[0] = select.POLLIN
            else:  # `fg` continues it (SIGCONT); a check now and then, should it not
                self.in_background = True
        return wanted

    def handle(self, events: dict[int, int]) -> None:
        if self.stdin_pipe >= 0 and events.get(0, 0) and _in_foreground():
            self.from_stdin()
        if self.stdin_pipe in events:
            self.to_session()
        for read_end, target in list(self.outputs.items()):
            if target in events:
                self.flush(read_end)
            elif read_end in events:
                self.copy_out(read_end)

    def from_stdin(self) -> None:
        try:
            self.pending = os.read(0, _CHUNK)
        except OSError:  # EIO: the terminal hung up
            self.pending = b""
        if self.pending:
            self.status_answers.see(self.pending)
            self.to_session()
        else:  # the end of input (Ctrl-D): the session's too
            self._close_stdin()

    def to_session(self) -> None:
        try:
            self.pending = self.pending[os.write(self.stdin_pipe, self.pending) :]
        except BlockingIOError:
            pass
        except OSError:  # EPIPE: the session no longer reads; what is typed stays the shell's
            self._close_stdin()

    def _close_stdin(self) -> None:
        os.close(self.stdin_pipe)
        self.stdin_pipe = -1
        self.pending = b""

    def copy_out(self, read_end: int) -> None:
        """Copy what the session wrote to one pipe; at its end, let go of it."""
        try:
            data = os.read(read_end, _CHUNK)
        except BlockingIOError:
            return
        target = self.outputs[read_end]
        if data:
            if target in self.terminals:
                queries = self.status_queries.setdefault(target, _StatusQueries())
                queries.see(data)
                if len(data.translate(None, _ESCAPES)) != len(data):
                    self.escaped.add(target)
            if target in self.failed:
                return  # read and dropped: the session is not killed by a SIGPIPE for it
            self.writers[target].pending += data
            self.flush(read_end)
            return
        os.close(read_end)
        del self.outputs[read_end]

    def flush(self, read_end: int) -> None:
        """What the target of read_end takes now of what the session wrote to it."""
        target = self.outputs[read_end]
        try:
            self.writers[target].write_some()
        except OSError as error:
            self.writers[target].pending = b""
            if target not in self.terminals:  # a file (a full disk): said at the end
                self.failed[target] = error
                return
            # the terminal is gone (EIO): the session's writes now fail too
            os.close(read_end)
            del self.outputs[read_end]

    def drain(self, limit: DrainLimit) -> None:
        """What the session wrote, to the end of each pipe, within limit (a write end left in
        flight in a unix socket, or held by another session)."""
        while self.outputs:
            waiting = [r for r, target in self.outputs.items() if self.writers[target].pending]
            if waiting:
                if not limit.writable(self.outputs[waiting[0]]):
                    return
                self.flush(waiting[0])
                continue
            ready = limit.ready(list(self.outputs))
            if not ready:
                return
            for read_end in ready:
                self.copy_out(read_end)

    def leave_tui_modes(self, limit: DrainLimit) -> None:
        """A session's output reaches the caller's terminal through these pipes as it would
        from a terminal of its own: the modes it turned on there go off, and the answers to its
        queries are dropped, as for --tty (only where it wrote an escape: a plain session's
        output costs no query)."""
        for fd in sorted(self.escaped):
            answered = self.status_answers.count if _same_file(0, fd) else 0
            leave_tui_modes(fd, limit, max(self.status_queries[fd].count - answered, 0))
        self.escaped.clear()

    def close(self) -> None:
        if self.stdin_pipe >= 0:
            self._close_stdin()
        for read_end in self.outputs:
            os.close(read_end)
        self.outputs = {}
        for writer in self.writers.values():
            writer.close()
        self.writers = {}


def _signal_group(sandbox: Sandbox, number: int) -> None:
    """Signal the command's process group (a session leader's: its own pid, a number no one
    else takes while the group lives), or the command alone should that fail."""
    try:
        os.killpg(sandbox.command_pid, number)
    except OSError:
        sandbox.send_signal(number)


def _same_file(first: int, second: int) -> bool:
    """Do the two fds write to one terminal, file or FIFO (`2>&1`)?"""
    one, other = os.fstat(first), os.fstat(second)
    if stat.S_ISCHR(one.st_mode):
        return stat.S_ISCHR(other.st_mode) and one.st_rdev == other.st_rdev
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _is_terminal_side(fd: int) -> bool:
    """Is fd a terminal's own side (a pty's /dev/pts/N, a console), not a pty's controller?"""
    try:
        return os.isatty(fd) and os.readlink(f"/proc/self/fd/{fd}") not in _CONTROLLERS
    except OSError:
        return False


_CONTROLLERS = ("/dev/ptmx", "/dev/pts/ptmx")  # what a pty's controller is opened as


def _is_file(fd: int) -> bool:
    """Is fd a regular file (which /proc/self/fd opens anew, and a write to never blocks)?"""
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:  # not open: nothing to hand over
        return False


class _Output:
    """What the session wrote that one of the caller's fds has not taken yet, written without
    waiting (a reader that stopped stops neither the launcher's loop nor the signals it
    hears; the session's side is read again once this is empty). Written through a file
    description of the launcher's own, O_NONBLOCK: the flag belongs to the description, and
    set on the caller's it would be every sharer's (the shell's, while a background run
    stopped in its write by SIGTTOU), and other writers to it would meet EAGAIN."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = b""
        self._own = -1  # the launcher's own description of what fd writes to, O_NONBLOCK
        self._socket: socket.socket | None = None  # or, for a socket, sent MSG_DONTWAIT
        self._send_flags = 0
        self._may_wait = False  # writes to fd itself may wait: a little at a time, when ready
        try:
            mode = os.fstat(fd).st_mode
        except OSError:  # (closed: its writes fail as they come)
            return
        if stat.S_ISSOCK(mode):
            import socket

            self._socket = socket.socket(fileno=os.dup(fd))
            self._send_flags = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
        elif stat.S_ISFIFO(mode) or _is_terminal_side(fd):
            # Opened again, the same pipe or terminal. (Not a terminal's controller, whose
            # device, opened again, is a new terminal; nor a device whose writes never wait.)
            flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
            try:
                self._own = os.open(f"/proc/self/fd/{fd}", flags)
            except OSError:  # (not ours to open: another account's terminal)
                self._may_wait = True

    def write_some(self) -> None:
        """As much of pending as the fd takes now; OSError as os.write raises it (EPIPE, EIO)."""
        if not self.pending:
            return
        try:
            if self._socket is not None:
                written = self._socket.send(self.pending, self._send_flags)
            elif self._own >= 0:
                written = os.write(self._own, self.pending)
            elif self._may_wait:  # what a pipe takes whole once it says it has room
                written = (
                    os.write(self.fd, self.pending[: select.PIPE_BUF])
                    if wait_fd(self.fd, 0, writable=True)
                    else 0
                )
            else:
                written = os.write(self.fd, self.pending)
        except BlockingIOError:
            written = 0
        self.pending = self.pending[written:]

    def close(self) -> None:
        if self._own >= 0:
            os.close(self._own)
            self._own = -1
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _write_all(fd: int, data: bytes, limit: DrainLimit) -> None:
    """data to the caller's fd, waiting for room while limit allows (an ending signal gives
    up what is left)."""
    output = _Output(fd)
    output.pending = data
    try:
        while True:
            output.write_some()
            if not output.pending or not limit.writable(fd):
                return
    finally:
        output.close()


@contextmanager
def held_signals() -> Iterator[int]:
    """From before the launch until the session is over: the held signals only wake the
    launcher (their numbers on the fd this yields), so one that arrives while the sandbox is
    still being built is passed on once it runs, not lost by killing the launcher. They are
    unblocked: a launcher started with them blocked (a supervisor spawning from a thread that
    blocks them) never saw one, and a SIGTERM neither reached the command nor ended the
    session. The handlers, wakeup fd and mask before are put back after."""
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous_fd = _signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    previous = {number: _signal.signal(number, _wake_only) for number in HELD_SIGNALS}
    previous_mask = _signal.pthread_sigmask(_signal.SIG_UNBLOCK, HELD_SIGNALS)
    try:
        yield wake_read
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, previous_mask)
        for number, handler in previous.items():
            _signal.signal(number, handler)
        _signal.set_wakeup_fd(previous_fd)
        os.close(wake_read)
        os.close(wake_write)


@contextmanager
def kept_stdio_flags() -> Iterator[None]:
    """The file status flags of the launcher's fds 0-2, put back when the session is over: a
    session shares their open files, and one that left O_NONBLOCK on a pipe would cut short
    the output of the caller's next writer to it (EAGAIN). Terminals get more: see
    nsconfine/_kernel/terminal.py."""
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


class DrainLimit:
    """How long an ended session's output is still copied: until DRAIN_IDLE_SECONDS pass without
    a byte, DRAIN_SECONDS of waiting for bytes in all, DRAIN_MOST_SECONDS in all (the time
    spent waiting for the caller to take output, writable(), not counted), or one of the
    ENDING_SIGNALS comes (on wake_read, from held_signals(); -1 for none). The caller is not
    waited for at all once run has killed the session (wait_for_the_caller False), and not
    past caller_deadline (a time.monotonic(); the grace period's end, once an ending signal
    came: a supervisor's one TERM ends run however slowly its output is read)."""

    def __init__(
        self,
        wake_read: int = -1,
        wait_for_the_caller: bool = True,
        caller_deadline: float | None = None,
    ) -> None:
        self.wake_read = wake_read
        self.waiting_left = DRAIN_SECONDS
        self.deadline = time.monotonic() + DRAIN_MOST_SECONDS
        self.reached = False
        # Whether a caller's fd that takes nothing now is waited for (not once the launcher
        # has killed the session: its second signal, or the grace period over, ends run).
        self.wait_for_the_caller = wait_for_the_caller
        self.caller_deadline = caller_deadline

    def writable(self, fd: int) -> bool:
        """Does the caller's fd take more now? Waited for as long as it takes (the time a
        slow reader takes is not counted), until one of the ENDING_SIGNALS comes."""
        while not self.reached:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            if self.wake_read >= 0:
                poller.register(self.wake_read, select.POLLIN)
            began = time.monotonic()
            wait = None if self.caller_deadline is None else self.caller_deadline - began
            events = dict(poller.poll(poll_ms(wait) if self.wait_for_the_caller else 0))
            self.deadline += time.monotonic() - began  # (the caller's time is not counted)
            if self.wake_read in events:
                self._take_signals()
            elif fd not in events:
                return False
            if fd in events and not self.reached:
                return True
        return False

    def _take_signals(self) -> None:
        """The signals held_signals() collected: an ending one reaches the limit."""
        signals = os.read(self.wake_read, 64)
        self.reached = any(number in ENDING_SIGNALS for number in signals)

    def ready(self, fds: list[int]) -> list[int]:
        """Those of fds with something to read (or at their end); none once the limit is
        reached."""
        idle_left = DRAIN_IDLE_SECONDS
        while not self.reached:
            began = time.monotonic()
            left = min(idle_left, self.waiting_left, self.deadline - began)
            if left <= 0:
                break
            poller = select.poll()
            for fd in (*fds, self.wake_read):
                if fd >= 0:
                    poller.register(fd, select.POLLIN)
            events = dict(poller.poll(poll_ms(left)))
            waited = time.monotonic() - began
            idle_left -= waited
            self.waiting_left -= waited
            if self.wake_read in events:
                del events[self.wake_read]
                self._take_signals()
            elif not events:
                break
            if events and not self.reached:
                return list(events)
        return []


def run_session(sandbox: Sandbox, grace: float, wake_read: int, relay: StdioRelay) -> int:
    """Wait for the session, passing on the signals held_signals() collects on wake_read,
    copying through relay (and its terminal, if it has one); its status."""
    terminal = None
    try:
        if sandbox.tty >= 0:
            terminal = _Terminal(sandbox.tty, sandbox.command_pid)
        killed, grace_over = _relay(sandbox, terminal, relay, grace, wake_read)
        # what the session wrote last, up to its end (no longer than the grace, once signalled)
        limit = DrainLimit(wake_read, wait_for_the_caller=not killed, caller_deadline=grace_over)
        relay.drain(limit)
        relay.leave_tui_modes(limit)
        if terminal is not None:
            terminal.drain(limit)
            terminal.leave_tui_modes(limit)
    except BaseException:  # the launcher is leaving (its stdout gone): the session goes first
        sandbox.kill()
        sandbox.wait()
        raise
    finally:
        if terminal is not None:
            terminal.restore()
            terminal.close()
    return sandbox.wait()


def _relay(
    sandbox: Sandbox, terminal: _Terminal | None, relay: StdioRelay, grace: float, wake_read: int
) -> tuple[bool, float | None]:
    """Until the session has ended (its sentinel readable; not yet reaped): signals passed
    on, the grace period kept, the caller's terminals relayed and its own terminal copied.
    Whether the launcher killed it (a second signal, or the grace period over), and when the
    grace period given at an ending signal ends (None: no such signal came)."""
    deadline: float | None = None
    signalled = killed = False
    while True:
        poller = select.poll()
        poller.register(sandbox.sentinel, select.POLLIN)
        poller.register(wake_read, select.POLLIN)
        for part in (relay, terminal):
            if part is not None:
                for fd, wanted in part.events().items():
                    poller.register(fd, wanted)
        waits = [] if deadline is None else [deadline - time.monotonic()]
        if terminal is not None:
            waits.append(terminal.check_due())
        if relay.in_background:
            waits.append(STATE_CHECK_SECONDS)
        events = dict(poller.poll(poll_ms(min(waits)) if waits else None))
        if sandbox.sentinel in events:
            return killed, deadline
        if deadline is not None and time.monotonic() >= deadline:  # the grace period is over
            sandbox.kill()
            killed, deadline = True, None
            continue
        relay.handle(events)
        if terminal is not None:
            terminal.handle(events)
            if terminal.check_due() <= 0:
                suspended, stop_it = terminal.to_suspend()
                if suspended:
                    terminal.suspend(sandbox, stop_it)
        if wake_read not in events:
            continue
        for received in os.read(wake_read, 64):
            if received == _signal.SIGCONT:
                if terminal is not None:
                    terminal.resume()  # stopped by someone else: raw again, resized
            elif received == _signal.SIGWINCH and terminal is not None:
                terminal.resize()  # the session's terminal tells its foreground job
            elif received not in ENDING_SIGNALS:
                sandbox.send_signal(received)  # passed on, nothing more
            elif signalled:
                sandbox.kill()
                killed, deadline = True, None
            else:
                signalled = True
                sandbox.send_signal(received)
                deadline = time.monotonic() + grace
