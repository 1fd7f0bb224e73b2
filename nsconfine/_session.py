"""A role session's profile, and the mount plan it becomes.

The plan starts from an empty root and adds only: the read-only system paths the harness and its
tools need, the harness and the runner's files read-only, the workspace and run directory
read-write, the tool socket, a private /tmp, a new /proc and a minimal /dev, and an empty HOME
inside the run directory. Paths are the same inside as outside.
"""

from __future__ import annotations

import contextlib
import functools
import os
import posixpath
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence

from nsconfine import _arguments as a
from nsconfine._errors import NsconfineError, PlanError, UsageError, path_refusal
from nsconfine._kernel.accounts import (
    READ,
    SEARCH,
    WRITE,
    RunAs,
    access_problem,
    allows,
    password_home,
    refuse_records_in,
    run_as,
)
from nsconfine._kernel.syscalls import open_no_symlinks, realpath
from nsconfine._plan import model as p
from nsconfine._plan import network as _network
from nsconfine._plan.allowlist import Destination, Route
from nsconfine._plan.credential import read_credential
from nsconfine._plan.harness import harness_entries
from nsconfine._plan.limits import Limits, pairs, parse_value
from nsconfine._plan.mask import mask_entries, mask_rules
from nsconfine._plan.model import DenyRule, EnvVar, Kind, Mode, Origin, Plan
from nsconfine._plan.options import OPTIONS
from nsconfine._plan.profiles import Bind, Profile, chain
from nsconfine._plan.protect import (
    protected_names,
    protection,
    read_only_holder,
    writable_trees,
)
from nsconfine._plan.system import HOSTS, RESOLVER, own_hosts, system_entries
from nsconfine._policy.lint import (
    check_plan,
    default_deny,
    deny_paths,
    refuse_profiles_a_session_could_write,
    resolve,
)
from nsconfine._record import Record
from nsconfine._text import encodable, inside, is_env_name, printable, says_nothing, within

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import Any

    from nsconfine._plan.options import HomeMode, Network, PathArgument, WorkspaceMode

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# Up to this many runner files are bound one by one (their content stays live); more are copied.
COPY_FILES_ABOVE = 16

_DIGEST = r"[0-9a-f]{64}\Z"  # each pattern here is compiled when first used


class Harness(Record):
    """An executable the session runs (the agent), optionally pinned by its sha256."""

    FIELDS = ("path", "sha256")
    __slots__ = FIELDS
    path: str
    sha256: str | None

    def __init__(self, path: str, sha256: str | None = None) -> None:
        if not isinstance(path, str | os.PathLike) or not isinstance(os.fspath(path), str):
            raise UsageError(f"Harness(path) is a path (str or os.PathLike), not {path!r}")
        if sha256 is not None:
            import re

            if not isinstance(sha256, str) or not re.match(_DIGEST, sha256.lower()):
                raise UsageError(
                    f"Harness({os.fspath(path)!r}, {sha256!r}): the digest must be 64 hex digits"
                )
            sha256 = sha256.lower()
        self._set(path=os.fspath(path), sha256=sha256)

    @classmethod
    def parse(cls, spec: str) -> Harness:
        """`PATH` or `PATH@sha256:HEX`."""
        path, at, pin = spec.rpartition("@sha256:")
        if not at:
            return cls(spec)
        try:
            return cls(path, pin)
        except UsageError:
            raise UsageError(
                f"harness {spec!r}: the digest must be 64 hex digits after @sha256:"
            ) from None


class Session(Record):
    """What a role session needs; `plan()` turns it into the mount plan that confines it. Its
    keywords are the rows of nsconfine._plan.options, in their order (tests/test_options.py
    holds the signature to the table)."""

    FIELDS = tuple(OPTIONS)
    __slots__ = FIELDS
    workspace: str
    run_dir: str
    ro: tuple[str, ...]
    harness: tuple[Harness, ...]
    tool_socket: str | None
    pass_env: tuple[str, ...]  # names whose values are passed from the launcher, when set
    credential: str | None
    deny: tuple[str, ...]
    user: str | int | None  # the account to run as (a root launcher must name one)
    protect: tuple[str, ...]  # more paths the host trusts, relative to the workspace
    unprotect: tuple[str, ...]  # default protected names to leave writable
    network: Network | None  # "none" (None: the profile's, else none) or "host" (the launcher's)
    network_reason: str | None  # why the session shares the launcher's network (host needs one)
    allow_hosts: tuple[Destination, ...]  # what a proxy session may reach, each with its reason
    inject: tuple[str, ...]  # routes (nsconfine._plan.network.ROUTES) whose key the proxy holds
    audit: str | None  # the file the proxy appends a JSON line to for each connection
    allow_nested_userns: str | None  # why it may make user namespaces (None: it may not)
    setenv: tuple[tuple[str, str], ...]  # literal, non-secret values
    terminal_env: bool  # TERM, COLORTERM, LANG, LANGUAGE, the LC_ locale names, TZ, passed
    home_mode: HomeMode | None  # "persist" (RUN/home, kept; None: the profile's, else persist)
    # or "fresh" (an empty tmpfs each launch)
    git_identity: str | None  # "Name <email>" for commits
    profile: tuple[str, ...]  # profiles (built-in names or files), applied by plan()
    binds: tuple[Bind, ...]  # more host paths, each with its reason (from profiles)
    workspace_mode: WorkspaceMode | None  # "rw" (None: the profile's, else rw) or "ro"
    limits: tuple[
        tuple[str, int], ...
    ]  # the session's share, by name (nsconfine._plan.limits); the
    # rest at their defaults
    mask: tuple[str, ...]  # host paths shown empty and read-only wherever a bind holds them

    def __init__(
        self,
        *,
        workspace: PathArgument,
        run_dir: PathArgument,
        ro: Iterable[PathArgument] = (),
        harness: Iterable[PathArgument | Harness] = (),
        tool_socket: PathArgument | None = None,
        pass_env: Iterable[str] = (),
        credential: PathArgument | None = None,
        deny: Iterable[PathArgument] = (),
        user: str | int | None = None,
        protect: Iterable[str] = (),
        unprotect: Iterable[str] = (),
        network: Network | None = None,
        network_reason: str | None = None,
        allow_hosts: Iterable[Destination | str] = (),
        inject: Iterable[str] = (),
        audit: PathArgument | None = None,
        allow_nested_userns: bool | str | None = False,
        setenv: Mapping[str, str] | Iterable[str | tuple[str, str]] = (),
        terminal_env: bool = True,
        home_mode: HomeMode | None = None,
        git_identity: str | None = None,
        profile: str | Iterable[str] = (),
        binds: Iterable[Bind] = (),
        workspace_mode: WorkspaceMode | None = None,
        limits: Mapping[str, int | str] | Iterable[str | tuple[str, int | str]] = (),
        mask: Iterable[PathArgument] = (),
    ) -> None:
        # Each keyword checked for its shape first (nsconfine._arguments): a bare string where a
        # list is meant, a path where a Bind is, a mapping where names are, refused by name.
        harnesses = tuple(
            h if isinstance(h, Harness) else Harness.parse(os.fspath(h))
            for h in a.items("harness", harness, (str, os.PathLike, Harness))
        )
        if any(not h.path for h in harnesses):
            raise UsageError("a harness path is empty: name the harness executable (--harness)")
        harnesses = tuple(Harness(_path(h.path), h.sha256) for h in harnesses)
        if git_identity is not None:
            git_identity_parts(a.text("git_identity", git_identity))  # refused now if malformed
        if isinstance(pass_env, Mapping):
            raise UsageError(
                "Session(pass_env=...) names variables to pass from the launcher's environment; "
                "for values, give setenv={...}"
            )
        names = tuple(a.items("pass_env", pass_env, str))
        for name in names:
            if not is_env_name(name):
                raise UsageError(f"pass_env (--pass-env) {name!r} is not a variable name")
            if name == "HOME":
                raise UsageError("HOME cannot be passed: the session gets its own empty HOME")
        if isinstance(user, bool) or not isinstance(user, str | int | None):
            raise UsageError(f"Session(user=...): an account name or uid, not {user!r}")
        self._set(
            workspace=_path(a.path("workspace", workspace)),
            run_dir=_path(a.path("run_dir", run_dir)),
            ro=tuple(_path(r) for r in a.paths("ro", ro)),
            harness=harnesses,
            tool_socket=_optional_path("tool_socket", tool_socket),
            pass_env=names,
            credential=_optional_path("credential", credential),
            deny=tuple(_path(d) for d in a.paths("deny", deny)),
            user=_path_text(user) if isinstance(user, str) else user,
            protect=tuple(_path_text(name) for name in a.items("protect", protect, str)),
            unprotect=tuple(_path_text(name) for name in a.items("unprotect", unprotect, str)),
            network=a.choice("network", network),
            network_reason=a.optional_text("network_reason", network_reason),
            allow_hosts=tuple(
                d if isinstance(d, Destination) else Destination.parse(d, ALLOWED_BY_LAUNCHER)
                for d in a.items("allow_hosts", allow_hosts, (str, Destination))
            ),
            inject=tuple(a.items("inject", inject, str)),
            audit=_optional_path("audit", audit),
            allow_nested_userns=_nested_userns_reason(allow_nested_userns),
            setenv=tuple(_literal_values(a.pairs("setenv", setenv))),
            terminal_env=a.flag("terminal_env", terminal_env),
            home_mode=a.choice("home_mode", home_mode),
            git_identity=git_identity,
            profile=(profile,) if isinstance(profile, str) else a.items("profile", profile, str),
            binds=a.items("binds", binds, Bind, "give nsconfine.Bind(source, dest, mode, reason)"),
            workspace_mode=a.choice("workspace_mode", workspace_mode),
            limits=tuple(
                (name, parse_value(name, value)) for name, value in pairs(a.pairs("limits", limits))
            ),
            mask=tuple(_path(m) for m in a.paths("mask", mask)),
        )

    @property
    def home(self) -> str:
        """The session's HOME: an empty directory inside its run directory."""
        return os.path.join(self.run_dir, "home")

    def plan(self) -> Plan:
        """The checked mount plan (PlanError, CredentialMissing or CredentialInsecure if not)."""
        return build_plan(self)


