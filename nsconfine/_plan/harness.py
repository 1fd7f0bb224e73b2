"""A harness as the session gets it: one executable file, or the package it belongs to.

npm installs an agent as a package (node_modules/@openai/codex) and puts a symlink to its entry
file in node_modules/.bin; the entry file loads the rest of its package and the packages it
depends on (Codex's native binary is an optional dependency of its own). So a harness path that
is a symlink becomes: the package its target lies in (the nearest directory above it with a
package.json), every installed package it depends on (found as node finds them), each bound
read-only; the symlink recreated as on the host; and, when pinned, the target file itself,
pinned by its digest. A harness that is a plain file is bound as it is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from nsconfine._errors import PlanError
from nsconfine._kernel.syscalls import lookups, read_untrusted, realpath
from nsconfine._plan import model as p
from nsconfine._text import printable, within

# A harness with more packages than this is refused rather than bound package by package
# (give the node_modules directory with --ro instead).
MAX_PACKAGES = 200


def harness_entries(path: str, sha256: str | None, writable: Sequence[str] = ()) -> list[p.Entry]:
    """The entries that give the session the harness at path (pinned by sha256 if given).
    writable: where the session writes (its workspace and run directory). A link whose way to
    its file, or to a package it needs, leads through there is refused: the session would
    choose, between launches, which host directories the next launch binds."""
    if not path or path == "/":
        raise PlanError("a harness path is empty: name the harness executable (--harness PATH)")
    if not os.path.lexists(path):
        raise PlanError(f"the harness {printable(path)} does not exist")
    # Bound at its path, through a linked directory it would land where the link leads (and
    # the mount check would refuse the sandbox): name it by its directory's own path.
    directory, name = os.path.split(os.path.abspath(path))
    real_directory = realpath(directory)
    if real_directory != directory:
        through = printable(os.path.join(real_directory, name))
        raise PlanError(
            f"the harness {printable(path)} lies below a symlink ({printable(directory)} leads "
            f"to {printable(real_directory)}): give {through}"
        )
    try:
        target = realpath(path)
    except OSError:
        raise PlanError(f"the harness {printable(path)} is a symlink to nothing") from None
    if not os.path.isfile(target) or not os.access(target, os.X_OK):
        raise PlanError(f"the harness {printable(path)} is not an executable file")
    pinned = " (pinned by sha256)" if sha256 else ""
    if not os.path.islink(path):
        return [p.ro_bind(path, path, f"harness executable{pinned}", sha256=sha256)]
    _refuse_if_writable(path, lookups("/", os.path.abspath(path))[0], writable)
    entries = [p.symlink(os.readlink(path), path, "the harness's link, as on the host")]
    package = _package_of(target)
    if package is None:
        entries.append(p.ro_bind(target, target, f"the file the harness link leads to{pinned}"))
        return _with_pin(entries, target, sha256, bound=True)
    _refuse_if_writable(path, [package], writable)
    for directory in _with_dependencies(package, path, writable):
        reason = (
            "the harness's package (read-only)"
            if directory == package
            else f"a package the harness's package {os.path.basename(package)} depends on"
        )
        entries.append(p.ro_bind(directory, directory, reason))
    return _with_pin(entries, target, sha256, bound=False)


def _with_pin(
    entries: list[p.Entry], target: str, sha256: str | None, bound: bool
) -> list[p.Entry]:
    if sha256 is None:
        return entries
    if bound:
        entries[-1] = p.ro_bind(target, target, entries[-1].reason, sha256=sha256)
        return entries
    return [*entries, p.ro_bind(target, target, "the harness's entry file, pinned", sha256=sha256)]


def _package_of(path: str) -> str | None:
    """The nearest directory above path holding a package.json (an npm package), or None."""
    directory = os.path.dirname(path)
    while directory != "/":
        if os.path.isfile(os.path.join(directory, "package.json")):
            return directory
        directory = os.path.dirname(directory)
    return None


def _refuse_if_writable(harness: str, looked: Sequence[str], writable: Sequence[str]) -> None:
    for path in looked:
        if any(within(path, place) for place in writable):
            raise PlanError(
                f"the harness {printable(harness)} leads through {printable(path)}, which the "
                "session can write: it could change which packages, and so which host "
                "directories, the next launch binds; install the harness outside the "
                "workspace and run directory"
            )


def _with_dependencies(package: str, harness: str, writable: Sequence[str]) -> list[str]:
    """package and every installed package it needs (dependencies and optionalDependencies,
    transitively), found as node's require finds them: in node_modules next to and above the
    requiring package (each way there checked against writable, see harness_entries)."""
    found = [package]
    pending = [package]
    while pending:
        current = pending.pop()
        for name in _dependency_names(current):
            located = _locate(name, current)
            if located is None:
                continue
            _refuse_if_writable(harness, [located], writable)
            if located not in found:
                found.append(located)
                pending.append(located)
                if len(found) > MAX_PACKAGES:
                    raise PlanError(
                        f"the harness package {printable(package)} needs more than "
                        f"{MAX_PACKAGES} packages: give its node_modules directory with --ro"
                    )
    return found


# A package name as npm allows it: "name" or "@scope/name", neither part starting with a dot
# (so no "..") and no other slash; os.path.join would take an absolute name for the path.
_NPM_NAME = r"(@[^/.\s][^/\s]*/)?[^/.@\s][^/\s]*\Z"


def _dependency_names(package: str) -> list[str]:
    import json  # only npm harnesses need these: not on every launcher's start
    import re

    raw = read_untrusted(os.path.join(package, "package.json"), (1 << 20) + 1)
    if raw is None or len(raw) > 1 << 20:  # a manifest of sane size only
        return []
    try:
        manifest = json.loads(raw)
    except ValueError:
        return []
    names: list[str] = []
    for key in ("dependencies", "optionalDependencies"):
        table = manifest.get(key) if isinstance(manifest, dict) else None
        if isinstance(table, dict):
            names += [name for name in table if isinstance(name, str) and re.match(_NPM_NAME, name)]
    return names


def _locate(name: str, requirer: str) -> str | None:
    """Where node finds package name from requirer: requirer/node_modules/name, then
    node_modules/name in each directory above (never inside a node_modules directory itself)."""
    directory = requirer
    while True:
        if os.path.basename(directory) != "node_modules":
            candidate = os.path.join(directory, "node_modules", name)
            if os.path.isfile(os.path.join(candidate, "package.json")):
                return realpath(candidate)
        if directory == "/":
            return None
        directory = os.path.dirname(directory)
