"""The records of stubs: which files in workspaces are mount points a launch of this account
made (a token per file, by device and inode, naming where it is), kept in the account's cache
under one lock, so that any launcher of the account tells its own stubs from a session's files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager

from nsconfine._errors import SandboxUnavailable, refuse_if_short_of_fds
from nsconfine._text import is_decimal, printable

Identity = tuple[int, int]

# Where an account without a cache directory it can write keeps its records: a directory of
# its own there, nsconfine-UID (a module attribute, for the tests' stand-in).
FALLBACK_BASE = "/tmp"

BUNDLES = "bundles"  # the records' directory of bundle companions (nsconfine._launch.sources)

_found: dict[tuple[int, str | None, str | None], str] = {}


def records() -> str:
    """The account's directory of stub tokens, made 0700 if missing; refused if anyone else
    could write it. Found once per account and environment (forget_records() on a miss)."""
    key = (os.geteuid(), os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME"))
    found = _found.get(key)
    if found is None:
        found = _find()
        _prune(found)
        _found[key] = found
    return found


def forget_records() -> None:
    """Look for the records directory afresh (it was removed, or the environment changed)."""
    _found.clear()


def _find() -> str:
    from nsconfine._kernel.accounts import (
        Replaceable,
        make_own_directory,
        make_private_directory,
        records_directory,
        require_private,
    )

    directory = records_directory("mountpoints")
    try:
        make_private_directory(directory)
        _require_writable(directory)  # one there already may sit on a read-only mount
    except Replaceable as error:
        raise _replaceable(directory, error) from None
    except OSError:
        # No writable home (a system account, a unit's read-only home): a directory of this
        # uid's own in /tmp, which every launcher of this account with the same environment
        # picks alike.
        own = os.path.join(FALLBACK_BASE, f"nsconfine-{os.geteuid()}")
        directory = os.path.join(own, "mountpoints")
        try:
            if not make_own_directory(own, 0o700, 0o022):
                raise SandboxUnavailable(
                    f"{printable(own)}, where nsconfine records the mount points it makes when "
                    "this account has no cache directory it can write, must be a directory of "
                    "this account's that no one else can write (another account may have made "
                    "it first, or a symlink there); remove it, or set XDG_CACHE_HOME to a "
                    "directory this account can write"
                )
            make_private_directory(directory)
        except OSError as error:
            refuse_if_short_of_fds(error)
            raise SandboxUnavailable(
                f"cannot keep the records of the mount points it makes in "
                f"{printable(directory)} ({error.strerror}): set XDG_CACHE_HOME to a directory "
                "this account can write"
            ) from error
    try:
        require_private(directory)
    except Replaceable as error:
        raise _replaceable(directory, error) from None
    except PermissionError:
        raise SandboxUnavailable(
            f"{printable(directory)} must belong to this account and be writable by no one "
            "else: it records the mount points nsconfine makes in workspaces"
        ) from None
    return directory


def _replaceable(directory: str, error: OSError) -> SandboxUnavailable:
    return SandboxUnavailable(
        f"{printable(directory)}, where nsconfine records the mount points it makes in "
        f"workspaces, could be replaced by another account: it lies in "
        f"{printable(str(error.filename))}, which someone else owns or can write; set "
        "XDG_CACHE_HOME to a directory of this account's"
    )


def _prune(directory: str) -> None:
    """Remove the tokens a week old whose stub is gone, or is another file now: a launcher
    killed before it removed its stubs, and then the workspace removed, leaves tokens nothing
    removes (this machine's records grew to thousands), and a token whose inode number came back
    to a file at its path would make that file a stub. Not younger ones: a stub is judged by its
    path as this launcher sees it, and a launcher in another mount namespace (PrivateTmp=, a
    container sharing the home), or a workspace whose directory another process renamed for a
    moment, shows a live stub elsewhere; its session would end leaving the stub behind. At
    most once a day (PRUNED marks when), when a process first finds the records (a launcher's
    first launch: a look at each token cost every `nsconfine run` 17 ms with 4,000 of them),
    with their lock held."""
    marker = os.path.join(directory, PRUNED)
    with contextlib.suppress(OSError):
        if os.lstat(marker).st_mtime > time.time() - PRUNE_EVERY_SECONDS:
            return
    try:
        fd = _open_lock(directory)
    except OSError:
        return  # pruned at a later start; launches go on as before
    try:
        _lock(fd)
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        os.utime(marker)
        with os.scandir(directory) as listing:
            for entry in listing:
                if _stale(entry):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                        os.unlink(os.path.join(directory, BUNDLES, entry.name))
    except OSError:
        pass
    finally:
        _unlock(fd)


STALE_AFTER_SECONDS = 7 * 24 * 3600
PRUNE_EVERY_SECONDS = 24 * 3600
PRUNED = ".pruned"  # in the records: its time is the last prune's


def _stale(entry: os.DirEntry[str]) -> bool:
    """Is entry a token (DEV-INO, a symlink naming its stub) a week old whose stub is not
    there?"""
    device, dash, inode = entry.name.partition("-")
    if not (dash and is_decimal(device) and is_decimal(inode) and entry.is_symlink()):
        return False  # the lock, the bundles' directory, a token of earlier code (a file)
    if entry.stat(follow_symlinks=False).st_mtime > time.time() - STALE_AFTER_SECONDS:
        return False
    where = os.readlink(entry.path)
    if not where.startswith("/"):
        return False  # never made so: left alone
    try:
        info = os.lstat(where)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False  # out of this account's reach now, not known to be gone
    return (info.st_dev, info.st_ino) != (int(device), int(inode))


@contextmanager
def records_locked() -> Iterator[str]:
    """The records directory, with its lock held (by this open file: threads exclude each
    other too)."""
    directory = records()
    try:
        fd = _open_lock(directory)
    except FileNotFoundError:  # removed since it was found: make it again
        forget_records()
        directory = records()
        fd = _open_lock(directory)
    try:
        _lock(fd)
        yield directory
    finally:
        _unlock(fd)


# The lock fds this process holds (or waits on). flock's lock belongs to the open file, which a
# fork shares: a child forked meanwhile (a multiprocessing worker) would hold the lock as long
# as it lived, and every launch of the account would wait that long. The child closes its copy.
_lock_fds: set[int] = set()


def _lock(fd: int) -> None:
    _lock_fds.add(fd)
    fcntl.flock(fd, fcntl.LOCK_EX)


def _unlock(fd: int) -> None:
    _lock_fds.discard(fd)
    os.close(fd)


def _close_locks_in_child() -> None:
    for fd in _lock_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _lock_fds.clear()


os.register_at_fork(after_in_child=_close_locks_in_child)


def _open_lock(directory: str) -> int:
    """The records' lock file, made if missing; never through a symlink, nor one that is no
    regular file (SandboxUnavailable, naming it: every launch would be refused until it is
    removed). FileNotFoundError if directory is gone."""
    path = os.path.join(directory, ".lock")
    # (O_NONBLOCK: a FIFO there is never waited on, it is refused below)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        raise
    except OSError as error:  # a directory, a symlink (ELOOP), unreadable
        raise _unusable_lock(path, error.strerror or str(error)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _unusable_lock(path, "not a regular file")
    return fd


def _unusable_lock(path: str, why: str) -> SandboxUnavailable:
    return SandboxUnavailable(
        f"{printable(path)}, the lock of nsconfine's records of the mount points it makes, "
        f"cannot be used ({why}): remove it (it is made again)"
    )


def _require_writable(directory: str) -> None:
    """OSError unless this account can make files in directory. Tried, not asked: access()
    answers by mode bits, and root passes those even on a read-only mount."""
    probe = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    os.close(probe)


def token_path(records: str, identity: Identity) -> str:
    return os.path.join(records, f"{identity[0]}-{identity[1]}")


def record(records: str, identity: Identity, where: str, changed_ns: int) -> None:
    """Make identity's token naming where: a symlink whose target is where, made in one
    system call (never followed: read back with readlink alone), its own time the stub's
    change time as it was made (changed_ns: see made_as). A launch makes one per stub, and
    a file (open, write, close) cost it twice as much."""
    path = token_path(records, identity)
    try:
        os.symlink(where, path)  # a full cache (ENOSPC) fails here
    except FileExistsError:  # the token of an inode number since reused: replaced
        os.unlink(path)
        os.symlink(where, path)
    os.utime(path, ns=(changed_ns, changed_ns), follow_symlinks=False)


def made_as(records: str, identity: Identity) -> int | None:
    """The change time identity's stub had as it was made (its token's own time); None if
    that is not known (a token of earlier code, a file, or none). A stub whose change time is
    another since was written into (the host wrote into it, or emptied what it wrote;
    something was made or removed in a directory): it is no longer only a stub, and no
    launcher removes it (sources._remove_at)."""
    try:
        info = os.lstat(token_path(records, identity))
    except FileNotFoundError:
        return None
    return info.st_mtime_ns if stat.S_ISLNK(info.st_mode) else None


def recorded(records: str, identity: Identity, where: str) -> bool:
    """Does identity's token name where (else there is none, or the inode number was reused
    elsewhere)? A token made by earlier code (until 2026-12-05) is a file holding where."""
    path = token_path(records, identity)
    try:
        return os.readlink(path) == where
    except FileNotFoundError:
        return False
    except OSError as error:
        if error.errno != errno.EINVAL:  # EINVAL: not a symlink
            raise
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags)
    try:
        return os.read(fd, 8192) == os.fsencode(where)
    finally:
        os.close(fd)


def is_stub(path: str) -> bool:
    """Is the file at path a stub a launch of this account made (and still holds, or left)?
    A plan built while another session of the workspace runs treats it as missing, as it
    will be once that session ends."""
    where = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    try:
        # Under the records' lock: a launch makes a stub and its token under it, so a stub is
        # never seen without its token (taken for the session's own, protected file by file,
        # and stubs made inside it, the plan would leave it behind, not empty).
        with records_locked() as records:
            info = os.lstat(path)
            return recorded(records, (info.st_dev, info.st_ino), where)
    except (OSError, SandboxUnavailable):
        return False
