"""Hostile input, by property: arbitrary path strings (NUL, newlines, spaces, colons, leading
dashes, `..`, relative, non-UTF-8, PATH_MAX-long, duplicate and nested destinations, binds over
/proc and /dev) given to the plan builder, the Plan entries API, profiles, the credential parser
and the CLI, and any value at all given to any Session keyword, each get a clear error or a
correct plan: never a traceback, never a plan the lint refuses, never a bwrap option injected
through a value.

No sandbox is launched: what would reach bwrap is checked in the form bwrap reads it (the
NUL-separated `--args` stream), against a table of how many values each option takes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import SESSION_USER, session_dirs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

import nsconfine
from nsconfine import Bind, Entry, EnvVar, Kind, Mode, NsconfineError, Origin, Plan
from nsconfine._cli.main import main
from nsconfine._plan import options as o
from nsconfine._plan.bwrap_args import bwrap_options, encode_options
from nsconfine._plan.credential import parse_environment_file, read_credential
from nsconfine._plan.profiles import chain
from nsconfine._policy.lint import check_plan

# Hypothesis keeps caches (constants it found in the source, Unicode tables) in a directory of
# its own, by default .hypothesis in the working directory: here, the suite's temporary cache.
set_hypothesis_home_dir(os.path.join(os.environ["XDG_CACHE_HOME"], "hypothesis"))

# Deterministic (the same examples on every run), no example database written into the tree,
# and few enough examples that the file runs in seconds.
PROPERTY = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
EXAMPLE_SECONDS = 5  # an example that takes longer has hung (a loop on a path that never ends)

# How many values each option nsconfine hands bwrap takes: at an option's place only these may
# stand, so a value that became an option (or swallowed one) breaks the walk.
NO_VALUE = ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
            "--unshare-net", "--disable-userns")  # fmt: skip
ONE_VALUE = ("--cap-drop", "--info-fd", "--seccomp", "--tmpfs", "--dir", "--proc", "--dev",
             "--remount-ro", "--chdir", "--perms", "--size", "--hostname")  # fmt: skip
TWO_VALUES = ("--setenv", "--bind", "--ro-bind", "--bind-fd", "--ro-bind-fd", "--symlink",
              "--ro-bind-data", "--file", "--dev-bind")  # fmt: skip
ARITY = {
    **dict.fromkeys(NO_VALUE, 0),
    **dict.fromkeys(ONE_VALUE, 1),
    **dict.fromkeys(TWO_VALUES, 2),
}
DEST_OPTIONS = frozenset(
    {"--bind", "--ro-bind", "--bind-fd", "--ro-bind-fd", "--symlink", "--ro-bind-data", "--file",
     "--tmpfs", "--dir", "--proc", "--dev", "--remount-ro", "--dev-bind"}
)  # fmt: skip

# Pieces of hostile paths.
PATH_MAX = os.pathconf("/", "PC_PATH_MAX")
NAME_MAX = os.pathconf("/", "PC_NAME_MAX")
PIECES = (
    "\0", "\n", "\r", "\t", "\x1b[2J", "\x85", "\u202e", " ", "a b", ":", "a:b", "-", "--",
    "--bind", "--ro-bind", "--setenv", "-rf", "..", ".", "", "~", "*", "?", "[a]", "$HOME",
    "${HOME}", "{workspace}", "{home}", "\udcff", "\udc80", "\ud800", "é", "=", "a=b", "#",
    "'", '"', "\\", "x" * NAME_MAX, "x" * (NAME_MAX + 1), "proc", "dev", "self", "sys",
)  # fmt: skip
# Where a hostile path starts; WS and RUN stand for the session's own directories.
STARTS = ("", "/", "//", "///", "/usr", "/usr/bin", "/proc", "/proc/sys", "/dev", "/dev/shm",
          "/etc", "/tmp", "WS", "RUN", "WS/sub", ".", "..", "-", "--ro")  # fmt: skip


@dataclass(frozen=True)
class Places:
    """Where hostile paths are placed: a workspace and a run directory the session's account
    owns, and a file inside each; WS and RUN in a drawn path stand for them."""

    workspace: str
    run_dir: str

    def place(self, path: str) -> str:
        """path with its WS and RUN stand-ins made real."""
        for stand_in, real in (("WS", self.workspace), ("RUN", self.run_dir)):
            if path == stand_in or path.startswith(stand_in + "/"):
                return real + path[len(stand_in) :]
        return path


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Places:
    """The session's directories, shared by every example of the module."""
    root = tmp_path_factory.mktemp("properties")
    workspace, run_dir = session_dirs(root, "ws", "run")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "file").write_text("a runner file\n")
    (workspace / "notes").mkdir()
    session_dirs(root, "ws", "run")  # give what was made inside to the session's account
    return Places(str(workspace), str(run_dir))


