"""The account a session runs as, and what that account can reach on the host.

A launcher that is not root runs its sessions as itself. A root launcher must name another,
unprivileged account (--user, Session(user=...)): no session ever holds host uid 0. That
account, not root, then runs bwrap: it must be able to reach bwrap, every path the plan binds,
and write its workspace and run directory, which the plan checks up front, naming what fails.
The account keeps no supplementary group, so only its uid and primary gid count here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from nsconfine._errors import PlanError, UsageError
from nsconfine._record import Record
from nsconfine._text import ancestors, is_decimal, printable, within

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

READ, WRITE, SEARCH = 0o4, 0o2, 0o1
# The highest uid or gid an account can hold: (uid_t)-1 means "no change" to setresuid.
MAX_ID = 2**32 - 2


class RunAs(Record):
    """The account a session runs as, on the host and inside: its name, uid and primary gid
    (it keeps no supplementary group)."""

    FIELDS = ("name", "uid", "gid")
    __slots__ = FIELDS
    name: str
    uid: int
    gid: int

    def __init__(self, name: str, uid: int, gid: int) -> None:
        # Checked here, not at launch: a negative id raised OverflowError from deep in it, and
        # True (an int) ran the session as uid 1.
        if not isinstance(name, str):
            raise UsageError(f"a RunAs's name is a str (the account's name), not {name!r}")
        for field, value in (("uid", uid), ("gid", gid)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
                raise UsageError(
                    f"a RunAs's {field} is a whole number from 0 to {MAX_ID}, not {value!r}: "
                    "give the account's own (pwd.getpwnam(NAME).pw_uid, .pw_gid)"
                )
        self._set(name=name, uid=uid, gid=gid)

    def __str__(self) -> str:
        return f"{self.name} (uid {self.uid}, gid {self.gid})"

    def to_json(self) -> dict[str, Any]:
        """The manifest form."""
        return {"name": self.name, "uid": self.uid, "gid": self.gid}


def launcher_account() -> RunAs:
    """The account the launcher itself runs as (a plan's default; refused at launch if root)."""
    import pwd

    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:  # an account without a passwd entry (containers)
        name = str(uid)
    return RunAs(name, uid, os.getegid())


def kept_groups(user: RunAs) -> list[int]:
    """The launcher's supplementary groups a session as user keeps: an unprivileged launcher's
    (its user namespace denies setgroups, so bwrap cannot drop them, and the kernel still
    grants what they may on the host's files the session is given); none for a root
    launcher's, which drops them all (setgroups(0))."""
    if os.geteuid() == 0 or user.uid != os.geteuid():
        return []
    return sorted(set(os.getgroups()) - {user.gid})


def run_as(user: str | int | None) -> RunAs:
    """The account a session runs as: the launcher's own, or (for a root launcher) the named
    one, by name or uid (a name of digits only is a uid, as useradd allows no such name).
    Refused: an unknown account, uid 0 or (for a root launcher) gid 0, and another account
    without root."""
    import pwd

    if user is None:
        return launcher_account()
    if isinstance(user, str) and is_decimal(user):
        if len(user) > 10:  # past any uid (and, past 4,300 digits, what int() reads)
            raise UsageError(f"--user {user[:20]}…: there is no such account")
        user = int(user)
    try:
        entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
    except (KeyError, OverflowError):
        raise UsageError(f"--user {user}: there is no such account") from None
    if entry.pw_uid == 0:
        raise UsageError(
            f"--user {user}: a session never runs as uid 0; name an unprivileged account"
        )
    if os.geteuid() != 0 and entry.pw_uid != os.geteuid():
        raise UsageError(
            f"--user {user}: only a launcher running as root can run a session as another "
            f"account (this one is uid {os.geteuid()}); drop --user"
        )
    gid = entry.pw_gid if os.geteuid() == 0 else os.getegid()
    if gid == 0 and os.geteuid() == 0:
        raise UsageError(
            f"--user {user}: its group is gid 0, root's: its sessions would write what root's "
            "group may; name an account of an unprivileged group"
        )
    return RunAs(entry.pw_name, entry.pw_uid, gid)


def allows(info: os.stat_result, user: RunAs, bits: int) -> bool:
    """Do the mode bits of what info describes let user use it with bits (ACLs not read)?"""
    if info.st_uid == user.uid:
        shift = 6
    elif info.st_gid == user.gid:
        shift = 3
    else:
        shift = 0
    return info.st_mode & (bits << shift) == bits << shift


def access_problem(path: str, user: RunAs, bits: int) -> str | None:
    """Why user could not reach path and use it with bits (READ, WRITE, SEARCH), or None.
    Judged by the mode bits (ACLs are not read); the launcher's own account is never asked."""
    if user.uid == os.geteuid():
        return None
    try:
        info = os.stat(path)
        if not allows(info, user, bits):
            words = _words(bits, directory=stat.S_ISDIR(info.st_mode))
            return f"{user.name} (uid {user.uid}) has no {words} permission on {path}"
        parent = os.path.dirname(os.path.abspath(path))
        while True:
            if not allows(os.stat(parent), user, SEARCH):
                return f"{user.name} (uid {user.uid}) cannot search {parent}"
            if parent == "/":
                return None
            parent = os.path.dirname(parent)
    except OSError as error:
        return f"{path}: {error.strerror}"


def untrusted_reason(path: str, *, own_account_trusted: bool = True) -> str | None:
    """Why someone other than root (or, for an unprivileged launcher, the launcher itself,
    unless not own_account_trusted) could replace the file at path, or None. Each way it is
    reached by is judged: the path given, each symlink met on the way (and on the way of its
    target), and the real path. On each, the file and every directory above it must be owned
    by them, and writable by no other group than theirs (nor through an ACL), nor by all; a
    sticky directory writable by all (/tmp) is fine when what lies in it is theirs. A
    symlink's own mode says nothing (the directory holding it decides who may change it);
    where it leads is judged as a way."""
    from nsconfine._kernel.syscalls import lookups

    # Every name the kernel looks up on the way (a directory left by `..` too: whoever may
    # change it may make it a symlink that `..` then leaves elsewhere), and where it ends.
    looked, real = lookups("/", os.path.abspath(path))
    trusted_owners = {0, os.geteuid()} if own_account_trusted else {0}
    # root's group; a user's own (a umask of 002), when no other account is in it
    egid = os.getegid()
    own_group = own_account_trusted and egid != 0 and _private_group(egid)
    trusted_groups = {0} | ({egid} if own_group else set())
    accepted: set[str] = set()  # directories judged, with all above them, within this call
    for way in dict.fromkeys([path, *looked, real]):
        reason = _replaceable_at(way, trusted_owners, trusted_groups, accepted)
        if reason is not None:
            return reason
    return None


def _replaceable_at(
    path: str, trusted_owners: set[int], trusted_groups: set[int], accepted: set[str]
) -> str | None:
    """Why someone not among trusted_owners (nor, by write bits, trusted_groups) could change
    the file at path itself, or a directory above it (walked as written, each symlink judged
    as a file), or None. accepted: directories found trusted (with all above them) by an
    earlier walk of the same call; a walk that reaches one stops there, and adds those it
    judged."""
    current = path
    below_owner: int | None = None
    walked = []
    while True:
        if current in accepted:  # (reached from a trusted entry: a sticky one holds too)
            break
        try:
            info = os.lstat(current)
        except OSError as error:
            return f"{current}: {error.strerror}"
        writable_by_others = not stat.S_ISLNK(info.st_mode) and (
            info.st_mode & 0o002
            or (info.st_mode & 0o020 and (info.st_gid not in trusted_groups or has_acl(current)))
        )
        sticky_and_below_is_ours = (
            stat.S_ISDIR(info.st_mode)
            and info.st_mode & stat.S_ISVTX
            and below_owner in trusted_owners
        )
        if info.st_uid not in trusted_owners:
            return f"{current} belongs to uid {info.st_uid}"
        if writable_by_others and not sticky_and_below_is_ours:
            return f"{current} is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
        walked.append(current)
        if current == "/":
            break
        below_owner = info.st_uid
        current = os.path.dirname(current)
    accepted.update(walked[1:])  # the directories above path (path itself may be no directory)
    return None


def _private_group(gid: int) -> bool:
    """Is gid the launcher's own group, which no other account is in (a user private group;
    a shared one, as nogroup or users, lets its other members write what it may)? Asked
    again only when the account databases change (a launch asks three times)."""
    databases = []
    for database in ("/etc/passwd", "/etc/group"):
        with contextlib.suppress(OSError):
            databases.append(os.stat(database).st_mtime_ns)
    key = (gid, tuple(databases))
    if key not in _private_groups:
        _private_groups.clear()
        _private_groups[key] = _no_other_member(gid)
    return _private_groups[key]


_private_groups: dict[tuple[int, tuple[int, ...]], bool] = {}


def _no_other_member(gid: int) -> bool:
    import grp
    import pwd

    me = launcher_account().name
    try:
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return False
    others = {entry.pw_name for entry in pwd.getpwall() if entry.pw_gid == gid}
    return (members | others) <= {me}


def has_acl_at(fd: int) -> bool:
    """Has the file open at fd (an O_PATH fd too) an access ACL?"""
    try:
        os.getxattr(f"/proc/self/fd/{fd}", "system.posix_acl_access")
    except OSError:
        return False
    return True


def has_acl(path: str) -> bool:
    """Has path an access ACL (whose named users and groups its group bits, the mask, let
    write: the bits alone do not say who)?"""
    try:
        os.getxattr(path, "system.posix_acl_access", follow_symlinks=False)
    except OSError:  # none (ENODATA), or none can be had here (a symlink, a file system without)
        return False
    return True


def _words(bits: int, directory: bool) -> str:
    """bits as permissions are named: the bit that searches a directory executes a file."""
    execute = "search" if directory else "execute"
    return "+".join(
        word for bit, word in ((READ, "read"), (WRITE, "write"), (SEARCH, execute)) if bits & bit
    )


def _in_this_pid_namespace(prefix: str) -> str:
    """prefix, then this process's pid namespace: another's pids say nothing here (a container
    sharing /tmp). A scratch directory is named PREFIX<namespace>-<pid>-…"""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{prefix}{namespace}-"


def _remove_left_by_the_dead(base: str, prefix: str) -> None:
    """Remove each scratch directory of prefix in base that this account made in this pid
    namespace and whose launcher is gone (a reused pid keeps one until the next look)."""
    import shutil

    ours = _in_this_pid_namespace(prefix)
    try:
        names = [name for name in os.listdir(base) if name.startswith(ours)]
    except OSError:
        return
    for name in names:
        pid = name[len(ours) :].partition("-")[0]
        path = os.path.join(base, name)
        try:
            if not is_decimal(pid) or os.lstat(path).st_uid != os.geteuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)  # (fd-based: no link in it followed)
        except (OSError, OverflowError):
            continue  # gone already, or its launcher lives (EPERM: another account's pid)


