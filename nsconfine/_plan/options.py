"""The session's options, each declared once: one row per `Session` keyword.

A row gives the keyword, the shape of its value, its default, its choices, its help, and how
the command line and a profile file spell it. The fronts are made from this table or checked
against it: the CLI's session flags (nsconfine._cli.main) and the profile schema's keys
(nsconfine._plan.profiles) are made from it; docs/options.md is generated from it
(`python -m nsconfine._cli.options_doc`); `Session`'s keyword-only signature, whose precise
types mypy checks, is compared with it by tests/test_options.py, which fails on any drift.

One spelling per option: the flag is `--` and the keyword with `-` for `_` (`--no-` and the
keyword for a switch that is on by default), and the profile key is the keyword. A row that
spells a front otherwise, or has no flag or no key, says why (`flag_why`, `key_why`). A
spelling an option had before is kept only to refuse it, naming the new one (`old_flags`,
`old_keys`; a former keyword is Python's TypeError): nsconfine 0.1.0 is unreleased, so no
script needs the old spelling to keep working, and a working alias would be a second spelling
to document, test and carry.
"""

from __future__ import annotations

from nsconfine._plan.model import NETWORKS
from nsconfine._record import Record

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    import os
    from typing import Literal, TypeAlias

    # The choices as types, for Session's signature: mypy refuses Session(network="nonee")
    # before it runs. tests/test_options.py checks each against its row's choices.
    Network: TypeAlias = Literal["none", "proxy", "host"]
    HomeMode: TypeAlias = Literal["persist", "fresh"]
    WorkspaceMode: TypeAlias = Literal["rw", "ro"]
    PathArgument: TypeAlias = str | os.PathLike[str]


# What a value is: each front takes its shape from here (the CLI: one value, a repeatable flag,
# a switch; a profile: a string, a list of strings, a table; the docs: how it is written).
PATH = "path"  # one path (str or os.PathLike)
PATHS = "paths"  # a list of paths
NAMES = "names"  # a list of names (or paths relative to the workspace)
VARIABLES = "variables"  # a list of environment variable names
TEXT = "text"  # one str
CHOICE = "choice"  # one of the row's choices
SWITCH = "switch"  # True or False
REASON = "reason"  # False, True, or the reason it is allowed (a str)
ACCOUNT = "account"  # an account name or uid
VALUES = "values"  # NAME=VALUE pairs: a mapping, NAME=VALUE strings or (name, value) pairs
SPECS = "specs"  # a list of records, each also written as one string (PATH@sha256:…, HOST)
RECORDS = "records"  # a list of records with no string form (nsconfine.Bind)

# Shapes whose value is a list: a repeatable flag, a TOML list or table, a tuple in Session.
LISTS = frozenset({PATHS, NAMES, VARIABLES, VALUES, SPECS, RECORDS})


