"""Bind sources, and mount points inside writable binds, as the launcher opens and makes them.

A session controls its workspace and run directory between launches (and during one, if
another session of that workspace runs). bwrap resolves every path it is given, follows
symlinks while it makes mount points (before 0.12.0, even onto the host through /oldroot:
GHSA-pxhw-h44j-8pfx), and creates what is missing. So, before bwrap runs:

- every bind source is opened O_PATH with no symlink followed anywhere on the way, at the path
  the lint resolved and judged, and checked to be the same file the lint looked at; bwrap
  gets that fd (`--bind-fd`/`--ro-bind-fd`, where it has them) and the launcher later checks
  that each destination shows exactly that file;
- every mount point that lies inside a writable bind (a protected path, a pinned directory, a
  runner file in the workspace, HOME in the run directory) is walked from the writable bind's
  own fd one component at a time without following symlinks; a symlink anywhere is refused by
  name; a missing stub is made (see nsconfine._plan.model.STUBS, the session's account's);
- a read-only file there must have no second name (a hardlink the session can write), and a
  read-only directory there no such file and no symlink out to where the session writes.

Stubs are shared by every launch of a workspace, from any process: each sandbox holds a shared
lock on every mount point it binds over inside a writable bind (the file itself, whoever made
it) for as long as it lives, and a stub is removed only under an exclusive lock on it, so the
last one to let go removes it, if it is still the one made, and no launcher removes one that
another live sandbox binds over (whatever records it keeps). What is a stub is recorded by its
token (a symlink named by the stub's device and inode, naming its path, in the account's
records directory, which no session can see); tokens are made and stubs adopted and removed
under one lock of the records directory. A stub left by a launcher that was killed is adopted
by the next launch that finds its token, and removed after it.

What stays open: a process that swaps a directory for a symlink *during* a launch, after this
walk and before bwrap makes its mount point, can still send bwrap's mount elsewhere in the
sandbox (the mount-table check then refuses the launch) and, with bwrap < 0.12, make bwrap
create an empty file where the session's account may write. The pins that make those
directories mount points stop a session of the same plan from doing it.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import os
import stat
from _thread import allocate_lock
from collections.abc import Callable, Mapping, Sequence

from nsconfine._errors import PlanError, SandboxUnavailable, refuse_if_short_of_fds
from nsconfine._kernel import stub_records as _stub_records
from nsconfine._kernel import syscalls as _syscalls
from nsconfine._kernel.accounts import (
    READ,
    SEARCH,
    RunAs,
    allows,
    has_acl_at,
    refuse_planted_link,
)
from nsconfine._launch.forks import LaunchWindow
from nsconfine._plan.model import COMMONDIR_STUB, Entry, Kind, Mode, Plan
from nsconfine._text import file_kind, inside, printable, within

Identity = tuple[int, int]

# How many entries of a read-only directory inside a writable bind are looked through for a
# second name or a symlink out; past it the launch is refused.
PROTECTED_DIRECTORY_SCAN = 10_000


class Stub:
    """A mount point inside a writable bind that a sandbox binds over, held until that sandbox
    ends: a stub made at launch (or adopted from an earlier launch), its token in this
    account's records, or a file found there (the session's own, or a stub of another records
    directory), held all the same."""

    __slots__ = ("counted", "hold", "identity", "kind", "parts", "recorded", "top")

    def __init__(
        self,
        top: str,
        parts: list[str],
        kind: str,
        identity: Identity,
        recorded: bool,
        hold: int,
    ) -> None:
        self.top = top  # the writable bind's resolved path
        self.parts = parts  # the path below it, one component each
        self.kind = kind
        self.identity = identity
        self.recorded = recorded  # a stub, by this account's records: removed when let go
        # An fd of the file itself, with a shared lock on it. A launcher removes a stub only
        # under an exclusive lock on it, so none (whatever records it keeps: another
        # XDG_CACHE_HOME, a read-only cache) removes one another live sandbox binds over. Once
        # the sandbox's reaper has a copy (hand_over), the launcher closes its own: the lock
        # lives as long as that copy, the session's life.
        self.hold = hold
        self.counted = hold >= 0  # in _held_here until let go
        if hold >= 0:
            with _held_here_lock:
                _held_here[identity] += 1


# How many of this launcher's sandboxes hold each stub: the last of them to end removes it.
# (A lock it cannot take does not say a sandbox holds the stub: a child another thread is
# starting has a copy of every fd, the holds included, until it execs.)
_held_here: collections.Counter[Identity] = collections.Counter()
_held_here_lock = allocate_lock()


# ------------------------------------------------------------------ preparing a launch


def _writable_tops(plan: Plan) -> list[Entry]:
    """The writable binds in whose sources the mount points inside them are made: each but
    one that lies inside another at the place that one's source has for it (the workspace's
    `notes`, bound onto itself), whose are made through that other. One bound from elsewhere
    (a cache's directory onto ws/cache) is a top of its own: what the plan protects in it lies
    in its source."""
    writable = [e for e in plan.entries if e.kind is Kind.BIND and e.mode is Mode.RW]
    return [
        e
        for e in writable
        if not any(
            o is not e
            and (relative := inside(e.dest, o.dest)) is not None
            and os.path.join(o.source, relative) == e.source
            for o in writable
        )
    ]


def _innermost_top(
    entry: Entry, tops: Sequence[tuple[Entry, str]]
) -> tuple[Entry, str, str] | None:
    """The innermost of tops (each a writable bind and its resolved source) that holds entry,
    its resolved source, and entry's place relative to it; None if none does."""
    holding = [
        (top, resolved, relative)
        for top, resolved in tops
        if (relative := inside(entry.dest, top.dest)) is not None
    ]
    return min(holding, key=lambda held: len(held[2])) if holding else None


class ReadOnlySeen:
    """What a launch checked of the read-only binds inside writable ones, and all they hold:
    each host path and what lstat gave for it (device, inode, modification and change time),
    up to `budget` bytes of paths. Past it nothing is kept (complete is False): a session can
    fill a protected directory with 10,000 entries of 4 KB paths each, which the launcher
    would otherwise hold for as long as the sandbox waits staged."""

    __slots__ = ("_left", "complete", "seen")

    def __init__(self, budget: int = 64 * 1024) -> None:
        self.seen: list[tuple[str, tuple[int, int, int, int]]] = []
        self.complete = True
        self._left = budget

    def add(self, path: str, info: os.stat_result) -> None:
        if not self.complete:
            return
        self._left -= len(path) + 64  # (the identity, packed)
        if self._left < 0:
            self.complete = False
            self.seen = []
            return
        self.seen.append((path, _syscalls.changing_identity(info)))


def open_for_launch(
    plan: Plan, read_only_seen: ReadOnlySeen | None = None
) -> tuple[list[Stub], dict[str, int]]:
    """Walk, check and (where the plan says so) make every mount point inside the plan's
    writable binds, then open every bind's and copy's source; the stubs held and dest -> an
    fd of each source (O_PATH for a bind, for reading for a copy; the caller closes them,
    removes the stubs once the sandbox is gone, and checks the fds against what the lint
    judged: check_judged). read_only_seen, if given, gets each read-only bind inside a
    writable one, and all it holds, as checked (a sandbox kept staged is used only while
    they are unchanged: another session of the workspace may move them aside, give them a
    second name, or put a symlink in them, and a bind follows what it was made on)."""
    stubs: list[Stub] = []
    fds: dict[str, int] = {}
    directories = _Directories()
    copies = _CopySources(plan.user)
    try:
        tops = [(top, directories.top(top.source, plan.user)) for top in _writable_tops(plan)]
        inner = [
            (entry, *held)
            for entry in plan.entries
            if entry.kind in (Kind.BIND, Kind.DIR, Kind.TMPFS, Kind.DATA)
            and (held := _innermost_top(entry, tops)) is not None
        ]
        if inner:
            with _stub_records.records_locked() as records:
                for entry, _top, resolved, relative in inner:
                    parts = relative.split("/")
                    parent = directories.holding(resolved, parts)
                    stub = _mount_point(records, parent, resolved, parts, entry, plan.user)
                    if stub is not None:
                        stubs.append(stub)
                    # A path bound onto itself (a protected one) is opened while no launch can
                    # remove a stub; one bound from elsewhere is opened as any source is.
                    if entry.kind is Kind.BIND and entry.source == entry.dest:
                        fds[entry.dest] = _open_inside(parent, parts[-1], entry)
        for entry in plan.entries:
            if entry.kind is Kind.BIND and entry.dest not in fds:
                fds[entry.dest] = _open_source(entry.source)
            elif entry.kind is Kind.COPY:
                source = entry.source
                assert source is not None
                fds[entry.dest] = _opened(source, copies.open, source)
        writable = [resolved for _top, resolved in tops]
        seen = ReadOnlySeen(0) if read_only_seen is None else read_only_seen
        for entry, _top, resolved, relative in inner:
            if entry.kind is Kind.BIND and entry.mode is Mode.RO:
                where = os.path.join(resolved, relative)
                _refuse_writable_names(entry, fds[entry.dest], writable, where, seen)
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        directories.close()
        copies.close()
        remove(stubs)
        raise
    directories.close()
    copies.close()
    return stubs, fds


def _open_source(source: str) -> int:
    """An O_PATH fd of source resolved as the lint resolves it, with no symlink followed on
    the way; refused if a symlink appeared there since."""
    try:  # a path with no symlink on it is its own resolution (the host's, as a rule)
        return _syscalls.open_no_symlinks(source)
    except OSError as error:
        if error.errno != errno.ELOOP:
            refuse_if_short_of_fds(error)
    resolved = _syscalls.realpath(source) if os.path.lexists(source) else source
    return _opened(source, _syscalls.open_no_symlinks, resolved)


def _opened(source: str, open_it: Callable[[str], int], path: str) -> int:
    """open_it(path), a launch's opening of source; its OSError a refusal of the launch."""
    try:
        return open_it(path)
    except OSError as error:
        refuse_if_short_of_fds(error)
        raise SandboxUnavailable(
            f"{printable(source)} changed since its plan was checked ({error.strerror}): a "
            "symlink appeared on its way, or it is gone; nothing was run"
        ) from error


def open_copy_source(source: str) -> int:
    """A runner file to copy into the sandbox (or an OCI bundle), opened for reading with no
    symlink followed on the way: its source is the real path its plan found (runner_entries),
    and a symlink there now was swapped in since, by whoever can write where it lies, perhaps
    a session. The launcher may be root, and would read through it what the session's
    account may not. OSError then (ELOOP), or if it is gone; PlanError unless it is still a
    regular file: a FIFO or device swapped in would hang the reader (it is opened without
    waiting) or read a device."""
    parent = _syscalls.open_no_symlinks(os.path.dirname(source))
    try:
        return _open_regular(parent, source)
    finally:
        os.close(parent)


def _open_regular(parent: int, source: str) -> int:
    """source's file in the directory open at parent, for reading, not through a symlink,
    never waiting; PlanError unless it is a regular file."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(os.path.basename(source), flags, dir_fd=parent)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PlanError(f"{printable(source)} is no longer a regular file: refusing to copy it")
    return fd


class _CopySources:
    """Opens a launch's runner files to copy (open_copy_source's way), and, when the launcher
    is not the session's account (root), judges each as it opens it: the file by its fd, and
    each directory on its way as it is walked, one component at a time from /, by its fd too,
    kept for the launch's other copies. What the account may not read (now: its plan found it
    could, and a kept plan's launches come later) is refused, as a bind would show it
    unreadable; so is what has an ACL, which nsconfine does not judge. A path judged apart
    from the opening could be another file or directory by then (a session that can rename
    where they lie exchanging them)."""

    def __init__(self, user: RunAs) -> None:
        self.user = user
        self.judged = user.uid != os.geteuid()  # else it reads only what the account may
        self.directories: dict[str, int] = {}

    def open(self, source: str) -> int:
        if not self.judged:
            return open_copy_source(source)
        fd = _open_regular(self._directory(os.path.dirname(source)), source)
        try:
            self._judge(fd, source, READ)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _directory(self, path: str) -> int:
        """An O_PATH fd of the directory path, walked to from the nearest one opened before,
        each directory judged for search as it is opened."""
        missing = []
        while path not in self.directories and path != "/":
            missing.append(os.path.basename(path))
            path = os.path.dirname(path)
        if path not in self.directories:
            self.directories["/"] = fd = os.open("/", _DIRECTORY_FLAGS)
            self._judge(fd, "/", SEARCH)
        for name in reversed(missing):
            below = os.path.join(path, name)
            fd = os.open(name, _DIRECTORY_FLAGS | os.O_NOFOLLOW, dir_fd=self.directories[path])
            self.directories[below] = fd
            self._judge(fd, below, SEARCH)
            path = below
        return self.directories[path]

    def _judge(self, fd: int, path: str, bits: int) -> None:
        user = self.user
        if not allows(os.fstat(fd), user, bits):
            how = "read" if bits == READ else "search"
            raise PlanError(
                f"{printable(path)} cannot be copied into the session: {user.name} (uid "
                f"{user.uid}) may not {how} it; let {user.name} read it, or drop it from the "
                "read-only paths"
            )
        if has_acl_at(fd):
            raise PlanError(
                f"{printable(path)} has an ACL, which nsconfine does not judge (it may keep a "
                f"runner file from {user.name}): a runner file below it cannot be copied into "
                "the session; bind the directory that holds it instead (--ro DIR), or remove "
                "the ACL"
            )

    def close(self) -> None:
        for fd in self.directories.values():
            os.close(fd)
        self.directories.clear()


_DIRECTORY_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


def check_judged(
    plan: Plan, opened: Mapping[str, Identity], judged: Mapping[str, Identity | None]
) -> None:
    """Each bind's and copy's opened source (dest -> its identity) is the very file the lint
    judged (None: a stub, judged by nobody)."""
    for entry in plan.entries:
        expected = judged.get(entry.source) if entry.is_host_bind else None
        if expected is not None and opened.get(entry.dest) != expected:
            raise SandboxUnavailable(
                f"{printable(entry.source)} was replaced while it was checked: nothing was "
                "run; launch again"
            )


class _Directories:
    """The directories that hold a batch's mount points, each reached once from its writable
    bind's resolved path, one component at a time without following a symlink (refused by
    name: a session may have planted it), and kept open for the batch: a workspace's top
    holds a score of them. close() closes them all."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, tuple[str, ...]], int] = {}

    def top(self, source: str, user: RunAs) -> str:
        """The real path of a writable bind's source, opened (kept as that path's directory)
        from / one component at a time, following only a symlink no session could have made:
        one that, and the directory holding it, root owns (or, for sessions of another
        account, the launcher), and no one else can write there (the lint's rule). Whoever
        can write where the workspace lies (its parent: a session given it) may swap in a
        symlink between the plan and the launch, or during it: the mount points the launch
        makes, as the launcher, would be made where it leads, and some kept there."""
        try:
            fd = _syscalls.open_no_symlinks(source)  # (as a rule: a real path, the host's)
        except OSError as error:
            if error.errno != errno.ELOOP:
                refuse_if_short_of_fds(error)
                raise SandboxUnavailable(
                    f"{printable(source)} cannot be reached ({error.strerror}): it changed since "
                    "its plan was checked; nothing was run"
                ) from error
            fd, real = _open_through_trusted_links(source, user)
        else:
            real = os.path.normpath(source)
        self._open.setdefault((real, ()), fd)
        if self._open[(real, ())] != fd:  # (the same top twice: its first fd serves)
            os.close(fd)
        return real

    def holding(self, top: str, parts: list[str]) -> int:
        """An O_PATH fd of the directory holding parts[-1] below top (this batch's: not to be
        closed by the caller)."""
        return self._directory(top, tuple(parts[:-1]))

    def _directory(self, top: str, path: tuple[str, ...]) -> int:
        fd = self._open.get((top, path))
        if fd is not None:
            return fd
        if not path:
            fd = _syscalls.open_no_symlinks(top)
        else:
            above = self._directory(top, path[:-1])
            flags = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
            try:
                fd = os.open(path[-1], flags, dir_fd=above)
            except OSError as error:
                refuse_if_short_of_fds(error)
                where = os.path.join(top, *path)
                with contextlib.suppress(OSError):
                    found = os.stat(path[-1], dir_fd=above, follow_symlinks=False).st_mode
                    if not stat.S_ISLNK(found):  # (a file, a FIFO: no symlink to speak of)
                        raise PlanError(_wrong_kind(where, found, "a directory")) from error
                raise PlanError(_refusal(where, error)) from error
        self._open[(top, path)] = fd
        return fd

    def close(self) -> None:
        for fd in self._open.values():
            os.close(fd)
        self._open.clear()


