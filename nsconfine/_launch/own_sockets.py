"""The sockets whose other end is a sandbox, held by the launcher: no session's stdio.

The launcher's end of a staged sandbox's shim socket takes the command the sandbox runs, and a
"proxy" session's listening socket on the launcher's proxy takes that sandbox's connections. A
session handed either as stdio could give the other sandbox a command of its own, under that
sandbox's plan and past every check of a launch, or take its traffic. A caller passes one only
by mistake (an fd number it closed, which nsconfine's next socket took), so each launch's stdio
is looked up here by identity (device, inode), which a dup of the fd keeps.
"""

from __future__ import annotations

import os

_held: set[tuple[int, int]] = set()  # (set.add and set.discard are atomic: no lock)


def hold(fd: int) -> tuple[int, int]:
    """Remember fd's socket as one of the launcher's own; its identity, to release it by."""
    info = os.fstat(fd)
    identity = (info.st_dev, info.st_ino)
    _held.add(identity)
    return identity


def release(identity: tuple[int, int]) -> None:
    """Forget a socket hold() remembered (before it is closed: its inode may be reused)."""
    _held.discard(identity)


def is_held(info: os.stat_result) -> bool:
    """Is the file whose fstat is info one of the launcher's own sockets?"""
    return (info.st_dev, info.st_ino) in _held