class _Required:
    """The default of a keyword that has none (workspace, run_dir)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()
_DERIVED = "derived"  # a flag or key spelled by the rule above


class Option(Record):
    """One session option, as every front spells and shows it."""

    FIELDS = ("name", "shape", "default", "help", "metavar", "choices", "flag", "flag_why",
              "key", "key_why", "old_keywords", "old_flags", "old_keys")  # fmt: skip
    __slots__ = FIELDS
    name: str  # the Session keyword
    shape: str  # one of the shapes above
    default: object  # Session's default (REQUIRED: none, the keyword must be given)
    help: str  # one line: --help, docs/options.md; {keyword} names another option (help_text)
    metavar: str  # how a value is written on the command line and in the docs
    choices: tuple[str, ...]  # a CHOICE's values, as its Literal type lists them
    flag: str | None  # the command-line flag (None: none)
    flag_why: str  # why the flag is spelled otherwise than the rule, or why there is none
    key: str | None  # the profile key (None: profiles do not set it)
    key_why: str  # why the key is spelled otherwise than the keyword, or why there is none
    old_keywords: tuple[str, ...]  # former keywords (docs/options.md lists them)
    old_flags: tuple[str, ...]  # former flags, refused with the new one
    old_keys: tuple[str, ...]  # former profile keys, refused with the new one

    def __init__(
        self,
        name: str,
        shape: str,
        default: object,
        help: str,
        metavar: str = "",
        *,
        choices: tuple[str, ...] = (),
        flag: str | None = _DERIVED,
        flag_why: str = "",
        key: str | None = _DERIVED,
        key_why: str = "",
        old_keywords: tuple[str, ...] = (),
        old_flags: tuple[str, ...] = (),
        old_keys: tuple[str, ...] = (),
    ) -> None:
        self._set(
            name=name,
            shape=shape,
            default=default,
            help=help,
            metavar=metavar or "|".join(choices),
            choices=choices,
            flag=derived_flag(name, shape, default) if flag == _DERIVED else flag,
            flag_why=flag_why,
            key=name if key == _DERIVED else key,
            key_why=key_why,
            old_keywords=old_keywords,
            old_flags=old_flags,
            old_keys=old_keys,
        )

    @property
    def repeatable(self) -> bool:
        """Whether the value is a list (a flag given once per item)."""
        return self.shape in LISTS


def help_text(option: Option, as_flags: bool) -> str:
    """option's help, each {keyword} in it spelled as that option's flag (as_flags) or as the
    keyword: the command line's help names flags, the API's docs keywords."""
    if "{" not in option.help:
        return option.help
    spelled = {o.name: (o.flag or o.name) if as_flags else o.name for o in SESSION_OPTIONS}
    return option.help.format_map(spelled)


def derived_flag(name: str, shape: str, default: object) -> str:
    """The flag the spelling rule gives keyword name."""
    spelled = name.replace("_", "-")
    return f"--no-{spelled}" if shape == SWITCH and default is True else f"--{spelled}"


_PER_SESSION = (
    "a place of one session's, given by its launcher; a profile describes a kind of session "
    "and refers to it as {workspace}, {run_dir} or {home}"
)

SESSION_OPTIONS = (
    Option("workspace", PATH, REQUIRED, "read-write; the working directory", "DIR",
           key=None, key_why=_PER_SESSION),
    Option("run_dir", PATH, REQUIRED, "read-write; HOME is created inside it", "DIR",
           key=None, key_why=_PER_SESSION),
    Option("ro", PATHS, (), "a read-only file or directory the runner loads", "PATH",
           key=None, key_why='a profile gives a host path as a [[bind]] with mode = "ro" and '
           "its reason"),
    Option("harness", SPECS, (), "a read-only harness executable, pinned when a digest is "
           "given", "PATH[@sha256:HEX]",
           key=None, key_why="the executable is the launcher's choice; a profile gives what it "
           "needs"),
    Option("tool_socket", PATH, None, "a unix socket the session reaches", "PATH",
           key=None, key_why=_PER_SESSION),
    Option("pass_env", VARIABLES, (), "pass NAME's value from the launcher's environment, when "
           "set (hidden in the manifest)", "NAME",
           old_keywords=("env",), old_flags=("--env",), old_keys=("env",)),
    Option("credential", PATH, None, "a KEY=VALUE file, owned by the caller, mode 0600: its "
           "values reach the session (hidden in the manifest)", "FILE"),
    Option("deny", PATHS, (), "another host path no bind may expose", "PATH"),
    Option("user", ACCOUNT, None, "the unprivileged account the session runs as (required as "
           "root)", "NAME|UID",
           key=None, key_why="who runs the session is the launcher's to say, not a profile's"),
    Option("protect", NAMES, (), "another path the host trusts, relative to the workspace (an "
           "absolute one must lie inside it): kept read-only there and in each repository",
           "PATH"),
    Option("unprotect", NAMES, (), "a protected name (.envrc, .vscode, …) to leave writable",
           "NAME"),
    Option("network", CHOICE, None, "none: a network namespace of its own with only a loopback "
           "(the default); proxy: that and a relay to nsconfine's proxy, which allows only the "
           "{allow_hosts} destinations (the default when any is given); host: the launcher's "
           "network, shared (needs {network_reason})", choices=tuple(NETWORKS)),
    Option("network_reason", TEXT, None, "why the session shares the launcher's network "
           "({network} host): the manifest shows it", "REASON"),
    Option("allow_hosts", SPECS, (), "a destination the proxy allows (pypi.org, "
           "*.githubusercontent.com, host:8443; =ADDRESS pins its address, as curl's --resolve "
           "does)", "HOST[:PORT][=ADDRESS]",
           flag="--allow-host", flag_why="one destination per flag, repeated"),
    Option("inject", NAMES, (), "an API (anthropic, openai) the session reaches through the "
           "proxy, which adds the credential file's key: the session holds a placeholder",
           "ROUTE",
           flag="--inject-for", flag_why="reads as what it does: the key is injected for ROUTE"),
    Option("audit", PATH, None, "append a JSON line per proxy connection (allowed or refused) "
           "to FILE", "FILE",
           key=None, key_why="where a session's log goes is the launcher's to say"),
    Option("allow_nested_userns", REASON, False, "let the session make user namespaces of its "
           "own (a harness that runs bwrap itself), saying why: the manifest shows it",
           "REASON"),
    Option("setenv", VALUES, (), "a literal, non-secret value (shown in the manifest)",
           "NAME=VALUE"),
    Option("terminal_env", SWITCH, True, "TERM, COLORTERM, LANG, LANGUAGE, TZ, LC_ALL and the "
           "locale's categories (LC_CTYPE ... LC_IDENTIFICATION; no other LC_ name) from the "
           "launcher: passed unless turned off", old_keywords=("pass_terminal",),
           key=None, key_why="the launcher's terminal is the launcher's, not a kind of "
           "session's"),
    Option("home_mode", CHOICE, None, "persist: RUN/home, kept from launch to launch (the "
           "default); fresh: an empty HOME every launch, gone after it",
           choices=("persist", "fresh"), old_flags=("--home",), old_keys=("home",)),
    Option("git_identity", TEXT, None, "who the session's commits are by (a generated, "
           "read-only HOME/.gitconfig)", '"NAME <EMAIL>"'),
    Option("profile", NAMES, (), "a built-in profile (nsconfine profiles) or a TOML profile "
           "file; the other options add to it", "NAME|FILE",
           key="include", key_why="a profile includes the profiles it builds on"),
    Option("binds", RECORDS, (), "more host paths, each a Bind(source, dest, mode, reason)",
           flag=None, flag_why="a bind needs its reason, which a profile file gives (or the "
           "API); the command line has --ro and --profile",
           key="bind", key_why="one [[bind]] table per bind, as TOML names an array of tables"),
    Option("workspace_mode", CHOICE, None, "rw: the workspace is writable (the default); ro: "
           "read-only", choices=("rw", "ro"), old_keys=("workspace",)),
    Option("limits", VALUES, (), "the session's share: processes, open_files, tmp, shm (bytes, "
           "or with K, M, G), ptys, inotify_instances, inotify_watches; shown in the manifest",
           "NAME=VALUE",
           flag="--limit", flag_why="one limit per flag, repeated"),
    Option("mask", PATHS, (), "a host path a bind would show (a workspace's .env): shown empty "
           "and read-only instead", "PATH"),
)  # fmt: skip

OPTIONS = {option.name: option for option in SESSION_OPTIONS}