def _open_through_trusted_links(source: str, user: RunAs) -> tuple[int, str]:
    """An O_PATH fd of the directory source and its real path, walked to from / by fds,
    following only the symlinks Directories.top allows; PlanError at any other."""
    pending = [name for name in reversed(source.split("/")) if name]
    real: list[str] = []
    fd = os.open("/", _DIRECTORY_FLAGS)
    followed = 0
    path = "/"
    try:
        while pending:
            name = pending.pop()
            if name in (".", ".."):
                if name == ".." and real:
                    real.pop()
                    fd = _replaced(fd, os.open("..", _DIRECTORY_FLAGS, dir_fd=fd))
                continue
            path = "/" + "/".join([*real, name])
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                holder = os.fstat(fd)
                target = os.readlink(name, dir_fd=fd)
                followed += 1
                if not pending:  # the source itself, which no rule lets be a symlink
                    raise PlanError(
                        f"{printable(source)} is a symlink (to {printable(target)}): a writable "
                        "bind is given by its real path, so that no session can plant one where "
                        "the next workspace goes; nothing was run"
                    )
                refuse_planted_link(source, path, info, holder, user)
                if followed > 40:  # (ELOOP, as the kernel says it)
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), source)
                pending += [part for part in reversed(target.split("/")) if part]
                if target.startswith("/"):
                    real = []
                    fd = _replaced(fd, os.open("/", _DIRECTORY_FLAGS))
                continue
            # (a symlink swapped in since the stat: ENOTDIR, refused below)
            fd = _replaced(fd, os.open(name, _DIRECTORY_FLAGS | os.O_NOFOLLOW, dir_fd=fd))
            real.append(name)
    except BaseException as error:
        os.close(fd)
        if not isinstance(error, OSError):
            raise
        refuse_if_short_of_fds(error)
        raise SandboxUnavailable(
            f"{printable(source)} cannot be reached at {printable(path)} ({error.strerror}): "
            "it changed since its plan was checked; nothing was run"
        ) from error
    return fd, "/" + "/".join(real)


