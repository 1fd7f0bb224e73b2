"""Walks over host trees a session may have shaped: iterative, never following a symlink; and
the walk of one path name by name, each symlink on its way followed as the kernel follows it.

Python 3.11's os.walk recurses once per directory level: a workspace holding 1,100 nested
directories (in a protected .vscode, say) raised RecursionError in every later launch. This walk
keeps its own stack, and says when a directory cannot be listed rather than skipping it
silently (a directory the launcher cannot read is one it cannot check).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

MAX_SYMLINKS = 40  # the kernel's limit on the symlinks one lookup follows (ELOOP past it)


def walk(
    top: str, on_error: Callable[[OSError], None] | None = None
) -> Iterator[tuple[str, list[str], list[str]]]:
    """(directory, subdirectory names, other names) for top and each directory below it, top
    down, as os.walk gives them (a symlink is listed, never followed; it counts as a
    directory's name when it leads to one, as there). A directory that cannot be listed
    raises its OSError, or is passed to on_error and left out."""
    pending = [top]
    while pending:
        directory = pending.pop()
        directories: list[str] = []
        others: list[str] = []
        below: list[str] = []
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        is_directory = entry.is_dir()
                        is_link = entry.is_symlink()
                    except OSError:
                        is_directory = is_link = False
                    (directories if is_directory else others).append(entry.name)
                    if is_directory and not is_link:
                        below.append(entry.path)
        except OSError as error:
            if on_error is None:
                raise
            on_error(error)
            continue
        yield directory, directories, others
        pending += reversed(below)


def walk_path(
    target: str,
    look: Callable[[str], str | bool | None],
    past_the_bound: bool,
    directory: str = "/",
) -> tuple[bool | None, str, list[str]]:
    """Walk target from directory (a path with no symlink in it) one name at a time, as the
    kernel resolves it: `..` from where the walk is, and each symlink met followed from where
    it lies. look(path) is asked about each path the walk reaches: a symlink's target (walked
    in its place), None (walked into, to the next name) or a bool (the walk stops there, with
    that answer). Past MAX_SYMLINKS links followed it stops with past_the_bound.

    Returns (the answer, or None if the walk reached its end; the path it stopped at, or the
    one it resolved to; the names it had yet to walk)."""
    pending = target.split("/")[::-1]  # the names still to walk, the next one last
    resolved = "/" if target.startswith("/") else directory
    followed = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            resolved = os.path.dirname(resolved)
            continue
        here = os.path.join(resolved, name)
        found = look(here)
        if found is None:
            resolved = here
            continue
        if isinstance(found, bool):
            return found, here, pending[::-1]
        followed += 1
        if followed > MAX_SYMLINKS:
            return past_the_bound, here, pending[::-1]
        resolved = "/" if found.startswith("/") else resolved
        pending += found.split("/")[::-1]
    return None, resolved, []