def hostile_paths() -> st.SearchStrategy[str]:
    """A start and up to four pieces, joined by slashes (sometimes by nothing), or a path of
    about PATH_MAX characters."""
    joined = st.builds(
        lambda start, pieces, slash: start + slash + slash.join(pieces),
        st.sampled_from(STARTS),
        st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=4),
        st.sampled_from(("/", "/", "")),
    )
    long = st.builds(
        lambda start, size: start + ("/" + "y" * 200) * (size // 201),
        st.sampled_from(("/usr", "WS", "/proc", "")),
        st.sampled_from((PATH_MAX - 300, PATH_MAX - 1, PATH_MAX, PATH_MAX + 1, 3 * PATH_MAX)),
    )
    return st.one_of(joined, joined, joined, long)


def real_paths() -> st.SearchStrategy[str]:
    """Paths that exist (so that a plan can get past `does not exist`), some nested in others,
    some the same as the system's own entries."""
    return st.sampled_from((
        "/usr/bin", "/usr/bin/env", "/usr/lib", "/usr", "/etc/hostname", "/proc", "/proc/self",
        "/proc/sys", "/proc/sys/kernel", "/dev", "/dev/null", "/dev/shm", "/tmp", "WS", "RUN",
        "WS/sub", "WS/sub/file", "WS/notes", "RUN/home", "/", "/etc", "/var/tmp",
    ))  # fmt: skip


def paths() -> st.SearchStrategy[str]:
    """A hostile path, or a real one."""
    return st.one_of(hostile_paths(), real_paths())


def mostly(usual: object, hostile: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """usual four times in five, else a hostile value: enough plans get past the first check
    for the later ones to be reached."""
    return st.one_of(st.just(usual), st.just(usual), st.just(usual), st.just(usual), hostile)


def texts() -> st.SearchStrategy[str]:
    """Free text: reasons, values, names."""
    return st.one_of(st.sampled_from(PIECES), st.text(max_size=12))


@contextlib.contextmanager
def no_hang(seconds: int = EXAMPLE_SECONDS) -> Iterator[None]:
    """Turn an example that runs for `seconds` (a loop that never ends) into a failure."""

    def hung(_signal: int, _frame: object) -> None:
        raise AssertionError(f"hung for {seconds} s on this input")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def bwrap_reads(plan: Plan) -> list[str]:
    """The options as bwrap reads them from `--args`: encoded, then split at each NUL."""
    stream = encode_options(bwrap_options(plan))
    assert stream.endswith(b"\0")
    return [item.decode("utf-8", "surrogateescape") for item in stream[:-1].split(b"\0")]


def assert_no_injection(plan: Plan, read: Sequence[str]) -> None:
    """Walk read option by option: every token at an option's place is an option nsconfine
    uses, and the values land where the plan put them (each environment variable in its own
    --setenv, each entry's destination as its option's last value, the working directory)."""
    walked: list[tuple[str, list[str]]] = []
    at = 0
    while at < len(read):
        option = read[at]
        assert option in ARITY, f"{option!r} stands where an option belongs: {read}"
        values = list(read[at + 1 : at + 1 + ARITY[option]])
        assert len(values) == ARITY[option], f"{option} lacks its values: {read}"
        walked.append((option, values))
        at += 1 + ARITY[option]
    environment = [(values[0], values[1]) for option, values in walked if option == "--setenv"]
    assert environment == [(variable.name, variable.value) for variable in plan.env]
    dests = [values[-1] for option, values in walked if option in DEST_OPTIONS]
    assert dests == [entry.dest for entry in plan.entries]
    assert [values for option, values in walked if option == "--chdir"] == [[plan.chdir]]


def assert_correct(plan: Plan) -> None:
    """A plan nsconfine returned is one the lint passes, with sane destinations, the system's
    /proc, /dev and read-only root intact, and nothing injected into bwrap's options."""
    check_plan(plan)  # the lint, again: it must not refuse what the builder returned
    kinds = {entry.dest: entry.kind for entry in plan.entries if entry.kind is not Kind.REMOUNT_RO}
    assert kinds["/proc"] is Kind.PROC
    assert kinds["/dev"] is Kind.DEV
    assert any(e.kind is Kind.REMOUNT_RO and e.dest == "/" for e in plan.entries)
    for entry in plan.entries:
        assert entry.dest.startswith("/")
        assert os.path.normpath(entry.dest) == entry.dest
        assert not any(c in entry.dest for c in "\0\n\r")
        if entry.is_host_bind:
            assert entry.source.startswith("/"), entry
            assert "\0" not in entry.source
        os.fsencode(entry.dest)  # every path can reach the kernel
    assert_no_injection(plan, bwrap_reads(plan))
    plan.manifest()
    plan.manifest_json()


def assert_one_line(refused: NsconfineError) -> None:
    """A refusal is one line: no path or value in it may start another."""
    assert "\n" not in str(refused), f"a refusal of more than one line: {refused}"


def refused_or_correct(build: object) -> Plan | None:
    """Run build(): a plan is checked with assert_correct; a refusal must be ours."""
    assert callable(build)
    with no_hang():
        try:
            plan = build()
        except NsconfineError as refused:
            assert_one_line(refused)
            return None
        assert isinstance(plan, Plan)
        assert_correct(plan)
        return plan


# ------------------------------------------------------------------ the plan builder


@PROPERTY
@given(
    workspace=mostly("WS", paths()),
    run_dir=mostly("RUN", paths()),
    ro=mostly([], st.lists(paths(), max_size=3)),
    harness=mostly(
        [],
        st.lists(st.one_of(paths(), paths().map(lambda p: p + "@sha256:" + "0" * 64)), max_size=2),
    ),
    deny=mostly([], st.lists(paths(), max_size=2)),
    tool_socket=mostly(None, paths()),
    credential=mostly(None, paths()),
    protect=mostly([], st.lists(texts(), max_size=2)),
    unprotect=mostly([], st.lists(texts(), max_size=2)),
    setenv=mostly(
        [], st.lists(st.tuples(st.sampled_from(("A", "LANG", "B_1")), texts()), max_size=2)
    ),
)
def test_session_paths(
    places: Places,
    workspace: str,
    run_dir: str,
    ro: list[str],
    harness: list[str],
    deny: list[str],
    tool_socket: str | None,
    credential: str | None,
    protect: list[str],
    unprotect: list[str],
    setenv: list[tuple[str, str]],
) -> None:
    """Hostile paths in every path a Session takes give a refusal of ours or a correct plan."""
    refused_or_correct(
        lambda: nsconfine.Session(
            workspace=places.place(workspace),
            run_dir=places.place(run_dir),
            ro=[places.place(path) for path in ro],
            harness=[places.place(path) for path in harness],
            deny=[places.place(path) for path in deny],
            tool_socket=None if tool_socket is None else places.place(tool_socket),
            credential=None if credential is None else places.place(credential),
            protect=protect,
            unprotect=unprotect,
            setenv=setenv,
            user=SESSION_USER,
        ).plan()
    )


def binds() -> st.SearchStrategy[dict[str, object]]:
    """The fields of profile binds with hostile sources and destinations: nested, duplicated,
    over /proc and /dev, under a read-only bind."""
    return st.fixed_dictionaries(
        {
            "source": paths(),
            "dest": st.one_of(paths(), paths()),
            "mode": st.one_of(st.just("ro"), mostly("rw", texts())),
            "reason": mostly("a reason", texts()),
            "optional": st.booleans(),
            "mkdir": st.booleans(),
        }
    )


@PROPERTY
@given(
    given_binds=st.lists(binds(), max_size=4),
    ro=st.lists(real_paths(), max_size=3),
    user_option=mostly(None, texts()),
)
def test_session_binds(
    places: Places, given_binds: list[dict[str, object]], ro: list[str], user_option: str | None
) -> None:
    """Binds with hostile, duplicate and nested destinations, over /proc and /dev or under a
    read-only bind, give a refusal of ours or a correct plan."""
    user = SESSION_USER if user_option is None else user_option

    def build() -> Plan:
        placed = []
        for fields in given_binds:
            bind = Bind(**fields)  # type: ignore[arg-type]
            placed.append(
                bind.replace(source=places.place(bind.source), dest=places.place(bind.dest))
            )
        return nsconfine.Session(
            workspace=places.workspace,
            run_dir=places.run_dir,
            ro=[places.place(path) for path in ro],
            binds=placed,
            user=user,
        ).plan()

    refused_or_correct(build)


# ------------------------------------------------------------------ every Session keyword


# Anything at all a caller might pass: wrong types, bare strings, mappings, nested lists.
ODD_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 70000)
    | st.text(max_size=12)
    | st.binary(max_size=6)
    | st.sampled_from((Path("/usr"), Bind("/usr/share/doc", "/usr/share/doc", "ro", "docs"))),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=6), inner, max_size=2)
    ),
    max_leaves=6,
)