def _replaced(old: int, new: int) -> int:
    os.close(old)
    return new


def _open_inside(parent: int, name: str, entry: Entry) -> int:
    """An O_PATH fd of a bind's source that lies inside a writable bind, name in the directory
    parent (reached from that bind's resolved path: a symlink above the workspace, the host's
    own, is fine)."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError as error:
        refuse_if_short_of_fds(error)
        raise SandboxUnavailable(
            f"{printable(entry.source)} cannot be opened ({error.strerror}): it changed during "
            "the launch; nothing was run"
        ) from error
    if stat.S_ISLNK(os.fstat(fd).st_mode):
        os.close(fd)
        raise PlanError(_refusal(entry.dest, None))
    return fd


def _mount_point(
    records: str, parent: int, resolved: str, parts: list[str], entry: Entry, user: RunAs
) -> Stub | None:
    """Entry's mount point, parts[-1] in the directory parent (parts: its path below the
    writable bind at resolved), made if it is missing and the entry says so (a stub, or a DIR
    the session keeps). The stub this launch now holds, if it is one (made now, or by an
    earlier launch)."""
    name, where = parts[-1], os.path.join(resolved, *parts)
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        try:
            made = _make(parent, name, entry, user)
        except FileExistsError:  # a launcher of other records made it meanwhile: found now
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        else:
            if made is None:
                return None
            return _made_stub(records, parent, resolved, parts, made)
    if stat.S_ISLNK(info.st_mode):
        raise PlanError(_refusal(entry.dest, None))
    made_as = _mounted_over(entry)
    if made_as is not None and stat.S_ISDIR(info.st_mode) != (made_as == "dir"):
        wanted = "a directory" if made_as == "dir" else "a file"
        raise PlanError(_wrong_kind(where, info.st_mode, f"{wanted} ({entry.reason})"))
    if entry.kind is Kind.DIR and stat.S_ISDIR(info.st_mode):
        _give_kept_directory(parent, name, info, user)
    # Held by what is found, whatever this entry would have made: another launch's stub (the
    # .mcp.json this --ro binds, a .vscode a mask covers, a commondir), from these records or
    # another's, is removed by the last launch that holds it, and its removal would detach
    # this sandbox's bind and give the session the path.
    identity = (info.st_dev, info.st_ino)
    kind = _removable_kind(parent, name, info)
    if kind is None:
        # A stub directory with something in it now (the host's own tools write into
        # .claude) is emptied later: one of these records' is held all the same. Anything
        # else no launcher removes: nothing to hold (nor to let a session lock).
        if not stat.S_ISDIR(info.st_mode) or not _stub_records.recorded(records, identity, where):
            return None
        return Stub(resolved, parts, "dir", identity, True, _hold(parent, name, identity, where))
    hold = _hold(parent, name, identity, where)
    try:
        recorded = _stub_records.recorded(records, identity, where)
    except BaseException:
        os.close(hold)
        raise
    return Stub(resolved, parts, kind, identity, recorded, hold)


def _give_kept_directory(parent_fd: int, name: str, info: os.stat_result, user: RunAs) -> None:
    """A directory the session keeps (its HOME) that is root's and empty: a root launcher
    killed between making it and giving it to the session's account left it so, and every
    later session would run with a HOME it cannot write. Given now, as that launch would have;
    one with anything in it is root's own, and stays."""
    if os.geteuid() != 0 or user.uid == 0 or info.st_uid != 0:
        return
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=parent_fd)
    except OSError:
        return  # changed since: judged as it is by what follows
    try:
        now = os.fstat(fd)
        same = (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)
        if same and now.st_uid == 0 and _empty(fd):
            os.fchown(fd, user.uid, user.gid)
    finally:
        os.close(fd)


