"""The files the launcher holds for its sessions, each another session's: no session's stdio.

The launcher's end of a staged sandbox's shim socket takes the command the sandbox runs; a
"proxy" session's listening socket on the launcher's proxy, and each connection it accepted
there, carry that session's traffic, and the proxy's sockets to their upstreams (and the pipes
it splices through) are the way out its plan allows; its audit file holds the proxy's records.
A session handed one as stdio could give the other sandbox a command of its own, under that
sandbox's plan and past every check of a launch, read or answer its traffic, reach a network
its own plan does not give it, or forge records. A caller passes one only by mistake (an fd
number it closed, which nsconfine's next file took), so each launch's stdio is looked up here
by identity (device, inode), which a dup of the fd keeps, while the launcher holds it.
"""

from __future__ import annotations

import os
from _thread import allocate_lock

# Each identity with how many holds it has (one audit file may serve two sessions).
_held: dict[tuple[int, int], int] = {}
_held_lock = allocate_lock()


def hold(fd: int) -> tuple[int, int]:
    """Remember fd's file as one the launcher holds for a session; its identity, to release
    it by."""
    info = os.fstat(fd)
    identity = (info.st_dev, info.st_ino)
    with _held_lock:
        _held[identity] = _held.get(identity, 0) + 1
    return identity


def release(identity: tuple[int, int]) -> None:
    """Forget a hold() (before its fd is closed: its inode may be reused once none is left)."""
    with _held_lock:
        left = _held.pop(identity, 0) - 1
        if left > 0:
            _held[identity] = left


def is_held(info: os.stat_result) -> bool:
    """Is the file whose fstat is info one the launcher holds for a session?"""
    return (info.st_dev, info.st_ino) in _held