def _names(*known: str) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(known), texts())


_VARIABLES = _names("TERM", "CI", "LANG", "HOME", "A_1", "processes", "tmp", "shm")
_VALUE_TEXTS = _names("1", "512", "4M", "ci")

# Values of each shape the table of session options (nsconfine/_plan/options.py) names: an
# option added with a known shape is covered here without a word; one of a new shape fails
# until its values are added.
SHAPED: dict[str, st.SearchStrategy[object]] = {
    o.PATH: paths(),
    o.PATHS: st.lists(paths(), max_size=3),
    o.NAMES: st.lists(
        _names(".envrc", ".vscode", "deploy/x.yml", "anthropic", "openai", "python", "tls"),
        max_size=3,
    ),
    o.VARIABLES: st.lists(_VARIABLES, max_size=3),
    o.TEXT: _names("Ada Lovelace <ada@example.org>", "a reason"),
    o.CHOICE: texts(),  # and the row's own choices (keyword_values)
    o.SWITCH: st.booleans(),
    o.REASON: st.one_of(st.booleans(), texts()),
    o.ACCOUNT: st.one_of(st.sampled_from(("nobody", "root", 0, 65534)), texts()),
    o.VALUES: st.one_of(
        st.dictionaries(_VARIABLES, _VALUE_TEXTS, max_size=2),
        st.lists(st.builds("{}={}".format, _VARIABLES, _VALUE_TEXTS), max_size=2),
        st.lists(st.tuples(_VARIABLES, _VALUE_TEXTS), max_size=2),
    ),
    o.SPECS: st.lists(
        st.one_of(
            paths(),
            paths().map(lambda path: path + "@sha256:" + "0" * 64),
            _names("pypi.org", "*.example.org:8443", "listed.test=127.0.0.1", "[::1]:80"),
        ),
        max_size=2,
    ),
    o.RECORDS: st.lists(
        st.builds(Bind, paths(), paths(), st.sampled_from(("ro", "rw")), texts()), max_size=2
    ),
}