def _empty(directory_fd: int) -> bool:
    """Does the directory open at directory_fd hold nothing? Read to its first entry at most:
    a session can fill a directory it writes (a pinned .git) with as many names as it likes,
    which a whole listing would read, under the records' lock that every launcher of the
    account waits for."""
    with os.scandir(directory_fd) as entries:
        return next(entries, None) is None


def _made_stub(records: str, parent: int, resolved: str, parts: list[str], made: _Made) -> Stub:
    """The stub this launch made at parts[-1] in parent, locked and recorded with its change
    time as made (stub_records.made_as)."""
    (kind, identity, hold), where = made, os.path.join(resolved, *parts)
    try:
        _lock_shared(hold, where)
        _stub_records.record(records, identity, where, os.fstat(hold).st_ctime_ns)
    except BaseException:  # (out of fds) unrecorded, so no later launch would remove it
        os.close(hold)
        _remove_at(parent, parts[-1], kind, identity, made_now=True)
        raise
    return Stub(resolved, parts, kind, identity, True, hold)


def _removable_kind(parent_fd: int, name: str, info: os.stat_result) -> str | None:
    """What a launcher could remove the file at name as, a stub of its own: what a stub is
    (an empty file, a commondir's ".\\n", an empty directory); None for anything else. Only
    those are held: a real .envrc, with content, no launcher ever removes, and a session that
    can read it (a reviewer's) must not keep the workspace's next launch from starting by
    locking it."""
    if stat.S_ISREG(info.st_mode):
        sizes = {_stub_size("file"): "file", _stub_size("commondir"): "commondir"}
        return sizes.get(info.st_size)
    if not stat.S_ISDIR(info.st_mode):
        return None
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd
        )
    except OSError:
        return "dir"  # judged by its lock, as before
    try:
        return "dir" if _empty(fd) else None
    finally:
        os.close(fd)


