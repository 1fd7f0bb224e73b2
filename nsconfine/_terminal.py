"""The caller's terminal, as a session found it.

A session whose stdio is the caller's terminal can change that terminal's settings (echo off,
raw mode, a 7x7 window) and leave them changed. The launcher records each terminal among the
session's stdio at launch and puts its settings and window size back once the session has
ended. (A session cannot inject input there: it runs in a new session without a controlling
terminal, and the seccomp filter refuses TIOCSTI.)
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # see nsconfine/_executor.py
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    # (a private duplicate of the terminal's fd, its termios attributes, its window size)
    Saved = tuple[int, list[Any], bytes]


def save(fds: Iterable[int]) -> list[Saved]:
    """The settings of every distinct terminal among fds (usually none: costs an isatty each)."""
    saved: list[Saved] = []
    seen: set[tuple[int, int]] = set()
    for fd in fds:
        if fd < 0 or not os.isatty(fd):
            continue
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) in seen:
            continue
        seen.add((info.st_dev, info.st_ino))
        import fcntl
        import termios

        try:
            attributes = termios.tcgetattr(fd)
            size = fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
        except (OSError, termios.error):
            continue
        saved.append((os.dup(fd), attributes, size))  # os.dup is close-on-exec
    return saved


def restore(saved: list[Saved]) -> None:
    """Put each recorded terminal back as it was, and let go of it."""
    if not saved:
        return
    import fcntl
    import signal
    import termios

    # A launcher in a background job would be stopped by SIGTTOU for changing its terminal;
    # with the signal blocked the change is made.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        for fd, attributes, size in saved:
            try:
                termios.tcsetattr(fd, termios.TCSANOW, attributes)
                fcntl.ioctl(fd, termios.TIOCSWINSZ, size)
            except (OSError, termios.error):
                pass  # the terminal is gone: nothing to restore
            finally:
                os.close(fd)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