def scratch_directory(prefix: str) -> str:
    """A fresh private directory (mode 0700) in the first of /tmp, /var/tmp and /dev/shm where
    no other account can rename it or what it holds (root's or this account's, and sticky or
    writable by its owner alone), whatever TMPDIR says: a launcher's TMPDIR may be a directory
    another account writes, which could swap the fresh directory for a symlink to one of its
    own while the launcher works in it by path. Its name holds the launcher's pid namespace and
    pid: one a launcher killed there left (SIGKILL, as it proved bwrap) is removed by the next
    of its kind in that namespace. OSError if there is none."""
    import tempfile

    for base in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            info = os.stat(base)
        except OSError:
            continue
        # (this account's own /tmp: in a user namespace that maps root to it)
        if not stat.S_ISDIR(info.st_mode) or others_may_replace_in(info):
            continue
        _remove_left_by_the_dead(base, prefix)
        try:
            return tempfile.mkdtemp(
                prefix=f"{_in_this_pid_namespace(prefix)}{os.getpid()}-", dir=base
            )
        except OSError:
            continue
    raise OSError(
        errno.ENOENT,
        "no temporary directory owned by root or this account and sticky (or writable by its "
        "owner alone) among /tmp, /var/tmp and /dev/shm",
        "/tmp",
    )