def _hold(parent_fd: int, name: str, identity: Identity, where: str) -> int:
    """An fd of the mount point at name, with a shared lock on it for as long as the sandbox
    binds it (see Stub.hold and _lock_shared)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO never blocks
    fd = os.open(name, flags, dir_fd=parent_fd)
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != identity:
            raise PlanError(f"{printable(where)} changed while it was checked; nothing was run")
        _lock_shared(fd, where)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_shared(fd: int, where: str) -> None:
    """Take fd's shared lock. Refused while someone holds it exclusively: a launcher removing
    it, or a running session of the workspace locking it to strip the next session's bind."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SandboxUnavailable(
            f"{printable(where)} is locked (a launcher is removing it, or a running session of "
            "this workspace holds it): nothing was run; launch again once that session ends"
        ) from None


# What the launch mounts over, by the entry's kind, where it makes one when it is missing: bwrap
# mounts a directory only over a directory, and a file only over what is not one.
_MADE_AS = {Kind.DIR: "dir", Kind.TMPFS: "dir", Kind.DATA: "file"}


def _mounted_over(entry: Entry) -> str | None:
    """What entry's mount point must be, "dir" or "file"; None if anything will do (a path
    bound onto itself is its own mount point)."""
    if entry.kind is Kind.BIND and entry.source != entry.dest:  # bound from elsewhere
        try:
            return "dir" if stat.S_ISDIR(os.stat(entry.source).st_mode) else "file"
        except OSError:
            return None  # (gone: opening it refuses the launch)
    return _MADE_AS.get(entry.kind)


def _wrong_kind(where: str, mode: int, wanted: str) -> str:
    return (
        f"{printable(where)} is {file_kind(mode)}, where the launch needs {printable(wanted)}: "
        "a session left it there; remove it, then launch again. Nothing was run"
    )


def _refusal(where: str, error: OSError | None) -> str:
    if error is None or error.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink, or a file
        return (
            f"{printable(where)} is (or runs through) a symlink, inside a writable bind: a "
            "session may have planted it to move a mount point; remove it. Nothing was run"
        )
    return f"{printable(where)} cannot be used as a mount point: {error.strerror}"


def _stub_kind(entry: Entry) -> str | None:
    """What is made as entry's mount point and removed after (a generated file's is an empty
    file); None for what is made and kept (a directory the session owns: HOME) or not made."""
    return "file" if entry.kind is Kind.DATA else entry.stub


