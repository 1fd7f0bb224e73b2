"""Typed wrappers over nsconfine._native, the only module that imports it."""

from __future__ import annotations

import errno
import os
import stat
import struct
from collections.abc import Sequence

from nsconfine._kernel.walk import walk_path
from nsconfine._native import ffi, lib  # type: ignore[import-not-found]

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
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
_nsc_linked_files = lib.nsc_linked_files
_nsc_seccomp_filter = lib.nsc_seccomp_filter
_nsc_open_path = lib.nsc_open_path
_nsc_landlock_abi = lib.nsc_landlock_abi
_nsc_landlock_scopes = lib.nsc_landlock_scopes
_nsc_first_changed = lib.nsc_first_changed
_string = ffi.string
_PATH_MAX: Final[int] = lib.NSC_PATH_MAX
_STAGE_EXEC: Final[int] = lib.NSC_STAGE_EXEC
_MAX_PASS_FDS: Final[int] = lib.NSC_MAX_PASS_FDS

# nsc_spawn's flags: what its child does before execve (csrc/nsconfine.h).
SPAWN_NEW_PGRP: Final[int] = lib.NSC_SPAWN_NEW_PGRP
SPAWN_SET_IDS: Final[int] = lib.NSC_SPAWN_SET_IDS
SPAWN_DROP_CAPS: Final[int] = lib.NSC_SPAWN_DROP_CAPS
SPAWN_NO_NEW_PRIVS: Final[int] = lib.NSC_SPAWN_NO_NEW_PRIVS
SPAWN_NEW_KEYRING: Final[int] = lib.NSC_SPAWN_NEW_KEYRING
SPAWN_FAIR_SHARE: Final[int] = lib.NSC_SPAWN_FAIR_SHARE

# The exec shim's wire (NSC_SHIM_* in csrc/nsconfine.h), by name without the prefix.
SHIM_WIRE: Final[dict[str, int]] = {
    name.removeprefix("NSC_SHIM_"): getattr(lib, name)
    for name in dir(lib)
    if name.startswith("NSC_SHIM_")
}

# nsc_seccomp_filter's rule groups.
SECCOMP_SETID: Final[int] = lib.NSC_SECCOMP_SETID
SECCOMP_KERNEL: Final[int] = lib.NSC_SECCOMP_KERNEL
SECCOMP_NAMESPACES: Final[int] = lib.NSC_SECCOMP_NAMESPACES
SECCOMP_OWN_NETWORK: Final[int] = lib.NSC_SECCOMP_OWN_NETWORK
# Every session's filter, and the one for a session allowed user namespaces of its own; a
# session on a network of its own (none, proxy) adds SECCOMP_OWN_NETWORK to either.
SECCOMP_DEFAULT: Final[int] = SECCOMP_SETID | SECCOMP_KERNEL | SECCOMP_NAMESPACES
SECCOMP_NESTED_USERNS: Final[int] = SECCOMP_SETID | SECCOMP_KERNEL


def seccomp_groups(namespace_rules: bool, own_network: bool) -> int:
    """The filter's rule groups: the namespace rules unless a session may make user
    namespaces, the datagram rules on a network of its own."""
    groups = SECCOMP_DEFAULT if namespace_rules else SECCOMP_NESTED_USERNS
    return groups | (SECCOMP_OWN_NETWORK if own_network else 0)


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
    lib.NSC_STAGE_SETPGID: "setpgid",
    lib.NSC_STAGE_DROP_GROUPS: "setgroups",
    lib.NSC_STAGE_SETGID: "setresgid",
    lib.NSC_STAGE_SETUID: "setresuid",
    lib.NSC_STAGE_CHECK_IDS: "getresuid (the ids did not change as asked)",
    lib.NSC_STAGE_CAPS: "capset",
    lib.NSC_STAGE_NO_NEW_PRIVS: "prctl(PR_SET_NO_NEW_PRIVS)",
    lib.NSC_STAGE_KEYRING: "keyctl(KEYCTL_JOIN_SESSION_KEYRING)",
    lib.NSC_STAGE_FILTER: "seccomp filter",
    lib.NSC_STAGE_SESSION_NS: "unshare(CLONE_NEWUSER|CLONE_NEWNS)",
    lib.NSC_STAGE_DEVPTS: "mount devpts at /dev/pts",
    lib.NSC_STAGE_INOTIFY: "write /proc/sys/user/max_inotify_*",
    lib.NSC_STAGE_NPROC: "prlimit(RLIMIT_NPROC)",
    lib.NSC_STAGE_IPC_NS: "unshare(CLONE_NEWUSER) then unshare(CLONE_NEWIPC)",
    lib.NSC_STAGE_IPC_LIMITS: "write /proc/sys/kernel/{shm,sem,msg}*",
    lib.NSC_STAGE_TMPFS: "mount a tmpfs at /dev/shm/<i>",
    lib.NSC_STAGE_PRIVATE: "mount --make-rprivate /",
    lib.NSC_STAGE_FAIR_SHARE: (
        "sched_setscheduler, setpriority, ioprio_set, oom_score_adj, setrlimit or personality"
    ),
    lib.NSC_STAGE_OPEN: "open (no symlinks)",
    lib.NSC_STAGE_LANDLOCK: "landlock",
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
    return SyscallError(err, stage_syscall(stage), filename)


