"""Profiles: what a kind of session gets, in a TOML file, each entry with its reason.

A profile is a built-in name (nsconfine/profiles/NAME.toml, listed by `nsconfine profiles`) or a
file. Its keys are the profile keys of the session's options (nsconfine._plan.options, listed in
docs/options.md) and two of its own, description and requires_credential:

    description = "what it is for"                      (required)
    include = ["node", "tls", "/path/other.toml"]        profiles it builds on, applied first
    pass_env = ["NAME", …]                               passed from the launcher, when set
    [setenv] NAME = "value"                              literal, non-secret values
    [[bind]] source, mode ("ro" | "rw"), reason          (required), and optionally:
             dest (default: source), optional (skip it when missing),
             mkdir (make a missing rw directory, inside the workspace or run directory)
    protect, unprotect, deny = ["…"]                     as the command-line options
    mask = ["{workspace}/.env"]                          paths shown empty and read-only, each
                                                         absolute after {workspace}, $NAME, ~
    network = "none" | "proxy" | "host"; network_reason = "why host" (host needs one)
    home_mode = "persist" | "fresh"; workspace_mode = "rw" | "ro"
    [limits] processes = 512, tmp = "256M", …          the session's share (nsconfine._plan.limits)
    git_identity = "Name <email>"; allow_nested_userns = "reason"
    credential = "~/.config/nsconfine/agent.env"         the file, if none is given
    requires_credential = true                           refuse a launch without one

Every path a profile gives (a bind's source and dest, deny, mask, credential) is absolute, or
starts with ~, $NAME (a variable of the launcher's environment), {workspace}, {run_dir}, {home}
or {config}; any other is refused, never taken from the launcher's working directory. A bind or
mask whose variable is unset is skipped, a deny rule's is kept and shown as matching nothing; a
source with * or ? binds every path it matches. Command-line options add to a profile: lists
are joined, and a value given there wins over the profile's. Errors name the file, the line and
the key.
"""

from __future__ import annotations

import os
import stat

from nsconfine._errors import PlanError, UsageError
from nsconfine._plan import options as o
from nsconfine._plan.allowlist import Destination
from nsconfine._plan.limits import parse_value
from nsconfine._record import Record
from nsconfine._text import is_env_name, path_too_long, says_nothing

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import Any

_STRING_LISTS = (o.PATHS, o.NAMES, o.VARIABLES)  # a TOML list of strings
_PATH_SHAPES = (o.PATH, o.PATHS)  # each string absolute or from one of PATH_FORMS

BUILT_IN_DIRECTORY = os.path.join(os.path.dirname(os.path.dirname(__file__)), "profiles")

# The keys a profile may hold: each session option's profile key, by the shape of its value
# (nsconfine._plan.options), and the profile's own. An option given as a TOML table or array of
# tables ([setenv], [limits], [[allow_hosts]], [[bind]]) has its own reader in _checked.
_OPTION_KEYS = {option.key: option for option in o.SESSION_OPTIONS if option.key is not None}
_SCALARS: dict[str, type] = {
    "description": str,
    "requires_credential": bool,
    **{key: str for key, option in _OPTION_KEYS.items() if not option.repeatable},
}
_LISTS = tuple(key for key, option in _OPTION_KEYS.items() if option.shape in _STRING_LISTS)
_CHOICES = {key: option.choices for key, option in _OPTION_KEYS.items() if option.choices}
_PATH_KEYS = tuple(key for key, option in _OPTION_KEYS.items() if option.shape in _PATH_SHAPES)
# Names relative to each repository (or paths): as long as a path may be, no longer.
_NAME_KEYS = ("protect", "unprotect")
# A key an option had before: refused, naming the key it has now.
_RENAMED = {old: option.key for option in o.SESSION_OPTIONS for old in option.old_keys}
# What a profile's path may start with: each is expanded (nsconfine._session), and a path that is
# none of them would be relative to whatever directory the launcher happens to run in.
PATH_FORMS = ("/", "~", "$", "{workspace}", "{run_dir}", "{home}", "{config}")
_BIND_KEYS = {"source": str, "dest": str, "mode": str, "reason": str, "optional": bool,
              "mkdir": bool}  # fmt: skip