def _make(parent_fd: int, name: str, entry: Entry, user: RunAs) -> _Made | None:
    """Make the missing mount point (the session's account's); what was made, if it is a stub
    to remove later."""
    kept = entry.kind in (Kind.DIR, Kind.TMPFS)  # the session's own directory (HOME)
    kind = "dir" if kept else _stub_kind(entry)
    if kind is None:  # a bind into the workspace (a profile's dest) at a path not there
        raise PlanError(
            f"{printable(entry.dest)}, where the plan binds {printable(entry.source or '')} "
            f"({printable(entry.reason)}), is not there, and nothing makes it: create it, then "
            "launch again"
        )
    owner = (user.uid, user.gid) if os.geteuid() == 0 and user.uid != 0 else None
    try:
        if kind == "dir":
            made = _make_directory(parent_fd, name, owner)
            if kept:
                os.close(made[2])
                return None
            return made
        if kind == "file":
            return _make_file(parent_fd, name, owner)
        return _make_commondir(parent_fd, name, owner)
    except FileExistsError:
        raise  # made meanwhile by a launcher of other records: the caller looks again
    except OSError as error:
        refuse_if_short_of_fds(error)
        raise PlanError(f"{printable(entry.dest)} cannot be made: {error.strerror}") from error


# A stub made: its kind, its identity, and the fd it was made through (its hold once locked).
_Made = tuple[str, Identity, int]


def _make_file(parent_fd: int, name: str, owner: tuple[int, int] | None) -> _Made:
    """An empty file stub, made read-only: the fd it is made through is its hold (a launch
    makes a score of them, and a second open and stat cost it a tenth of a millisecond)."""
    flags = os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=parent_fd)  # nothing is made if this fails
    return "file", _owned(fd, owner, lambda: os.unlink(name, dir_fd=parent_fd)), fd


