"""The sha256 of the few bytes nsconfine names things by (a session's machine-id, where a
workspace's git directories are remembered), without hashlib: importing it loads OpenSSL
first, 2-4 ms of every command line's start. Files, which can be large, are hashed with
hashlib's (nsconfine._policy.pins)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs every command line its import; mypy reads this block
if TYPE_CHECKING:
    from collections.abc import Callable
    from hashlib import _Hash


def _cpython_sha256() -> Callable[[bytes], _Hash]:
    """CPython's own sha256, found once: a failed import searches every sys.path entry."""
    try:  # CPython 3.12 and later
        from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:  # CPython 3.11
            from _sha256 import sha256  # type: ignore[import-not-found,unused-ignore]
        except ImportError:  # pragma: no cover - a Python built without either
            from hashlib import sha256
    return sha256  # type: ignore[no-any-return,unused-ignore]


_sha256 = _cpython_sha256()


def sha256_hex(data: bytes) -> str:
    """The hex sha256 of data, by CPython's own implementation where it has one."""
    return _sha256(data).hexdigest()