class Bind(Record):
    """A host path a profile gives the session, with the profile's reason."""

    FIELDS = ("source", "dest", "mode", "reason", "optional", "mkdir")
    __slots__ = FIELDS
    source: str
    dest: str
    mode: str
    reason: str
    optional: bool
    mkdir: bool

    def __init__(
        self,
        source: str | os.PathLike[str],
        dest: str | os.PathLike[str],
        mode: str,
        reason: str,
        optional: bool = False,
        mkdir: bool = False,
    ) -> None:
        for name, value in (("source", source), ("dest", dest)):
            if not isinstance(value, str | os.PathLike) or not isinstance(os.fspath(value), str):
                raise UsageError(f"a Bind's {name} is a path (str or os.PathLike), not {value!r}")
            if not os.fspath(value):
                raise UsageError(
                    f"a Bind's {name} holds an empty path, which would name the launcher's "
                    "working directory: give the path"
                )
        if not isinstance(reason, str):
            raise UsageError(f"a Bind's reason is a str, not {reason!r}")
        for name, flag in (("optional", optional), ("mkdir", mkdir)):
            if not isinstance(flag, bool):
                raise UsageError(f"a Bind's {name} is True or False, not {flag!r}")
        self._set(source=os.fspath(source), dest=os.fspath(dest), mode=mode, reason=reason,
                  optional=optional, mkdir=mkdir)  # fmt: skip
        if mode not in ("ro", "rw"):
            raise UsageError(f"a bind's mode is ro or rw, not {mode!r} ({source!r})")


class Profile(Record):
    """One profile file, checked."""

    FIELDS = ("name", "path", "values", "binds", "lines")
    __slots__ = FIELDS
    name: str
    path: str
    values: dict[str, Any]  # the scalar, list and setenv keys it sets
    binds: tuple[Bind, ...]
    lines: dict[str, int]  # the line of each key ("deny", "bind.0.source", …)

    def __init__(
        self,
        name: str,
        path: str,
        values: dict[str, Any],
        binds: tuple[Bind, ...],
        lines: dict[str, int] | None = None,
    ) -> None:
        self._set(name=name, path=path, values=values, binds=binds, lines=lines or {})

    def where(self, key: str) -> str:
        """Where a key is, as errors name it: the file, the line and the key."""
        return f"profile {self.path}, line {self.lines.get(key, 1)}, key {key.split('.')[-1]}"


def built_in() -> dict[str, str]:
    """Built-in profile name -> its description."""
    names = sorted(
        name[: -len(".toml")] for name in os.listdir(BUILT_IN_DIRECTORY) if name.endswith(".toml")
    )
    return {name: load(name).values["description"] for name in names}


MAX_PROFILE_BYTES = 1 << 20