def build_plan(
    session: Session,
    *,
    homes: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    lint: bool = True,
) -> Plan:
    """The plan for session, checked against the deny set of the invoking user's home plus
    `homes` (selftest's stand-in home), with pass_env's values taken from environ. lint=False
    leaves the lint to the launch that follows at once (spawn lints every plan afresh, while
    bwrap builds), so that a `run` does not lint twice in a row. An OSError on a path (one
    swapped while the plan was built, unreadable, too long) is a PlanError naming it."""
    try:
        return _build_plan(session, homes, os.environ if environ is None else environ, lint)
    except NsconfineError:  # some are OSErrors too (CredentialMissing): each says its own
        raise
    except OSError as error:
        raise path_refusal(error, "the plan") from error


def _build_plan(
    session: Session, homes: Sequence[str], environ: Mapping[str, str], lint: bool
) -> Plan:
    session, profile_deny, needs_credential, profile_files = with_profiles(session, environ)
    user = run_as(session.user)
    writable = READ | WRITE | SEARCH
    _require_directory(
        session.workspace,
        "workspace",
        user,
        writable if session.workspace_mode == "rw" else READ | SEARCH,
    )
    _require_directory(session.run_dir, "run directory", user, writable)
    if session.credential is None and needs_credential:
        raise PlanError(
            f"the {', '.join(needs_credential)} profile needs a credential: give "
            "--credential FILE (KEY=VALUE, mode 0600)"
        )
    deny = default_deny(homes, environ, user)
    if session.credential is not None:
        deny += tuple(
            deny_paths([session.credential], "the session's credential file", "--credential")
        )
    deny += (*profile_deny, *deny_paths(session.deny, "denied by --deny", "--deny"))
    deny += tuple(mask_rules(session.mask))
    for rule in deny:
        if rule.inside:
            continue  # only homes are denied "itself or above"
        home = resolve(rule.path)
        for name, where in (("workspace", session.workspace), ("run directory", session.run_dir)):
            if _is_same_or_above(resolve(where), home):
                raise PlanError(
                    f"the {name} {printable(where)} is the home directory {printable(rule.path)} "
                    f"({rule.origin}) or above it: use a directory of its own, e.g. "
                    f"{printable(rule.path)}/work/<session>"
                )
    system = system_entries(user, session.home)
    if (session.network or "none") != "host":  # (no resolver, and no host's names)
        system = tuple(
            own_hosts() if entry.dest == HOSTS else entry
            for entry in system
            if entry.dest != RESOLVER
        )
    own = session_entries(session, reserved=system)
    protected = session_protection(session, [*system, *own])
    env, routes, home_files = network_environment(
        session, session_environment(session, user, environ), environ
    )
    plan = Plan(
        [*system, *own, *home_files, *protected.entries],
        env=env,
        chdir=session.workspace,
        deny=deny,
        user=user,
        network=session.network or "none",
        network_reason=session.network_reason,
        destinations=session.allow_hosts,
        routes=routes,
        audit=session.audit,
        credential_needed=session.credential if credential_pending(session) else None,
        nested_userns=session.allow_nested_userns,
        protection=protected,
        limits=Limits.parse(session.limits),
    )
    refuse_profiles_a_session_could_write(plan, profile_files)  # read now, not at launch
    _refuse_writable_above(session, plan)
    _refuse_writable_binds_held_read_only(session, plan)
    if lint:
        check_plan(plan)  # first: a denied store is refused as one, never as out of reach
    _require_reachable(session, user)
    _require_runnable(plan, len(session.ro))
    return plan


def _require_runnable(plan: Plan, runner_paths: int) -> None:
    """Refuse a plan with more options than bwrap accepts, now rather than at launch."""
    from nsconfine._plan.bwrap_args import MAX_BWRAP_ARGUMENTS, bwrap_options

    count = len(bwrap_options(plan)) + 8  # and the command line: --args 3 -- the shim …
    if count > MAX_BWRAP_ARGUMENTS:
        raise PlanError(
            f"the plan takes {count} bwrap arguments, and bwrap accepts at most "
            f"{MAX_BWRAP_ARGUMENTS} ({runner_paths} read-only paths, most of the plan): give "
            "the directories that hold the runner files (--ro DIR) instead of listing each file"
        )