def password_home(uid: int) -> str | None:
    """uid's home in the password database; None for an account it does not name (containers).
    (os.path.expanduser("~") takes an empty $HOME as it is.)"""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None


def records_directory(name: str, environ: Mapping[str, str] | None = None) -> str:
    """Where nsconfine keeps its records of kind name for this account, by environ (default
    the launcher's): $XDG_CACHE_HOME/nsconfine/name, else $HOME/.cache/nsconfine/name (in every
    deny set, as the fallback is). A relative XDG_CACHE_HOME or HOME is ignored, as the XDG
    spec says: it would name a place under the launcher's working directory, which may be a
    session's workspace."""
    environ = os.environ if environ is None else environ
    cache = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):
        home = environ.get("HOME", "")
        if not os.path.isabs(home):
            home = password_home(os.geteuid()) or f"/tmp/nsconfine-{os.geteuid()}"
        cache = os.path.join(home, ".cache")
    return os.path.join(cache, "nsconfine", name)


def refuse_records_in(writable: Iterable[str]) -> None:
    """PlanError if this account's records (records_directory's, by the launcher's
    environment) lie in one of writable, the real paths of a session's writable binds: the
    launch would make them there first (the lint refuses such a plan too, but only once they
    were made), for the session to rewrite what the launcher's later launches trust."""
    from nsconfine._kernel.syscalls import realpath

    records = os.path.dirname(records_directory("mountpoints"))
    try:
        real = realpath(records)
    except OSError:  # not made yet
        real = os.path.realpath(records)
    for top in writable:
        if within(real, top):
            raise PlanError(
                f"this launcher keeps its records (proven bwrap binaries, the mount points it "
                f"made) in {printable(records)}, inside {printable(top)}, which the session "
                "writes: it could rewrite what the launcher trusts; set XDG_CACHE_HOME (or "
                "HOME) to a directory outside the session's workspace and run directory. "
                "Nothing was made or run"
            )