def load(name: str) -> Profile:
    """A built-in profile by name, or a profile file by path."""
    if os.sep in name or name.endswith(".toml"):
        path = os.path.abspath(name)
        label = path
    else:
        path = os.path.join(BUILT_IN_DIRECTORY, f"{name}.toml")
        label = name
        if not os.path.isfile(path):
            known = ", ".join(sorted(n[:-5] for n in os.listdir(BUILT_IN_DIRECTORY)))
            raise UsageError(
                f"profile {name!r}: no such built-in profile ({known}); or give a file's path"
            )
    raw = _read_profile(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:  # (read with U+FFFD, a path in it would name another)
        line = raw.count(b"\n", 0, error.start) + 1
        raise UsageError(f"profile {label}, line {line}: not UTF-8, as TOML must be") from None
    return _checked(label, path, text)


def _read_profile(path: str) -> bytes:
    """A profile file's bytes: a regular file (a FIFO would hang the launcher, a device feed
    it without end), of MAX_PROFILE_BYTES at most."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise UsageError(f"profile {path}: cannot be read: {error.strerror}") from error
    except ValueError:  # a NUL byte or a lone surrogate: no file has such a name
        raise UsageError(f"profile {path}: no file can have this name") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"profile {path}: not a regular file")
        _refuse_untrusted(path, fd, info)
        raw = os.read(fd, MAX_PROFILE_BYTES + 1)
    except OSError as error:
        raise UsageError(f"profile {path}: cannot be read: {error.strerror}") from error
    finally:
        os.close(fd)
    if len(raw) > MAX_PROFILE_BYTES:
        raise UsageError(f"profile {path}: larger than {MAX_PROFILE_BYTES:,} bytes")
    return raw


def _refuse_untrusted(path: str, fd: int, info: os.stat_result) -> None:
    """A profile says what a session is given: the file opened (fd) must be one that only root
    or this launcher's account can change, as its programs are (accounts.untrusted_reason), by
    the way it was named and where it really lies (no symlink another account could re-point
    on the way), and have one name (a hardlink may lie where a session writes)."""
    from nsconfine._kernel.accounts import untrusted_reason

    built_in = os.path.dirname(os.path.abspath(path)) == BUILT_IN_DIRECTORY
    if info.st_nlink > 1 and not built_in:  # (an installer may link them from its cache)
        raise PlanError(
            f"profile {path}: it has {info.st_nlink} names (hardlinks), and one may lie where "
            "a session writes; keep a profile with one name"
        )
    real = os.readlink(f"/proc/self/fd/{fd}")
    for way in (os.path.abspath(path), real):
        reason = untrusted_reason(way)
        if reason is not None:
            raise PlanError(
                f"profile {path}: someone other than root or this launcher could change it "
                f"({reason}): a profile says what a session is given; keep it where only they "
                "can write"
            )
    try:
        named = os.stat(path)
    except OSError:
        named = None
    if named is None or (named.st_dev, named.st_ino) != (info.st_dev, info.st_ino):
        raise PlanError(f"profile {path}: it changed while it was read; nothing was run")


MAX_INCLUDE_DEPTH = 32


def chain(names: list[str]) -> list[Profile]:
    """The profiles named, each after the ones it includes, each once; a cycle, or includes
    deeper than MAX_INCLUDE_DEPTH, are refused."""
    ordered: list[Profile] = []
    seen: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        profile = load(name)
        if profile.path in stack:
            raise UsageError(
                f"profile {profile.path}: it includes itself (through {' -> '.join(stack)})"
            )
        if len(stack) == MAX_INCLUDE_DEPTH:
            raise UsageError(
                f"profile {stack[0]} includes more than {MAX_INCLUDE_DEPTH} deep (to "
                f"{profile.path}): include fewer levels"
            )
        if profile.path in seen:
            return
        for included in profile.values.get("include", []):
            visit(_relative(included, profile.path), (*stack, profile.path))
        seen.add(profile.path)
        ordered.append(profile)

    for name in names:
        visit(name, ())
    return ordered


def _relative(name: str, including: str) -> str:
    """An include as written: a built-in name, or a file's path (with a slash, or ending in
    .toml) relative to the including file, never to the working directory."""
    if (os.sep in name or name.endswith(".toml")) and not os.path.isabs(name):
        return os.path.join(os.path.dirname(including), name)
    return name


# ------------------------------------------------------------------ checking a file


class _Where:
    """Finds the line a key is on (tomllib reports positions only for syntax errors)."""

    def __init__(self, label: str, text: str) -> None:
        self.label = label
        self.lines = text.splitlines()

    def line_of(self, key: str, after: int = 0) -> int:
        import re  # here: profiles are read as a launch's plan is made, not at import

        pattern = re.compile(rf"\s*(\[\[?)?\s*{re.escape(key)}\s*(=|\]\]?)")
        for number, line in enumerate(self.lines[after:], start=after + 1):
            if pattern.match(line):
                return number
        return after + 1 if after else 1

    def error(self, line: int, key: str, problem: str) -> UsageError:
        return UsageError(f"profile {self.label}, line {line}, key {key}: {problem}")


def _checked(label: str, path: str, text: str) -> Profile:
    import re
    import tomllib

    where = _Where(path, text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        found = re.search(r"line (\d+)", str(error))
        line = int(found.group(1)) if found else 1
        raise UsageError(f"profile {path}, line {line}: not valid TOML: {error}") from None
    except ValueError as error:  # a number past what int() reads from a text (4,300 digits)
        raise UsageError(f"profile {path}: not valid TOML: {error}") from None
    except RecursionError:  # tomllib's parser recurses once per nested array or table
        raise UsageError(f"profile {path}: not valid TOML: nested too deep") from None
    values: dict[str, Any] = {}
    binds: list[Bind] = []
    lines: dict[str, int] = {}
    for key, value in data.items():
        line = where.line_of(key)
        if key in _RENAMED:
            raise where.error(line, key, f"is now {_RENAMED[key]}")
        lines[key] = line
        if key in _PATH_KEYS:
            for text in value if isinstance(value, list) else [value]:
                _check_path_form(where, line, key, text)
        if key in _NAME_KEYS and isinstance(value, list):
            for text in value:
                _check_length(where, line, key, text)
        if key in _SCALARS:
            if not isinstance(value, _SCALARS[key]):
                raise where.error(line, key, f"must be a {_SCALARS[key].__name__}")
            if key in _CHOICES and value not in _CHOICES[key]:
                raise where.error(line, key, f"must be one of {', '.join(_CHOICES[key])}")
            values[key] = value
        elif key in _LISTS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise where.error(line, key, "must be a list of strings")
            if _OPTION_KEYS[key].shape == o.VARIABLES and not all(is_env_name(v) for v in value):
                raise where.error(line, key, "must hold variable names")
            values[key] = value
        elif key == "limits":
            if not isinstance(value, dict):
                raise where.error(line, key, "must be a table of NAME = value ([limits])")
            try:
                values[key] = {name: parse_value(name, given) for name, given in value.items()}
            except UsageError as refused:
                raise where.error(line, key, refused.message) from None
        elif key == "setenv":
            if not isinstance(value, dict) or not all(
                isinstance(v, str) and is_env_name(k) for k, v in value.items()
            ):
                raise where.error(line, key, 'must be a table of NAME = "value"')
            values[key] = dict(value)
        elif key == "allow_hosts":
            values[key] = _checked_destinations(where, line, value)
        elif key == "bind":
            if not isinstance(value, list):
                raise where.error(line, key, "must be an array of tables ([[bind]])")
            after = 0
            for number, table in enumerate(value):
                after = where.line_of("bind", after)
                binds.append(_checked_bind(where, after, table))
                for path_key in ("source", "dest"):
                    key_line = where.line_of(path_key, after) if path_key in table else after
                    lines[f"bind.{number}.{path_key}"] = key_line
                    _check_path_form(where, key_line, path_key, table.get(path_key, "/"))
        else:
            raise where.error(line, key, "is not a profile key (docs/options.md lists them)")
    if "description" not in values:
        raise where.error(1, "description", "is required: say what the profile is for")
    name = label if os.sep not in label else os.path.basename(path).removesuffix(".toml")
    return Profile(name, path, values, tuple(binds), lines)


def _checked_destinations(where: _Where, line: int, value: object) -> list[Destination]:
    """[[allow_hosts]] tables: host (as --allow-host takes it) and reason, both required."""
    if not isinstance(value, list) or not all(isinstance(table, dict) for table in value):
        raise where.error(line, "allow_hosts", "must be an array of tables ([[allow_hosts]])")
    destinations = []
    after = 0
    for table in value:
        after = where.line_of("allow_hosts", after)
        if set(table) != {"host", "reason"} or not all(isinstance(v, str) for v in table.values()):
            raise where.error(after, "allow_hosts", 'each is host = "…" and reason = "…"')
        try:
            destinations.append(Destination.parse(table["host"], table["reason"]))
        except UsageError as refused:
            raise where.error(after, "allow_hosts", refused.message) from None
    return destinations


def _check_path_form(where: _Where, line: int, key: str, text: object) -> None:
    if isinstance(text, str) and not text.startswith(PATH_FORMS):
        raise where.error(
            line,
            key,
            f"{text!r} is a relative path: give it absolute, or from ~, $NAME, {{workspace}}, "
            "{run_dir}, {home} or {config}",
        )
    _check_length(where, line, key, text)


def _check_length(where: _Where, line: int, key: str, text: object) -> None:
    """Refuse a path or name past what the kernel resolves (as the Session's own are)."""
    too_long = path_too_long(text) if isinstance(text, str) else None
    if too_long is not None:
        raise where.error(line, key, too_long)


def _checked_bind(where: _Where, line: int, table: object) -> Bind:
    if not isinstance(table, dict):
        raise where.error(line, "bind", "must be a table")
    for key, value in table.items():
        if key not in _BIND_KEYS:
            raise where.error(where.line_of(key, line), key, "is not a key of [[bind]]")
        if not isinstance(value, _BIND_KEYS[key]):
            problem = f"must be a {_BIND_KEYS[key].__name__}"
            raise where.error(where.line_of(key, line), key, problem)
    for required in ("source", "mode", "reason"):
        value = table.get(required)
        if value is None or (isinstance(value, str) and says_nothing(value)):
            raise where.error(line, required, "is required in every [[bind]]")
    if table["mode"] not in ("ro", "rw"):
        raise where.error(where.line_of("mode", line), "mode", "must be ro or rw")
    source: str = table["source"]
    dest: str = table.get("dest", source)
    return Bind(
        source,
        dest,
        table["mode"],
        table["reason"],
        table.get("optional", False),
        table.get("mkdir", False),
    )
