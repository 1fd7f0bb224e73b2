"""A process's mount table as the kernel shows it (/proc/<pid>/mountinfo), parsed.

nsconfine._launch.confirm compares it with a plan at every launch.
"""

from __future__ import annotations

import os


class Mount:
    """One line of mountinfo, as far as the check needs it."""

    __slots__ = ("device", "flags", "fstype", "mode", "mount_id", "options", "propagation", "root")

    def __init__(
        self,
        mode: str,
        fstype: str,
        options: frozenset[str] = frozenset(),
        device: str = "",
        root: str = "/",
        flags: frozenset[str] = frozenset(),
        mount_id: str = "",
        propagation: tuple[str, ...] = (),
    ) -> None:
        self.mode = mode  # "ro" or "rw"
        self.fstype = fstype
        self.options = options  # the file system's own (super) options: size=…k, max=…
        self.device = device  # "major:minor" of its file system
        self.root = root  # the directory of that file system it shows (a bind's source there)
        self.flags = flags  # the mount's own: ro or rw, nosuid, nodev, noexec, relatime, …
        self.mount_id = mount_id  # the table's id of it (MountTree's)
        # its peer group (shared:N) and the one it takes mounts from (master:N), if any
        self.propagation = propagation


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo.
    if "\\" not in field:  # nearly every field: no need of re
        return field
    import re

    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def _mount(fields: list[str]) -> Mount | None:
    """The mount one line of mountinfo (split at spaces) describes; None for a line cut short."""
    if len(fields) < 7 or "-" not in fields[6:]:
        return None
    dash = fields.index("-", 6)
    flags = frozenset(fields[5].split(","))
    options = frozenset(fields[dash + 3].split(",")) if len(fields) > dash + 3 else frozenset()
    return Mount(
        "ro" if "ro" in flags else "rw",
        fields[dash + 1],
        options,
        device=fields[2],
        root=_unescape(fields[3]),
        flags=flags,
        mount_id=fields[0],
        propagation=tuple(fields[6:dash]),
    )


class MountTree:
    """A mount table as a tree: which mount a path is seen through, and so where the path lies
    in its file system, whatever mount (a bind-mount view among them) it is reached through.

    A path is walked from the root mount, directory by directory, into the mount attached at
    each (the last of those stacked there): a mount listed below a directory that another mount
    was later made over (a bind over a parent) is hidden, and no path reaches it."""

    def __init__(self, text: str) -> None:
        # id -> (mount point, device "major:minor", the mount's root inside its file system)
        self.mounts: dict[str, tuple[str, str, str]] = {}
        self.points: dict[str, Mount] = {}  # point -> its mount, the last listed there
        self.by_id: dict[str, Mount] = {}
        self._attached: dict[tuple[str, str], str] = {}  # (parent id, point) -> id, the last
        parents: dict[str, str] = {}
        for line in text.split("\n"):  # the kernel's only line break (str.splitlines breaks
            # at U+2028, U+0085 and others, which a mount point's name may hold as they are)
            fields = line.split(" ")
            if len(fields) >= 5:
                point = _unescape(fields[4])
                self.mounts[fields[0]] = (point, fields[2], _unescape(fields[3]))
                self._attached[(fields[1], point)] = fields[0]
                parents[fields[0]] = fields[1]
                mount = _mount(fields)
                if mount is not None:
                    self.points[point] = self.by_id[fields[0]] = mount
        # The root: the mount whose parent is not in the table (the namespace's, or above the
        # process's root), and then whatever is stacked on it.
        root = next(
            (
                m
                for m, parent in parents.items()
                if parent not in self.mounts and self.mounts[m][0] == "/"
            ),
            "",
        )
        self._seen: dict[str, str] = {"/": self._on_top(root, "/")} if root else {}
        # Where a mount may be attached: the only places a walk can change mounts at, and so
        # the only ones remembered (every parent of a deep path would take the square of its
        # length).
        self._points = {point for _parent, point in self._attached}

    def _on_top(self, mount: str, point: str) -> str:
        """The mount seen at point, mount the one found there first: the last stacked on it."""
        seen: set[str] = set()  # (a table naming a loop of parents is read no further)
        while (mount, point) in self._attached and mount not in seen:
            seen.add(mount)
            mount = self._attached[(mount, point)]
        return mount

    def seen_at(self, path: str) -> tuple[str, str, str] | None:
        """(mount point, device, root) of the mount an absolute, normalized path lies on; None
        for a table without a root mount."""
        mount = self.mount_seen_at(path)
        return None if mount is None else self.mounts[mount]

    def mounted_at(self, point: str) -> Mount | None:
        """The mount a path reaches at point, if one is mounted there (the topmost, even where
        it was listed first: one moved there with `mount --move`)."""
        mount = self.mount_seen_at(point)
        if mount is None or self.mounts[mount][0] != point:
            return None
        return self.by_id.get(mount)

    def mount_seen_at(self, path: str) -> str | None:
        """The id of the mount an absolute, normalized path lies on; None for a table without
        a root mount."""
        if "/" not in self._seen:
            return None
        walked = []  # (a loop: a path may have thousands of components)
        while path not in self._seen:
            walked.append(path)
            path = path[: path.rfind("/")] or "/"
        mount = self._seen[path]
        for below in reversed(walked):
            if below in self._points:
                mount = self._seen[below] = self._on_top(mount, below)
        return mount


def watched_mountinfo(pid: int | str) -> tuple[int, str]:
    """A process's mount table, and the open fd it was read from, which poll() marks POLLPRI
    once that mount namespace's table changes (a mount made, or one unmounted or detached)."""
    fd = os.open(f"/proc/{pid}/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except BaseException:
        os.close(fd)
        raise
    return fd, os.fsdecode(b"".join(chunks))


def read_mountinfo(pid: int | str) -> str:
    """A process's mount table, its bytes as paths are (a mount point need not be UTF-8)."""
    fd, text = watched_mountinfo(pid)
    os.close(fd)
    return text