def stage_syscall(stage: int) -> str:
    """The system call a native stage (NSC_STAGE_*) names."""
    return _SYSCALL_OF_STAGE.get(stage, f"native stage {stage}")


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
    flags: int = 0,
    uid: int = 0,
    gid: int = 0,
    pdeathsig: int = 0,
    exec_fd: int = -1,
    landlock_fd: int = -1,
    result: Any = None,
) -> int:
    """Exec path with argv, exactly env and only the given fds; return the pid once exec worked.

    flags (SPAWN_*) say what the child does first: a new process group, the ids uid/gid,
    no capabilities, no new privileges, a fresh session keyring; landlock_fd >= 0 (a ruleset)
    then restricts it. exec_fd >= 0 runs that open file (a program in a memfd) instead of path,
    which then only names it in errors. result: a spawn_result() of the caller's, where the
    pid lands as the exec succeeds (-1 otherwise): a caller whose call is interrupted as it
    returns (a KeyboardInterrupt) still has the child to end."""
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
    out = spawn_result() if result is None else result
    err = _nsc_spawn(
        path,
        exec_fd,
        c_argv,
        c_env,
        stdin,
        stdout,
        stderr,
        fds,
        len(fds),
        flags,
        uid,
        gid,
        landlock_fd,
        pdeathsig,
        out,
        out + 1,
    )
    if err:
        stage = out[1]
        raise _error(err, stage, os.fsdecode(path) if stage == _STAGE_EXEC else None)
    return int(out[0])


def spawn_result() -> Any:
    """Where spawn puts the pid it started ([0]) and the stage that failed ([1])."""
    result = _new("int[2]")
    result[0] = -1
    return result


def memfd_sealed(name: str, data: bytes) -> int:
    """A memfd holding data: close-on-exec, sealed against any change, read offset at 0."""
    out = _new("int[2]")
    err = _nsc_memfd_sealed(os.fsencode(name), data, len(data), out, out + 1)
    if err:
        raise _error(err, out[1])
    return int(out[0])


def child_statuses_discarded() -> bool:
    """Does the kernel reap this process's children itself, their statuses lost (SIGCHLD
    ignored, or SA_NOCLDWAIT), as sigaction says: signal.getsignal knows only what Python
    set?"""
    return bool(lib.nsc_child_statuses_discarded())


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


def linked_files(directory: str, depth: int, budget: int) -> tuple[list[tuple[int, int, str]], int]:
    """The regular files with more than one name in directory, depth levels down, symlinks
    below it never followed: (device, inode, path) of each, and what is left of budget, one
    taken for each entry looked at (the walk stops at 0). OSError if directory cannot be
    opened; an entry or a directory below that cannot be is skipped."""
    left = _new("long *", budget)
    count = _new("size_t *")
    # Room for a few (a launch looks through several directories, which hold none as a rule),
    # made larger and looked through again when the files found do not fit.
    room, names_size = 64, 16 * 1024
    while True:
        found = _new("struct nsc_linked[]", room)
        names = _new("char[]", names_size)
        err = _nsc_linked_files(
            os.fsencode(directory), depth, left, found, room, names, names_size, count
        )
        if err != errno.ENOBUFS:
            break
        left[0] = budget
        room, names_size = room * 8, names_size * 8
    if err:
        raise SyscallError(err, "open", directory)
    top = directory.rstrip("/") + "/" if directory != "/" else "/"
    return [
        (item.dev, item.ino, top + os.fsdecode(_string(names + item.name)))
        for item in found[0 : count[0]]
    ], left[0]


