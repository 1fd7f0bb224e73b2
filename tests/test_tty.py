"""A terminal of the session's own (--tty, tty=True): a pty of the sandbox's devpts as its
controlling terminal, job control, Ctrl-C and Ctrl-Z for the foreground job only, window-size
changes relayed, and the caller's terminal put back. And the caller's terminal itself, which no
session reads: not at /dev/console, not after Ctrl-Z, not through its stdout."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    SESSION_USER,
    give_to_session_user,
    kill_all,
    pids_with,
    python_child,
    read_until,
    session,
    session_options,
    session_uid,
    tmux,
    without_fd,
)

import nsconfine
from nsconfine._cli.relay import STATUS_QUERY
from nsconfine._selftest.report import terminal_read_leaks
from nsconfine._selftest.world import World

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


def test_the_command_has_a_controlling_terminal(ws_run: tuple[Path, Path]) -> None:
    """tty=True: the command's stdio is a pty of the sandbox's own, its controlling terminal:
    tty names it, /dev/tty opens, and the command is its foreground job."""
    script = (
        "tty; echo via-dev-tty > /dev/tty; "
        "python3 -c 'import os; print(\"foreground\", os.tcgetpgrp(0) == os.getpgrp())'"
    )
    sandbox = nsconfine.spawn(session(*ws_run).plan(), ["/bin/sh", "-c", script], tty=True)
    output = read_until(sandbox.tty, b"foreground")
    sandbox.wait(timeout=30)
    assert b"/dev/pts/" in output, output
    assert b"via-dev-tty" in output
    assert b"foreground True" in output


def test_without_tty_there_is_no_controlling_terminal(ws_run: tuple[Path, Path]) -> None:
    """The control: without tty=True, /dev/tty cannot be opened."""
    read_end, write_end = os.pipe()
    sandbox = nsconfine.spawn(
        session(*ws_run).plan(),
        ["/bin/sh", "-c", "(: > /dev/tty) 2>&1 || echo no-tty"],
        stdout=write_end,
        stderr=write_end,
    )
    os.close(write_end)
    output = read_until(read_end, b"no-tty")
    os.close(read_end)
    sandbox.wait(timeout=30)
    assert b"no-tty" in output


def wait_for_foreground(tty: int, program: str, timeout: float = 60) -> None:
    """Wait until program runs as the terminal's foreground job, so a Ctrl-C or Ctrl-Z
    typed next reaches it and not the shell still starting it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{os.tcgetpgrp(tty)}/comm") as comm:
                if comm.read().strip() == program:
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"{program} never became the foreground job")


def test_ctrl_c_and_ctrl_z_reach_only_the_foreground_job(ws_run: tuple[Path, Path]) -> None:
    """In an interactive bash on the session's terminal, Ctrl-C ends the foreground `sleep`
    and Ctrl-Z stops one, while bash itself goes on."""
    sandbox = nsconfine.spawn(
        session(*ws_run).plan(), ["/bin/bash", "--norc", "--noprofile", "-i"], tty=True
    )
    try:
        tty = sandbox.tty
        os.write(tty, b"PS1='$ '; sleep 30\n")
        wait_for_foreground(tty, "sleep")
        os.write(tty, b"\x03")  # Ctrl-C
        os.write(tty, b"echo alive-$((20+1))\n")
        assert b"alive-21" in read_until(tty, b"alive-21")
        os.write(tty, b"sleep 31\n")
        wait_for_foreground(tty, "sleep")
        os.write(tty, b"\x1a")  # Ctrl-Z
        os.write(tty, b"jobs; echo listed-$((1+1))\n")
        output = read_until(tty, b"listed-2")
        assert b"Stopped" in output, output
        assert b"sleep 31" in output
        os.write(tty, b"kill -9 %1; wait; echo killed-$((2+2))\n")
        assert b"killed-4" in read_until(tty, b"killed-4")
        os.write(tty, b"exit 3\n")
        try:
            status = sandbox.wait(timeout=10)
        except nsconfine.TimeoutExpired:
            # bash answers a first `exit` with "There are stopped jobs." while it still lists
            # the killed job; a second one exits. Seen on a loaded machine.
            os.write(tty, b"exit 3\n")
            status = sandbox.wait(timeout=30)
        assert status == 3
    finally:
        sandbox.kill()
        sandbox.wait()


