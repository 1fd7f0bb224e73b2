"""The sha256 of the few bytes nsconfine names things by (a session's machine-id, where a
workspace's git directories are remembered), without hashlib: importing it loads OpenSSL
first, 2-4 ms of every command line's start. Files, which can be large, are hashed with
hashlib's (nsconfine._policy.pins)."""

from __future__ import annotations


def sha256_hex(data: bytes) -> str:
    """The hex sha256 of data, by CPython's own implementation where it has one."""
    try:  # CPython 3.12 and later
        from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:  # CPython 3.11
            from _sha256 import sha256  # type: ignore[import-not-found,unused-ignore]
        except ImportError:  # pragma: no cover - a Python built without either
            from hashlib import sha256
    return str(sha256(data).hexdigest())