def seccomp_filter(rules: int) -> bytes:
    """The sessions' seccomp filter with the given rule groups, as bwrap's --seccomp reads it."""
    buffer = _new("unsigned char[]", lib.NSC_SECCOMP_MAX_BYTES)
    length = _new("size_t *")
    stage = _new("int *")
    err = _nsc_seccomp_filter(rules, buffer, lib.NSC_SECCOMP_MAX_BYTES, length, stage)
    if err:
        raise _error(err, stage[0])
    return bytes(ffi.buffer(buffer, length[0]))


# How a seccomp rule's condition reads its arguments (NSC_RULE_* in csrc/nsconfine.h).
RULE_ALWAYS: Final[int] = lib.NSC_RULE_ALWAYS
RULE_ARG_IN: Final[int] = lib.NSC_RULE_ARG_IN
RULE_ARG_NOT_IN: Final[int] = lib.NSC_RULE_ARG_NOT_IN
RULE_ANY_BIT: Final[int] = lib.NSC_RULE_ANY_BIT
RULE_BOTH_ANY_BIT: Final[int] = lib.NSC_RULE_BOTH_ANY_BIT
RULE_ARG_NOT_OR_ARG2_IN: Final[int] = lib.NSC_RULE_ARG_NOT_OR_ARG2_IN
RULE_ARG_IS_AND_ARG2_MASKED_IN: Final[int] = lib.NSC_RULE_ARG_IS_AND_ARG2_MASKED_IN
RULE_SOCKET_TYPE_PROTOCOLS: Final[int] = lib.NSC_RULE_SOCKET_TYPE_PROTOCOLS


class SeccompRule:
    """One rule of the filter, as csrc/seccomp.c's table states it: the syscall fails with
    errno err when its arguments meet the condition `when` (a RULE_* value) over arg, arg2
    and values."""

    __slots__ = ("arg", "arg2", "err", "name", "nr", "values", "when")

    def __init__(
        self, name: str, nr: int, err: int, when: int, arg: int, arg2: int, values: tuple[int, ...]
    ) -> None:
        self.name, self.nr, self.err, self.when = name, nr, err, when
        self.arg, self.arg2, self.values = arg, arg2, values

    def __repr__(self) -> str:
        return (
            f"SeccompRule({self.name!r}, nr={self.nr}, err={self.err}, when={self.when}, "
            f"arg={self.arg}, arg2={self.arg2}, values={self.values!r})"
        )


def seccomp_rules(rules: int) -> list[SeccompRule]:
    """The rules of the filter seccomp_filter(rules) builds, in its order."""
    cap = lib.NSC_SECCOMP_MAX_RULES
    table = _new("struct nsc_seccomp_rule[]", cap)
    count = _new("size_t *")
    err = lib.nsc_seccomp_rules(rules, table, cap, count)
    if err:
        raise SyscallError(err, "seccomp rules")
    return [
        SeccompRule(
            _string(rule.name).decode(),
            rule.nr,
            rule.err,
            rule.when,
            rule.arg,
            rule.arg2,
            tuple(rule.values[0 : rule.n_values]),
        )
        for rule in table[0 : count[0]]
    ]


# Set by the test that forces the component-by-component fallback of open_no_symlinks.
FORCE_WALK = False


