"""The caller's terminal, as a session found it.

A session whose stdio is the caller's terminal (one a launcher gave it through the API:
`nsconfine run` relays its own instead) can change that terminal's settings (echo off, raw
mode), its line discipline (N_NULL: every read and write fails), its open file's flags
(O_NONBLOCK, shared with the caller), make it exclusive (TIOCEXCL: no one else may open it) or
suspend its output (TCOOFF: the caller's next write blocks), and leave all that changed. The
launcher records each terminal among the session's stdio at launch and puts it back once the
session has ended. Not its window size: that is the terminal's own (a window resized during the
session would be set back to its old size). (A session cannot inject input there: bwrap's
--new-session leaves it without a controlling terminal, which TIOCSTI needs.)
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    # (a private duplicate of the terminal's fd, its termios attributes, its file status
    # flags, whether it was exclusive, its line discipline)
    Saved = tuple[int, list[Any], int, bool, bytes]

_TIOCGEXCL = 0x80045440  # _IOR('T', 0x40, int), Linux 3.8; not in Python's termios


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
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            exclusive = int.from_bytes(fcntl.ioctl(fd, _TIOCGEXCL, b"\0" * 4), "little") != 0
            discipline = fcntl.ioctl(fd, termios.TIOCGETD, b"\0" * 4)
        except (OSError, termios.error):
            continue
        saved.append((os.dup(fd), attributes, flags, exclusive, discipline))
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
        for fd, attributes, flags, exclusive, discipline in saved:
            try:
                if fcntl.ioctl(fd, termios.TIOCGETD, b"\0" * 4) != discipline:
                    fcntl.ioctl(fd, termios.TIOCSETD, discipline)  # before the settings
                termios.tcsetattr(fd, termios.TCSANOW, attributes)
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
                fcntl.ioctl(fd, termios.TIOCEXCL if exclusive else termios.TIOCNXCL)
                termios.tcflow(fd, termios.TCOON)  # output the session suspended flows again
            except (OSError, termios.error):
                pass  # the terminal is gone: nothing to restore
            finally:
                os.close(fd)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
