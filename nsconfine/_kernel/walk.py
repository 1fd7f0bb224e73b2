"""Walks over host trees a session may have shaped: iterative, never following a symlink.

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