def _refuse_writable_above(session: Session, plan: Plan) -> None:
    """No writable bind but the workspace's own may show the workspace or a directory above
    it (the run directory among them): the host's git, run in the workspace, looks for a
    repository in each directory above, and would run the config of one the session made
    there (the scan looks only below)."""
    workspace = session.workspace
    real = resolve(workspace)
    writable = [(session.run_dir, "the run directory")] + [
        (entry.source, entry.reason)
        for entry in plan.entries
        if entry.kind is Kind.BIND and entry.mode is Mode.RW and entry.dest != workspace
    ]
    for source, reason in writable:
        if _is_same_or_above(resolve(source), real):
            raise PlanError(
                f"the writable bind {printable(source)} ({reason}) is at or above "
                f"the workspace {printable(workspace)}: the host's git, run in the workspace, "
                "would find a repository the session made there and run its config; give the "
                "workspace and the run directory side by side (e.g. /srv/s1/ws and /srv/s1/run)"
            )


def _is_same_or_above(path: str, other: str) -> bool:
    return path == other or path == "/" or other.startswith(path + "/")


def _require_directory(path: str, what: str, user: RunAs, bits: int) -> None:
    try:
        info = os.stat(path)
    except OSError as error:
        raise PlanError(f"the {what} {path} cannot be used: {error.strerror}") from error
    if not stat.S_ISDIR(info.st_mode):
        raise PlanError(f"the {what} {path} is not a directory")
    problem = access_problem(path, user, bits)
    if problem is not None:
        verb = "writable" if bits & WRITE else "readable"
        # Never advise handing / or a top-level directory (/usr, /home, ...) to the session;
        # nor path, where a directory above it is what the account cannot pass (root's home).
        real = os.path.realpath(path)
        if real.count("/") <= 1 or any(within(real, top) for top in _SYSTEMS_OWN):
            advice = f"pick a directory of its own: {path} is the system's"
        elif allows(info, user, bits):  # path itself is usable: a directory above is not
            advice = f"pick a directory {user.name} can reach"
        elif info.st_uid == user.uid:  # its own, and its mode shuts it out
            advice = f"chmod u+{_mode_letters(bits)} {path}"
        elif info.st_uid != os.geteuid():  # a third account's: not the launcher's to give
            advice = f"pick a directory {user.name} owns: {path} belongs to uid {info.st_uid}"
        else:
            advice = f"chown -R {user.name} {path}, or pick a directory it owns"
        raise PlanError(
            f"the {what} {path} is not {verb} by {user.name}, who runs the session "
            f"({problem}): {advice}"
        )


# The system's trees, whose directories are never to be handed to a session's account (chown).
_SYSTEMS_OWN = ("/usr", "/etc", "/proc", "/sys", "/dev", "/boot", "/bin", "/sbin", "/lib", "/lib64",
                "/run", "/var")  # fmt: skip


def _mode_letters(bits: int) -> str:
    """chmod's letters for bits (READ, WRITE, SEARCH)."""
    return "".join(
        letter for bit, letter in ((READ, "r"), (WRITE, "w"), (SEARCH, "x")) if bits & bit
    )


def _require_reachable(session: Session, user: RunAs) -> None:
    """What bwrap binds it binds as the session's account, so that account must reach it: the
    runner's files (and read them), the harness (and run it), the tool socket (and connect),
    each bind of its profiles (read, or read and write)."""
    needs = [(path, READ) for path in session.ro]
    needs += [(harness.path, READ | SEARCH) for harness in session.harness]
    for bind in session.binds:
        bits = READ if bind.mode == "ro" else READ | WRITE
        needs += [(source, bits) for source in bind_sources(bind)]
    if session.tool_socket is not None:
        needs.append((session.tool_socket, WRITE))
    for path, bits in needs:
        try:
            resolved = realpath(path)
        except OSError:
            continue  # missing: refused by name where the entry is made
        problem = access_problem(resolved, user, bits)
        if problem is not None:
            raise PlanError(
                f"{path} cannot be given to the session, which runs as {user.name}: {problem}; "
                "grant that account access, or run the session as one that has it"
            )


def session_entries(session: Session, reserved: Sequence[p.Entry] = ()) -> list[p.Entry]:
    """The session's own paths: harness, runner files, tool socket, workspace, run dir, HOME."""
    entries: list[p.Entry] = []
    writable = (realpath(session.workspace), realpath(session.run_dir)) if session.harness else ()
    # A harness link in a directory the plan binds as it is (/usr/bin/python3) shows there
    # already, and bwrap could not make it in that read-only bind.
    as_is = [e.dest for e in reserved if e.kind is Kind.BIND and e.source == e.dest]
    for harness in session.harness:
        for entry in harness_entries(harness.path, harness.sha256, writable):
            if entry.kind is Kind.SYMLINK and any(within(entry.dest, d) for d in as_is):
                continue
            if all(entry.dest != other.dest for other in entries):  # packages two share
                entries.append(entry)
    if session.tool_socket is not None:
        _require_exists(session.tool_socket, "tool socket")
        if not stat.S_ISSOCK(os.stat(session.tool_socket).st_mode):
            raise PlanError(f"the tool socket {session.tool_socket} is not a unix socket")
        entries.append(
            p.ro_bind(
                session.tool_socket,
                session.tool_socket,
                p.TOOL_SOCKET_REASON,
            )
        )
    if session.workspace_mode == "ro":
        entries.append(
            p.ro_bind(session.workspace, session.workspace, "the session's workspace, read-only")
        )
    else:
        entries.append(p.rw_bind(session.workspace, session.workspace, "the session's workspace"))
    if session.run_dir != session.workspace:
        entries.append(p.rw_bind(session.run_dir, session.run_dir, "the session's run directory"))
    entries += profile_entries(session, [*reserved, *entries])
    if session.home_mode == "fresh":
        entries.append(
            p.tmpfs(session.home, "the session's HOME: empty at every launch, gone after it")
        )
    else:
        entries.append(
            p.directory(
                session.home,
                "the session's HOME, inside its run directory: kept from launch to launch",
            )
        )
    if session.git_identity is not None:
        entries.append(gitconfig_entry(session.home, session.git_identity))
    entries += runner_entries(session.ro, [*reserved, *entries])
    covers = mask_entries(session.mask, [*reserved, *entries])
    return with_masks(entries, covers)


def with_masks(entries: list[p.Entry], covers: Sequence[p.Entry]) -> list[p.Entry]:
    """entries and the covers of masked paths; an entry at or below a cover is refused, being
    asked for and masked at once."""
    for entry in entries:
        if any(within(entry.dest, cover.dest) for cover in covers):
            raise PlanError(
                f"{printable(entry.dest)} is masked (--mask) and also given to the session by "
                f"a {entry.kind} entry ({printable(entry.reason)}): drop one of them"
            )
    return entries + list(covers)


def session_protection(session: Session, entries: Sequence[p.Entry]) -> p.Protection:
    """What keeps the files the host trusts read-only in the session's writable trees (the
    workspace, when it is writable, and each writable bind inside it), with the pins above
    every read-only path inside a writable bind."""
    refuse_records_in(
        realpath(e.source) for e in entries if e.kind is Kind.BIND and e.mode is Mode.RW
    )  # (the look at the trees remembers what it finds there)
    names = protected_names(session.protect, session.unprotect, session.workspace)
    return protection(entries, writable_trees(entries, session.workspace), names)


