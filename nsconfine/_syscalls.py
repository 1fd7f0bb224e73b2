"""Typed wrappers over nsconfine._native, the only module that imports it."""

from __future__ import annotations

import os
from collections.abc import Sequence

from nsconfine._native import ffi, lib  # type: ignore[import-not-found]

TYPE_CHECKING = False  # see nsconfine/_executor.py
if TYPE_CHECKING:
    from typing import Any, Final

# Looked up once: spawn is on the launcher's hot path.
_new = ffi.new
_from_buffer = ffi.from_buffer
_NULL = ffi.NULL
_nsc_spawn = lib.nsc_spawn
_nsc_memfd_sealed = lib.nsc_memfd_sealed
_nsc_probe_userns = lib.nsc_probe_userns
_nsc_realpath = lib.nsc_realpath
_string = ffi.string
_PATH_MAX: Final[int] = lib.NSC_PATH_MAX
_STAGE_EXEC: Final[int] = lib.NSC_STAGE_EXEC
_MAX_PASS_FDS: Final[int] = lib.NSC_MAX_PASS_FDS

_SYSCALL_OF_STAGE: Final[dict[int, str]] = {
    lib.NSC_STAGE_PIPE: "pipe2",
    lib.NSC_STAGE_CLONE: "clone",
    lib.NSC_STAGE_PDEATHSIG: "prctl(PR_SET_PDEATHSIG)",
    lib.NSC_STAGE_PARENT_DIED: "getppid",
    lib.NSC_STAGE_DUP: "dup2",
    lib.NSC_STAGE_CLOSE: "close_range",
    lib.NSC_STAGE_SIGNALS: "sigprocmask",
    lib.NSC_STAGE_EXEC: "execve",
    lib.NSC_STAGE_MEMFD: "memfd_create",
    lib.NSC_STAGE_WRITE: "write memfd",
    lib.NSC_STAGE_SEAL: "fcntl(F_ADD_SEALS)",
    lib.NSC_STAGE_SEEK: "lseek",
    lib.NSC_STAGE_UNSHARE: "unshare(CLONE_NEWUSER)",
    lib.NSC_STAGE_SETGROUPS: "write /proc/self/setgroups",
    lib.NSC_STAGE_UID_MAP: "write /proc/self/uid_map",
    lib.NSC_STAGE_GID_MAP: "write /proc/self/gid_map",
    lib.NSC_STAGE_WAIT: "waitpid",
    lib.NSC_STAGE_SETSID: "setsid",
}


class SyscallError(OSError):
    """An OSError whose `syscall` names the step that failed, as its message does."""

    syscall: str

    def __init__(self, err: int, syscall: str, filename: str | None = None) -> None:
        message = f"{syscall}: {os.strerror(err)}"
        if filename is None:
            super().__init__(err, message)
        else:
            super().__init__(err, message, filename)
        self.syscall = syscall

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.errno, self.syscall, self.filename))


def _error(err: int, stage: int, filename: str | None = None) -> SyscallError:
    return SyscallError(err, _SYSCALL_OF_STAGE.get(stage, f"native stage {stage}"), filename)


def _cstring_array(items: Sequence[bytes]) -> tuple[Any, Any]:
    """A NULL-terminated char *[] over one joined copy of items, and that copy (keep it alive)."""
    joined = b"\0".join(items) + b"\0"
    if joined.count(0) != max(len(items), 1):
        raise ValueError("embedded null byte")
    base = _from_buffer(joined)
    pointers = []
    offset = 0
    for item in items:
        pointers.append(base + offset)
        offset += len(item) + 1
    pointers.append(_NULL)
    return _new("char *[]", pointers), base


def spawn(
    path: bytes,
    argv: Sequence[bytes],
    env: Sequence[bytes],
    *,
    stdin: int = -1,
    stdout: int = -1,
    stderr: int = -1,
    pass_fds: Sequence[int] = (),
    pdeathsig: int = 0,
) -> int:
    """Exec path with argv, exactly env and only the given fds; return the pid once exec worked."""
    if not argv:
        raise ValueError("argv must not be empty")
    if b"\0" in path:
        raise ValueError("embedded null byte")
    if len(pass_fds) > _MAX_PASS_FDS:
        raise ValueError(f"at most {_MAX_PASS_FDS} pass_fds")
    # The arrays point into the joined buffers, which must outlive the call.
    c_argv, _argv_buffer = _cstring_array(argv)
    c_env, _env_buffer = _cstring_array(env)
    fds = tuple(pass_fds)
    out = _new("int[2]")
    err = _nsc_spawn(
        path, c_argv, c_env, stdin, stdout, stderr, fds, len(fds), pdeathsig, out, out + 1
    )
    if err:
        stage = out[1]
        raise _error(err, stage, os.fsdecode(path) if stage == _STAGE_EXEC else None)
    return int(out[0])


def memfd_sealed(name: str, data: bytes) -> int:
    """A memfd holding data: close-on-exec, sealed against any change, read offset at 0."""
    out = _new("int[2]")
    err = _nsc_memfd_sealed(os.fsencode(name), data, len(data), out, out + 1)
    if err:
        raise _error(err, out[1])
    return int(out[0])


def probe_user_namespace() -> None:
    """Check that a child can create a user namespace and map its ids, as bwrap will."""
    stage = _new("int *")
    err = _nsc_probe_userns(stage)
    if err:
        raise _error(err, stage[0])


def realpath(path: str) -> str:
    """The path with every symlink resolved, like realpath(3); OSError if it does not exist."""
    buffer = _new("char[]", _PATH_MAX)
    err = _nsc_realpath(os.fsencode(path), buffer)
    if err:
        raise SyscallError(err, "realpath", path)
    return os.fsdecode(_string(buffer))
