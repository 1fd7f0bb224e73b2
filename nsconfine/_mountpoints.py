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
  name; a missing stub is made (an empty file or directory, the session's account's) and
  removed after the session if it is still the empty one made here.

What stays open: a process that swaps a directory for a symlink *during* a launch, after this
walk and before bwrap makes its mount point, can still send bwrap's mount elsewhere in the
sandbox (the mount-table check then refuses the launch) and, with bwrap < 0.12, make bwrap
create an empty file where the session's account may write. The pins that make those
directories mount points stop a session of the same plan from doing it.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Mapping

from nsconfine import _syscalls
from nsconfine._errors import PlanError, SandboxUnavailable
from nsconfine._plan import Entry, Kind, Mode, Plan, RunAs, printable

Identity = tuple[int, int]


class Stub:
    """An empty file or directory made at launch as a mount point, removed once no sandbox of
    this process binds it any more: found again from its writable bind's resolved path, one
    component at a time, without following symlinks, and removed only if still the same empty
    file or directory. (Launches of one workspace from different processes do not know of each
    other's stubs: one may remove a stub another is about to bind, which then fails to set up.)"""

    __slots__ = ("identity", "kind", "parts", "top", "users")

    def __init__(self, top: str, parts: list[str], kind: str, identity: Identity) -> None:
        self.top = top
        self.parts = parts
        self.kind = kind
        self.identity = identity
        self.users = 1  # sandboxes of this process that bind it


_made: dict[Identity, Stub] = {}  # the stubs this process made and has not removed yet
_made_lock = threading.Lock()


def _use(fd: int, stubs: list[Stub]) -> None:
    """If fd is a stub this process made (for another sandbox of the same workspace), count
    this sandbox among its users and keep it in stubs."""
    info = os.fstat(fd)
    with _made_lock:
        stub = _made.get((info.st_dev, info.st_ino))
        if stub is not None and stub not in stubs:
            stub.users += 1
            stubs.append(stub)


def _outermost_writable(plan: Plan) -> list[Entry]:
    writable = [e for e in plan.entries if e.kind is Kind.BIND and e.mode is Mode.RW]
    return [
        e
        for e in writable
        if not any(o is not e and e.dest.startswith(o.dest.rstrip("/") + "/") for o in writable)
    ]


def _inside(dest: str, top: str) -> str | None:
    """dest relative to top if it lies strictly inside it."""
    prefix = top.rstrip("/") + "/"
    return dest[len(prefix) :] if dest.startswith(prefix) else None


def prepare(plan: Plan, judged: Mapping[str, Identity | None]) -> list[Stub]:
    """Walk, check and (where the plan says so) make every mount point inside the plan's
    writable binds; the stubs made. judged: each source's identity as the lint saw it."""
    stubs: list[Stub] = []
    try:
        for top in _outermost_writable(plan):
            top_fd = _open_judged(top.source, judged)
            try:
                for entry in plan.entries:
                    relative = _inside(entry.dest, top.dest)
                    if relative is not None and entry.kind in (Kind.BIND, Kind.DIR):
                        stub = _mount_point(top, top_fd, relative, entry, plan.user)
                        if stub is not None:
                            stubs.append(stub)
            finally:
                os.close(top_fd)
    except BaseException:
        remove(stubs)
        raise
    return stubs


def prepare_one(plan: Plan, entry: Entry, judged: Mapping[str, Identity | None]) -> list[Stub]:
    """prepare() for one entry: its stub, made again."""
    for top in _outermost_writable(plan):
        relative = _inside(entry.dest, top.dest)
        if relative is not None:
            top_fd = _open_judged(top.source, judged)
            try:
                stub = _mount_point(top, top_fd, relative, entry, plan.user)
            finally:
                os.close(top_fd)
            return [] if stub is None else [stub]
    return []


def _open_judged(source: str, judged: Mapping[str, Identity | None]) -> int:
    """An O_PATH fd of source as the lint resolved it, with no symlink followed; refused if
    a symlink appeared on the way or the file changed since the lint looked."""
    resolved = _syscalls.realpath(source) if os.path.lexists(source) else source
    try:
        fd = _syscalls.open_no_symlinks(resolved)
    except OSError as error:
        raise SandboxUnavailable(
            f"{printable(source)} changed since its plan was checked ({error.strerror}): a "
            "symlink appeared on its way, or it is gone; nothing was run"
        ) from None
    info = os.fstat(fd)
    expected = judged.get(source)
    if expected is not None and expected != (info.st_dev, info.st_ino):
        os.close(fd)
        raise SandboxUnavailable(
            f"{printable(source)} was replaced since its plan was checked: nothing was run; "
            "launch again"
        )
    return fd