def test_window_size_changes_reach_the_session(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine run --tty` under a terminal: the session starts with that terminal's size,
    a resize reaches it (SIGWINCH to the launcher, relayed), and the terminal keeps its new
    size when the session ends (the launch-time size used to be put back over it)."""
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    before = termios.tcgetattr(terminal)

    # The session shows its size, then waits (up to a minute) for the resize to reach it.
    script = (
        'stty size; i=0; while [ "$(stty size)" != "30 100" ] && [ $i -lt 1200 ]; do '
        "sleep 0.05; i=$((i+1)); done; stty size; echo bye"
    )
    # setsid -c: a session of its own whose controlling terminal is ours (no preexec_fn, which
    # forks the test runner with its threads: that can deadlock under ASan).
    cli = subprocess.Popen(
        ["setsid", "-c", sys.executable, "-m", "nsconfine", "run", "--tty",
         *session_options(*ws_run), "--", "/bin/sh", "-c", script],
        stdin=terminal, stdout=terminal, stderr=terminal, cwd="/",
    )  # fmt: skip
    try:
        assert b"24 80" in read_until(controller, b"24 80")
        fcntl.ioctl(controller, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        output = read_until(controller, b"bye", timeout=120)
        assert b"30 100" in output, output
        assert cli.wait(timeout=30) == 0
        assert termios.tcgetattr(terminal) == before  # raw mode undone
        assert window_size(terminal) == (30, 100)  # the window's own size, not the launch's
    finally:
        if cli.poll() is None:
            cli.send_signal(signal.SIGKILL)
            cli.wait()
        os.close(controller)
        os.close(terminal)


def test_the_session_cannot_push_input_into_its_own_terminal(ws_run: tuple[Path, Path]) -> None:
    """TIOCSTI is refused even on the session's own terminal."""
    script = (
        "import fcntl, termios\ntry:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x'); print('pushed')\n"
        "except OSError as e:\n    print('refused', e.errno)"
    )
    sandbox = nsconfine.spawn(session(*ws_run).plan(), ["python3", "-c", script], tty=True)
    output = read_until(sandbox.tty, b"\n")
    sandbox.wait(timeout=30)
    assert b"refused 1" in output, output


@pytest.mark.parametrize("ignored_by", ["sleep", "a raw terminal"])
def test_input_the_session_never_reads_does_not_hang_the_launcher(
    ws_run: tuple[Path, Path], ignored_by: str
) -> None:
    """`yes | nsconfine run --tty -- sleep 2`: more input than the session's terminal holds,
    which the session never reads. The launcher keeps relaying (its write to the session's
    terminal used to block, for good, even after the session ended: SIGTERM and a second
    signal could not end it) and returns the session's status when it ends."""
    script = "sleep 2; exit 7" if ignored_by == "sleep" else "stty raw -echo; sleep 2; exit 7"
    cli = subprocess.Popen(
        [sys.executable, "-m", "nsconfine", "run", "--tty", *session_options(*ws_run), "--",
         "/bin/sh", "-c", script],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/",
    )  # fmt: skip
    assert cli.stdin is not None
    try:
        os.set_blocking(cli.stdin.fileno(), False)
        fed = 0
        deadline = time.monotonic() + 10
        while cli.poll() is None and fed < 4 << 20 and time.monotonic() < deadline:
            try:
                fed += os.write(cli.stdin.fileno(), b"y\n" * 32768)
            except BlockingIOError:
                time.sleep(0.01)
            except BrokenPipeError:
                break  # the launcher is done with its input (the session ended, as it exits)
        try:
            status = cli.wait(timeout=60)
        except subprocess.TimeoutExpired:
            status = None
        assert status == 7, f"the launcher is stuck (fed {fed} bytes)"
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        cli.stdin.close()
        assert cli.stderr is not None
        cli.stderr.close()


def _run_tty(
    ws_run: tuple[Path, Path], script: str, closed: int | None = None, **popen: Any
) -> subprocess.Popen[bytes]:
    """`nsconfine run --tty … -- sh -c script`, started with fd `closed` closed if given."""
    argv = [sys.executable, "-m", "nsconfine", "run", "--tty", *session_options(*ws_run), "--",
            "/bin/sh", "-c", script]  # fmt: skip
    return subprocess.Popen(argv if closed is None else without_fd(argv, closed), cwd="/", **popen)


@pytest.mark.parametrize(
    ("given", "script", "expected"),
    [
        (b"", "cat; echo done", b"done"),
        (b"x\n", "cat; echo done", b"x\r\ndone"),
        (b"no newline", "cat; echo; echo done", b"no newline\r\ndone"),
    ],
    ids=["nothing", "a line", "a partial line"],
)
def test_the_end_of_stdin_that_is_no_terminal_reaches_the_command(
    ws_run: tuple[Path, Path], given: bytes, script: str, expected: bytes
) -> None:
    """`nsconfine run --tty -- cat </dev/null`, `echo x | nsconfine run --tty …`: the end of
    a stdin that is no terminal reaches the command as its terminal's end of file, as
    `script` passes it (attackers' pass: cat waited for good)."""
    cli = _run_tty(ws_run, script, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE)  # fmt: skip
    try:
        out, err = cli.communicate(given, timeout=30)
    except subprocess.TimeoutExpired:
        cli.kill()
        cli.communicate()
        pytest.fail("the command never saw the end of its input")
    assert cli.returncode == 0, err
    assert expected in out, out


def test_every_byte_the_session_wrote_reaches_stdout(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine run --tty` copies all the session wrote, up to the end of its terminal: the
    last bytes could still sit in the terminal's buffers when the session ended (4095 of
    5,000 bytes arrived in 3 runs of 30, none in 1 of 60, on a busy machine: busy loops here
    make the window likelier)."""
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range((os.cpu_count() or 1) + 1)
    ]
    try:
        for _ in range(40):
            cli = _run_tty(
                ws_run, "head -c 5000 /dev/zero | tr '\\0' a",
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            out, err = cli.communicate(timeout=60)
            assert cli.returncode == 0, err
            assert out.count(b"a") == 5000
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()


def test_a_reader_gone_away_ends_the_session_and_its_mount_points(
    ws_run: tuple[Path, Path],
) -> None:
    """`nsconfine run --tty -- yes | head -c 10`: the CLI's stdout goes away; the CLI ends the
    session and removes the mount points it made in the workspace (they stayed behind)."""
    before = sorted(ws_run[0].iterdir())
    reader, writer = os.pipe()
    cli = _run_tty(ws_run, "yes", stdin=subprocess.DEVNULL, stdout=writer, stderr=subprocess.PIPE)
    os.close(writer)
    os.read(reader, 10)
    os.close(reader)
    _, err = cli.communicate(timeout=60)
    assert b"Traceback" not in err, err
    assert cli.returncode == 141
    assert sorted(ws_run[0].iterdir()) == before


@pytest.mark.parametrize("closed", [0, 2])
def test_a_tty_session_starts_with_a_stdio_fd_of_the_launcher_closed(
    ws_run: tuple[Path, Path], closed: int
) -> None:
    """`nsconfine run --tty … <&-` (or `2>&-`): the session's stdio is its new terminal
    anyway; the terminal's controller, opened where the launcher's fd was missing, used to be
    overwritten by it before it was sent (exit 69)."""
    cli = _run_tty(
        ws_run, "echo done",
        closed, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = cli.communicate(timeout=60)
    assert cli.returncode == 0
    assert b"done" in out


def test_a_tty_run_without_stdin_still_passes_signals_on(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine run --tty … <&-`, then SIGTERM: with fd 0 closed, the launcher's own signal
    pipe took fd 0 and was read as stdin (a traceback, the signal typed into the session);
    the command's trap runs and its status comes back."""
    cli = _run_tty(
        ws_run, 'trap "exit 7" TERM; echo ready; for i in 1 2 3 4 5 6 7 8 9 10; do sleep 1; done',
        0, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert cli.stdout is not None
    assert b"ready" in read_until(cli.stdout.fileno(), b"ready")
    cli.send_signal(signal.SIGTERM)
    _, err = cli.communicate(timeout=60)
    assert b"Traceback" not in err, err
    assert cli.returncode == 7


# ------------------------------------------------------------------ the caller's terminal


_TERMINAL_MESS = r"""
import fcntl, os, struct, termios
fcntl.fcntl(0, fcntl.F_SETFL, fcntl.fcntl(0, fcntl.F_GETFL) | os.O_NONBLOCK)
fcntl.ioctl(0, termios.TIOCEXCL)
termios.tcflow(0, termios.TCOOFF)
try:
    fcntl.ioctl(0, termios.TIOCSETD, struct.pack("i", 27))  # N_NULL: every read and write fails
except OSError:
    pass
"""


def test_the_callers_terminal_is_restored(plan: nsconfine.Plan) -> None:
    """A session that turns echo off, makes the terminal non-blocking and exclusive and
    suspends its output leaves the caller's terminal as it found it. (Not its window size: a
    window resized meanwhile must keep its new size, see test_tty.py.)"""
    controller, terminal = pty.openpty()
    try:
        before = termios.tcgetattr(terminal)
        flags = fcntl.fcntl(terminal, fcntl.F_GETFL)
        sandbox = nsconfine.spawn(
            plan,
            [
                "/bin/sh",
                "-c",
                f"stty -echo -icanon; python3 -c '{_TERMINAL_MESS}'",
            ],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
        )
        assert sandbox.wait(timeout=30) == 0
        after = termios.tcgetattr(terminal)
        assert fcntl.fcntl(terminal, fcntl.F_GETFL) == flags
        discipline = struct.unpack("i", fcntl.ioctl(terminal, termios.TIOCGETD, b"\0" * 4))[0]
        assert discipline == 0  # N_TTY
        os.close(os.open(os.ttyname(terminal), os.O_RDWR | os.O_NOCTTY))  # not exclusive
        os.write(terminal, b"flows\n")  # output not suspended: this returns
        assert os.read(controller, 100).endswith(b"flows\r\n")
    finally:
        os.close(controller)
        os.close(terminal)
    assert after == before


def window_size(fd: int) -> tuple[int, int]:
    """The terminal's rows and columns."""
    rows, columns, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    return rows, columns


class HostShell:
    """An interactive bash with job control on a pty of the test's own: the user's shell at
    the terminal, into which the test types."""

    def __init__(self) -> None:
        self.controller, terminal = os.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        environment = {**os.environ, "PS1": "$ ", "TERM": "dumb"}
        # setsid -c: bash leads a session of its own, whose controlling terminal is the pty
        self.process = subprocess.Popen(
            ["setsid", "-c", "bash", "--norc", "--noprofile", "-i"],
            stdin=terminal, stdout=terminal, stderr=terminal, cwd="/", env=environment,
        )  # fmt: skip
        os.close(terminal)
        self.screen = b""

    def type(self, keys: bytes | str) -> None:
        """Keys typed at the terminal."""
        os.write(self.controller, keys.encode() if isinstance(keys, str) else keys)

    def expect(self, wanted: bytes, timeout: float = 60) -> bool:
        """Wait until wanted shows up on the terminal after what was already seen."""
        start = len(self.screen)
        deadline = time.monotonic() + timeout
        while wanted not in self.screen[start:]:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.controller], [], [], left)[0]:
                return False
            try:
                chunk = os.read(self.controller, 4096)
            except OSError:
                return False
            if not chunk:
                return False
            self.screen += chunk
        return True

    def wait_for_a_job(self, timeout: float = 60) -> None:
        """Wait until a job, not bash, is the terminal's foreground (bash has read its
        command line and is out of line editing)."""
        deadline = time.monotonic() + timeout
        while os.tcgetpgrp(self.controller) == self.process.pid:
            if time.monotonic() >= deadline:
                self.expect(b"\0", timeout=1)  # (what the shell said meanwhile, for the message)
                raise AssertionError(f"no job took the terminal: {self.screen[-2000:]!r}")
            time.sleep(0.02)

    def wait_for_raw_modes(self, timeout: float = 60) -> None:
        """Wait until the terminal is raw (a `run --tty` continued in the foreground sets it so
        as it goes on): what is typed before is the line discipline's, cooked as the shell left
        it, as it would be for any full-screen program just continued (an EOF typed then is
        read as a NUL once the terminal is raw)."""
        deadline = time.monotonic() + timeout
        while termios.tcgetattr(self.controller)[3] & termios.ICANON:
            if time.monotonic() >= deadline:
                raise AssertionError(f"the terminal stayed cooked: {self.screen[-2000:]!r}")
            time.sleep(0.02)

    def wait_for_a_stopped_job(self, timeout: float = 60) -> None:
        """Wait until bash lists a job as stopped (`jobs`, asked again each second). A `fg`
        typed while a background job is stopping races bash's own collection of that stop:
        bash may then report the job it has just continued as stopped, and keep the
        terminal."""
        deadline = time.monotonic() + timeout
        while True:
            self.type("jobs\n")
            if self.expect(b"Stopped", timeout=1):
                return
            if time.monotonic() >= deadline:
                raise AssertionError(f"no job stopped: {self.screen[-2000:]!r}")

    def close(self, marker: str) -> None:
        """End the shell, and every process whose command line holds marker."""
        kill_all(pids_with(marker))
        self.process.kill()
        self.process.wait()
        os.close(self.controller)