def _make_commondir(parent_fd: int, name: str, owner: tuple[int, int] | None) -> _Made:
    """A commondir stub (git's "this directory"), written, given and identified through the
    fd it is made with (its hold): never through its name, which a session could have renamed
    a file of its own to once it was written."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=parent_fd)  # nothing is made if this fails
    try:
        os.write(fd, COMMONDIR_STUB)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=parent_fd)  # made a moment ago, never recorded
        raise
    return "commondir", _owned(fd, owner, lambda: os.unlink(name, dir_fd=parent_fd)), fd


def _make_directory(parent_fd: int, name: str, owner: tuple[int, int] | None) -> _Made:
    """An empty directory, and an fd of it opened at once without following a symlink (its
    hold): what is recorded and chowned is what that fd shows, never a name a session could
    have renamed its own directory to in between (as root, one not the launcher's is
    refused, and so is one not empty)."""
    os.mkdir(name, 0o755, dir_fd=parent_fd)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=parent_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=parent_fd)  # made a moment ago (refused if no longer empty)
        raise
    # Made empty: one holding anything now was renamed over it (another root-owned directory
    # the session's directory held, which the chown below would give it, with what it holds).
    try:
        replaced = not _empty(fd)
    except BaseException:  # (short of fds: scandir takes one more)
        os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=parent_fd)  # made a moment ago (refused if no longer empty)
        raise
    if replaced:
        os.close(fd)
        raise PlanError("a mount point was replaced while it was made; nothing was run")
    return "dir", _owned(fd, owner, lambda: os.rmdir(name, dir_fd=parent_fd)), fd


def _owned(fd: int, owner: tuple[int, int] | None, remove: Callable[[], None]) -> Identity:
    """The identity of the file just made at fd, given to owner (as root: the session's
    account); on failure fd is closed and the file removed (made a moment ago, never
    recorded)."""
    try:
        info = os.fstat(fd)
        replaced = info.st_uid != os.geteuid()  # then not ours to remove either
        if not replaced and owner is not None:
            os.fchown(fd, *owner)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            remove()
        raise
    if replaced:
        os.close(fd)
        raise PlanError("a mount point was replaced while it was made; nothing was run")
    return (info.st_dev, info.st_ino)


def _refuse_writable_names(
    entry: Entry, fd: int, writable: list[str], where: str, checked: ReadOnlySeen
) -> None:
    """A read-only bind inside a writable one must not be writable under another name, nor
    written through: a file with a second name (a hardlink, made while it was not protected)
    is written through that name; a FIFO or a device is written through the read-only bind
    itself. A directory must hold none of these, and no symlink that leads through where the
    session writes (the host would follow it into what the session wrote, then or later).
    Each file looked at goes to checked, by its path on the host (where: the bind's source)."""
    info = os.fstat(fd)
    _refuse_written_through(printable(entry.source), info)
    checked.add(where, info)
    if not stat.S_ISDIR(info.st_mode):
        return
    from nsconfine._kernel.walk import walk

    seen = 0
    base = f"/proc/self/fd/{fd}"
    own = ""  # where the directory is, resolved when a symlink in it needs it (seldom)
    try:
        for root, dirs, files in walk(base):  # iterative: no depth runs out of stack
            for name in [*files, *dirs]:
                path = os.path.join(root, name)
                shown = printable(entry.source + path[len(base) :])
                member = os.lstat(path)
                _refuse_written_through(shown, member)
                checked.add(where + path[len(base) :], member)
                if stat.S_ISLNK(member.st_mode):
                    own = own or _syscalls.realpath(base)
                    _refuse_leading_out(shown, path, own, writable)
            seen += len(files) + len(dirs)
            if seen > PROTECTED_DIRECTORY_SCAN:
                raise PlanError(
                    f"{printable(entry.source)} holds more than {PROTECTED_DIRECTORY_SCAN:,} "
                    "entries: too many to check that none can be changed from the workspace"
                )
    except OSError as error:  # unreadable, too deep for a path, or changed while checked
        refuse_if_short_of_fds(error)  # the launcher's shortage, not the directory's fault
        where = entry.source + (error.filename or base)[len(base) :]
        raise PlanError(
            f"{printable(where)} cannot be checked ({error.strerror}): nothing in "
            f"{printable(entry.source)} may be left unchecked; make it readable, or remove it"
        ) from error


def _refuse_written_through(shown: str, info: os.stat_result) -> None:
    """Refuse a read-only file that can be written all the same (see _refuse_writable_names)."""
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise PlanError(
            f"{shown} has {info.st_nlink} names (hardlinks): another may lie where the session "
            f"writes and change it there; keep one name (`find {shown} -samefile` … lists "
            "them), then launch again"
        )
    if stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        raise PlanError(
            f"{shown} is {file_kind(info.st_mode)}: a read-only bind does not stop a session "
            "writing through it, to whoever reads it on the host; remove it, then launch again"
        )


def _refuse_leading_out(shown: str, link: str, own: str, writable: list[str]) -> None:
    """Refuse a symlink in a read-only directory whose way leads through a path outside that
    directory where the session writes: the session can put, or re-point, what it leads to
    (a symlink to a file it makes later, or through a symlink of its own)."""
    directory = _syscalls.realpath(os.path.dirname(link))
    looked, _end = _syscalls.lookups(directory, os.readlink(link))
    for path in looked:
        if within(path, "/proc"):  # /proc/self means whoever follows the link
            raise PlanError(
                f"{shown} is a symlink that leads through {printable(path)}, which leads "
                "elsewhere for each process that follows it; make it a file, or remove it"
            )
        if not within(path, own) and any(within(path, top) for top in writable):
            raise PlanError(
                f"{shown} is a symlink that leads through {printable(path)}, which the session "
                "can write: the host would follow it into what the session put there; make it "
                "a file, or remove it"
            )


# ------------------------------------------------------------------ after a sandbox


def remove(stubs: list[Stub]) -> None:
    """A sandbox is done with stubs: let go of each, and remove those no other launch holds,
    if each is still the stub made."""
    if not stubs:
        return
    with LaunchWindow():  # no fork meanwhile: it would hold the records' lock
        _remove(stubs)


def _remove(stubs: list[Stub]) -> None:
    # Let go of the holds first: that frees as many fds as the lock below needs, for a launch
    # refused for want of fds. Whether a stub is still held is decided by its own lock.
    release(stubs)
    # A stub another sandbox of this launcher still holds is left to the last of them to end,
    # without the records' lock, which a Pool's sessions would otherwise take in turn at each
    # end; whether any other goes is decided under that lock (_remove_if_unused).
    with _held_here_lock:
        unheld = [stub for stub in stubs if stub.recorded and not _held_here[stub.identity]]
    stubs.clear()
    if not unheld:
        return
    directories = _Directories()
    try:
        with _stub_records.records_locked() as records:
            companions = _bundle_companions(records)
            for stub in reversed(unheld):  # what lies inside another stub first
                _remove_if_unused(records, stub, directories, companions)
    except (OSError, SandboxUnavailable):
        pass  # the records are gone or out of reach: the next launch adopts the stubs
    finally:
        directories.close()


def holds(stubs: list[Stub]) -> list[int]:
    """The fds holding stubs, for the sandbox's reaper to keep."""
    return [stub.hold for stub in stubs if stub.hold >= 0]


def hand_over(stubs: list[Stub]) -> None:
    """The sandbox's reaper has its copy of each hold: close the launcher's. The stubs stay
    counted as held by this launcher until release()."""
    for stub in stubs:
        if stub.hold >= 0:
            os.close(stub.hold)
            stub.hold = -1


def release(stubs: list[Stub]) -> None:
    """Let go of stubs (their holds) without removing them."""
    for stub in stubs:
        if stub.hold >= 0:
            os.close(stub.hold)
        stub.hold = -1
        if stub.counted:
            stub.counted = False
            with _held_here_lock:
                _held_here[stub.identity] -= 1
                if not _held_here[stub.identity]:
                    del _held_here[stub.identity]


def keep_for_bundle(stubs: list[Stub], config: str) -> None:
    """Keep stubs while the OCI bundle whose config.json is at config exists: a runtime runs it
    when it will, and the container would lose its protected paths with them. Each stub's
    token gets a companion naming that file (by path and identity), in the records' bundles/
    directory; a stub whose bundle is still there is never removed, and goes with the first
    session to end after the bundle has been."""
    recorded = [stub for stub in stubs if stub.recorded]
    if not recorded:
        return
    info = os.stat(config)
    holder = os.fsencode(f"{info.st_dev}-{info.st_ino}\0{config}")
    with _stub_records.records_locked() as records:
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.join(records, _stub_records.BUNDLES), 0o700)
        for stub in recorded:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(_bundle_path(records, stub.identity), flags, 0o600)
            try:
                os.write(fd, holder)
            finally:
                os.close(fd)


def _bundle_path(records: str, identity: Identity) -> str:
    return os.path.join(records, _stub_records.BUNDLES, f"{identity[0]}-{identity[1]}")