def keyword_values(option: o.Option) -> st.SearchStrategy[object]:
    """Values for option's keyword: mostly of its shape (its choices too), else anything."""
    shaped = SHAPED[option.shape]
    if option.choices:
        shaped = st.one_of(st.sampled_from(option.choices), shaped)
    # flatmap, not one_of: one_of does not weigh a branch by how often it is listed
    return st.sampled_from((shaped, shaped, shaped, ODD_VALUES)).flatmap(lambda chosen: chosen)


def placed(places: Places, value: object) -> object:
    """value with the WS and RUN stand-ins made real, in every path it holds."""
    if isinstance(value, str):
        return places.place(value)
    if isinstance(value, Bind):
        return value.replace(source=places.place(value.source), dest=places.place(value.dest))
    if isinstance(value, list | tuple):
        return type(value)(placed(places, item) for item in value)
    if isinstance(value, dict):
        return {key: placed(places, item) for key, item in value.items()}
    return value


@settings(PROPERTY, max_examples=400)
@given(option=st.sampled_from(o.SESSION_OPTIONS), data=st.data())
def test_every_session_keyword(places: Places, option: o.Option, data: st.DataObject) -> None:
    """Each keyword of the table of session options, given a value of its shape or anything at
    all, gives a refusal of ours or a correct plan, never a traceback; a Session keeps a
    list-shaped keyword's value as a tuple. (It iterates the table: a new option is covered.)"""
    value = placed(places, data.draw(keyword_values(option), label=option.name))
    keywords = {"workspace": places.workspace, "run_dir": places.run_dir, "user": SESSION_USER}

    def build() -> Plan:
        session = nsconfine.Session(**{**keywords, option.name: value})  # type: ignore[arg-type]
        assert isinstance(getattr(session, option.name), tuple) == option.repeatable
        return session.plan()

    refused_or_correct(build)


