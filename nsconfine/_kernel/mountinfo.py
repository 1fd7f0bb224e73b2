"""A process's mount table as the kernel shows it (/proc/<pid>/mountinfo), parsed.

nsconfine._launch.confirm compares it with a plan at every launch.
"""

from __future__ import annotations

import os


class Mount:
    """One line of mountinfo, as far as the check needs it."""

    __slots__ = ("fstype", "mode", "options")

    def __init__(self, mode: str, fstype: str, options: frozenset[str] = frozenset()) -> None:
        self.mode = mode  # "ro" or "rw"
        self.fstype = fstype
        self.options = options  # the file system's own (super) options: size=…k, max=…


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo.
    if "\\" not in field:  # nearly every field: no need of re
        return field
    import re

    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def parse_mountinfo(text: str) -> dict[str, Mount]:
    """Mount point -> its mount, the topmost at each point winning."""
    points: dict[str, Mount] = {}
    for line in text.split("\n"):  # the kernel's only line break (str.splitlines breaks at
        # U+2028, U+0085 and others, which a mount point's name may hold as they are)
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
    for line in text.split("\n"):  # as parse_mountinfo
        fields = line.split(" ")
        if len(fields) >= 5:
            roots[_unescape(fields[4])] = (fields[2], _unescape(fields[3]))
    return roots


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
