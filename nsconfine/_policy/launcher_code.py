"""Where the launcher's own next start loads code from, none of which a session may write.

A .pth file or a module a session wrote into the launcher's environment, or into a directory
its imports search, runs at the launcher's next start, outside the sandbox, with the
launcher's trust (a root one's): nsconfine installed editable into a venv in the workspace, a
broker script kept there, a library in an LD_LIBRARY_PATH directory there. The gate refuses a
plan whose writable binds hold any of these places, judged by every path looked up on the way
to each (a link there could be re-pointed), and a place that is not there yet counts (the
session could make it). A workspace below one of these directories is not judged by them (a
package there that the launcher has not imported yet, `lib/app/plugins` under a sys.path
entry `lib`): a sys.path entry of `/` (python -m started there) holds every workspace.
"""

from __future__ import annotations

import os
import sys
import types

from nsconfine._errors import SandboxUnavailable
from nsconfine._kernel.syscalls import lookups

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from collections.abc import Sequence

# The places found for each state of the launcher (its sys.path, the modules it has, its
# working directory and loader variables), with the paths looked up to resolve each: the same
# for every launch of a process that leaves them alone (the modules nsconfine imports lazily
# change them once or twice).
_WAYS: dict[tuple[object, ...], _Ways] = {}
_SITE_DIRECTORIES = ("site-packages", "dist-packages")  # where site.py reads .pth files


class _Ways:
    """Each place, with every path looked up on the way to it, and all of those at once."""

    __slots__ = ("every", "modules", "places")

    def __init__(
        self, places: list[tuple[str, str, frozenset[str]]], modules: tuple[object, ...]
    ) -> None:
        self.places = places  # (what it is, path, the paths looked up resolving it)
        self.every = frozenset().union(*(looked for _what, _path, looked in places))
        self.modules = modules  # those whose identities key these ways


def refuse_writable_launcher_code(writable: Sequence[str]) -> None:
    """SandboxUnavailable if a place the launcher loads code from lies in writable (the real
    paths of the plan's writable binds)."""
    ways = _ways()
    # (A walk from / reaches a path inside a directory, real as each writable bind's source
    # is, only through a lookup of that directory itself.)
    for root in writable:
        if root not in ways.every:
            continue
        what, path, _looked = next(place for place in ways.places if root in place[2])
        raise SandboxUnavailable(
            f"{what}, {path}, lies inside {root}, which the session can write (a session "
            "could put code there that the launcher's next start runs, outside the sandbox): "
            "run the launcher from an environment, a script and a directory outside every "
            "writable bind"
        )


def _ways() -> _Ways:
    """The places of the launcher as it is now."""
    try:
        cwd = os.getcwd()
    except OSError:  # removed: nothing is loaded from it
        cwd = ""
    loader = tuple(os.environ.get(name) for name in _LOADER_SEPARATORS)
    modules = tuple(sys.modules.copy().values())
    # (By identity: one swapped for another too. The ways hold the modules, so that no other
    # object takes a freed one's id meanwhile.)
    key = (sys.prefix, sys.pycache_prefix, cwd, tuple(map(id, modules)), loader, *sys.path)
    ways = _WAYS.get(key)
    if ways is None:
        walks = _Walks()
        places = [
            (what, path, walks.looked(os.path.join(cwd or "/", path)))
            for path, what in _places(cwd).items()
            if path and "\0" not in path  # (no file has such a name)
        ]
        ways = _Ways(places, modules)
        if len(_WAYS) > 16:  # a launcher that keeps changing them
            _WAYS.clear()
        _WAYS[key] = ways
    return ways


_DEEPEST_SHARED = 64  # the most names of a path walked from its directory's walk


