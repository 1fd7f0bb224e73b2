"""Where the launcher's own next start loads code from, none of which a session may write.

A .pth file or a module a session wrote into the launcher's environment, or into a directory
its imports search, runs at the launcher's next start, outside the sandbox, with the
launcher's trust (a root one's): nsconfine installed editable into a venv in the workspace, a
broker script kept there, a library in an LD_LIBRARY_PATH directory there. The gate refuses a
plan whose writable binds hold any of these places, judged by every path looked up on the way
to each (a link there could be re-pointed), and a place that is not there yet counts (the
session could make it).
"""

from __future__ import annotations

import os
import sys

from nsconfine._errors import SandboxUnavailable
from nsconfine._kernel.syscalls import lookups

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from collections.abc import Sequence

# The places found for each state of the launcher (its sys.path, the modules it has, its
# working directory and loader variables), with the paths looked up to resolve each: the same
# for every launch of a process that leaves them alone (the modules nsconfine imports lazily
# change the count once or twice).
_WAYS: dict[tuple[object, ...], list[tuple[str, str, frozenset[str]]]] = {}
_SITE_DIRECTORIES = ("site-packages", "dist-packages")  # where site.py reads .pth files
_LOADER_VARIABLES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "LD_AUDIT")


def refuse_writable_launcher_code(writable: Sequence[str]) -> None:
    """SandboxUnavailable if a place the launcher loads code from lies in writable (the real
    paths of the plan's writable binds)."""
    for what, path, looked in _ways():
        # (A walk from / reaches a path inside a directory, real as each writable bind's
        # source is, only through a lookup of that directory itself.)
        for root in writable:
            if root in looked:
                raise SandboxUnavailable(
                    f"{what}, {path}, lies inside {root}, which the session can write (a "
                    "session could put code there that the launcher's next start runs, outside "
                    "the sandbox): run the launcher from an environment, a script and a "
                    "directory outside every writable bind"
                )


def _ways() -> list[tuple[str, str, frozenset[str]]]:
    """(what it is, path, every path looked up resolving it) of each place."""
    try:
        cwd = os.getcwd()
    except OSError:  # removed: nothing is loaded from it
        cwd = ""
    loader = tuple(os.environ.get(name) for name in _LOADER_VARIABLES)
    key = (sys.prefix, sys.pycache_prefix, cwd, len(sys.modules), loader, *sys.path)
    ways = _WAYS.get(key)
    if ways is None:
        ways = []
        known: dict[str, str | bool | None] = {}
        for path, what in _places(cwd).items():
            if path:
                looked, _end = lookups("/", os.path.join(cwd or "/", path), known)
                ways.append((what, path, frozenset(looked)))
        if len(_WAYS) > 16:  # a launcher that keeps changing them
            _WAYS.clear()
        _WAYS[key] = ways
    return ways


def _places(cwd: str) -> dict[str, str]:
    """Each place the launcher loads code from (a relative one is cwd's), and what it is."""
    places = {sys.prefix: "the launcher's Python environment"}
    if sys.pycache_prefix:
        places[sys.pycache_prefix] = "where the launcher's Python keeps compiled modules"
    for entry in sys.path:
        if not isinstance(entry, str):
            continue  # (imports skip it)
        if entry in ("", cwd):  # python -m, -c: the current directory first
            places.setdefault(
                cwd,
                "the directory the launcher was started in, from which its Python imports first "
                "(python -m, -c; python -P does not, nor the nsconfine command)",
            )
        else:
            places.setdefault(entry, "a directory the launcher's Python imports from")
            for named in _named_by_pth_files(entry) if entry.endswith(_SITE_DIRECTORIES) else ():
                places.setdefault(named, f"a directory a .pth file in {entry} adds to its imports")
    for name, module in sys.modules.copy().items():
        where = getattr(module, "__file__", None)
        if isinstance(where, str):  # an editable install's finder maps names anywhere
            if name == "__main__":
                places.setdefault(where, "the launcher's script")
            places.setdefault(os.path.dirname(where), f"the directory of its module {name}")
    for entry in os.environ.get("LD_LIBRARY_PATH", "").split(":"):  # (empty: the cwd)
        places.setdefault(entry or cwd, "a directory of the launcher's LD_LIBRARY_PATH")
    for name in ("LD_PRELOAD", "LD_AUDIT"):  # (a name without a slash: the loader's search)
        for entry in os.environ.get(name, "").replace(" ", ":").split(":"):
            if "/" in entry:
                places.setdefault(entry, f"a library of the launcher's {name}")
    return places


def _named_by_pth_files(directory: str) -> list[str]:
    """The directories the .pth files in directory name (site.py adds each once it exists,
    at the next start: one not there yet is the session's to make)."""
    try:
        names = [name for name in os.listdir(directory) if name.endswith(".pth")]
    except OSError:
        return []
    named = []
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as file:
                lines = file.read(1 << 20).splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")):
                named.append(os.path.join(directory, line))
    return named