def open_sources(
    plan: Plan, judged: Mapping[str, Identity | None], stubs: list[Stub]
) -> dict[str, int]:
    """dest -> an O_PATH fd of each bind's source (see _open_judged); the caller closes them.
    A stub is anyone's empty placeholder, judged by nobody: if another launch of the same
    workspace removed it since prepare() saw it, it is made again (and added to stubs)."""
    fds: dict[str, int] = {}
    try:
        for entry in plan.entries:
            if entry.kind is not Kind.BIND:
                continue
            if entry.stub is None:
                fds[entry.dest] = _open_judged(entry.source, judged)
                continue
            for _attempt in range(3):
                try:
                    fds[entry.dest] = _syscalls.open_no_symlinks(entry.source)
                    _use(fds[entry.dest], stubs)
                    break
                except OSError as error:
                    if error.errno == errno.ENOENT:
                        stubs += prepare_one(plan, entry, judged)
                        continue
                    raise SandboxUnavailable(
                        f"{printable(entry.source)} cannot be opened ({error.strerror}): a "
                        "symlink appeared on its way; nothing was run"
                    ) from None
            else:
                raise SandboxUnavailable(f"{printable(entry.source)} keeps disappearing")
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


def _mount_point(top: Entry, top_fd: int, relative: str, entry: Entry, user: RunAs) -> Stub | None:
    """Walk from the writable bind's fd to entry's mount point without following symlinks;
    make it if the entry says so (a stub, or a DIR the session keeps). The stub made, if any."""
    parts = relative.split("/")
    fd = os.dup(top_fd)
    try:
        for depth, part in enumerate(parts[:-1]):
            where = os.path.join(top.dest, *parts[: depth + 1])
            try:
                next_fd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=fd)
            except OSError as error:
                raise PlanError(_refusal(where, error)) from None
            os.close(fd)
            fd = next_fd
        name = parts[-1]
        where = entry.dest
        try:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            made = _make(fd, name, where, entry, user)
            if made is None:
                return None
            stub = Stub(_syscalls.realpath(top.source), parts, made[0], made[1])
            with _made_lock:
                _made[stub.identity] = stub
            return stub
        if stat.S_ISLNK(mode):
            raise PlanError(_refusal(where, None))
        return None
    finally:
        os.close(fd)


def _refusal(where: str, error: OSError | None) -> str:
    if error is None or error.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink, or a file
        return (
            f"{printable(where)} is (or runs through) a symlink, inside a writable bind: a "
            "session may have planted it to move a mount point; remove it. Nothing was run"
        )
    return f"{printable(where)} cannot be used as a mount point: {error.strerror}"


def _make(
    parent_fd: int, name: str, where: str, entry: Entry, user: RunAs
) -> tuple[str, Identity] | None:
    """Make the missing mount point; its kind and identity if it is a stub to remove later."""
    kind = "dir" if entry.kind is Kind.DIR else entry.stub
    if kind is None:
        raise PlanError(
            f"{printable(where)} is missing since its plan was built: build the plan again"
        )
    try:
        if kind == "dir":
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(name, flags, 0o644, dir_fd=parent_fd))
    except FileExistsError:
        # Another launch of this workspace made it meanwhile: theirs to remove, ours to use,
        # unless it is a symlink.
        if stat.S_ISLNK(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode):
            raise PlanError(_refusal(where, None)) from None
        return None
    except OSError as error:
        raise PlanError(f"{printable(where)} cannot be made: {error.strerror}") from None
    if os.geteuid() == 0 and user.uid != 0:
        os.chown(name, user.uid, user.gid, dir_fd=parent_fd, follow_symlinks=False)
    if entry.kind is Kind.DIR:
        return None  # the session's own (HOME): kept
    info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    return kind, (info.st_dev, info.st_ino)


def remove(stubs: list[Stub]) -> None:
    """A sandbox is done with stubs: remove each one no other sandbox of this process binds,
    if it is still the empty file or directory made at launch."""
    for stub in reversed(stubs):
        with _made_lock:
            stub.users -= 1
            if stub.users > 0:
                continue
            _made.pop(stub.identity, None)
        parent = -1
        try:
            parent = _syscalls.open_no_symlinks(stub.top)
            for part in stub.parts[:-1]:
                next_fd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=parent)
                os.close(parent)
                parent = next_fd
            name = stub.parts[-1]
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if (info.st_dev, info.st_ino) == stub.identity:
                if stub.kind == "dir" and stat.S_ISDIR(info.st_mode):
                    os.rmdir(name, dir_fd=parent)  # refused if not empty: then kept
                elif stat.S_ISREG(info.st_mode) and info.st_size == 0:
                    os.unlink(name, dir_fd=parent)
        except OSError:
            pass  # gone, changed or no longer empty: not ours to remove
        finally:
            if parent >= 0:
                os.close(parent)
    stubs.clear()