def runner_entries(paths: Sequence[str], others: Sequence[p.Entry]) -> list[p.Entry]:
    """The runner's read-only files and directories: a bind each, except that more than
    COPY_FILES_ABOVE files are copied into a read-only tmpfs per common directory, because
    bwrap re-reads /proc/self/mountinfo after every bind and n binds cost it O(n²). The
    sandbox shows exactly the same paths either way."""
    modes = {}
    for path in paths:
        try:
            modes[path] = os.stat(path).st_mode
        except OSError as error:
            raise PlanError(
                f"the read-only path {path} does not exist or cannot be used: {error.strerror}"
            ) from error
    _refuse_links_already_shown(paths, others)
    files = [path for path, mode in modes.items() if stat.S_ISREG(mode)]
    if len(files) <= COPY_FILES_ABOVE:
        return [p.ro_bind(path, path, "a file the runner loads (read-only)") for path in paths]
    dirs = [path for path, mode in modes.items() if not stat.S_ISREG(mode)]
    entries = [p.ro_bind(path, path, "a directory the runner loads (read-only)") for path in dirs]
    # A tmpfs may not replace another entry, nor hide part of a bound directory.
    taken = {entry.dest for entry in others} | set(dirs)
    bound = [entry.dest for entry in others if entry.kind is Kind.BIND] + dirs

    def usable(root: str) -> bool:
        return (
            root != "/"
            and root not in taken
            and not any(root.startswith(dest + "/") for dest in bound)
        )

    roots, leftover = _copy_roots(sorted(files), usable)
    reason = (
        f"a runner file copied at launch ({len(files)} files: a bind each would cost bwrap "
        "O(n²)); later edits on the host are not seen"
    )
    for root, members in roots.items():
        entries.append(p.tmpfs(root, f"holds only the {len(members)} runner files copied below"))
        # The copy's source is the file the path resolves to now; at launch it is opened
        # without following a symlink there, so a link swapped in later is refused.
        entries += [
            p.copy(realpath(member), member, reason, stat.S_IMODE(modes[member]) & 0o777)
            for member in members
        ]
        entries.append(p.remount_ro(root, "the copied runner files are read-only"))
    entries += [p.ro_bind(path, path, "a file the runner loads (read-only)") for path in leftover]
    return entries


def _refuse_links_already_shown(paths: Sequence[str], others: Sequence[p.Entry]) -> None:
    """Refuse a read-only path that is, or lies below, a symlink the session already sees: one
    inside a directory the plan binds (`--ro /usr/bin/python3`), or one of the plan's own
    links (`--ro /bin/true`, /bin -> usr/bin). bwrap cannot bind onto or through it: it follows
    the link, binds where that leads, and the launch is then refused as a race, or as mounts
    that differ from the plan."""
    binds = [entry.dest for entry in others if entry.kind is Kind.BIND] + list(paths)
    plan_links = {entry.dest for entry in others if entry.kind is Kind.SYMLINK}

    def shown_link(path: str) -> tuple[str, str] | None:
        """(path, where the session sees it) if path is a symlink the session sees."""
        if not os.path.islink(path):
            return None
        if path in plan_links:
            return path, "that the plan makes itself"
        holder = next((dest for dest in binds if dest != path and within(path, dest)), None)
        return None if holder is None else (path, f"inside {printable(holder)}")

    # directory -> the first link the session meets on its way there from /, if any (runner
    # files share their directories, which may lie thousands deep: each is looked at once)
    on_the_way: dict[str, tuple[str, str] | None] = {"/": None}
    for path in paths:
        unknown = []
        directory = posixpath.dirname(path)
        while directory not in on_the_way:
            unknown.append(directory)
            directory = posixpath.dirname(directory)
        for directory in reversed(unknown):  # from the top down
            above = on_the_way[posixpath.dirname(directory)]
            on_the_way[directory] = above if above is not None else shown_link(directory)
        above = on_the_way[posixpath.dirname(path)]
        if above is not None:
            link, shown = above
            raise PlanError(
                f"{printable(path)} lies through {printable(link)}, a symlink {shown}, which "
                "the session already sees: give the path it leads to "
                f"({printable(realpath(path))}), or drop it if the session sees that already"
            )
        if (here := shown_link(path)) is not None:
            raise PlanError(
                f"{printable(path)} is a symlink {here[1]}, which the session already sees "
                "(the link with it): drop it from the read-only paths, or give the file it "
                f"leads to ({printable(realpath(path))})"
            )


def _copy_roots(
    files: list[str], usable: Callable[[str], bool]
) -> tuple[dict[str, list[str]], list[str]]:
    """Files grouped under the deepest directory they share that is usable as a tmpfs root;
    files that sit directly in an unusable directory are left to be bound one by one. (Its own
    stack: runner files may lie thousands of directories deep.)"""
    roots: dict[str, list[str]] = {}
    leftover: list[str] = []
    pending = [files]
    while pending:
        group = pending.pop()
        root = os.path.dirname(group[0]) if len(group) == 1 else os.path.commonpath(group)
        if usable(root):
            roots[root] = group
            continue
        below_root: dict[str, list[str]] = {}
        for path in group:
            below = path[len(root.rstrip("/")) + 1 :].split("/", 1)
            if len(below) == 1:
                leftover.append(path)
            else:
                below_root.setdefault(os.path.join(root, below[0]), []).append(path)
        pending += reversed(below_root.values())
    return roots, leftover


# Passed from the launcher by default (terminal_env): how to draw and speak, never a secret.
# The terminal's and the locale's variables: LC_ALL and the locale's categories (glibc's), by
# name. Not any LC_ name: ssh's usual AcceptEnv LC_* makes LC_ a prefix that carries anything.
# fmt: off
TERMINAL_VARIABLES = frozenset({
    "TERM", "COLORTERM", "LANG", "LANGUAGE", "TZ", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME",
    "LC_COLLATE", "LC_MONETARY", "LC_MESSAGES", "LC_PAPER", "LC_NAME", "LC_ADDRESS",
    "LC_TELEPHONE", "LC_MEASUREMENT", "LC_IDENTIFICATION",
})
# fmt: on
# No control character: the identity is written into the session's .gitconfig.
_IDENTITY = (
    r"\s*(?P<name>[^<>\x00-\x1f\x7f]*[^<>\s\x00-\x1f\x7f])\s*"
    r"<(?P<email>[^<>\s\x00-\x1f\x7f]+)>\s*\Z"
)


def _literal_values(
    setenv: Mapping[str, str] | Iterable[str | tuple[str, str]],
) -> list[tuple[str, str]]:
    """setenv as (name, value) pairs: from a mapping, NAME=VALUE strings (--setenv), or
    pairs."""
    given = pairs(setenv, "--setenv")
    for name, value in given:
        if not is_env_name(name):
            raise UsageError(f"--setenv {name!r}=…: {name!r} is not a variable name")
        if name == "HOME":
            raise UsageError("--setenv cannot set HOME: the session gets its own")
        if not isinstance(value, str):
            raise UsageError(f"--setenv {name}: the value is a str, not {value!r}")
        if "\0" in value:
            raise UsageError(f"--setenv {name}: the value holds a NUL byte")
    return [(str(name), str(value)) for name, value in given]


