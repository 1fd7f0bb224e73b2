"""Harness pins: a pinned bind's source must hash to its sha256 before a launch.

Hashing a large agent binary on every launch would cost more than the launch, so a verified
digest is remembered for the file's identity (device, inode, size, mtime, ctime) and the file is
hashed again whenever any of those change.
"""

from __future__ import annotations

import os
import stat

from nsconfine._errors import PlanError
from nsconfine._plan.model import Plan
from nsconfine._text import printable

_verified: dict[tuple[str, int, int, int, int, int], str] = {}

# The largest file a pin hashes: past any agent's binary (Claude Code's is ~220 MiB), and a
# bound on what a launch reads for one (~1 GiB/s here). A pinned file something could grow,
# as a sparse one of 16 TiB, would otherwise cost every launch hours.
MAX_PINNED_BYTES = 2 << 30


def verify_pins(plan: Plan) -> None:
    """Refuse the plan if a pinned file's content is not the one its digest names."""
    for entry in plan.entries:
        if entry.sha256 is None:
            continue
        shown = printable(entry.source)
        try:
            actual = _verified_sha256(entry.source, entry.sha256)
        except OSError as error:
            raise PlanError(f"pinned {shown} cannot be read: {error.strerror}") from error
        if actual != entry.sha256:
            raise PlanError(
                f"{shown} has sha256 {actual}, not the pinned {entry.sha256}: the harness "
                "changed; re-pin it only if you trust the new one"
            )


def _verified_sha256(path: str, pinned: str) -> str:
    """path's sha256: pinned itself if the file is the one last found to have it, else hashed
    (and remembered if it is pinned)."""
    fd, info = open_pinned(path)
    try:
        identity = (path, info.st_dev, info.st_ino, info.st_size,
                    info.st_mtime_ns, info.st_ctime_ns)  # fmt: skip
        if _verified.get(identity) == pinned:
            return pinned
        actual = _sha256(fd, info.st_size, path)
    finally:
        os.close(fd)
    if actual == pinned:
        _verified[identity] = actual
    return actual


def open_pinned(path: str) -> tuple[int, os.stat_result]:
    """path opened for its hash, and what it is: never waiting on a FIFO for a writer,
    refused (PlanError) unless a regular file of at most MAX_PINNED_BYTES."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PlanError(f"pinned {printable(path)} is not a regular file")
        if info.st_size > MAX_PINNED_BYTES:
            raise PlanError(
                f"pinned {printable(path)} is larger than any harness "
                f"({info.st_size} bytes; at most {MAX_PINNED_BYTES}): the harness changed"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _sha256(fd: int, size: int, path: str) -> str:
    """The sha256 of the size bytes the file held when it was opened; PlanError if it holds
    more (something writes it: a file kept growing would be read for as long as it grows)."""
    import hashlib  # only plans with pinned harnesses need it

    digest = hashlib.sha256()
    left = size
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        digest.update(chunk)
        left -= len(chunk)
    if os.read(fd, 1):
        raise PlanError(f"pinned {printable(path)} changed while it was hashed")
    return digest.hexdigest()