def _cli_line(ws_run: tuple[Path, Path], *run_options: str, script: str) -> str:
    """The `nsconfine run … -- sh -c script` command line a user types at the shell."""
    argv = [sys.executable, "-m", "nsconfine", "run", *run_options, *session_options(*ws_run),
            "--", "/bin/sh", "-c", script]  # fmt: skip
    return shlex.join(argv) + "\n"


def test_ctrl_z_leaves_the_session_nothing_to_read(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine run` without --tty at an interactive shell, stopped by Ctrl-Z: what the user
    types at the shell next is the shell's. (The session, a session of its own outside job
    control, went on reading the terminal: a password typed for sudo was its to read.) `fg`
    continues it, and it reads what is typed then."""
    got = ws_run[0] / "got"
    shell = HostShell()
    try:
        shell.type(_cli_line(ws_run, script="echo ready-$((3*3)); exec cat > got"))
        assert shell.expect(b"ready-9"), shell.screen
        shell.type(b"\x1a")  # Ctrl-Z
        assert shell.expect(b"Stopped"), shell.screen
        # What the user types while the shell's next job runs (sudo's password, say) waits
        # for whoever reads the terminal next: the shell, once that job is done.
        shell.type("sleep 2\n")
        wait_for_foreground(shell.controller, "sleep")
        shell.type("echo typed-$((6*7))\n")
        assert shell.expect(b"typed-42"), (shell.screen, got.read_bytes())
        assert got.read_bytes() == b""
        shell.type("fg\n")
        shell.wait_for_a_job()  # bash has given the CLI the terminal back
        shell.type("after-fg\n")
        shell.type(b"\x04")  # Ctrl-D: the end of the session's input
        shell.type("echo status-$?-$((2+2))\n")
        assert shell.expect(b"status-0-4"), shell.screen
        assert got.read_bytes() == b"after-fg\n"
    finally:
        shell.close(str(ws_run[0]))


PROBE_READS_THE_TERMINAL = """
import os, select, sys, time
fds = {"stdout": 1}
for name, path in (("console", "/dev/console"), ("reopened", "/proc/self/fd/1")):
    try:
        fds[name] = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as error:
        print(name, "not opened:", error.strerror, file=sys.stderr)
print("ready", file=sys.stderr, flush=True)  # not on stdout: a pipe, which "reopened" reads
got = {}
deadline = time.monotonic() + 4
while fds and time.monotonic() < deadline:
    readable = select.select(list(fds.values()), [], [], max(deadline - time.monotonic(), 0))[0]
    for name, fd in list(fds.items()):
        if fd in readable:
            try:
                data = os.read(fd, 100)
            except OSError as error:
                data = b""
                print(name, "not read:", error.strerror, file=sys.stderr)
            got[name] = got.get(name, b"") + data
            if not data:
                del fds[name]
print("read:", got, file=sys.stderr)
"""


def test_a_session_cannot_read_the_terminal_its_output_goes_to(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine run … </dev/null` with stdout on the user's terminal: what the user types
    there is not the session's, through its stdout (a terminal a shell opened read-write), its
    re-opened /proc/self/fd/1, or /dev/console (where bwrap bound its own stdout's terminal)."""
    controller, terminal = os.openpty()
    if SESSION_USER:  # the user's terminal is the session's account's own (unprivileged)
        os.chown(os.ttyname(terminal), session_uid(), -1)
    cli = subprocess.Popen(
        [sys.executable, "-m", "nsconfine", "run", *session_options(*ws_run), "--",
         "python3", "-c", PROBE_READS_THE_TERMINAL],
        stdin=subprocess.DEVNULL, stdout=terminal, stderr=subprocess.PIPE, cwd="/",
    )  # fmt: skip
    try:
        assert cli.stderr is not None
        first = b""
        while b"ready" not in first and (line := cli.stderr.readline()):
            first += line
        assert b"ready" in first, first
        os.write(controller, b"typed-secret\n")
        _, err = cli.communicate(timeout=60)
        err = first + err
        assert b"read:" in err, err
        assert b"typed-secret" not in err, err
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.communicate()
        os.close(controller)
        os.close(terminal)


# A TUI at Ctrl-Z: raw, it reads the key, puts its terminal back and sends its group SIGTSTP
# (as Claude Code does), which the kernel drops: the group, whose parent is outside its session,
# is orphaned.
_TUI_SUSPENDING = """
import os, signal, sys, termios, tty
cooked = termios.tcgetattr(0)
tty.setraw(0)
os.write(1, b"before-" b"2\\r\\n")
while os.read(0, 1) != b"\\x1a":
    pass
termios.tcsetattr(0, termios.TCSANOW, cooked)
os.kill(0, signal.SIGTSTP)
print("got-" + sys.stdin.readline().strip() + "-7")
"""

_STOPPING = {
    "SIGSTOP": ('echo before-$((1+1)); kill -STOP $$; read line; echo "got-$line-$((3+4))"', b""),
    "a TUI's SIGTSTP": (f"exec python3 -c {shlex.quote(_TUI_SUSPENDING)}", b"\x1a"),
    "Ctrl-Z in a cooked terminal": (
        'echo before-$((1+1)); line=$(head -n 1); echo "got-$line-$((3+4))"',
        b"\x1a",
    ),
}


@pytest.mark.parametrize("how", list(_STOPPING))
def test_a_tty_command_that_stops_itself_stops_the_cli_as_a_job(
    ws_run: tuple[Path, Path], how: str
) -> None:
    """`nsconfine run --tty` at an interactive shell, whose command stops itself (SIGSTOP), or
    asks to (a TUI's SIGTSTP, or the terminal's at Ctrl-Z: both dropped by the kernel, the
    command's group being orphaned): the CLI gives the shell its terminal back and stops, a
    job of that shell (it held the terminal raw, and only Ctrl-C got out: Claude Code said
    "suspended" and froze); `fg` continues both, and the command reads the terminal again."""
    stopping, keys = _STOPPING[how]
    shell = HostShell()
    try:
        shell.type(_cli_line(ws_run, "--tty", script=stopping))
        assert shell.expect(b"before-2"), shell.screen
        shell.type(keys)
        assert shell.expect(b"Stopped"), shell.screen
        shell.type("echo back-$((4*4))\n")
        assert shell.expect(b"back-16"), shell.screen
        shell.type("fg\n")
        shell.wait_for_a_job()  # bash reads no more: what is typed now is the command's
        shell.type("hello\r")
        assert shell.expect(b"got-hello-7"), shell.screen
        assert shell.expect(b"$ "), shell.screen  # the CLI is done with the terminal
        shell.type("echo status-$?-$((2+2))\n")
        assert shell.expect(b"status-0-4"), shell.screen
    finally:
        shell.close(str(ws_run[0]))


# What the caller's shell reads after the session, in raw mode: what the terminal types next.
NEXT_READER = """
import os, select, sys, termios, time, tty
tty.setraw(0, termios.TCSANOW)
print("reader-" "ready", end="", flush=True)
got = b""
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    if select.select([0], [], [], max(deadline - time.monotonic(), 0))[0]:
        got += os.read(0, 100)
with open(sys.argv[1], "w") as out:
    out.write(repr(got))
"""

TUI_MODES = "\033[?1049h\033[?1000h\033[?1006h\033[?1004h\033[?2004h\033[?25l\033[?1h\033="
TERMINAL_QUERIES = "\033[c\033[6n\033[>c"  # device attributes, cursor position, version


@pytest.mark.parametrize(
    ("tty", "stdin"),
    [(True, ""), (False, ""), (True, " </dev/null"), (False, " </dev/null")],
    ids=["tty", "relayed-terminal", "tty-stdin-elsewhere", "relayed-terminal-stdin-elsewhere"],
)
def test_a_tty_session_leaves_no_replies_and_no_modes_behind(
    ws_run: tuple[Path, Path], tmp_path: Path, tty: bool, stdin: str
) -> None:
    """Under tmux, `nsconfine run --tty` whose command turns on a TUI's modes (the alternate
    screen, mouse reporting, focus events, bracketed paste, a hidden cursor, application keys)
    and asks the terminal questions, then exits: the caller's shell reads no reply and the
    terminal is out of those modes (replies were typed into the shell, modes stayed on).
    Likewise without --tty, where the session's output reaches the caller's terminal through
    the pipe `run` relays: the same bytes there left the same modes and replies behind. And
    with run's stdin elsewhere (</dev/null), the replies are read from the terminal all the
    same (attackers' pass: they reached the shell, and a terminal that echoes a request's text
    back typed a whole command line)."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux)")
    socket = str(tmp_path / "tmux.sock")
    typed = tmp_path / "typed"
    cli = [sys.executable, "-m", "nsconfine", "run", *(["--tty"] if tty else []),
           *session_options(*ws_run), "--",
           "/bin/sh", "-c", f"printf '{TUI_MODES}{TERMINAL_QUERIES}'"]  # fmt: skip
    reader = [sys.executable, "-c", NEXT_READER, str(typed)]
    tmux(socket, "new-session", "-d", "-x", "80", "-y", "24", "-c", "/",
          f"{shlex.join(cli)}{stdin}; {shlex.join(reader)}; sleep 60")  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "reader-ready" not in tmux(socket, "capture-pane", "-p"):
            assert time.monotonic() < deadline, tmux(socket, "capture-pane", "-p")
            time.sleep(0.1)
        tmux(socket, "set-buffer", "pasted")
        tmux(socket, "paste-buffer", "-p")  # bracketed only if the pane asked for it
        while not typed.exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        flags = tmux(socket, "display-message", "-p",
                      "#{alternate_on} #{mouse_any_flag} #{mouse_sgr_flag} #{cursor_flag} "
                      "#{keypad_cursor_flag} #{keypad_flag}")  # fmt: skip
    finally:
        tmux(socket, "kill-server")
    # what the shell read next, and: no alternate screen, no mouse reporting (any, SGR), a
    # visible cursor, normal cursor keys and keypad
    assert (typed.read_text(), flags.split()) == (repr(b"pasted"), ["0", "0", "0", "1", "0", "0"])


# Modes tmux does not keep (so the test above cannot see them), each with what turns it off:
# X10 and highlight mouse reporting, SGR pixel mouse, three kitty keyboard-protocol pushes,
# xterm's modifyOtherKeys, the line-drawing set as G0 and G1 shifted in.
UNTRACKED_MODES = {
    "\033[?9h": b"\033[?9l",
    "\033[?1001h": b"\033[?1001l",
    "\033[?1016h": b"\033[?1016l",
    "\033[>1u\033[>1u\033[>1u": b"\033[<99u",
    "\033[>4;2m": b"\033[>4m",
    "\033(0\033)0\016": b"\033(B\033)B\017",
}


def _written_to_the_terminal(ws_run: tuple[Path, Path], tmp_path: Path, output: str) -> bytes:
    """All `nsconfine run` wrote to its terminal (script's typescript) for a session that
    prints output (printf's format)."""
    typescript = tmp_path / "typescript"
    cli = [sys.executable, "-m", "nsconfine", "run", *session_options(*ws_run), "--",
           "/bin/sh", "-c", f"printf '{output}'"]  # fmt: skip
    # (from /, as the other CLI tests: the installed package, not the source tree)
    subprocess.run(["script", "-q", "-e", "-c", shlex.join(cli), str(typescript)],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True,
                   timeout=60, cwd="/")  # fmt: skip
    return typescript.read_bytes()


def test_run_turns_off_the_modes_a_terminal_keeps_that_tmux_does_not(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """What `run` writes to the caller's terminal once a session that turned on each of
    UNTRACKED_MODES ends turns each off, after the session's bytes (attackers' pass: X10 mouse
    reports were typed into the shell, two kitty keyboard levels kept Ctrl-C from being an
    interrupt, and the line-drawing set garbled the caller's prompt)."""
    written = _written_to_the_terminal(ws_run, tmp_path, "".join(UNTRACKED_MODES))
    after = written[written.rindex(b"\033)0\016") :]
    assert [off for off in UNTRACKED_MODES.values() if off not in after] == [], written


@pytest.mark.parametrize(
    ("sent", "undone_by"), [("\\016", b"\017"), ("\\230", b"\033\\")], ids=["SO", "8-bit-SOS"]
)
def test_a_session_whose_output_holds_no_escape_is_reset_after_all(
    ws_run: tuple[Path, Path], tmp_path: Path, sent: str, undone_by: bytes
) -> None:
    """A session whose output holds SO (shift to G1) or an 8-bit SOS (a string the terminal
    swallows to its end, on one that reads 8-bit controls) and no escape at all: `run` still
    resets the terminal after it (attackers' pass and its review, stop 43: only an escape made
    it reset the terminal, and a console whose G1 is the line-drawing set garbled the
    warnings and the prompt)."""
    written = _written_to_the_terminal(ws_run, tmp_path, f"shifted{sent}out")
    assert undone_by in written[written.rindex(b"shifted") :], written


# What a session may leave a terminal in that would hide what `run` prints after it, each
# sent last: a scroll region of the bottom two rows with origin mode on (the warnings scroll out
# of sight), a control string left open (a terminal swallows all until its end), the default
# colours both black, autowrap off (a long line's tail written over its last column).
HIDING_STATES = {
    "scroll-region": "\033[23;24r\033[?6h\033[1;1H",
    "open-control-string": "\033Pq",
    "black-on-black": "\033]10;#000000\007\033]11;#000000\007",
    "no-autowrap": "\033[?7l",
}
PLANTS_CONFIG = "mkdir -p sub/.git && printf '[core]\\n\\tfsmonitor = x\\n' > sub/.git/config"


@pytest.mark.parametrize("state", list(HIDING_STATES))
@pytest.mark.parametrize("tty", [True, False], ids=["tty", "relayed-terminal"])
def test_what_run_says_after_a_session_is_seen_whatever_state_it_left_the_terminal_in(
    ws_run: tuple[Path, Path], tmp_path: Path, tty: bool, state: str
) -> None:
    """Under tmux, a session plants config the host trusts, then leaves the terminal in one of
    HIDING_STATES: `run`'s warning about that config is on the screen in full once `run` ends,
    and the pane's colours are the default again (attackers' pass, stop 43: each state hid
    the warning, with --tty and without)."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux)")
    socket = str(tmp_path / "tmux.sock")
    cli = [sys.executable, "-m", "nsconfine", "run", *(["--tty"] if tty else []),
           *session_options(*ws_run), "--",
           "/bin/sh", "-c", f"{PLANTS_CONFIG}; printf '{HIDING_STATES[state]}'"]  # fmt: skip
    tmux(socket, "new-session", "-d", "-x", "80", "-y", "24", "-c", "/",
          f"{shlex.join(cli)}; echo run-end''ed; sleep 60")  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "run-ended" not in tmux(socket, "capture-pane", "-p", "-J"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        screen = tmux(socket, "capture-pane", "-p", "-J")
        colours = tmux(socket, "display-message", "-p", "#{pane_fg} #{pane_bg}")
    finally:
        tmux(socket, "kill-server")
    warning = (
        f"nsconfine: warning: {ws_run[0]}/sub/.git/config could be written by the session, and "
        "the host runs or trusts what it holds: read it before running git, an agent or an "
        "editor there"
    )
    assert (warning in screen.replace("\n", ""), "run-ended" in screen) == (True, True), screen
    assert colours.split() == ["default", "default"]


# The session's last process sends its own fds 0-2 and one end of a socketpair over that pair,
# so that the end sits in its own queue, then closes them: the kernel's unix garbage collector
# frees such a cycle, but it runs only when some unix socket is closed somewhere (a.close()
# starts one while b is still open; b's last close, at exit, starts none).
IN_FLIGHT_CYCLE = """
import array, os, socket, time
a, b = socket.socketpair()
print("cycle-" "made", flush=True)
fds = array.array("i", [b.fileno(), 0, 1, 2])
a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
for fd in (0, 1, 2):
    os.close(fd)
a.close()
time.sleep(0.5)
"""


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "relayed-terminal"])
def test_the_cli_returns_when_the_sessions_stdio_is_left_in_flight(
    ws_run: tuple[Path, Path], tty: bool
) -> None:
    """`nsconfine run --tty` (or `run` with stdout on a terminal, which it relays) whose last
    process leaves its stdio in flight in a unix-socket cycle: the CLI returns once the session
    has ended (it waited for the kernel's next garbage collection, 0.1 s to 97 s later, with the
    caller's terminal raw meanwhile)."""
    controller, terminal = os.openpty()
    argv = [sys.executable, "-m", "nsconfine", "run", *(["--tty"] if tty else []),
            *session_options(*ws_run), "--", "python3", "-c", IN_FLIGHT_CYCLE]  # fmt: skip
    try:
        for _ in range(3):  # another process's close starts a collection now and then
            cli = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, cwd="/"
            )
            try:
                assert b"cycle-made" in read_until(controller, b"cycle-made")
                assert cli.wait(timeout=30) == 0
            finally:
                if cli.poll() is None:
                    cli.kill()
                    cli.wait()
    finally:
        os.close(controller)
        os.close(terminal)


@pytest.mark.parametrize("launch", ["spawn", "pool"])
def test_no_launch_binds_the_launchers_terminal_at_dev_console(
    ws_run: tuple[Path, Path], launch: str
) -> None:
    """A launcher whose stdout is a terminal, which its session inherits: the session has no
    /dev/console (bwrap's --dev binds its own stdout's terminal there, read-write, and bwrap
    had the launcher's), through spawn and through a Pool's staged sandbox."""
    controller, terminal = os.openpty()
    child = python_child(
        """
        plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3])
        read_end, write_end = os.pipe()
        argv = ["/bin/sh", "-c", "{ test -e /dev/console && echo present || echo absent; } >&2"]
        if sys.argv[4] == "pool":
            with nsconfine.Pool(plan, refill="inline") as pool:
                sandbox = pool.launch(argv, stderr=write_end)
        else:
            sandbox = nsconfine.spawn(plan, argv, stderr=write_end)
        os.close(write_end)
        sandbox.wait()
        print("console", os.read(read_end, 100).decode().strip(), file=sys.stderr)
        """,
        str(ws_run[0]), str(ws_run[1]), SESSION_USER or "", launch,
        stdin=subprocess.DEVNULL, stdout=terminal, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _, err = child.communicate(timeout=60)
    finally:
        os.close(controller)
        os.close(terminal)
    assert "console absent" in err, err


def test_the_selftest_terminal_check_can_fail(world: World) -> None:
    """selftest's terminal row: through `nsconfine run` the session reads nothing the user
    types at the terminal its output goes to; given that terminal by spawn() itself (as the
    API does when told to), it does: the check can fail."""
    assert terminal_read_leaks(world) is None
    assert terminal_read_leaks(world, through_cli=False) is not None


def test_a_slow_reader_gets_the_end_of_a_tty_session_s_output(ws_run: tuple[Path, Path]) -> None:
    """What a --tty session wrote before it ended reaches a reader slower than the copy: the
    drain's time limit counts the time it waits for the session's terminal, not the time the
    caller's stdout takes (a 4 KiB pipe read 1 KiB every 0.5 s lost the last ~3 KiB and the
    final line of 40,000 bytes, the status 0)."""

    controller, terminal = os.openpty()  # the caller's terminal
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)

    cli = _run_tty(
        ws_run, "head -c 30000 /dev/zero | tr '\\0' x; echo; echo END",
        stdin=terminal, stdout=write_end, stderr=terminal, preexec_fn=_take_the_terminal,
    )  # fmt: skip
    os.close(write_end)
    os.close(terminal)

    def answer_the_terminal() -> None:  # what the session's tty relay writes to the caller's
        with contextlib.suppress(OSError):  # EIO once the terminal is closed
            while os.read(controller, 4096):
                pass

    threading.Thread(target=answer_the_terminal, daemon=True).start()
    received = b""
    while chunk := os.read(read_end, 1024):
        received += chunk
        time.sleep(0.5)
    os.close(read_end)
    assert cli.wait(timeout=60) == 0
    os.close(controller)
    assert received.count(b"x") == 30000
    assert b"END" in received


def test_a_tty_sessions_output_is_there_to_read_after_it_is_reaped(
    ws_run: tuple[Path, Path],
) -> None:
    """What a terminal session wrote before it ended can be read from its controller after
    wait() has reaped it, as an event loop reads it once the end is seen (broker's pass, stop
    32: the end closed the controller, under aio's reader, losing the output and freeing the
    fd number for another session's); the handle closes it as it goes (`with`, or dropped)."""
    plan = session(*ws_run).plan()
    with nsconfine.spawn(plan, ["/bin/sh", "-c", "echo written-before-the-end"], tty=True) as box:
        assert box.wait(timeout=60) == 0
        controller = box.tty
        output = b""
        with contextlib.suppress(OSError):  # EIO once it is drained: the session is gone
            while chunk := os.read(controller, 4096):
                output += chunk
        assert b"written-before-the-end" in output
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(controller)  # closed by the handle's end


def test_a_tty_run_sent_to_the_background_and_back_goes_on(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine run --tty` stopped (Ctrl-Z), continued in the background (`bg`: stopped
    again by the terminal as it sets its modes) and then in the foreground (`fg`): the command
    goes on reading the terminal. The continue interrupted the launcher's setting of the
    terminal's modes (EINTR, which termios does not retry): a traceback, and the session
    killed (found by an attacker's pass)."""
    shell = HostShell()
    try:
        shell.type(_cli_line(ws_run, "--tty", script="echo ready-$((1+1)); cat"))
        assert shell.expect(b"ready-2"), shell.screen
        shell.type(b"\x1a")
        assert shell.expect(b"Stopped"), shell.screen
        shell.type("bg\n")
        assert shell.expect(b"$ "), shell.screen
        shell.wait_for_a_stopped_job()  # by the terminal, as the run sets its modes
        shell.type("fg\n")
        shell.wait_for_a_job()
        shell.wait_for_raw_modes()
        shell.type("hello-$((5))\r")
        assert shell.expect(b"hello-$((5))"), shell.screen
        shell.type(b"\x04")
        assert shell.expect(b"$ "), shell.screen
        shell.type("echo status-$?-$((2+2))\n")
        assert shell.expect(b"status-0-4"), shell.screen
        assert b"Traceback" not in shell.screen, shell.screen
    finally:
        shell.close(str(ws_run[0]))


def test_a_tty_run_in_a_script_stops_the_script_with_it(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine run --tty` in a script run at an interactive shell (`bash -c "…; echo
    done"`), whose command stops itself: the whole job stops, as at Ctrl-Z, and the shell
    says so; `fg` continues it, and the script goes on. run stopped only itself: the script's
    shell went on waiting, the shell never saw a stopped job, and the terminal sat with no
    prompt (a review of stop 42's fixes)."""
    shell = HostShell()
    try:
        line = _cli_line(ws_run, "--tty", script="echo before-$((1+1)); kill -STOP $$; "
                         "echo after-$((3+4))").rstrip("\n")  # fmt: skip
        shell.type(f"bash -c {shlex.quote(line + '; echo done-$((1+1))')}\n")
        assert shell.expect(b"before-2"), shell.screen
        assert shell.expect(b"Stopped"), shell.screen
        shell.type("fg\n")
        assert shell.expect(b"after-7"), shell.screen
        assert shell.expect(b"done-2"), shell.screen
        assert b"Traceback" not in shell.screen, shell.screen
    finally:
        shell.close(str(ws_run[0]))


# A caller with no terminal at all that starts `run` in a process group of its own (a
# service's, a script's background job): its group is not orphaned, and no shell continues it.
_CALLER_WITHOUT_A_TERMINAL = """
import subprocess, sys
run = subprocess.Popen(sys.argv[1:], process_group=0, stdin=subprocess.DEVNULL)
sys.exit(run.wait())
"""


def test_a_tty_command_that_stops_itself_under_a_caller_without_a_terminal_goes_on(
    ws_run: tuple[Path, Path],
) -> None:
    """`run --tty` whose caller has no terminal, in a process group that is not orphaned: the
    command stops itself (SIGSTOP) and is continued at once, as outside job control anywhere.
    run stopped itself, a job of no shell, and a SIGTERM to it stayed pending for good, the
    session alive (attacker's pass, stop 42)."""
    marker = str(ws_run[0])
    script = "echo ready-$((1+1)); kill -STOP $$; echo continued-$((2+2))"
    argv = [sys.executable, "-m", "nsconfine", "run", "--tty", *session_options(*ws_run), "--",
            "/bin/sh", "-c", script]  # fmt: skip
    caller = subprocess.Popen(
        [sys.executable, "-c", _CALLER_WITHOUT_A_TERMINAL, *argv], cwd="/",  # (not the tree's)
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        output, errors = caller.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        output, errors = b"(still stopped after 60 s)", b""
    finally:
        kill_all(pids_with(marker))
        caller.kill()
        caller.wait()
    assert b"continued-4" in output, (output, errors)
    assert caller.returncode == 0, errors


def test_a_tty_run_whose_terminal_hangs_up_passes_the_hangup_on(ws_run: tuple[Path, Path]) -> None:
    """The caller's terminal closing under `nsconfine run --tty` (its SIGHUP comes with a
    SIGCONT): the command gets the hangup, its trap runs, and run exits with its status. The
    launcher set the gone terminal's modes (EIO) and killed the session, exit 1 (found by an
    attacker's pass)."""
    controller, terminal = os.openpty()
    script = 'trap "echo got-hup > hup; exit 5" HUP; echo ready; sleep 30 & wait'
    argv = [sys.executable, "-m", "nsconfine", "run", "--tty", *session_options(*ws_run),
            "--", "/bin/sh", "-c", script]  # fmt: skip
    launcher = subprocess.Popen(
        ["setsid", "-c", *argv], stdin=terminal, stdout=terminal, stderr=terminal, cwd="/"
    )
    os.close(terminal)
    try:
        assert b"ready" in read_until(controller, b"ready"), "the session did not start"
        os.close(controller)  # the terminal hangs up
        controller = -1
        assert launcher.wait(timeout=60) == 5
        assert (ws_run[0] / "hup").read_text() == "got-hup\n"
    finally:
        if controller >= 0:
            os.close(controller)
        kill_all(pids_with(str(ws_run[0])))
        launcher.wait()


@contextlib.contextmanager
def _flooding_a_stalled_reader(
    ws_run: tuple[Path, Path], tty: bool, grace: str, script: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`nsconfine run` of script, which floods its output to a caller that no longer reads it
    (with --tty: stdin a terminal, the output a pipe nobody reads; else the caller's terminal
    relayed, its reader gone quiet), once every buffer on the way is full; nothing of it
    left after."""
    controller, terminal = os.openpty()
    reader, writer = os.pipe()
    if tty:
        stdin, stdout, stalled = terminal, writer, reader
    else:
        stdin, stdout, stalled = subprocess.DEVNULL, terminal, controller
    argv = [sys.executable, "-m", "nsconfine", "run", *(["--tty"] if tty else []),
            "--grace", grace, *session_options(*ws_run), "--", "/bin/sh", "-c", script]  # fmt: skip
    launcher = subprocess.Popen(
        argv, stdin=stdin, stdout=stdout, stderr=subprocess.DEVNULL, cwd="/",
        start_new_session=True,
    )  # fmt: skip
    os.close(terminal)
    os.close(writer)
    try:
        deadline = time.monotonic() + 60
        held = bytearray(4)
        while fcntl.ioctl(stalled, termios.FIONREAD, held) or struct.unpack("i", held)[0] < 2048:
            assert time.monotonic() < deadline, "the session's output never came"
            time.sleep(0.05)
        time.sleep(0.5)  # (every buffer on the way full)
        yield launcher
        assert not pids_with(str(ws_run[0]))
    finally:
        kill_all(pids_with(str(ws_run[0])))
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()
        os.close(controller)
        os.close(reader)


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "relayed-terminal"])
def test_a_run_whose_output_nobody_reads_still_ends_at_a_second_signal(
    ws_run: tuple[Path, Path], tty: bool
) -> None:
    """A session flooding its output to a caller that no longer reads it (a pager paused, a
    stalled log pipe): the launcher waits to write, and still hears its signals; at a second
    TERM the whole session is killed and run exits 137. The launcher sat in its write for
    good, deaf to both (found by an attacker's pass)."""
    script = 'trap "" TERM; exec yes flood'  # (TERM stays ignored through the exec)
    with _flooding_a_stalled_reader(ws_run, tty, "600", script) as launcher:
        launcher.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert launcher.poll() is None  # ignored by the command; the grace is long
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 137


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "relayed-terminal"])
def test_a_run_ended_by_one_signal_drops_what_a_stalled_reader_left(
    ws_run: tuple[Path, Path], tty: bool
) -> None:
    """The same flood, a command that one TERM ends: run waited for its stalled reader to take
    the rest for as long as it took, deaf to none but a second signal (attacker's pass, stop
    40: `timeout`, or a supervisor that sends one TERM, waited for good). Past the grace
    period the rest is dropped, and run exits with the command's status."""
    with _flooding_a_stalled_reader(ws_run, tty, "1", "exec yes flood") as launcher:
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 128 + signal.SIGTERM


def _answering_terminal(controller: int, answered: list[bytes]) -> None:
    """A terminal that answers each status query (ESC [ 5 n) and title report request
    (ESC [ 21 t) it is sent, in order, 0.1 s after the one before; the title it reports is
    one the session would have typed into the shell. Until three are answered."""
    import re

    seen = b""
    while len(answered) < 3:
        if not select.select([controller], [], [], 30)[0]:
            return
        try:
            chunk = os.read(controller, 4096)
        except OSError:
            return
        seen += chunk
        # (a status query as a terminal's parser takes it: leading zeros, a NUL within)
        for query in re.findall(rb"\033\[0*5\0?n|\033\[21t", seen)[len(answered) :]:
            time.sleep(0.1)
            answer = b"\033]lrm -rf ~\033\\" if query == b"\033[21t" else b"\033[0n"
            os.write(controller, answer)
            answered.append(answer)


@pytest.mark.parametrize("query", ["\\033[5n", "\\033[05n", "\\033[5\\000n"])
@pytest.mark.parametrize("tty", [True, False], ids=["tty", "relayed-terminal"])
def test_a_session_s_own_status_query_does_not_end_the_dropping_of_answers(
    ws_run: tuple[Path, Path], tty: bool, query: str
) -> None:
    """The answers a session's queries left on their way to the caller's terminal are read
    and dropped up to the answer to run's own status query; a session that asked the same
    question (ESC [ 5 n) before another one answered with text it chose (a title report)
    had run stop at its answer, and the text reached the shell (found by an attacker's
    pass). run counts the session's status queries and waits for one answer more: each a
    terminal takes for one (ESC [ 0 5 n, a NUL within: attacker's pass, stop 38)."""

    controller, terminal = os.openpty()
    keep = os.dup(terminal)  # the shell's side, read after run

    script = f"printf '{query}\\033[21t'"  # a status query, then a title report's
    argv = [sys.executable, "-m", "nsconfine", "run", *(["--tty"] if tty else []),
            *session_options(*ws_run), "--", "/bin/sh", "-c", script]  # fmt: skip
    answered: list[bytes] = []
    answering = threading.Thread(target=_answering_terminal, args=(controller, answered))
    left = _left_for_the_shell(argv, terminal, keep, controller, answering)
    assert len(answered) == 3, answered
    assert b"rm -rf" not in left, left


# A shell with job control, in a few lines: leads a session on its stdin (a terminal), runs
# argv as its foreground job, and once that job stops, takes the terminal back and writes what
# its line editor would read next to the file RESULT names.
_JOB_CONTROL_SHELL = r"""
import fcntl, os, select, signal, sys, termios, time
os.setsid()
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
job = os.fork()
if job == 0:
    os.setpgid(0, 0)
    os.tcsetpgrp(0, os.getpid())
    signal.signal(signal.SIGTTOU, signal.SIG_DFL)
    os.execv(sys.argv[1], sys.argv[1:])
os.setpgid(job, job)
_, status = os.waitpid(job, os.WUNTRACED)
os.tcsetpgrp(0, os.getpgrp())
time.sleep(0.3)  # (printing its prompt)
modes = termios.tcgetattr(0)
modes[3] &= ~(termios.ICANON | termios.ECHO)
termios.tcsetattr(0, termios.TCSANOW, modes)
left = b""
while select.select([0], [], [], 1.0)[0]:
    left += os.read(0, 4096)
os.killpg(job, signal.SIGKILL)
os.waitpid(job, 0)
with open(os.environ["RESULT"], "wb") as result:
    result.write(b"stopped " if os.WIFSTOPPED(status) else b"ended ")
    result.write(left)
"""


def _answering_once_handed_back(controller: int, shell_side: int, done: threading.Event) -> None:
    """A terminal that answers a title report (with a title a session chose, which a shell
    would run) once the launcher asks a status query of its own, or has handed the terminal
    back (line editing on again), whichever comes first; and run's status query after it."""
    seen, titled, statused = b"", False, False
    while not done.is_set():
        if select.select([controller], [], [], 0.02)[0]:
            try:
                seen += os.read(controller, 4096)
            except OSError:
                return
        asked, ours = b"\033[21t" in seen, STATUS_QUERY in seen
        handed_back = termios.tcgetattr(shell_side)[3] & termios.ICANON
        if asked and not titled and (ours or handed_back):
            os.write(controller, b"\033]l; touch pwned-by-the-title\033\\")
            titled = True
        if ours and titled and not statused:
            os.write(controller, b"\033[0n")
            statused = True


def test_a_session_that_stops_itself_leaves_no_answer_for_the_shell(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A --tty session asks for its title (one it set: a command line) and stops itself: run
    gives the caller's terminal back to its shell, which read the answer still coming as typed
    (attacker's pass, stop 40: a title report ran as root in 4 of 12 tries). As at the
    session's end, run turns the modes off and drops the answers first."""
    controller, terminal = os.openpty()
    shell_side = os.dup(terminal)
    result = tmp_path / "left"
    script = "printf '\\033[21t'; kill -STOP $$"
    argv = [sys.executable, "-m", "nsconfine", "run", "--tty", *session_options(*ws_run),
            "--", "/bin/sh", "-c", script]  # fmt: skip
    done = threading.Event()
    answering = threading.Thread(
        target=_answering_once_handed_back, args=(controller, shell_side, done)
    )
    answering.start()
    shell = subprocess.Popen(
        [sys.executable, "-c", _JOB_CONTROL_SHELL, *argv], stdin=terminal, stdout=terminal,
        stderr=terminal, cwd="/", env={**os.environ, "RESULT": str(result)},
    )  # fmt: skip
    os.close(terminal)
    try:
        assert shell.wait(timeout=60) == 0
    finally:
        done.set()
        answering.join(timeout=30)
        if shell.poll() is None:
            shell.kill()
            shell.wait()
        os.close(shell_side)
        os.close(controller)
        kill_all(pids_with(str(ws_run[0])))
    left = result.read_bytes()
    assert left.startswith(b"stopped "), left
    assert b"pwned" not in left, left


def _take_the_terminal() -> None:
    """(In the launcher's child) lead a session of its own whose controlling terminal is its
    stdin, as a login shell's job is."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _left_for_the_shell(
    argv: list[str], terminal: int, keep: int, controller: int, feeder: threading.Thread
) -> bytes:
    """Run argv (`nsconfine run …`) as the job of terminal, which leads it, while the thread
    feeder plays the terminal at its controller; once run succeeds and feeder is done, what is
    left for the reader of the terminal at keep (the shell). terminal is closed once run has
    it, keep and controller however it ends."""
    feeder.start()
    launcher = subprocess.Popen(
        argv,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        cwd="/",
        preexec_fn=_take_the_terminal,
    )
    os.close(terminal)
    try:
        assert launcher.wait(timeout=60) == 0
        feeder.join(timeout=30)
        return _what_the_shell_reads_next(keep)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        os.close(keep)
        os.close(controller)
        feeder.join(timeout=30)


def _what_the_shell_reads_next(keep: int) -> bytes:
    """What is left for the reader of the terminal at keep (the shell's side) once run is
    done, read as a line editor reads it."""
    termios.tcsetattr(keep, termios.TCSANOW, _raw(termios.tcgetattr(keep)))
    left = b""
    while select.select([keep], [], [], 0.5)[0]:
        left += os.read(keep, 4096)
    return left


def _raw(modes: list[Any]) -> list[Any]:
    """modes with line editing and echo off (what a shell's line editor reads in)."""
    modes[3] &= ~(termios.ICANON | termios.ECHO)
    return modes


def test_status_queries_are_counted_however_the_output_is_split() -> None:
    """Every status query in a session's output counts once, however the reads split it, a
    byte at a time among them, and however it is spelled that a terminal takes for one (ESC
    [ 5 n; leading zeros, more parameters, a C0 control within, which a terminal acts on
    and goes on, as it does past a byte over 0x7F); the 8-bit CSI byte, which UTF-8 text holds
    ("\u011b5n" is C4 9B 35 6E), counts for none, nor does another question (ESC [ 6 n, ESC [
    ? 5 n, ESC [ 1 5 n), nor one cut short (CAN, a new ESC). (Hostile review, stop 38: tmux
    answered ESC [ 0xff 5 n and the parser, taking 0xff for the final byte, did not count it.)"""
    from nsconfine._cli.relay import _StatusQueries

    asked = [b"\033[5n", b"\033[05n", b"\033[0005;1n", b"\033[5\0n", b"\033[\r5n", b"\033\0[5n"]
    asked += [
        b"\033[\xff5n",
        b"\033[5\xffn",
        b"\033\xff[5n",
        b"\033[\xc3\xa95n",
        b"\033[" + b"0" * 80 + b"5n",
    ]
    other = [b"\x9b5n", "\u011b5n".encode(), b"\033[6n", b"\033[?5n", b"\033[15n"]
    other += [b"\033[5\x18n", b"\033[5\033n", b"\033[5 n", b"\033[50n"]
    stream = b"a".join([*asked, *other, *asked])
    for size in (1, 2, 3, 4, 5, 7, len(stream)):
        counted = _StatusQueries()
        for at in range(0, len(stream), size):
            counted.see(stream[at : at + size])
        assert counted.count == 2 * len(asked), size


@pytest.mark.parametrize("kind", ["pipe", "terminal", "socket"])
def test_the_callers_output_is_written_without_making_its_description_nonblocking(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The copy of a session's output to a caller's fd waits for nothing, yet never sets
    O_NONBLOCK on the caller's file description: that flag is every sharer's (the shell's,
    while a background run is stopped in its write by SIGTTOU; another writer to the same log
    pipe, which then met EAGAIN). Set around each write, it was (found by the review of that
    change). The write is made through a description of the launcher's own."""
    import socket

    from nsconfine._cli.relay import _Output

    if kind == "pipe":
        reader, caller = os.pipe()
    elif kind == "terminal":
        reader, caller = os.openpty()
    else:
        reader_socket, caller_socket = socket.socketpair()
        reader, caller = reader_socket.detach(), caller_socket.detach()
    seen: list[bool] = []
    real_write = os.write

    def watched_write(fd: int, data: bytes) -> int:
        seen.append(os.get_blocking(caller))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", watched_write)
    output = _Output(caller)
    try:
        output.pending = b"y" * (1 << 20)  # more than the pipe, terminal or socket holds
        output.write_some()
        assert output.pending, "all of it was taken: nothing was shown"
        seen.append(os.get_blocking(caller))
        assert all(seen), seen
    finally:
        output.close()
        monkeypatch.setattr(os, "write", real_write)
        os.close(reader)
        os.close(caller)


def test_the_time_a_slow_caller_takes_is_not_counted_against_the_drain() -> None:
    """Waiting for a caller's output to take what the session wrote (a pager paged slowly)
    takes nothing of the time the drain gives the session's side: after such a wait, what the
    session still holds is copied. Counted, a reader slower than the drain's 30 s lost the
    end of the output (found by the review of the change that made the wait)."""

    from nsconfine._cli.relay import DrainLimit

    limit = DrainLimit()
    limit.deadline = time.monotonic() + 0.2
    reader, writer = os.pipe()
    os.set_blocking(writer, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(writer, b"x" * 65536)
    taken = threading.Timer(0.5, lambda: os.read(reader, 1 << 20))
    taken.start()
    try:
        assert limit.writable(writer)
        session_read, session_write = os.pipe()
        os.write(session_write, b"more")
        assert limit.ready([session_read]) == [session_read]
    finally:
        taken.join()
        for fd in (reader, writer, session_read, session_write):
            os.close(fd)


ASKER = """
import os, tty
if os.isatty(0):
    tty.setraw(0)
os.write(1, b"\\033[5n")  # a status query, its answer read here (a TUI asking the terminal)
got = b""
while not got.endswith(b"n"):
    got += os.read(0, 1)
"""


def test_a_status_answer_the_session_read_is_not_waited_for_again(
    ws_run: tuple[Path, Path],
) -> None:
    """A --tty session that asked the terminal's status and read the answer itself (through
    run's stdin, the caller's terminal raw): at its end run waits for the answer to its own
    query alone, and what the user types next is the shell's. (Without --tty the caller's
    terminal stays cooked: an answer, no line, reaches no session.) run waited for one answer
    more, half a second, reading and dropping the type-ahead, then flushed the rest (found by
    the final read of the change that counts the session's queries)."""

    asker = ws_run[0] / "asker.py"
    asker.write_text(ASKER)
    give_to_session_user(asker)
    controller, terminal = os.openpty()
    keep = os.dup(terminal)

    def answer_then_type() -> None:
        seen, answered = b"", 0
        while answered < 2:
            if not select.select([controller], [], [], 30)[0]:
                return
            seen += os.read(controller, 4096)
            while seen.count(b"\033[5n") > answered:
                os.write(controller, b"\033[0n")
                answered += 1
        time.sleep(0.2)  # (run, done with its own answer, has given the terminal back)
        os.write(controller, b"keep-me")

    argv = [sys.executable, "-m", "nsconfine", "run", "--tty", *session_options(*ws_run), "--",
            "python3", str(asker)]  # fmt: skip
    typing = threading.Thread(target=answer_then_type)
    left = _left_for_the_shell(argv, terminal, keep, controller, typing)
    assert left == b"keep-me", left


def test_output_to_a_terminal_s_controller_reaches_that_terminal() -> None:
    """A caller whose stdout is a pty's controller gets the session's output on that pty:
    opened again to write without waiting, the controller's device made a new pty, and the
    output went nowhere (found by the final read of the change)."""
    from nsconfine._cli.relay import _Output

    controller, terminal = os.openpty()
    termios.tcsetattr(terminal, termios.TCSANOW, _raw(termios.tcgetattr(terminal)))
    output = _Output(controller)
    try:
        output.pending = b"to-this-terminal"
        output.write_some()
        assert read_until(terminal, b"terminal", timeout=5) == b"to-this-terminal"
    finally:
        output.close()
        os.close(controller)
        os.close(terminal)