def git_identity_parts(identity: str) -> tuple[str, str]:
    """("Name", "email") of a "Name <email>" identity, or UsageError."""
    import re

    found = re.match(_IDENTITY, identity)
    if found is None:
        raise UsageError(
            f"git identity '{printable(identity)}': give it as 'Name <email@example.org>'"
        )
    return found["name"], found["email"]


def gitconfig_entry(home: str, identity: str) -> p.Entry:
    """A generated, read-only HOME/.gitconfig: who commits, and that repositories of other
    owners (bound read-only) may be used."""
    name, email = git_identity_parts(identity)

    def quoted(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    text = f"[user]\n\tname = {quoted(name)}\n\temail = {quoted(email)}\n[safe]\n\tdirectory = *\n"
    return p.data(
        text.encode("utf-8", "surrogateescape"),  # as the caller gave it: git takes bytes
        os.path.join(home, ".gitconfig"),
        "the session's git identity (--git-identity), and safe.directory for repositories "
        "bound from other owners; generated, read-only",
    )


NESTED_USERNS_DEFAULT_REASON = "the session's harness sandboxes its own tools (bwrap inside)"


# The reason of a destination the launcher names without one (--allow-host, allow_hosts=).
ALLOWED_BY_LAUNCHER = "named by the launcher (--allow-host)"


def network_environment(
    session: Session, env: list[EnvVar], environ: Mapping[str, str]
) -> tuple[list[EnvVar], tuple[Route, ...], list[p.Entry]]:
    """A proxy session's environment: the relay's proxy variables instead of any the launcher
    passed, and for each injected route its base URL on the relay and a placeholder where the
    credential file's key was (the key goes to the route, for the launcher's proxy); the routes;
    and the files its harnesses read to find a route, generated read-only in its HOME. With any
    other network, neither routes nor files, and env as it is but on none: no launcher's proxy
    variable (passed by name, as the tls profile does), which names a proxy the session cannot
    reach, with any password in it, nor any launcher's value holding a URL with a credential."""
    network = session.network or "none"
    if network == "none":  # (nor a launcher's URL with a credential in it)
        kept = [v for v in env if not _launcher_proxy(v) and not _launcher_url_credential(v)]
        return kept, (), []
    if network != "proxy":
        return env, (), []
    credential = {v.name: v.value for v in env if v.origin is Origin.CREDENTIAL}
    injected = _network.injected(
        session.inject,
        credential,
        environ,
        pending=credential_pending(session),
        workspace=session.workspace,
    )
    replaced = {**injected.environment, **_network.PROXY_VARIABLES}
    kept = [
        v
        for v in env
        if v.name not in replaced
        and v.name not in _network.LAUNCHER_PROXY_VARIABLES
        and not _launcher_proxy(v)  # (a JVM's: it would take the JVM past the relay)
    ]
    files: list[p.Entry] = []
    for path, (text, reason) in injected.home_files.items():
        parent = os.path.dirname(path)  # made for the file, and kept: the harness's own
        if parent:
            files.append(p.directory(os.path.join(session.home, parent), f"holds: {reason}"))
        files.append(p.data(text.encode(), os.path.join(session.home, path), reason))
    new = [EnvVar(n, value, Origin.NSCONFINE) for n, value in replaced.items()]
    return [*kept, *new], injected.routes, files


def _launcher_proxy(variable: EnvVar) -> bool:
    """A launcher's proxy setting: a proxy variable, or a value that sets a JVM's proxy."""
    return variable.origin is Origin.LAUNCHER and (
        variable.name in _network.LAUNCHER_PROXY_VARIABLES
        or _network.sets_jvm_proxy(variable.value)
    )


def _launcher_url_credential(variable: EnvVar) -> bool:
    """A launcher's value that may hold a URL with a user or password in it (a private
    index's or registry's token, which the python and node profiles pass): an @ anywhere after
    a "://" (however the URLs are separated, a password holding a "/" too). On `none` such a
    value names a place the session cannot reach, so nothing it needs is lost; and a session
    that held the token could still write it where the host takes it from."""
    _before, found, after = variable.value.partition("://")
    return variable.origin is Origin.LAUNCHER and bool(found) and "@" in after


def _nested_userns_reason(allowed: bool | str | None) -> str | None:
    """allow_nested_userns as the plan keeps it: the reason it is allowed, or None."""
    if allowed is True:
        return NESTED_USERNS_DEFAULT_REASON
    if allowed is False or allowed is None:
        return None
    if isinstance(allowed, str) and not says_nothing(allowed):
        return allowed.strip()
    raise UsageError(
        "allow_nested_userns (--allow-nested-userns) is True, False or the reason it is "
        "allowed: say why the session makes user namespaces of its own"
    )


def credential_pending(session: Session) -> bool:
    """Whether the session names a credential file that is not there (yet): its plan can be
    shown and explained, and a launch of it is refused (Plan.credential_needed)."""
    if session.credential is None:
        return False
    try:
        os.lstat(session.credential)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False  # there, out of reach (a directory not searchable): read, and refused
    return False


def _require_exists(path: str, what: str) -> None:
    if not os.path.exists(path):
        shown = printable(path)
        if os.path.lexists(path):
            raise PlanError(f"the {what} {shown} is a symlink to nothing (a dangling symlink)")
        raise PlanError(f"the {what} {shown} does not exist")


def session_environment(session: Session, user: RunAs, environ: Mapping[str, str]) -> list[EnvVar]:
    """HOME, PATH, USER and LOGNAME; the terminal's and locale's variables; the literal values;
    the allowlisted variables; the credential's; then PWD."""
    harness_dirs = dict.fromkeys(os.path.dirname(h.path) for h in session.harness)
    path = ":".join([*harness_dirs, DEFAULT_PATH])
    chosen = {"HOME": session.home, "PATH": path, "USER": user.name, "LOGNAME": user.name}
    variables = {name: EnvVar(name, value, Origin.NSCONFINE) for name, value in chosen.items()}
    if session.terminal_env:
        for name, value in environ.items():
            if name in TERMINAL_VARIABLES:
                variables[name] = EnvVar(name, value, Origin.TERMINAL)
    for name, value in session.setenv:
        variables[name] = EnvVar(name, value, Origin.SETENV)
    for name in session.pass_env:
        if name in environ:
            variables[name] = EnvVar(name, environ[name], Origin.LAUNCHER)
    if session.credential is not None and not credential_pending(session):
        for name, value in read_credential(session.credential).items():
            if name in variables and variables[name].origin is not Origin.NSCONFINE:
                raise PlanError(
                    f"{name} comes both from pass_env (--pass-env) and from the credential file"
                )
            if name == "HOME":
                raise PlanError("the credential file cannot set HOME")
            variables[name] = EnvVar(name, value, Origin.CREDENTIAL)
    # bwrap sets PWD to the directory it starts the command in (the workspace), over any
    # value given: listed, as the session has it.
    variables["PWD"] = EnvVar("PWD", session.workspace, Origin.NSCONFINE)
    return list(variables.values())


# ------------------------------------------------------------------ profiles


# The options a profile gives one value of (a string): the session's own value wins.
_PROFILE_SCALARS = tuple(
    option for option in OPTIONS.values() if option.key is not None and not option.repeatable
)


def with_profiles(
    session: Session, environ: Mapping[str, str]
) -> tuple[Session, list[DenyRule], tuple[str, ...], tuple[str, ...]]:
    """session with its profiles applied (nsconfine._plan.profiles): each profile's values, in
    include order, then the session's own, which add to lists and win over scalars; every path
    a profile gives expanded here, once (_expand). Also the profiles' deny rules, each naming
    its profile (one whose variable is unset keeps its text, and matches nothing), the
    names of the profiles that refuse a launch without a credential file, and the files the
    profiles were read from."""
    scalars: dict[str, Any] = {}  # by keyword
    lists: dict[str, list[str]] = {key: [] for key in ("pass_env", "protect", "unprotect")}
    setenv: dict[str, str] = {}
    limits: dict[str, int] = {}
    masks: list[str] = []
    binds: list[Bind] = []
    deny: list[DenyRule] = []
    needs_credential: list[str] = []
    allow_hosts: list[Destination] = []
    inject: list[str] = []
    credential_where = network_where = inject_where = ""
    unprotected: list[tuple[Profile, list[str]]] = []  # each profile's own, judged once all are in
    profiles = chain(list(session.profile))
    for profile in profiles:
        values = profile.values
        protected: list[str] = []  # this profile's protect, expanded
        for key in lists:
            given = values.get(key, [])
            if key != "pass_env":  # protect, unprotect: names, or paths after a placeholder
                given = [_expand_name(t, session, environ, profile.where(key)) for t in given]
            lists[key] += given
            if key == "protect":
                protected = given
            elif key == "unprotect" and given:
                unprotected.append((profile, given))
        _refuse_what_the_session_would(profile, protected, session.workspace)
        if "network" in values:
            network_where = profile.where("network")
        setenv.update(values.get("setenv", {}))
        limits.update(values.get("limits", {}))
        for masked in values.get("mask", []):
            expanded = _expand(masked, session, environ, profile.where("mask"))
            if expanded is not None:  # it names a variable the launcher does not set
                masks.append(expanded)
        allow_hosts += [
            d.replace(reason=f"{d.reason} [profile {profile.name}]")
            for d in values.get("allow_hosts", [])
        ]
        inject += values.get("inject", [])
        if values.get("inject"):
            inject_where = profile.where("inject")
        for option in _PROFILE_SCALARS:
            if option.key in values:
                scalars[option.name] = values[option.key]
        if "credential" in values:
            credential_where = profile.where("credential")
        if values.get("requires_credential"):
            needs_credential.append(profile.name)
        origin = f"profile {profile.name}"
        for text in values.get("deny", []):
            path = _expand(text, session, environ, profile.where("deny"))
            deny.append(
                DenyRule(text if path is None else path, f"denied by {origin}", True, origin)
            )
        for number, bind in enumerate(profile.binds):
            source = _expand(
                bind.source, session, environ, profile.where(f"bind.{number}.source"), _glob_escape
            )
            dest = _expand(bind.dest, session, environ, profile.where(f"bind.{number}.dest"))
            if source is not None and dest is not None:  # else it names an unset variable
                reason = f"{bind.reason} [profile {profile.name}]"
                binds.append(bind.replace(source=source, dest=dest, reason=reason))
    for bind in session.binds:  # the API's own: relative to the caller, as its other paths
        source = _expand(bind.source, session, environ, escape=_glob_escape)
        dest = _expand(bind.dest, session, environ)
        if source is not None and dest is not None:
            binds.append(bind.replace(source=source, dest=dest))
    protect = [*lists["protect"], *session.protect]
    for profile, dropped in unprotected:  # (a name a later profile, or the session, protects)
        judged = functools.partial(protected_names, protect, dropped, session.workspace)
        _in_profile(profile, "unprotect", judged)
    network = session.network or scalars.get("network")
    if network == "host" and session.network is None:
        host_reason = session.network_reason or scalars.get("network_reason")
        _in_profile(None, network_where, lambda: p.require_network_reason("host", host_reason))
    if network is None:
        wants_proxy = allow_hosts or inject or session.allow_hosts or session.inject
        network = "proxy" if wants_proxy else "none"
    if network != "proxy" and (inject or session.inject):
        # A route is the proxy's: without one, the key its credential file holds would reach
        # the session's environment as any other of the file's variables.
        names = ", ".join(dict.fromkeys([*inject, *session.inject]))
        given = f"{inject_where}: " if inject and not session.inject else ""
        raise UsageError(
            f"{given}inject ({names}: --inject-for, or a profile's inject) has the launcher's "
            f"proxy hold the key, which only --network proxy has; with network {network} the key "
            "would be in the session's environment: use --network proxy (with --allow-host "
            "for what else it reaches), or leave the injection out"
        )
    if network != "proxy":  # a profile's allowlist is for a proxy session
        allow_hosts = []
    credential = session.credential
    if credential is None and "credential" in scalars:
        credential = _expand(scalars["credential"], session, environ, credential_where)
    applied = session.replace(
        profile=(),
        pass_env=tuple(dict.fromkeys([*lists["pass_env"], *session.pass_env])),
        protect=(*lists["protect"], *session.protect),
        unprotect=(*lists["unprotect"], *session.unprotect),
        setenv=(*setenv.items(), *session.setenv),
        limits=(*limits.items(), *session.limits),
        mask=(*masks, *session.mask),
        allow_hosts=tuple(dict.fromkeys([*allow_hosts, *session.allow_hosts])),
        inject=tuple(dict.fromkeys([*inject, *session.inject])),
        network=network,
        network_reason=session.network_reason or scalars.get("network_reason"),
        home_mode=session.home_mode or scalars.get("home_mode", "persist"),
        workspace_mode=session.workspace_mode or scalars.get("workspace_mode", "rw"),
        git_identity=session.git_identity or scalars.get("git_identity"),
        allow_nested_userns=session.allow_nested_userns or scalars.get("allow_nested_userns"),
        credential=credential,
        binds=tuple(binds),
    )
    return applied, deny, tuple(needs_credential), tuple(profile.path for profile in profiles)


def _in_profile(profile: Profile | None, key: str, check: Callable[[], object]) -> None:
    """Run check, which refuses a value as the session does (naming the command-line flag that
    gives it); a refusal names where the profile gave it instead (key: its key in profile, or,
    without profile, where already), which is all the user wrote."""
    try:
        check()
    except NsconfineError as error:
        where = key if profile is None else profile.where(key)
        raise type(error)(f"{where}: {error.message}") from None


def _refuse_what_the_session_would(profile: Profile, protect: list[str], workspace: str) -> None:
    """Refuse, by its file, line and key, a value of profile's of the right type that the
    session would refuse later: a route to inject that is none, a git identity or a reason
    for nested user namespaces of the wrong form, a path to protect (protect: as expanded)
    outside the workspace."""
    values = profile.values
    if protect:
        _in_profile(profile, "protect", lambda: protected_names(protect, (), workspace))
    for name in values.get("inject", []):
        _in_profile(profile, "inject", functools.partial(_network.route_kind, name))
    if "git_identity" in values:
        identity = values["git_identity"]
        _in_profile(profile, "git_identity", lambda: git_identity_parts(identity))
    if "allow_nested_userns" in values:
        allowed = values["allow_nested_userns"]
        _in_profile(profile, "allow_nested_userns", lambda: _nested_userns_reason(allowed))


# What a profile's path may name, filled in one pass (a value is never read again: a $ or a
# {workspace} in the workspace's own path is a character of it): a place, or $NAME / ${NAME}.
_TOKEN = (
    r"\{(workspace|run_dir|home|config)\}"
    r"|\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))"
)


def _as_is(value: str) -> str:
    return value


def _expand(
    text: str,
    session: Session,
    environ: Mapping[str, str],
    where: str | None = None,
    escape: Callable[[str], str] = _as_is,
) -> str | None:
    """A path with {workspace}, {run_dir}, {home}, {config}, $NAME and a leading ~ filled in;
    None if it names a variable the launcher's environment does not set. A profile's path
    (where: which file, line and key gave it) that is still relative once expanded is refused:
    it would be taken from the launcher's working directory. escape: applied to each value
    filled in (glob.escape for a bind's source, a pattern in which only the profile's own
    text may be a wildcard)."""
    import re

    # (an empty HOME is none: a profile's {config} became /.config)
    launcher_home = environ.get("HOME") or password_home(os.getuid()) or "/"
    config = environ.get("XDG_CONFIG_HOME") or os.path.join(launcher_home, ".config")
    places = {"workspace": session.workspace, "run_dir": session.run_dir,
              "home": session.home, "config": config}  # fmt: skip
    missing: list[str] = []

    def value(found: re.Match[str]) -> str:
        if found.group(1) is not None:
            return escape(places[found.group(1)])
        name = found.group(2) or found.group(3)
        given = environ.get(name, "")
        if not given:
            missing.append(name)
        return escape(given)

    expanded = re.sub(_TOKEN, value, text)
    if missing:
        return None
    if expanded == "~" or expanded.startswith("~/"):
        expanded = escape(launcher_home) + expanded[1:]
    elif expanded.startswith("~"):  # ~NAME: that account's home
        head, slash, rest = expanded.partition("/")
        home = os.path.expanduser(head)
        expanded = (escape(home) if home != head else head) + slash + rest
    if where is not None and not expanded.startswith("/"):
        raise UsageError(
            f"{where}: {text!r} gives {expanded!r}, not an absolute path (a relative one would "
            "be taken from the launcher's working directory)"
        )
    return _absolute(expanded)


def _expand_name(text: str, session: Session, environ: Mapping[str, str], where: str) -> str:
    """A profile's protect or unprotect name: one that begins with a placeholder
    ({workspace}/deploy.yml), a variable ($NAME/deploy.yml) or a ~ expanded as a path (then
    taken from the workspace, as an absolute --protect is), any other as it is (a name
    relative to each repository, such as a template's {{cookiecutter.name}}/deploy.yml, or a
    path). Left as it was, it named a directory "{workspace}" in the workspace, and protected
    nothing the profile meant."""
    if not text.startswith(_PLACES):
        return text
    expanded = _expand(text, session, environ, where)
    if expanded is None:  # a $NAME in it the launcher does not set: it names no one path
        raise UsageError(
            f"{where}: {text!r} names a variable the launcher's environment does not set"
        )
    return expanded


# As _TOKEN names them, then what _expand expands at the start of a path: $NAME, ${NAME}, ~.
_PLACES = ("{workspace}", "{run_dir}", "{home}", "{config}", "$", "~")


def _path(value: str | os.PathLike[str]) -> str:
    return _absolute(_path_text(os.fspath(value)))


def _optional_path(keyword: str, value: str | os.PathLike[str] | None) -> str | None:
    return None if value is None else _path(a.path(keyword, value))


def _absolute(path: str) -> str:
    """path made absolute and normalized; POSIX lets a path keep a leading "//", and inside the
    sandbox it is plain "/"."""
    return "/" + os.path.abspath(path).lstrip("/")


def _path_text(text: str) -> str:
    """text, if the kernel can take it as a path or name: no NUL byte, no lone surrogate."""
    if "\0" in text or not encodable(text):
        raise UsageError(
            f"{text!r} holds a NUL byte or a character no path can hold: give the name as the "
            "file system has it"
        )
    return text


def _glob_escape(value: str) -> str:
    import glob  # here: a session without binds (the default) never needs it

    return glob.escape(value)


def _literal(pattern: str) -> str | None:
    """The one path an expanded bind's source names, if it is no wildcard pattern (its
    wildcards all escaped: a value filled in, or the profile's own [*]); else None."""
    import re

    literal = re.sub(r"\[([*?[])\]", r"\1", pattern)
    return literal if _glob_escape(literal) == pattern else None


def bind_sources(bind: Bind) -> list[str]:
    """The host paths an expanded bind names: its source, or each path its glob matches."""
    import glob

    literal = _literal(bind.source)
    return [literal] if literal is not None else sorted(glob.glob(bind.source))


def profile_gives(name: str, session: Session, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(host path, reason) of each bind the profile `name` gives session itself (not through
    what it includes), expanded and globbed as a launch would."""
    applied, _, _, _ = with_profiles(session.replace(profile=(name,), binds=()), environ)
    own = f"[profile {name}]"
    return [
        (source, bind.reason)
        for bind in applied.binds
        if bind.reason.endswith(own)
        for source in bind_sources(bind)
    ]


def profile_entries(session: Session, others: Sequence[p.Entry]) -> list[p.Entry]:
    """The binds profiles give (and any Session(binds=...)), each with its reason. One the plan
    gives already, at that place or through a bind above it, is left out; one whose place the
    plan holds otherwise is refused."""
    entries: list[p.Entry] = []
    taken = {entry.dest: entry for entry in others}  # and the profiles' binds, as they come

    def shows(entry: p.Entry, source: str, mode: str) -> bool:
        return entry.kind is Kind.BIND and (entry.source, str(entry.mode)) == (source, mode)

    def already_shown(source: str, dest: str, mode: str) -> bool:
        # The same host path at the same place, in the same mode, through a bind above it.
        parent = dest
        while parent != "/":
            parent = os.path.dirname(parent)
            above = taken.get(parent)
            if above is not None and above.kind is Kind.BIND:
                return above.source + dest[len(parent) :] == source and str(above.mode) == mode
        return False

    for bind in session.binds:  # expanded by with_profiles
        source, dest = _literal(_path_text(bind.source)), _path_text(bind.dest)
        pairs = [(source, dest)] if source is not None else [(m, m) for m in bind_sources(bind)]
        for one_source, one_dest in pairs:
            _refuse_nsconfine_s_own(one_dest, bind, session.network == "proxy")
            there = taken.get(one_dest)
            if there is not None:
                if shows(there, one_source, bind.mode):
                    continue  # the very bind, given already
                raise PlanError(
                    f"{printable(one_dest)} is in the plan already ({there.kind.value} "
                    f"{printable(there.source or '')}, {there.mode}: {there.reason}): a "
                    f"profile's {bind.mode} bind of {printable(one_source)} there "
                    f"({printable(bind.reason)}) cannot be too; give it another destination"
                )
            if already_shown(one_source, one_dest, bind.mode):
                continue
            if not os.path.lexists(one_source):
                if bind.mkdir and bind.mode == "rw":
                    _make_bind_directory(one_source, session)
                elif bind.optional:
                    continue
                else:
                    raise PlanError(
                        f"{printable(one_source)} (a bind of the profile: {bind.reason}) does "
                        "not exist"
                    )
            make = p.rw_bind if bind.mode == "rw" else p.ro_bind
            entries.append(make(one_source, one_dest, bind.reason))
            taken[one_dest] = entries[-1]
    _refuse_mount_points_a_bind_lacks(entries, others)
    return entries


def _refuse_mount_points_a_bind_lacks(given: Sequence[p.Entry], others: Sequence[p.Entry]) -> None:
    """PlanError for a profile's read-only bind (given) above another entry's place whose
    source has no such place, or not of its kind (a directory for a directory; a file for a
    file, not through a link): bwrap could not make the mount point in it, and the launch
    would fail as if bwrap could not confine. (A profile's bind whose place the system's
    read-only binds lack, as /usr, fails in bwrap, its message naming the place.)"""
    for holder in given:
        if holder.kind is not Kind.BIND or holder.mode is not Mode.RO:
            continue
        for held in (*others, *given):
            below = inside(held.dest, holder.dest)
            if below is None:
                continue
            place = os.path.join(holder.source, below)
            if held.kind is Kind.REMOUNT_RO:
                continue  # (no mount point: it remounts one)
            if held.kind is Kind.SYMLINK:  # made there by bwrap, unless the very link is
                with contextlib.suppress(OSError):
                    if os.readlink(os.path.join(holder.source, below)) == held.source:
                        continue
                raise PlanError(
                    f"the read-only bind of {printable(holder.source)} at "
                    f"{printable(holder.dest)} ({printable(holder.reason)}) holds "
                    f"{printable(held.dest)} ({printable(held.reason)}), a symlink to "
                    f"{printable(held.source or '')} that bwrap cannot make in a read-only "
                    "bind, nor finds there; give the profile's bind another destination"
                )
            if held.kind in (Kind.BIND, Kind.COPY):
                a_directory = os.path.isdir(held.source)
            else:  # a tmpfs, a directory, /proc, /dev are directories; a data entry a file
                a_directory = held.kind is not Kind.DATA
            try:
                kind = stat.S_IFMT(os.lstat(place).st_mode)
            except OSError:
                kind = None
            if a_directory:
                fits = kind == stat.S_IFDIR
            else:
                fits = kind not in (None, stat.S_IFDIR, stat.S_IFLNK)
            if fits:
                continue
            raise PlanError(
                f"the read-only bind of {printable(holder.source)} at {printable(holder.dest)} "
                f"({printable(holder.reason)}) holds {printable(held.dest)} "
                f"({printable(held.reason)}), whose mount point its source lacks (no "
                f"{'directory' if a_directory else 'file'} at {printable(place)}) and bwrap "
                "cannot make in a read-only bind; give the profile's bind another "
                "destination, or a source that holds that place"
            )


def _refuse_nsconfine_s_own(dest: str, bind: Bind, relayed: bool) -> None:
    """PlanError for a bind at or in p.OWN_DIRECTORY, or one holding it in a proxy session
    (relayed): a proxy session's relay is bound at p.RELAY_DIRECTORY at each launch, and a bind
    there took its place, the session's traffic going past the allowlist the manifest shows."""
    if within(dest, p.OWN_DIRECTORY) or (relayed and within(p.RELAY_DIRECTORY, dest)):
        raise PlanError(
            f"a profile's {bind.mode} bind at {printable(dest)} ({printable(bind.reason)}) "
            f"would take nsconfine's own place, {p.OWN_DIRECTORY} (a proxy session's relay "
            f"is bound at {p.RELAY_DIRECTORY} at each launch); give it another destination"
        )


def _refuse_writable_binds_held_read_only(session: Session, plan: Plan) -> None:
    """PlanError for a writable bind the plan shows through a bind above it (and so gives no
    entry of its own) where a read-only one holds it: one inside a protected directory would
    not be writable, and is refused rather than dropped."""
    dests = {entry.dest for entry in plan.entries}
    for bind in session.binds:
        if bind.mode != "rw":
            continue
        source = _literal(_path_text(bind.source))
        places = [_path_text(bind.dest)] if source is not None else bind_sources(bind)
        for place in places:
            holder = None if place in dests else read_only_holder(plan.entries, place)
            if holder is not None:
                raise PlanError(
                    f"the writable bind of {printable(place)} ({printable(bind.reason)}) lies "
                    f"in {printable(holder.dest)}, which the plan keeps read-only "
                    f"({printable(holder.reason)}): the session could not write there; bind "
                    "another place, or --unprotect that name"
                )


def _make_bind_directory(path: str, session: Session) -> None:
    """Make a profile's missing writable directory (mkdir = true), only inside the workspace or
    run directory, without following a symlink, as the session's account."""
    parent, name = os.path.split(path)
    in_session = any(within(parent, top) for top in (session.workspace, session.run_dir))
    try:
        real_parent = realpath(parent)
    except OSError:
        real_parent = ""  # missing: refused as through a symlink, for want of a parent
    if not in_session or real_parent != parent:
        raise PlanError(
            f"{printable(path)} is made only inside the workspace or run directory, in a "
            "directory that exists, through no symlink"
        )
    try:  # a directory on the way swapped for a symlink since the check: refused
        parent_fd = open_no_symlinks(parent)
    except OSError as error:
        raise PlanError(f"{printable(path)} cannot be made: {error.strerror}") from error
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
        user = run_as(session.user)
        if os.geteuid() == 0 and user.uid != 0:
            _give_made_directory(parent_fd, name, (user.uid, user.gid))
    except FileExistsError:
        pass
    except OSError as error:
        raise PlanError(f"{printable(path)} cannot be made: {error.strerror}") from error
    finally:
        os.close(parent_fd)


def _give_made_directory(parent_fd: int, name: str, owner: tuple[int, int]) -> None:
    """Give the directory just made at name to owner, through an fd of it: the name may hold
    another directory a moment later, renamed over it (by a session, in a directory it writes),
    and one that is not the launcher's or not empty is refused, never given away."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, dir_fd=parent_fd)
    try:
        if os.fstat(fd).st_uid != os.geteuid() or os.listdir(fd):
            raise PlanError(f"{printable(name)} was replaced while it was made; nothing was run")
        os.fchown(fd, *owner)
    finally:
        os.close(fd)


def profiles_showing(path: str, session: Session) -> list[str]:
    """A line for each built-in profile whose own binds would show path (for `explain`)."""
    from nsconfine._plan.profiles import built_in

    lines: list[str] = []
    for name in built_in():
        try:
            given = profile_gives(name, session, os.environ)
        except NsconfineError:  # a profile this session cannot take (a missing credential)
            continue
        for source, reason in given:
            if within(path, source):
                lines.append(f"  --profile {name} would show it: {printable(reason)}")
                break
    return lines