# ------------------------------------------------------------------ the Plan entries API


@PROPERTY
@given(
    kind=st.sampled_from(list(Kind)),
    dest=paths(),
    source=paths(),
    mode=st.sampled_from(list(Mode)),
    reason=texts(),
    name=texts(),
    value=texts(),
    chdir=paths(),
    without=paths(),
)
def test_plan_entries(
    places: Places,
    kind: Kind,
    dest: str,
    source: str,
    mode: Mode,
    reason: str,
    name: str,
    value: str,
    chdir: str,
    without: str,
) -> None:
    """An Entry, an EnvVar, a working directory or a `without` with hostile strings is refused
    with PlanError or UsageError, or gives a plan whose bwrap options carry every value as the
    value of its own option; the lint judges it without a traceback."""
    base = nsconfine.Session(
        workspace=places.workspace, run_dir=places.run_dir, user=SESSION_USER
    ).plan()
    source = places.place(source)
    content = b"x" if kind is Kind.DATA else None
    perms = 0o644 if kind is Kind.COPY else None
    with no_hang():
        try:
            entry = Entry(
                kind, places.place(dest), mode, reason, source=source, content=content, perms=perms
            )
            variable = EnvVar(name, value, Origin.SETENV)
            plan = base.replace(
                entries=(*base.entries, entry), env=(*base.env, variable), chdir=chdir
            )
            plan = Plan(
                plan.entries, env=plan.env, chdir=plan.chdir, deny=plan.deny, user=plan.user
            )
            shorter = plan.without(places.place(without))
        except NsconfineError:
            return
        for one in (plan, shorter):
            for entry in one.entries:
                if entry.is_host_bind:
                    assert entry.source.startswith("/"), entry
            try:
                read = bwrap_reads(one)
            except NsconfineError:
                pass
            else:
                assert_no_injection(one, read)
            try:
                check_plan(one)
            except NsconfineError:
                pass
            one.manifest()


