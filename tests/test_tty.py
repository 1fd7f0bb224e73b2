"""A terminal of the session's own (--tty, tty=True): a pty of the sandbox's devpts as its
controlling terminal, job control, Ctrl-C and Ctrl-Z for the foreground job only, window-size
changes relayed, and the caller's terminal put back."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import session, session_options, without_fd

import nsconfine

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


def read_until(fd: int, wanted: bytes, timeout: float = 20) -> bytes:
    """What fd gives until wanted shows up (or the timeout, or the end)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    return seen


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


def wait_for_foreground(tty: int, program: str, timeout: float = 20) -> None:
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
    and a resize reaches it (SIGWINCH to the launcher, relayed)."""
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    before = termios.tcgetattr(terminal)

    script = "stty size; read line; stty size; echo bye"
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
        time.sleep(0.5)  # the kernel's SIGWINCH reaches the CLI, which relays the size
        os.write(controller, b"go\r")
        output = read_until(controller, b"bye")
        assert b"30 100" in output, output
        assert cli.wait(timeout=30) == 0
        assert termios.tcgetattr(terminal) == before  # raw mode undone
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