class _Walks:
    """The walks of many paths that share their directories (a module's file, each in one of
    a few), each directory walked once."""

    def __init__(self) -> None:
        self.known: dict[str, str | bool | None] = {}  # lookups' record of each path's kind
        self.walked: dict[str, tuple[frozenset[str], str]] = {}

    def looked(self, path: str) -> frozenset[str]:
        """Every path looked up resolving path (absolute)."""
        return self._walk(path)[0]

    def _walk(self, path: str) -> tuple[frozenset[str], str]:
        """(the paths looked up, where it leads) of path."""
        walked = self.walked.get(path)
        if walked is not None:
            return walked
        directory, name = os.path.split(path)
        # (a path of many names, a hostile PYTHONPATH's, is walked whole: not a recursion deep)
        if name in ("", ".", "..") or directory == path or path.count("/") > _DEEPEST_SHARED:
            looked, end = lookups("/", path, self.known)
            walked = (frozenset(looked), end)
        else:
            above, where = self._walk(directory)
            here = os.path.join(where, name)
            try:
                target = os.readlink(here)
            except OSError:  # no link: walked into (or the walk ends here)
                walked = (above | {here}, here)
            else:  # a link: followed from where it lies
                looked, end = lookups(where, target, self.known)
                walked = (above.union(looked, (here,)), end)
        self.walked[path] = walked
        return walked


def _places(cwd: str) -> dict[str, str]:
    """Each place the launcher loads code from (a relative one is cwd's), and what it is."""
    import site

    places = {
        sys.executable: "the launcher's Python interpreter",
        sys.prefix: "the launcher's Python environment",
    }
    if sys.pycache_prefix:
        places[sys.pycache_prefix] = "where the launcher's Python keeps compiled modules"
    site_directories = [e for e in sys.path if isinstance(e, str) and e.endswith(_SITE_DIRECTORIES)]
    if site.ENABLE_USER_SITE:  # (added to sys.path only once it is there: judged before)
        user_site = site.getusersitepackages()
        places[user_site] = "the launcher's user site-packages (usercustomize, .pth files)"
        site_directories.append(user_site)
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
    for directory in site_directories:
        for pth_file, named in _pth_files(directory):
            places.setdefault(pth_file, "a .pth file site.py reads")
            places.setdefault(named, f"a directory {pth_file} adds to the imports")
    _add_modules(places)
    _add_loader_paths(places, cwd)
    return places


def _add_modules(places: dict[str, str]) -> None:
    """Each module's file and compiled copy (an editable install's finder maps names anywhere,
    and a module may be a link), the directories of a package without a file, and what an
    editable finder maps a name to before it is imported."""
    for name, module in sys.modules.copy().items():
        namespace = _namespace(module)
        for key in ("__file__", "__cached__"):
            where = namespace.get(key)
            if isinstance(where, str) and not where.startswith("<"):  # not <stdin>, <frozen>
                places.setdefault(where, "the launcher's script" if name == "__main__" else
                                  f"the file of its module {name}")  # fmt: skip
        if namespace.get("__file__") is None:  # a namespace package's directories (as read)
            for entry in _paths(namespace.get("__path__")):
                places.setdefault(entry, f"a directory of its package {name}")
        if name.startswith("__editable__"):  # setuptools' finder: names -> paths, unimported
            mapping, namespaces = namespace.get("MAPPING"), namespace.get("NAMESPACES")
            found = [*(mapping.values() if isinstance(mapping, dict) else ()),
                     *(v for vs in (namespaces.values() if isinstance(namespaces, dict) else ())
                       for v in _paths(vs))]  # fmt: skip
            for where in _paths(found):
                places.setdefault(where, f"where {name} finds a package")


def _namespace(module: object) -> dict[str, object]:
    """What a module holds, read without running its code: a module's own __dict__ (asking a
    lazy module for an attribute loads it); another object standing in sys.modules (a wrapper
    that forwards to the module it replaced, as the sh library's does) is asked by name."""
    if isinstance(module, types.ModuleType):
        try:
            namespace = object.__getattribute__(module, "__dict__")
        except Exception:
            return {}
        return namespace if isinstance(namespace, dict) else {}
    found: dict[str, object] = {}
    for key in ("__file__", "__cached__", "__path__", "MAPPING", "NAMESPACES"):
        try:
            found[key] = getattr(module, key)
        except Exception:  # (a wrapper's attribute may raise)
            continue
    return found