# ------------------------------------------------------------------ profiles


def toml_string(text: str) -> str:
    """text as a TOML basic string (control characters escaped, as TOML requires)."""
    escaped = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or c in '\x7f"\\' else c for c in text)
    return f'"{escaped}"'


def encodable(text: str) -> str:
    """text without lone surrogates, which no TOML file can hold."""
    return text.encode("utf-8", "replace").decode("utf-8")


@PROPERTY
@given(
    source=paths(),
    dest=st.one_of(st.none(), paths()),
    mode=st.one_of(st.just("ro"), mostly("rw", texts())),
    optional=st.booleans(),
    mkdir=st.booleans(),
    include=mostly([], st.lists(paths(), max_size=2)),
    listed=st.lists(texts(), max_size=2),
    key=st.sampled_from(("pass_env", "protect", "unprotect", "deny")),
    credential=mostly(None, paths()),
    raw=mostly(None, st.binary(max_size=64)),
)
def test_profile_file(
    places: Places,
    tmp_path_factory: pytest.TempPathFactory,
    source: str,
    dest: str | None,
    mode: str,
    optional: bool,
    mkdir: bool,
    include: list[str],
    listed: list[str],
    key: str,
    credential: str | None,
    raw: bytes | None,
) -> None:
    """A profile file with hostile paths in its binds, includes, lists and credential, or of
    arbitrary bytes (non-UTF-8 too), is a usage error of ours or gives a correct plan."""
    lines = ['description = "hostile"']
    if include:
        lines.append(f"include = [{', '.join(toml_string(encodable(i)) for i in include)}]")
    lines.append(f"{key} = [{', '.join(toml_string(encodable(v)) for v in listed)}]")
    if credential is not None:
        lines.append(f"credential = {toml_string(encodable(places.place(credential)))}")
    lines += [
        "[[bind]]",
        f"source = {toml_string(encodable(places.place(source)))}",
        f"mode = {toml_string(encodable(mode))}",
        'reason = "hostile"',
        f"optional = {'true' if optional else 'false'}",
        f"mkdir = {'true' if mkdir else 'false'}",
    ]
    if dest is not None:
        lines.append(f"dest = {toml_string(encodable(places.place(dest)))}")
    content = raw if raw is not None else "\n".join(lines).encode()
    profile = tmp_path_factory.mktemp("profile") / "hostile.toml"
    profile.write_bytes(content)
    refused_or_correct(
        lambda: nsconfine.Session(
            workspace=places.workspace,
            run_dir=places.run_dir,
            profile=[str(profile)],
            user=SESSION_USER,
        ).plan()
    )


@PROPERTY
@given(name=paths())
def test_profile_names(name: str) -> None:
    """A hostile profile name or path is a usage error of ours, or a profile."""
    with no_hang():
        try:
            chain([name, name + ".toml"])
        except NsconfineError as refused:
            assert_one_line(refused)


# ------------------------------------------------------------------ the credential parser


@PROPERTY
@given(text=st.text(max_size=80), lines=st.lists(texts(), max_size=4))
def test_credential_text(text: str, lines: list[str]) -> None:
    """Any text is KEY=VALUE variables with valid names and no NUL or newline in a value, or a
    CredentialInsecure naming the line."""
    for candidate in (text, "\n".join(lines), "\n".join(f"K{i}={v}" for i, v in enumerate(lines))):
        try:
            variables = parse_environment_file(candidate, "/the/file")
        except nsconfine.CredentialInsecure:
            continue
        for name, value in variables.items():
            assert name.isidentifier()
            assert name.isascii()
            assert "\n" not in value


