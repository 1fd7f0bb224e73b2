"""Harness pins: a pinned bind's source must hash to its sha256 before a launch.

Hashing a large agent binary on every launch would cost more than the launch, so a verified
digest is remembered for the file's identity (device, inode, size, mtime, ctime) and the file is
hashed again whenever any of those change.
"""

from __future__ import annotations

import os

from nsconfine._errors import PlanError
from nsconfine._plan.model import Plan

_verified: dict[tuple[str, int, int, int, int, int], str] = {}


def _identity(path: str) -> tuple[str, int, int, int, int, int]:
    info = os.stat(path)
    return (path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def file_sha256(path: str) -> str:
    """The hex sha256 of the file at path."""
    import hashlib  # only plans with pinned harnesses need it

    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def verify_pins(plan: Plan) -> None:
    """Refuse the plan if a pinned file's content is not the one its digest names."""
    for entry in plan.entries:
        if entry.sha256 is None:
            continue
        try:
            identity = _identity(entry.source)
            if _verified.get(identity) == entry.sha256:
                continue
            actual = file_sha256(entry.source)
        except OSError as error:
            raise PlanError(f"pinned {entry.source} cannot be read: {error.strerror}") from error
        if actual != entry.sha256:
            raise PlanError(
                f"{entry.source} has sha256 {actual}, not the pinned {entry.sha256}: the harness "
                "changed; re-pin it only if you trust the new one"
            )
        _verified[identity] = actual