def _paths(value: object) -> list[str]:
    """The paths in value: a list or tuple of them, a namespace package's path (as last read:
    reading it afresh may raise, or import), or a path itself."""
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    elif not isinstance(value, (list, tuple)):
        value = getattr(value, "_path", None)  # importlib's _NamespacePath
        if not isinstance(value, list):
            return []
    paths = []
    for item in value:
        try:
            path = os.fspath(item)
        except TypeError:
            continue
        if isinstance(path, str):
            paths.append(path)
    return paths


# The loader's variables (ld.so(8)): what separates paths in each, and its tokens ($NAME
# followed by no letter, digit or _, or ${NAME}; any other $ is a character). What $LIB and
# $PLATFORM stand for is the loader's build's: each value it may take is judged.
_LOADER_SEPARATORS = {"LD_LIBRARY_PATH": ":;", "LD_PRELOAD": ": ", "LD_AUDIT": ":"}
_LOADER_TOKEN = r"\$(?:\{(ORIGIN|LIB|PLATFORM)\}|(ORIGIN|LIB|PLATFORM)(?![A-Za-z0-9_]))"


def _add_loader_paths(places: dict[str, str], cwd: str) -> None:
    """The paths of LD_LIBRARY_PATH, LD_PRELOAD and LD_AUDIT as the loader reads them."""
    for name, separators in _LOADER_SEPARATORS.items():
        value = os.environ.get(name)
        if not value:
            continue
        for entry in value.translate({ord(separator): ":" for separator in separators}).split(":"):
            if name != "LD_LIBRARY_PATH" and "/" not in entry:
                continue  # a library's name (or nothing): found by the loader's search
            for expanded in _expansions(entry) if "$" in entry else [entry]:
                places.setdefault(expanded or cwd, f"a path of the launcher's {name}")  # ("": cwd)


def _expansions(entry: str) -> list[str]:
    """entry with each loader token replaced by each value it may take (re and sysconfig are
    imported here, not by every `nsconfine run`: few launchers name a token)."""
    import re
    import sysconfig

    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    values = {
        "ORIGIN": [os.path.dirname(os.path.realpath(sys.executable))],
        "LIB": ["lib", "lib64", f"lib/{multiarch}"],
        "PLATFORM": [os.uname().machine],
    }

    def expand(entry: str) -> list[str]:
        token = re.search(_LOADER_TOKEN, entry)
        if token is None:
            return [entry]
        head, tail = entry[: token.start()], entry[token.end() :]
        return [head + value + rest for value in values[token.group(1) or token.group(2)]
                for rest in expand(tail)][:64]  # fmt: skip

    return expand(entry)


def _pth_files(directory: str) -> list[tuple[str, str]]:
    """(file, directory it names) of each path line of the .pth files in directory (site.py
    adds each once it exists, at the next start: one not there yet is the session's to make;
    an `import` line runs code, whose own imports sys.path judges)."""
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(".pth"))
    except OSError:
        return []
    named = []
    for name in names:
        pth_file = os.path.join(directory, name)
        named.append((pth_file, directory))
        try:
            with open(pth_file, encoding="utf-8", errors="replace") as file:
                lines = file.read(1 << 20).splitlines()
        except OSError:
            continue
        if lines and lines[0].startswith("\ufeff"):  # (3.13's site.py drops it; 3.11's not)
            lines.append(lines[0][1:])
        for line in lines:
            line = line.strip()
            if line and "\0" not in line and not line.startswith(("#", "import ", "import\t")):
                named.append((pth_file, os.path.join(directory, line)))
    return named