def _bundle_companions(records: str) -> frozenset[str]:
    """The names of the bundle companions there are (read once a batch: usually none)."""
    try:
        return frozenset(os.listdir(os.path.join(records, _stub_records.BUNDLES)))
    except (FileNotFoundError, NotADirectoryError):  # (a file there: no bundle kept any)
        return frozenset()


def _kept_for_bundle(records: str, identity: Identity, companions: frozenset[str]) -> bool:
    """Is the stub of identity kept for an OCI bundle that still exists (its config.json the
    very file named)? A companion whose bundle is gone is removed."""
    if f"{identity[0]}-{identity[1]}" not in companions:
        return False
    path = _bundle_path(records, identity)
    try:
        with open(path, "rb") as companion:
            named, _, config = companion.read(8192).partition(b"\0")
    except FileNotFoundError:
        return False
    try:
        info = os.stat(config)
        if os.fsencode(f"{info.st_dev}-{info.st_ino}") == named:
            return True
    except OSError:
        pass
    with contextlib.suppress(OSError):
        os.unlink(path)
    return False


def _remove_if_unused(
    records: str, stub: Stub, directories: _Directories, companions: frozenset[str]
) -> None:
    """Remove a stub of these records (called with their lock held) unless a sandbox or an
    OCI bundle holds it; its token goes with it, or stays for a later launch to remove it
    then."""
    token_path = _stub_records.token_path(records, stub.identity)
    if not stub.recorded or not os.path.lexists(token_path):
        return  # not a stub, another records directory's, or removed by another launch
    if _kept_for_bundle(records, stub.identity, companions):
        return
    with _held_here_lock:
        if _held_here[stub.identity]:
            return  # another sandbox of this launcher binds over it, and removes it at its end
    if _remove_stub(stub, directories, _stub_records.made_as(records, stub.identity)):
        with contextlib.suppress(OSError):
            os.unlink(token_path)


def _remove_stub(stub: Stub, directories: _Directories, made_ns: int | None) -> bool:
    """Remove the stub if it is still the one made, unchanged since (see _remove_at); False if
    it is kept: another sandbox binds over it, or the way to it is no directory now."""
    try:
        parent = directories.holding(stub.top, stub.parts)
    except (OSError, PlanError):
        # Moved aside, with a symlink in its place perhaps (the session's account can), and it
        # may come back with the stub in it: the record stays, for the end of a later launch
        # that finds the stub to remove it (one whose stub is gone for good is pruned).
        return False
    return _remove_at(parent, stub.parts[-1], stub.kind, stub.identity, made_ns=made_ns)


def _remove_at(
    parent_fd: int,
    name: str,
    kind: str,
    identity: Identity,
    *,
    made_now: bool = False,
    made_ns: int | None = None,
) -> bool:
    """Remove the stub of kind at name in parent_fd if it is still the one made (the same
    inode, and empty, or for a commondir holding "." alone), unchanged since it was made (its
    change time made_ns, where given: one written into and emptied again, by the host or
    another launcher's stubs within it, may be bound by a sandbox that took no hold of it then,
    and its removal would detach that bind; and the host's own file must stay) and no sandbox
    holds it (an exclusive lock on it, held while it goes); False if one does. made_now: a
    stub this launch has just made and no one can hold yet, removed without an fd (a launch
    short of fds takes this way out)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = -1
    try:
        if made_now:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        else:
            fd = os.open(name, flags, dir_fd=parent_fd)
            info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != identity:
            return True
        if made_ns is not None and info.st_ctime_ns != made_ns:
            return True  # written into since: the host's now, never removed
        if fd >= 0 and not _lock_exclusively(fd):
            return False
        if kind == "dir" and stat.S_ISDIR(info.st_mode):
            os.rmdir(name, dir_fd=parent_fd)  # refused if not empty: then kept
        elif stat.S_ISREG(info.st_mode) and info.st_size == _stub_size(kind):
            os.unlink(name, dir_fd=parent_fd)
    except OSError:
        pass  # gone, changed or no longer empty: not ours to remove
    finally:
        if fd >= 0:
            os.close(fd)
    return True


def _lock_exclusively(fd: int) -> bool:
    """Take fd's exclusive lock, or find that only copies of this launcher's own let-go holds
    keep it (children being started, until they exec): then no sandbox holds the file."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return locked_by_this_launcher_alone(os.fstat(fd))


# /proc/locks lists every lock on the host, and a session can take 100,000 POSIX locks in half
# a second, after which each read of the table took the kernel seconds (a stub's removal reads
# it under the records lock, which every launch of the account waits on). Past this many
# bytes (some 3,000 locks) it is not read through: the stub is taken as held, and kept.
LOCKS_READ_LIMIT = 256 * 1024


def locked_by_this_launcher_alone(info: os.stat_result, table: str = "/proc/locks") -> bool:
    """Is every lock on the file this process's (the lock table names the process that took
    each; another launcher's sandbox holds its own)? Called only when this launcher holds
    none of its stubs there any more; False if the table is past LOCKS_READ_LIMIT."""
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        fd = os.open(table, os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = b""
            while len(text) <= LOCKS_READ_LIMIT and (chunk := os.read(fd, 1 << 16)):
                text += chunk
        finally:
            os.close(fd)
    except OSError:
        return False
    if len(text) > LOCKS_READ_LIMIT:
        return False
    holders = set()
    for line in text.decode(errors="replace").splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == inode:
            holders.add(fields[4])
    return holders == {str(os.getpid())}


def _stub_size(kind: str) -> int:
    return len(COMMONDIR_STUB) if kind == "commondir" else 0
