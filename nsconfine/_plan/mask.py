"""Masks: a path a session's binds would show (a workspace's .env with secrets), covered in the
session by an empty read-only file or directory at every place a bind shows it.

`--mask PATH` (a profile's `mask`, `Session(mask=...)`) keeps the rest of the bind: `--deny`
on a file inside the workspace refuses the whole workspace. The masked path is a deny rule
(DenyRule.mask) that every bind must keep, except that a bind holding it passes where the plan
covers it at the very place that bind shows it (nsconfine._policy.lint checks both). Here, the
covers:

- an existing directory: a tmpfs remounted read-only (empty, and nothing can be made in it);
- anything else, or a path that is missing: an empty generated file (a missing one's mount
  point is made at launch, inside the writable bind, and removed after the session, as a
  missing protected file's: the session cannot create it, and what the host writes there
  meanwhile stays unseen);
- a missing path inside a read-only bind has no place for one and is refused (the host could
  make it during the session, and the session would see it); a path no bind shows needs none.

The masked path itself must not be a symlink (mask what it points to), nor a file with another
name (a hardlink, which would show its content), nor a directory holding one. The host's file is
never changed: a mount covers it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence

from nsconfine._errors import PlanError
from nsconfine._kernel.syscalls import realpath
from nsconfine._plan import model as p
from nsconfine._plan.model import DenyRule, Entry, Kind
from nsconfine._text import inside, printable

# A masked directory is looked through this far for a file with another name; past it, refused.
MASKED_DIRECTORY_SCAN = 10_000

MASK_REASON = (
    "masked (--mask): an empty, read-only {what} in place of the host's, which the session "
    "never sees (the host's is untouched)"
)


def mask_rules(paths: Iterable[str], origin: str = "--mask") -> list[DenyRule]:
    """The deny rules of masked paths: shown by no bind but where the plan covers them."""
    return [
        DenyRule(path, "masked: shown empty where a bind holds it", origin=origin, mask=True)
        for path in paths
    ]


def masked_path(path: str) -> str:
    """path as the host has it: its directory with every symlink resolved. PlanError if path
    is itself a symlink (a cover over the link would leave what it points to)."""
    if os.path.islink(path):
        raise PlanError(
            f"the masked path {printable(path)} is a symlink (to "
            f"{printable(os.readlink(path))}): mask the file it points to"
        )
    parent, name = os.path.split(path)
    try:
        parent = realpath(parent)
    except OSError:
        pass  # missing: nothing of it can be shown
    return os.path.join(parent, name)


def refuse_other_names(path: str) -> os.stat_result | None:
    """What path is (None: missing); PlanError if it, or a file in it, has another name."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    linked = path if stat.S_ISREG(info.st_mode) and info.st_nlink > 1 else None
    if stat.S_ISDIR(info.st_mode):
        linked = _linked_inside(path)
    if linked is not None:
        raise PlanError(
            f"the masked {printable(linked)} has another name (a hardlink, {info.st_nlink} "
            "names in all, or more than a masked directory can be looked through for them): "
            "that name would show its content; remove the other name"
        )
    return info


def _linked_inside(directory: str) -> str | None:
    """A file in directory with more than one name, or directory itself when it is too large
    to look through; None if it holds none."""
    seen = 0
    for root, dirs, files in os.walk(directory):
        seen += len(dirs) + len(files)
        if seen > MASKED_DIRECTORY_SCAN:
            return directory
        for name in files:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                return os.path.join(root, name)
    return None


def mask_entries(paths: Sequence[str], entries: Sequence[Entry]) -> list[Entry]:
    """The covers of each masked path, at every place one of entries' binds shows it."""
    if not paths:
        return []
    binds = [
        (entry, realpath(entry.source))
        for entry in entries
        if entry.kind is Kind.BIND and os.path.lexists(entry.source)
    ]
    made: list[Entry] = []
    for given in paths:
        path = masked_path(given)
        info = refuse_other_names(path)
        for entry, source in binds:
            below = inside(path, source)
            if below is None:
                continue
            dest = os.path.join(entry.dest, below)
            if any(cover.dest == dest for cover in made):
                continue
            if info is None and entry.mode is p.Mode.RO:
                raise PlanError(
                    f"the masked path {printable(given)} does not exist, and it lies in the "
                    f"read-only bind of {printable(entry.source)}, where no empty file can be "
                    "put in its place: were it made during the session, the session would see "
                    "it; create it first, or drop the mask"
                )
            if info is not None and stat.S_ISDIR(info.st_mode):
                reason = MASK_REASON.format(what="directory")
                made += [p.tmpfs(dest, reason), p.remount_ro(dest, reason)]
            else:
                made.append(p.data(b"", dest, MASK_REASON.format(what="file")))
    return made


def is_cover(entry: Entry, remounted: set[str]) -> bool:
    """Is entry one that masks what lies below it: an empty generated file, or a tmpfs
    remounted read-only (remounted: the destinations the plan remounts read-only)?"""
    if entry.kind is Kind.DATA:
        return entry.content == b""
    return entry.kind is Kind.TMPFS and entry.dest in remounted