class Replaceable(PermissionError):
    """A directory on the way to nsconfine's records that another account could replace (it
    owns or can write the directory above): its filename names it."""


def require_private(directory: str) -> None:
    """PermissionError unless directory, and the one above it, are directories of this
    account that no one else can write: a directory another account (a session) could write
    may hold symlinks it planted for the launcher to write through. Nor may anyone else be
    able to replace either of them (Replaceable, see _require_unreplaceable)."""
    for path in (directory, os.path.dirname(directory)):
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise PermissionError(
                errno.EPERM, "not a directory of this account that only it can write", path
            )
    _require_unreplaceable(os.path.dirname(os.path.dirname(os.path.abspath(directory))))


def _require_unreplaceable(start: str) -> None:
    """Replaceable unless start and every directory above it are root's or this account's,
    writable by no one else (but a sticky one, /tmp, where what lies in it is ours): their
    owner could swap what lies below for its own once it was checked."""
    # Both ways the kernel walks: the path as written, and where its symlinks lead. A
    # symlink's own mode is always 0777 and says nothing: only who may write the directory
    # holding it can swap it, and that directory is checked in its turn.
    for begin in (start, os.path.realpath(start)):
        for current in ancestors(begin):
            if others_may_replace_in(os.lstat(current)):
                raise Replaceable(
                    errno.EPERM,
                    "could be replaced by another account (who owns or can write the "
                    "directory above)",
                    current,
                )


def others_may_replace_in(info: os.stat_result) -> bool:
    """Could another account replace what lies in the directory info describes: is it neither
    root's nor this account's, or writable by others and not sticky (/tmp is, and what lies in
    it is its owner's)? A symlink's own mode is always 0777 and says nothing of who can write."""
    writable = info.st_mode & 0o022 and not stat.S_ISLNK(info.st_mode)
    return info.st_uid not in (0, os.geteuid()) or bool(
        writable and not info.st_mode & stat.S_ISVTX
    )


def refuse_planted_link(
    source: str,
    path: str,
    link: os.stat_result,
    holder: os.stat_result,
    user: RunAs,
    real: str | None = None,
) -> None:
    """PlanError unless no session of user could have made the symlink at path (link, in the
    directory holder) on the way to the writable bind source: unless it and its directory are
    root's (or, for sessions of another account, the launcher's) and no one else can write
    that directory (or it is sticky, /tmp). A session that plants `next -> …/checkout` in its
    workspace, where the broker puts the next workspace at next/proj, would lead that one into
    the checkout. The lint judges the path, the launch each symlink its fds walk through;
    real, where known, is the source's real path, for the refusal to name."""
    trusted = (0,) if user.uid == os.geteuid() else (0, os.geteuid())
    if link.st_uid in trusted and holder.st_uid in trusted and not others_may_replace_in(holder):
        return
    try:
        target = os.readlink(path)
    except OSError as error:
        target = f"unreadable: {error.strerror}"
    raise PlanError(
        f"{printable(source)} is reached through the symlink {printable(path)} (to "
        f"{printable(target)}), which a session may have planted where the next workspace "
        "goes: a workspace or writable bind is given by its real path"
        f"{'' if real is None else ', ' + printable(real)}; nothing was run"
    )


def make_own_directory(path: str, mode: int, others_may_not: int) -> bool:
    """Make the directory path with mode unless something is there already; is it now a
    directory of this account's (never a symlink) with none of the bits others_may_not set?
    For names in a directory every account writes (/tmp), which another may have taken first,
    a symlink among them, to lead what is made below it elsewhere."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    info = os.lstat(path)
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & others_may_not
    )


def make_private_directory(path: str) -> None:
    """Make path and the directory holding it, where missing, 0700 whatever the umask (777
    would leave them unusable): records directories are refused if another account, or the
    group, could write them or the directory above (a umask of 002 would). Above them
    only the cache directory itself is made ($XDG_CACHE_HOME, $HOME/.cache): never a home that
    is not there (a system account's /nonexistent, which root would make its own, and which
    then stops being denied as that account's home). FileNotFoundError then; Replaceable,
    with nothing made, if another account could replace a directory on the way."""
    holder = os.path.dirname(path)
    cache = os.path.dirname(holder)
    above_cache = os.path.dirname(cache)
    if not os.path.isdir(above_cache):
        raise FileNotFoundError(errno.ENOENT, "no such directory (not made)", above_cache)
    # Nothing is made where another account could have planted a symlink for it to be made
    # through (a root launcher given a HOME in that account's home): checked before, not only
    # after (require_private), when it would already have been made.
    _require_unreplaceable(cache if os.path.isdir(cache) else above_cache)
    for directory in (cache, holder, path):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue
        os.chmod(directory, 0o700)  # (mkdir's mode passes the umask: 777 would leave 000)
