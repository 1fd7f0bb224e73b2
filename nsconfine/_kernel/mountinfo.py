"""The whole-truth check: does a sandbox's mount table hold exactly the plan's mounts?

Run on every launch, before the command may exec, against /proc/<pid>/mountinfo of the process
that will become the command. Every mount point must be one the plan sets up (or lie below a
new /proc or /dev, whose inner mounts bwrap makes itself, or be a mount the host has below a
bound directory, which a recursive bind carries in); every mount the plan sets up must be there;
each must be read-only or writable as the plan says; and each must be what the plan says: a new
tmpfs or proc (a tmpfs of the size the plan gives it), the session's own devpts (holding the
ptys the plan allows, and not the host's: a devpts bound in from the launcher's namespace would
show the host's terminals), or, for a bind, the very file or directory of its source: the
launcher looks at the destination through the sandbox's own root (/proc/<pid>/root) and
compares device and inode with the source's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from nsconfine._kernel import syscalls as _syscalls
from nsconfine._plan.model import Entry, Kind, Plan, inside

_ESCAPE = re.compile(r"\\([0-7]{3})")


class Mount:
    """One line of mountinfo, as far as the check needs it."""

    __slots__ = ("fstype", "mode", "options")

    def __init__(self, mode: str, fstype: str, options: frozenset[str] = frozenset()) -> None:
        self.mode = mode  # "ro" or "rw"
        self.fstype = fstype
        self.options = options  # the file system's own (super) options: size=…k, max=…


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo.
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def parse_mountinfo(text: str) -> dict[str, Mount]:
    """Mount point -> its mount, the topmost at each point winning."""
    points: dict[str, Mount] = {}
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        fstype = fields[dash + 1]
        mode = "ro" if "ro" in fields[5].split(",") else "rw"
        options = frozenset(fields[dash + 3].split(",")) if len(fields) > dash + 3 else frozenset()
        points[_unescape(fields[4])] = Mount(mode, fstype, options)
    return points


def mount_roots(text: str) -> dict[str, tuple[str, str]]:
    """Mount point -> (device "major:minor", the mount's root inside its file system), the
    topmost at each point winning: where a path lies in its file system, whatever mount (a
    bind-mount view among them) it is reached through."""
    roots: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) >= 5:
            roots[_unescape(fields[4])] = (fields[2], _unescape(fields[3]))
    return roots


def _capacity_option(entry: Entry) -> str | None:
    """The super option that shows entry's capacity: a tmpfs's size (in KiB, whole pages, as
    the kernel rounds it), a devpts's max."""
    if entry.capacity is None:
        return None
    if entry.kind is Kind.DEVPTS:
        return f"max={entry.capacity}"
    page = os.sysconf("SC_PAGE_SIZE")
    return f"size={-(-entry.capacity // page) * page // 1024}k"


def _expected(plan: Plan) -> dict[str, tuple[str, str, str | None]]:
    """Mount point -> (mode, what, option): what is a file system type, or "bind" for a bind;
    option a super option it must show (its size, or its ptys), if any."""
    expected: dict[str, tuple[str, str, str | None]] = {"/": ("rw", "tmpfs", None)}
    for entry in plan.entries:
        if entry.kind is Kind.BIND:
            expected[entry.dest] = (str(entry.mode), "bind", None)
        elif entry.kind in (Kind.TMPFS, Kind.DEV, Kind.DATA):  # a data file sits on a tmpfs
            mode = "ro" if entry.kind is Kind.DATA else "rw"
            expected[entry.dest] = (mode, "tmpfs", _capacity_option(entry))
        elif entry.kind is Kind.DEVPTS:
            expected[entry.dest] = ("rw", "devpts", _capacity_option(entry))
        elif entry.kind is Kind.PROC:
            expected[entry.dest] = ("rw", "proc", None)
        elif entry.kind is Kind.REMOUNT_RO:
            _, what, option = expected.get(entry.dest, ("ro", "?", None))
            expected[entry.dest] = ("ro", what, option)
    return expected


def mount_table_problems(
    mountinfo: str,
    plan: Plan,
    root: str | None = None,
    sources: Mapping[str, tuple[int, int] | None] | None = None,
    host_mountinfo: str | None = None,
) -> list[str]:
    """What in the sandbox's mountinfo differs from the plan (empty when they agree).

    root is the sandbox's root as the launcher reaches it (/proc/<pid>/root): each bind's
    destination is looked at through it and compared with sources (dest -> the (device, inode)
    of the source the launcher opened; each bind's source as it is now if None). root None (a
    session reading its own table) skips that part.
    host_mountinfo is the launcher's own table, consulted only for mounts below a bound
    directory; None reads /proc/self/mountinfo when one is found."""
    expected = _expected(plan)
    observed = parse_mountinfo(mountinfo)
    made_by_bwrap = [e.dest for e in plan.entries if e.kind in (Kind.PROC, Kind.DEV)]
    binds = {e.dest: e.source for e in plan.entries if e.kind is Kind.BIND}
    problems = []
    host_points: set[str] | None = None
    for point, mount in observed.items():
        want = expected.get(point)
        if want is not None:
            mode, what, option = want
            if mount.mode != mode:
                problems.append(f"{point} is mounted {mount.mode}, the plan says {mode}")
            if what != "bind" and mount.fstype != what:
                problems.append(f"{point} is a {mount.fstype} mount, the plan's is a {what}")
            elif option is not None and option not in mount.options:
                problems.append(f"{point} is not mounted with {option}, as the plan says")
            continue
        if any(point.startswith(tree + "/") for tree in made_by_bwrap):
            continue
        carried = _host_path_below_bind(point, binds)
        if carried is not None:
            if host_points is None:
                host_points = set(parse_mountinfo(host_mountinfo or read_mountinfo("self")))
            if carried in host_points:
                continue
        problems.append(f"{point} is mounted, and no plan entry accounts for it")
    problems += [
        f"{point} is not mounted, though the plan sets it up"
        for point in expected
        if point not in observed
    ]
    if root is not None:
        if sources is None:
            sources = {
                e.dest: _syscalls.identity(e.source) for e in plan.entries if e.kind is Kind.BIND
            }
        for dest, source in sources.items():
            seen = _syscalls.identity(root + dest)
            if seen is None or seen != source:
                problems.append(f"{dest} does not show {binds[dest]}")
        host_ptys = _syscalls.identity("/dev/pts")
        for entry in plan.entries:
            if entry.kind is Kind.DEVPTS:
                seen = _syscalls.identity(root + entry.dest)
                if seen is None or (host_ptys is not None and seen[0] == host_ptys[0]):
                    problems.append(f"{entry.dest} is not the session's own devpts")
    return problems


def _host_path_below_bind(point: str, binds: dict[str, str]) -> str | None:
    """The host path that point shows, if it lies below a bound directory."""
    best = ""
    for dest in binds:
        if inside(point, dest) is not None and len(dest) > len(best):
            best = dest
    if not best:
        return None
    return binds[best].rstrip("/") + point[len(best.rstrip("/")) :]


def read_mountinfo(pid: int | str) -> str:
    """A process's mount table, its bytes as paths are (a mount point need not be UTF-8)."""
    with open(f"/proc/{pid}/mountinfo", "rb") as file:
        return os.fsdecode(file.read())