def open_no_symlinks(path: str) -> int:
    """An O_PATH, close-on-exec fd for the absolute path, with no symlink followed on the way:
    OSError (ELOOP) if one is there, (ENOENT) if it is gone."""
    out = _new("int[2]")
    err = _nsc_open_path(os.fsencode(path), 1 if FORCE_WALK else 0, out, out + 1)
    if err:
        raise SyscallError(err, "open (no symlinks)", path)
    return int(out[0])


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: no Landlock)."""
    return int(_nsc_landlock_abi())


def landlock_scopes() -> int:
    """A Landlock ruleset fd that scopes abstract unix sockets and signals (ABI >= 6)."""
    out = _new("int[2]")
    err = _nsc_landlock_scopes(out, out + 1)
    if err:
        raise _error(err, out[1])
    return int(out[0])


def wait_fd(fd: int, timeout: float | None, *, writable: bool = False) -> bool:
    """Wait until fd is readable (or writable), at most timeout seconds (None: no limit);
    whether it is. The one wait on an fd: poll(), as select() fails on fds above 1023 and a
    wide launcher holds thousands."""
    import select

    poller = select.poll()
    poller.register(fd, select.POLLOUT if writable else select.POLLIN)
    return bool(poller.poll(poll_ms(timeout)))


def poll_ms(seconds: float | None) -> float | None:
    """seconds as poll()'s timeout: None (no limit) for one longer than its int of ms can
    count (~24 days), which would raise OverflowError (float('inf'), a --grace of 1e300)."""
    if seconds is None:
        return None
    ms = max(seconds, 0.0) * 1000
    return None if ms > 2**31 - 1 else ms


def read_untrusted(path: str, limit: int) -> bytes | None:
    """Up to limit bytes of the regular file at path, read as a session may have left it:
    never through a symlink at its end, never blocking (a FIFO); None if it is no regular file
    or cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


# struct nsc_identity: present, device, inode, then each time's seconds and nanoseconds.
_IDENTITY = struct.Struct("=qQQqqqq")


def changing_identity(info: os.stat_result) -> tuple[int, int, int, int]:
    """What PathIdentities compares of a file: device, inode, modification and change time in
    ns (a directory's change with each entry it gains, loses or renames; a file's with each
    write, link and rename)."""
    return (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)


class PathIdentities:
    """Paths and what lstat gave for each, (device, inode, modification and change time in
    ns), or None where it failed, packed once: whether any has changed since is then one
    call (nsc_first_changed), which every launch asks. same_file: only which file each path
    names is asked (stat, following symlinks: device and inode; the times given are not
    compared)."""

    __slots__ = ("_count", "_expected", "_paths", "_same_file")

    def __init__(
        self,
        observed: Sequence[tuple[str, tuple[int, int, int, int] | None]],
        same_file: bool = False,
    ) -> None:
        self._same_file = same_file
        paths = [os.fsencode(path) for path, _ in observed]
        if any(b"\0" in path for path in paths):
            raise ValueError("embedded null byte")  # as lstat itself refuses such a path
        self._paths = b"".join(path + b"\0" for path in paths)
        packed = bytearray()
        for _, seen in observed:
            if seen is None:
                packed += _IDENTITY.pack(0, 0, 0, 0, 0, 0, 0)
            else:
                device, inode, modified_ns, changed_ns = seen
                packed += _IDENTITY.pack(
                    1, device, inode, *divmod(modified_ns, 10**9), *divmod(changed_ns, 10**9)
                )
        self._expected = ffi.from_buffer("struct nsc_identity[]", packed)
        self._count = len(observed)

    def any_changed(self) -> bool:
        """Does any path now lstat (same_file: stat) to another identity, or fail where it
        did not (or the reverse)?"""
        first = _nsc_first_changed(self._paths, self._count, self._expected, self._same_file)
        return bool(first >= 0)


def identity(path: str, dir_fd: int | None = None) -> tuple[int, int] | None:
    """(device, inode) of the file at path (relative: to dir_fd), symlinks followed; None if it
    cannot be reached."""
    try:
        info = os.stat(path, dir_fd=dir_fd)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def lookups(
    directory: str, target: str, known: dict[str, str | bool | None] | None = None
) -> tuple[list[str], str]:
    """What the kernel looks up to resolve target from directory (a path with no symlink in
    it), one name at a time: every path it looks a name up at, each symlink followed in turn,
    and where the walk ends (a path that need not exist: the lookup fails there). Whoever can
    change any of those paths can change where target leads. known: what each path looked
    up was, kept between the walks of many paths that share their first names."""
    looked: list[str] = []
    known = {} if known is None else known

    def look(path: str) -> str | bool | None:
        looked.append(path)
        if path not in known:
            try:
                known[path] = os.readlink(path)
            except OSError as error:
                # not a symlink: walked into; missing, or not a directory: the walk ends there
                known[path] = None if error.errno == errno.EINVAL else False
        return known[path]

    _answer, reached, left = walk_path(target, look, past_the_bound=False, directory=directory)
    return looked, os.path.join(reached, *left)