@PROPERTY
@given(content=st.binary(max_size=200), path=paths())
def test_credential_file(
    places: Places, tmp_path_factory: pytest.TempPathFactory, content: bytes, path: str
) -> None:
    """A credential file of arbitrary bytes, or a hostile path to one, gives variables that
    reach bwrap each as the value of its own --setenv, or a refusal of ours."""
    credential = tmp_path_factory.mktemp("credential") / "agent.env"
    credential.write_bytes(b"K=v\n" + content)
    credential.chmod(0o600)
    for given_path in (str(credential), places.place(path)):
        with no_hang():
            try:
                variables = read_credential(given_path)
            except NsconfineError as refused:
                assert_one_line(refused)
                continue
        try:
            env = [EnvVar(name, value, Origin.CREDENTIAL) for name, value in variables.items()]
        except NsconfineError:
            continue
        plan = Plan((), env=tuple(env))
        assert_no_injection(plan, bwrap_reads(plan))


# ------------------------------------------------------------------ the CLI


@contextlib.contextmanager
def terminal_streams() -> Iterator[tuple[io.BytesIO, io.BytesIO]]:
    """stdout and stderr as a UTF-8 terminal has them: stdout strict, stderr escaping what it
    cannot encode (Python's own defaults under a UTF-8 locale)."""
    out, err = io.BytesIO(), io.BytesIO()
    streams = (
        io.TextIOWrapper(out, encoding="utf-8", errors="strict", write_through=True),
        io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True),
    )
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = streams
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved
        for stream in streams:
            stream.detach()  # keep the bytes: closing a wrapper would close them


# Every session flag that takes a value (nsconfine/_plan/options.py): a new one is covered too.
OPTIONS = tuple(
    option.flag for option in o.SESSION_OPTIONS if option.flag and option.shape != o.SWITCH
)


@PROPERTY
@given(
    command=st.sampled_from(("plan", "plan --json", "plan --bwrap-args", "explain")),
    given_options=st.lists(st.tuples(st.sampled_from(OPTIONS), paths()), max_size=3),
    loose=st.lists(paths(), max_size=1),
)
def test_cli(
    places: Places, command: str, given_options: list[tuple[str, str]], loose: list[str]
) -> None:
    """`nsconfine plan` and `explain` with hostile option values exit 0 with their output, or
    non-zero with one line `nsconfine: CODE: …` on stderr; never a traceback."""
    argv = command.split()
    if command == "explain":
        argv.append(places.place(loose[0]) if loose else "/usr")
        loose = []
    argv += ["--workspace", places.workspace, "--run-dir", places.run_dir]
    argv += ["--user", SESSION_USER] if SESSION_USER else []
    for option, value in given_options:
        argv += [option, places.place(value)]
    argv += [places.place(value) for value in loose]
    with no_hang(), terminal_streams() as (out, err):
        status = main(argv)
    stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    if status == 0 or (command == "explain" and status == 1 and not stderr):
        assert not stderr, stderr
        if command == "plan --bwrap-args":
            assert all(isinstance(option, str) for option in json.loads(stdout))
        elif command == "plan --json":
            json.loads(stdout)
        return
    assert stderr.startswith("nsconfine: "), (status, stderr)
    assert stderr.count("\n") == 1, f"a refusal of more than one line: {stderr!r}"
    assert not stdout


def test_examples_reach_the_hostile_cases(places: Places) -> None:
    """The strategies do produce the inputs this file is about (a guard against a strategy
    that quietly stopped producing them)."""
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(path=hostile_paths())
    def collect(path: str) -> None:
        for label, present in (
            ("NUL", "\0" in path),
            ("newline", "\n" in path),
            ("leading dash", path.startswith("-")),
            ("dotdot", "/.." in path or path.startswith("..")),
            ("relative", not path.startswith("/")),
            ("non-UTF-8", "\udcff" in path or "\udc80" in path),
            ("PATH_MAX", len(path) >= PATH_MAX),
            ("proc", path.startswith("/proc")),
        ):
            if present:
                seen.add(label)

    collect()
    assert Path(places.workspace).is_dir()
    assert seen == {"NUL", "newline", "leading dash", "dotdot", "relative", "non-UTF-8",
                    "PATH_MAX", "proc"}  # fmt: skip
