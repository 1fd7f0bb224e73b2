"""Files the host trusts, kept read-only inside the session's writable workspace.

A session writes its workspace; the host later runs git, direnv, editors and agents there,
which trust what they find: `git config core.fsmonitor '…'` in a workspace runs on the host's
next `git status`. So these paths are read-only in every session: at the top of each writable
tree of the workspace (the workspace itself, and each writable bind inside it: the reviewer's
notes) and in every repository inside one (any depth; not inside node_modules or a
virtualenv):

- an existing one is bound read-only onto itself (whatever it is: a file where a protected
  directory belongs is kept too, so that the directory cannot take its place);
- a missing one is made at launch as an empty file or directory, bound read-only (so it cannot
  be created), and removed after the session;
- every directory between the writable tree and a protected path is bound onto itself
  (writable, as it was), which makes it a mount point: renaming it (`mv .git .git.old`, then a
  fresh `.git/config`) fails with EBUSY instead of carrying the protection away.

What is a repository is decided as git decides it, by what a session cannot make look
otherwise before the next launch. Every directory is looked at, and what one is never hides
what another is:

- a directory holding a `.git` directory is a repository, whatever that .git holds (a
  session can move its HEAD away between launches, and back once its config is written);
  one whose `.git` is a file is a repository whose git directory that file names; a `.git`
  that is a symlink, a FIFO, a socket or a device is refused (git would follow or read it);
- a directory that looks bare (a HEAD beside objects, refs or a commondir, or objects and
  refs) is a git directory of its own, protected as a .git is, and is looked into as any
  other (a bare look-alike beside a .git hides neither);
- a directory holding a `.hg` directory is a Mercurial repository;
- and each git directory a launch of this workspace protected before stays protected while it
  is a directory (remembered in the launcher's records), so that one a session made look like
  nothing before a launch is still covered.

git's own trusted files are protected in every git directory of such a repository: its own
(.git), each submodule's (.git/modules/NAME), each linked worktree's (.git/worktrees/NAME),
and the one a `.git` file points to or a commondir names, where the session writes (its
workspace or run directory): `config` and `hooks` (git runs what they name), and `commondir`,
which names the directory git takes config and hooks from. A missing commondir is made holding
".", the git directory itself, which changes nothing for git. A pointer the session could
re-point (through a symlink of its own) is refused.

A plan keeps what its scan depended on (each directory listed, each file read, by identity):
every launch looks again (`refreshed`), and scans afresh if any of it changed, so a plan kept
across launches protects the repositories each launch finds.

The list is the caller's to extend (`--protect PATH`, relative to the workspace) or shorten
(`--unprotect NAME`). Anything else a session wrote (Makefiles, scripts, venvs, a repository
it created itself during the session) stays untrusted input to the host: `written_config`
names what the host runs that a session could write.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Iterable, Mapping, Sequence, Set

from nsconfine._errors import PlanError, SandboxUnavailable, refuse_if_short_of_fds
from nsconfine._kernel import syscalls as _syscalls
from nsconfine._kernel.accounts import RunAs
from nsconfine._kernel.stub_records import is_stub
from nsconfine._kernel.walk import walk_path
from nsconfine._plan import model as p
from nsconfine._plan.model import Kind, Mode, Plan, Protection
from nsconfine._text import file_kind, inside, printable, within

# What a scan depended on: a path and its identity then (None: it did not exist).
Observed = dict[str, tuple[int, int, int, int] | None]

# (name relative to a repository, what to make if missing, why the host trusts it). Names under
# .git/ apply to every git directory of the repository (see the module's docstring).
PROTECTED: tuple[tuple[str, str, str], ...] = (
    (".git/config", "file", "git runs what it names on the host (core.fsmonitor, aliases)"),
    (".git/config.worktree", "file", "git reads it as config with extensions.worktreeConfig"),
    (".git/hooks", "dir", "git runs these hooks on the host"),
    (".git/commondir", "commondir", "git takes its config and hooks from the directory it names"),
    (".gitmodules", "file", "git clones and runs submodule URLs and commands from it"),
    (".envrc", "file", "direnv runs it in the host's shell"),
    ("mise.toml", "file", "mise runs its hooks and env scripts on the host once trusted, by path"),
    (".mise.toml", "file", "mise runs its hooks and env scripts on the host once trusted, by path"),
    (".vscode", "dir", "the editor runs tasks and settings from it on the host"),
    (".idea", "dir", "the IDE runs run-configurations from it on the host"),
    # Whole: Claude Code loads most of what it holds at its start (settings and the hooks they
    # run, commands, agents, skills, rules, workflows), and submits the prompts of its
    # scheduled tasks by itself.
    (
        ".claude",
        "dir",
        "Claude Code on the host runs its settings' hooks, commands, agents, skills and "
        "workflows, and submits its scheduled tasks' prompts by itself",
    ),
    (".agents", "dir", "Codex on the host offers its skills to its model"),
    (".mcp.json", "file", "agents on the host start the MCP servers it names"),
    (".codex", "dir", "Codex on the host reads its settings and commands"),
    (".cursor", "dir", "Cursor on the host starts the MCP servers and runs the rules it names"),
    (".gemini", "dir", "Gemini CLI on the host starts the MCP servers its settings name"),
    (".zed", "dir", "Zed on the host runs its tasks and the language servers it names"),
    (".devcontainer", "dir", "VS Code runs its initializeCommand on the host"),
    (".devcontainer.json", "file", "VS Code runs its initializeCommand on the host"),
    (".bashrc", "file", "a shell started here on the host runs it"),
    (".zshrc", "file", "a shell started here on the host runs it"),
    (".profile", "file", "a login shell started here on the host runs it"),
    (".bash_profile", "file", "a login shell started here on the host runs it"),
    (".bash_login", "file", "a login shell started here on the host runs it"),
    (".bash_logout", "file", "a login shell started here on the host runs it as it exits"),
    (".zshenv", "file", "every zsh started here on the host runs it, scripts too"),
    (".zprofile", "file", "a login shell started here on the host runs it"),
    (".zlogin", "file", "a login shell started here on the host runs it"),
    (".zlogout", "file", "a login shell started here on the host runs it as it exits"),
    (".hg/hgrc", "file", "Mercurial runs the hooks and extensions it names on the host"),
    (".hg/hgrc-not-shared", "file", "Mercurial reads it as .hg/hgrc (5.7 on)"),
    (".hg/sharedpath", "file", "Mercurial reads the .hg/hgrc of the repository it names"),
)

# The repository scan looks through at most this many directories, never into these (large
# and generated); past it the plan is refused rather than protecting less than it says.
REPOSITORY_SCAN = 20_000
# And at most this many entries in all (files too: a session may make millions in one
# directory, each costing every launch time), keeping only what it needs of each directory
# (_Listing); past it the plan is refused as well.
ENTRIES_SCANNED = 1_000_000
NOT_SCANNED = frozenset({"node_modules", ".venv", "venv", "__pycache__", ".tox"})
# Names inside a version control directory, protected only where that directory is (as git's
# are): an empty read-only stand-in would stop `hg init`, and look like a repository.
ONLY_WHERE_PRESENT = (".hg/",)
# What the host's agents and editors read from the directory they are started in, which may
# be any directory of a workspace (`cd packages/app && claude`). Below the top and outside a
# repository's root nothing keeps it read-only (no stub can wait in every directory), so what
# a session made or changed there is named once it has ended (written_config). Shell startup
# files are read from HOME, not the working directory; git's and Mercurial's, at a root.
_SHELL_STARTUP = frozenset(
    {".bashrc", ".zshrc", ".profile", ".bash_profile", ".bash_login", ".bash_logout", ".zshenv",
     ".zprofile", ".zlogin", ".zlogout"}
)  # fmt: skip
STARTED_IN = frozenset(
    name.split("/", 1)[0]
    for name, _kind, _reason in PROTECTED
    if not name.startswith((".git", ".hg")) and name not in _SHELL_STARTUP
)
# How much of all such config the report looks through for what changed, at any depth
# (.claude/skills/NAME/SKILL.md); past either, the writable trees are named.
_STARTED_IN_ENTRIES = 20_000
_STARTED_IN_SECONDS = 2.0
# What a launch spends on a workspace: every protected path and pinned directory is a mount
# point, bwrap's set-up time grows with the square of their number (bwrap reads its mount
# table again after each), and a live session holds an fd on each. A score of repositories
# fit; past this the plan is refused, not protected less.
MAX_PROTECTED_MOUNTS = 400
REPOSITORIES_SHOWN = "about 12"  # how many repositories that is, for the refusal
# The entries of a git directory that are git's own: never looked into for the git directory
# of a submodule whose name continues that of the one it is in.
_GIT_DIRECTORY_PARTS = frozenset({"objects", "refs", "hooks", "info", "logs", "lfs", "branches"})
# What is read of a file git reads whole (a .git pointer, a commondir, a remembered list): past
# this it is refused, not read in part (git would read what the plan did not).
_WHOLE_FILE_BYTES = 1 << 20

PIN_REASON = (
    "a mount point of itself, writable as before: renaming it cannot carry the read-only "
    "paths below it away (EBUSY)"
)


def protected_names(
    protect: Iterable[str], unprotect: Iterable[str], workspace: str
) -> list[tuple[str, str, str]]:
    """The default list less unprotect, plus protect (each a path relative to a repository,
    or an absolute one inside workspace, taken relative to it). An unprotect that names
    neither a default nor a protect name is refused: dropped without a word, a typo (or a
    directory whose files the list names) left the caller believing a path writable."""
    extras = [_protected_name(extra, workspace, "--protect") for extra in protect]
    dropped = {_protected_name(name, workspace, "--unprotect") for name in unprotect}
    known_names = [name for name, _, _ in PROTECTED] + extras
    unknown = sorted(dropped.difference(known_names))
    if unknown:
        raise PlanError(
            f"--unprotect {', '.join(map(printable, unknown))} names no protected path: it "
            "takes a name as `nsconfine plan` lists it below each repository, one of "
            + ", ".join(name for name, _, _ in PROTECTED)
            + ", or a --protect name"
        )
    names = [item for item in PROTECTED if item[0] not in dropped]
    known = {name for name, _, _ in names}
    for name in extras:
        if name not in known and name not in dropped:
            names.append((name, "file", "named by --protect: the host trusts it"))
            known.add(name)
    return names


def _protected_name(extra: str, workspace: str, option: str) -> str:
    """A --protect (or --unprotect) path as a name relative to each repository. An absolute
    one is taken from the workspace (as users mean it), or refused outside it: its leading "/"
    was once stripped, and WORKSPACE/deploy.yml protected WORKSPACE/tmp/.../deploy.yml
    instead."""
    relative = extra
    if extra.startswith("/"):
        path = "/" + os.path.normpath(extra).lstrip("/")  # POSIX keeps a leading "//"
        found = "." if path == workspace else inside(path, workspace)
        if found is None:
            raise PlanError(
                f"{option} {printable(extra)} lies outside the workspace "
                f"{printable(workspace)}: name it relative to the workspace ({option} "
                "deploy.yml), which names it in each repository too"
            )
        relative = found
    name = os.path.normpath(relative.strip("/"))
    if name == ".":
        raise PlanError(
            f"{option} {printable(extra)} is the workspace itself: name a path inside it (or "
            "keep the whole workspace read-only: --workspace-mode ro)"
        )
    if name == ".." or name.startswith("../"):
        raise PlanError(f"{option} {printable(extra)} must lie inside the workspace")
    return name


def writable_trees(entries: Sequence[p.Entry], workspace: str) -> tuple[tuple[str, str], ...]:
    """The writable binds scanned as a workspace is, (dest, source) each: the workspace itself
    when the session writes it, and every writable bind inside it (its dest lies there)."""
    return tuple(
        (entry.dest, entry.source)
        for entry in entries
        if entry.kind is Kind.BIND and entry.mode is Mode.RW and within(entry.dest, workspace)
    )


def protection(
    entries: Sequence[p.Entry],
    trees: Sequence[tuple[str, str]],
    names: Sequence[tuple[str, str, str]],
) -> Protection:
    """What protects the files the host trusts in trees, for a plan of entries (which the
    result's entries do not repeat): the read-only entries, the pins above them and above
    every other entry inside a writable bind, and what the scan depended on."""
    return _protection(entries, trees, names)[0]


def _protection(
    entries: Sequence[p.Entry],
    trees: Sequence[tuple[str, str]],
    names: Sequence[tuple[str, str, str]],
) -> tuple[Protection, _Scan]:
    scan = _Scan(entries)
    found: dict[str, p.Entry] = {}
    if names:
        for dest, source in trees:
            for entry in scan.tree(dest, source, names, trees):
                found.setdefault(entry.dest, entry)
    taken = {entry.dest for entry in entries}
    # Where the sandbox shows content of nsconfine's own inside a writable tree (a masked
    # path's empty cover), nothing of the host's is there to protect.
    covers = [
        e.dest
        for e in entries
        if e.kind in (Kind.TMPFS, Kind.DATA) and any(inside(e.dest, d) for d, _ in trees)
    ]
    kept = [
        entry
        for dest, entry in found.items()
        if dest not in taken and not any(within(dest, cover) for cover in covers)
    ]
    # Where a read-only bind (a protected directory, an --ro one) is the innermost entry that
    # holds a place, the place is read-only: nothing there needs protecting, and nothing
    # derived may be mounted there, as a repository's writable entries (the pins above its
    # files) would make it writable below them. A writable bind inside it makes its own
    # places writable again, to be protected as any.
    holders = _holders([*entries, *kept])
    protected = [entry for entry in kept if _read_only_holder(holders, entry.dest) is None]
    pins = pin_parents([*entries, *protected])
    derived = (*protected, *pins)
    if len(derived) > MAX_PROTECTED_MOUNTS:
        tops = ", ".join(printable(dest) for dest, _ in trees)
        shown = ", ".join(printable(path) for path in scan.found[:5])
        more = len(scan.found) - 5
        raise PlanError(
            f"protecting the files the host trusts in {tops} takes {len(derived)} read-only "
            f"mount points, and a launch makes at most {MAX_PROTECTED_MOUNTS} "
            f"({REPOSITORIES_SHOWN} repositories: bwrap's set-up time grows with the square of "
            f"their number); they are for {len(scan.repositories)} repositories (counting "
            f"the workspace's top) and "
            f"{len(scan.found)} git directories ({shown}"
            f"{f' and {more} more' if more > 0 else ''}; one a launch protected before stays "
            "protected while it is a directory, whatever it holds now): remove the "
            "repositories and directories the session does not need from its workspace, or "
            "--unprotect the names it does not need (such as --unprotect .idea)"
        )
    observed, contents = tuple(scan.observed.items()), tuple(scan.contents.items())
    return Protection(tuple(trees), tuple(names), derived, observed, contents), scan


# What the latest look at a plan's protection found and depended on: a launch's own stubs
# change the workspace, and the next launch need not look through it again; and a look that
# finds what the last one did gives the very plan built then (whose options are encoded once).
# id(plan) -> (plan, what the look found, what it depended on: the paths it looked at, packed
# once (every launch asks whether any of them changed, in one call), the files it read, and
# the identities it saw, as a report after a launch judges by them: Seen).
Seen = tuple[tuple[str, tuple[int, int, int, int] | None], ...]
_Depended = tuple[_syscalls.PathIdentities, tuple[tuple[str, str | None], ...], Seen]
_latest: dict[int, tuple[Plan, Plan, _Depended]] = {}


def refreshed(plan: Plan) -> Plan:
    """plan as a launch now must run it: its protection found afresh if anything its scan
    depended on changed since (a repository made, a stub gone) and what it finds differs,
    else plan itself (or the plan an earlier call found, if it still holds). A directory's
    identity (device, inode, modification and change times, to the nanosecond) changes
    whenever it gains, loses or renames an entry, a file's whenever it is written (but through
    a mapping: the files whose content the look read are read again)."""
    return refreshed_and_seen(plan)[0]


def refreshed_and_seen(plan: Plan) -> tuple[Plan, Seen]:
    """refreshed(plan), and what the look it judged by saw (path, identity), which the report
    after the launch judges "moved into view" by: a plan launched again and again keeps the
    scan it was built with, whatever has been looked at since."""
    kept = plan.protection
    if kept is None:
        return plan, ()
    latest = _latest.get(id(plan))
    if latest is None or latest[0] is not plan:
        latest = _remember(plan, plan, kept)
    current, (looked_at, read, seen) = latest[1], latest[2]
    if not looked_at.any_changed() and all(_read_again(path) == raw for path, raw in read):
        return current, seen
    base = _base_entries(plan)
    fresh = protection(base, kept.trees, kept.names)
    assert current.protection is not None
    if fresh.entries != current.protection.entries:
        current = (
            plan
            if fresh.entries == kept.entries
            else plan.replace(entries=(*base, *fresh.entries), protection=fresh)
        )
    _remember(plan, current, fresh)
    return current, fresh.observed


def _remember(plan: Plan, found: Plan, look: Protection) -> tuple[Plan, Plan, _Depended]:
    """Keep what a look at plan's protection found and what it depended on (plan kept with
    them: its id stays its own)."""
    if len(_latest) >= 64:
        _latest.clear()
    depended = (_syscalls.PathIdentities(look.observed), look.contents, look.observed)
    latest = _latest[id(plan)] = (plan, found, depended)
    return latest


def _read_again(path: str) -> str | None:
    """The digest of a file the look read, read as it did (_read_whole), now."""
    return _digest_of(_syscalls.read_untrusted(path, _WHOLE_FILE_BYTES + 1))


def _digest_of(raw: bytes | None) -> str | None:
    from nsconfine._digest import sha256_hex

    return None if raw is None else sha256_hex(raw)


def written_config(
    plan: Plan,
    bound: Mapping[str, tuple[int, int, int]] | None = None,
    since: float = 0.0,
    seen: Seen | None = None,
) -> list[str]:
    """The host paths the host runs or trusts that a session of plan could write, looked for
    once it has ended: each one a scan finds now (a repository the session made, a git
    directory it revealed) that no read-only entry of plan covered; each protected file the
    host itself replaced while the session ran (`git config` renames config.lock over
    .git/config: the read-only bind held the old file, the session could write the new one),
    by the identities the launch bound (bound: dest -> (device, inode, change time), as an
    inode number is reused at once); each repository an index written since the session began
    (since: a time.time()) records as a gitlink that the scan does not reach (one in
    node_modules, which the host's `git status` enters); and each symlink made since that
    leads to a directory the session could write and the scan did not look through (a
    repository the session made in its run directory, which the host's git would enter
    through it). And what lies in a directory the launch did not see there (seen: what
    refreshed_and_seen gave the launch; plan's own scan's if None), whatever its times.
    A workspace that can no longer be scanned (a planted .git symlink) is named itself."""
    kept = plan.protection
    if kept is None:
        return []
    try:
        return _written_config(
            plan, kept, bound or {}, since, kept.observed if seen is None else seen
        )
    except (PlanError, OSError):  # the report cannot be told: name what it would look through
        return _tree_sources(kept)


def _tree_sources(kept: p.Protection) -> list[str]:
    """The host paths of the writable trees: what a report names when it cannot say more."""
    return [source for _dest, source in kept.trees]


def _written_config(
    plan: Plan,
    kept: p.Protection,
    bound: Mapping[str, tuple[int, int, int]],
    since: float,
    seen: Seen,
) -> list[str]:
    base = _base_entries(plan)
    fresh, scan = _protection(base, kept.trees, kept.names)
    holders = _holders(plan.entries)
    written: list[str] = []
    for entry in fresh.entries:
        if entry.mode is not Mode.RO or not os.path.lexists(entry.source):
            continue
        covering = _innermost(holders, entry.dest)
        if covering is None or not _read_only_bind(covering):
            written.append(entry.source)
        elif bound and covering.dest == entry.dest and covering.dest in bound:
            info = os.lstat(entry.source)
            if (info.st_dev, info.st_ino, info.st_ctime_ns) != bound[covering.dest]:
                written.append(entry.source)  # replaced while the session ran
    launched = _SeenAtLaunch(seen)
    written += _gitlinks_unscanned(scan, since, plan.user, launched)
    written += _links_unscanned(plan, scan, since, launched)
    written += _started_in_written(kept, holders, scan, since, launched)
    return list(dict.fromkeys(written))


class _SeenAtLaunch:
    """The directories the launch's look saw, to tell those it did not see where they are now:
    one a session renamed out of node_modules (never looked into) changed its own times, and
    nothing it holds, whose times then say nothing of when it came into view. So what lies
    directly in a directory unseen at launch is judged new, whatever its times."""

    def __init__(self, seen: Seen) -> None:
        # By device and inode: a directory seen changes its times whenever it gains an entry.
        self.seen = {path: identity[:2] for path, identity in seen if identity}

    def unseen(self, directory: str) -> bool:
        """Is directory (a real path) one the launch's scan did not see there?"""
        try:
            info = os.lstat(directory)
        except OSError:
            return True
        return self.seen.get(directory) != (info.st_dev, info.st_ino)

    def swapped(self, directory: str, info: os.stat_result, trees: Sequence[str]) -> bool:
        """Is directory (a real path, its lstat info) below the top of a writable tree (trees:
        their real paths) and not what the launch saw there? A session that renames one
        directory away and another into its place changes no time of what they hold."""
        inside_a_tree = any(inside(directory, top) is not None for top in trees)
        return inside_a_tree and self.seen.get(directory) != (info.st_dev, info.st_ino)


def _started_in_written(
    kept: p.Protection,
    holders: Mapping[str, p.Entry],
    scan: _Scan,
    since: float,
    launched: _SeenAtLaunch,
) -> list[str]:
    """The config the host's tools read where they are started that the scan met below a
    tree's top, not inside a read-only bind, made or changed since `since`, at any depth (a
    link to it followed: what it leads to is the config). Past _STARTED_IN_ENTRIES entries
    in all, or _STARTED_IN_SECONDS, the writable trees are named instead."""
    budget = _Budget(_STARTED_IN_ENTRIES, _STARTED_IN_SECONDS)
    ways = _Ways(since, launched, [resolved for _dest, resolved, _written in scan.writable])
    found = []
    for path in scan.started_in:
        named = scan.shown(path)
        if named is None or _read_only_bind(_innermost(holders, named[0])):
            continue
        changed = launched.unseen(os.path.dirname(path)) or _changed_within(path, ways, budget)
        if changed is None:
            return _tree_sources(kept)
        if changed:
            found.append(named[1])
    return found


class _Budget:
    """What a look through files may spend: entries and seconds, for all it looks at."""

    def __init__(self, entries: int, seconds: float) -> None:
        self.entries = entries
        self.deadline = time.monotonic() + seconds

    def spend(self) -> bool:
        """One entry more; False once either is spent."""
        self.entries -= 1
        return self.entries >= 0 and time.monotonic() < self.deadline


def _changed_within(path: str, ways: _Ways, budget: _Budget) -> bool | None:
    """Did path, or anything below it, change since ways.since? Each link met, path itself
    among them, is judged by its way (_Ways.changed) and followed: what the host's tool reads
    is what it leads to, which a later session may rewrite in place. None once budget is
    spent."""
    pending = [path]
    while pending:
        where = pending.pop()
        try:
            info = os.lstat(where)
            if stat.S_ISLNK(info.st_mode):
                if ways.changed(where):
                    return True
                info = os.stat(where)
        except OSError:
            continue  # gone, or a link to nothing: nothing for the host to read
        if max(info.st_mtime, info.st_ctime) >= ways.since:
            return True
        if not stat.S_ISDIR(info.st_mode):
            continue
        try:
            with os.scandir(where) as entries:
                for entry in entries:
                    if not budget.spend():
                        return None
                    pending.append(entry.path)
        except OSError:
            return True  # cannot be looked through: named
    return False


class _Ways:
    """What a session's end needs to judge the way a link of config leads: when the session
    began, what its launch saw, and the writable trees' real paths."""

    def __init__(self, since: float, launched: _SeenAtLaunch, trees: Sequence[str]) -> None:
        self.since = since
        self.launched = launched
        self.trees = trees

    def changed(self, path: str) -> bool:
        """Did a link met resolving path (path itself among them, if one) change since
        `since`, or a directory on the way in a writable tree (one renamed into its place),
        or does the way pass through /proc or /dev/fd, which lead elsewhere for each process
        that follows them, or loop? What the host's tool reads through path depends on each
        of them (a link in node_modules that the way passes, re-pointed at an older file)."""

        def look(here: str) -> str | bool | None:
            if any(within(here, top) for top in _PER_PROCESS):
                return True
            try:
                info = os.lstat(here)
                if not stat.S_ISLNK(info.st_mode):  # walked into, unless renamed into place
                    if stat.S_ISDIR(info.st_mode) and self.launched.swapped(here, info, self.trees):
                        return True
                    return None
                target = os.readlink(here)
            except OSError:
                return False  # leads nowhere yet: what is made there later is new
            return True if max(info.st_mtime, info.st_ctime) >= self.since else target

        return walk_path(path, look, past_the_bound=True)[0] is True


# The most links made during a session that its end looks at, each resolved, and the most
# time it spends on all the links the scan met; past either the workspace itself is named (a
# session could make millions, or chains of links each of whose resolutions takes ms).
LINKS_LOOKED_AT = 256
LINKS_KEPT = 10_000  # the links a scan remembers; past it, the writable trees are named
LINKS_SECONDS = 5.0
# Where a link's way that passes through it leads depends on who follows it: /proc/self/cwd
# is the launcher's working directory to the launcher, the host shell's own to that shell.
_PER_PROCESS = ("/proc", "/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")
_LOOPING = ""  # what a resolution the kernel refuses (too many links) gives


def _links_unscanned(plan: Plan, scan: _Scan, since: float, launched: _SeenAtLaunch) -> list[str]:
    """The symlinks the scan met that lead to a directory the session could write and the scan
    did not look through (its run directory, a node_modules), or to nothing yet or a file
    there, where the host's git, run after `cd` through one, finds what a session put there:
    each new one, and each older one to a directory while it stands (no time of the link or
    of its place tells whether a session changed what lies behind it: config rewritten in
    place, a repository made above its place, a link on its way re-pointed). And each whose
    way passes through /proc or /dev/fd, and each new one that cannot be resolved. Past
    LINKS_LOOKED_AT new ones (made or moved into view since `since`), or LINKS_SECONDS, the
    writable trees instead."""
    assert plan.protection is not None
    trees = _tree_sources(plan.protection)
    writable = [resolved for _dest, resolved, _written in scan.writable]
    ages = []
    for link in scan.links:
        try:
            info = os.lstat(link)
        except OSError:
            continue  # gone: nothing for the host to enter
        new = max(info.st_mtime, info.st_ctime) >= since
        ages.append((link, new or launched.unseen(os.path.dirname(link))))
    if scan.links_left_out or sum(new for _link, new in ages) > LINKS_LOOKED_AT:
        return trees
    deadline = time.monotonic() + LINKS_SECONDS
    found = []
    for link, new in ages:
        if time.monotonic() > deadline:
            return trees
        if _through_per_process(link):
            found.append(link)
            continue
        place = _place(link)
        if place is None:  # a way too long, or looping: not to be judged
            if new:
                found.append(link)
            continue
        where, unscanned = place
        if not (unscanned or where not in scan.listed):
            continue
        # What lies behind one to a directory, no time tells: named while it stands. One to
        # a file or to nothing is no place git runs in until a later session makes it a
        # directory, and is then named again, as one to a directory.
        if any(within(where, top) for top in writable) and (new or os.path.isdir(link)):
            found.append(link)
    return found


def _place(link: str) -> tuple[str, bool] | None:
    """Where link leads, as the directory a later session could give a repository (the
    directory itself; a file's; for a link to nothing, the deepest part of its way that
    exists), and whether what its way names after that is unscanned whatever it is (a
    node_modules, a `..`); None if that cannot be told (a looping or too long a way)."""
    reached = _reached(link)
    if reached == _LOOPING:
        return None
    if reached is not None:
        return (reached if os.path.isdir(reached) else os.path.dirname(reached)), False
    try:
        written = os.readlink(link)
    except OSError:
        return None
    parts = os.path.join(os.path.dirname(link), written).split("/")
    if len(parts) > 64:
        return None
    for end in range(len(parts) - 1, 0, -1):
        real = _reached("/".join(parts[:end]) or "/")
        if real == _LOOPING:
            return None
        if real is not None:
            where = real if os.path.isdir(real) else os.path.dirname(real)
            return where, any(part in NOT_SCANNED or part == ".." for part in parts[end:])
    return None


def _through_per_process(link: str) -> bool:
    """Does link's way, as written, or the way a link met on it names, pass through /proc or
    /dev/fd (which lead elsewhere for each process that follows them)?"""
    try:
        way = os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link)))
    except OSError:
        return False
    ways = [way]
    parts = way.split("/")
    for end in range(2, min(len(parts), 64)):
        prefix = "/".join(parts[:end])
        with contextlib.suppress(OSError):
            if os.path.islink(prefix):
                named = os.readlink(prefix)
                ways.append(os.path.normpath(os.path.join(os.path.dirname(prefix), named)))
    return any(within(way, top) for way in ways for top in _PER_PROCESS)


def _reached(path: str) -> str | None:
    """The real path of what path leads to (resolved by the kernel, in one open: a resolution
    path by path costs the square of a long target's length); None if it leads nowhere;
    _LOOPING if the kernel refuses it (too many links)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as error:
        return _LOOPING if error.errno == errno.ELOOP else None
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    finally:
        os.close(fd)


def _index_files(gitdir: str) -> list[os.DirEntry[str]]:
    """gitdir's index and its shared indexes (a split index's); OSError if it cannot be
    listed."""
    with os.scandir(gitdir) as listing:
        return [
            entry
            for entry in listing
            if entry.name == "index" or entry.name.startswith("sharedindex.")
        ]


def _index_written_since(indexes: Sequence[os.DirEntry[str]], since: float) -> bool:
    """Was one of a git directory's indexes (_index_files) written since `since`? By change
    time too: a session sets a file's mtime back, never its ctime."""
    try:
        times = [entry.stat(follow_symlinks=False) for entry in indexes]
    except OSError:
        return True  # changed as it was looked at: read it
    return any(max(info.st_mtime, info.st_ctime) >= since for info in times)


def _innermost(holders: Mapping[str, p.Entry], place: str) -> p.Entry | None:
    """The entry that shows place in the sandbox: the deepest of holders (_holders) whose
    destination is place or holds it."""
    above = place
    while (holder := holders.get(above)) is None and above != "/":
        above = os.path.dirname(above)
    return holder


def _read_only_bind(entry: p.Entry | None) -> bool:
    return entry is not None and entry.kind is Kind.BIND and entry.mode is Mode.RO


# The most of an index the report hands to git (some 600,000 files); a larger one is named.
_INDEX_READ = 64 << 20
# Where the host's git is looked for: never the launcher's PATH, an input like any other.
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def _gitlinks_unscanned(
    scan: _Scan, since: float, user: RunAs, launched: _SeenAtLaunch
) -> list[str]:
    """What the gitlinks of the indexes written since `since` lead the host's git into that
    the scan does not see: a repository it did not find (in node_modules: its config), the
    place of one not made yet where the scan does not look (a later session could make it),
    or the index itself where no working tree of the workspace resolves them (a linked
    worktree's outside it), where one is no path inside its working tree (absolute, `..`),
    or where what it holds cannot be told."""
    trees = {gitdir: tree for tree, gitdir in scan.indexes}
    found: list[str] = []
    deadline = time.monotonic() + GITLINKS_SECONDS
    for gitdir in dict.fromkeys([*trees, *scan.found]):  # worktrees/*, modules/* too
        index = os.path.join(gitdir, "index")
        try:
            indexes = _index_files(gitdir)
        except OSError:
            continue  # gone, or no directory: no index for the host's git
        if not any(e.name == "index" for e in indexes):
            continue
        # A git directory, or a repository, moved (or pointed) into view: its index is new to it.
        tree = trees.get(gitdir)
        new = launched.unseen(gitdir) or (tree is not None and launched.unseen(tree))
        if not new and not _index_written_since(indexes, since):
            continue
        gitlinks = _gitlinks(gitdir, indexes, user) if time.monotonic() < deadline else None
        if gitlinks is None or tree is None:
            if gitlinks != []:  # none to tell, or none that a tree here resolves
                found.append(index)
            continue
        places = _gitlink_places(gitlinks, tree, scan)
        found += [index] if places is None or len(places) > GITLINKS_NAMED else places
    return found


# The most places one index's gitlinks lead that the report names; past it, the index (a
# session could write hundreds of thousands, for as many warning lines). And the most time
# the report gives git on all the indexes; past it, the indexes left are named unread.
GITLINKS_NAMED = 16
GITLINKS_SECONDS = 20.0


def _gitlink_places(gitlinks: Sequence[str], tree: str, scan: _Scan) -> list[str] | None:
    """Where gitlinks of the working tree at tree lead that the scan did not see: a repository
    it did not find (its config, or its .git), or the place of one not made yet where the scan
    does not look; None if one is no path inside the tree (absolute, `..`)."""
    places = []
    for name in gitlinks:
        parts = name.split("/")
        if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
            return None
        repository = os.path.join(tree, name)
        if repository in scan.repositories:
            continue  # found by the scan: protected
        config = os.path.join(repository, ".git", "config")
        path = config if os.path.lexists(config) else os.path.join(repository, ".git")
        if os.path.lexists(path):
            places.append(path)
        elif os.path.dirname(repository) not in scan.listed:
            places.append(repository)
    return places


def _gitlinks(gitdir: str, indexes: Sequence[os.DirEntry[str]], user: RunAs) -> list[str] | None:
    """The paths gitdir's index records as gitlinks (mode 0160000: a submodule the host's git
    status enters), as git itself reads them: git's own ls-files, on a git directory of
    nsconfine's that links to the index and its shared indexes (indexes: _index_files), so no
    config, hook or fsmonitor of the session's runs. Read every way git reads an index (in
    order; by its end-of-index offset; by its offset table, as a host whose config sets
    index.threads does). None when that cannot be told: no git (nor prlimit, setpriv) on the
    host, an index that is no regular file or is too large, more than _SHARED_INDEXES shared
    ones, one git refuses or whose answer is past _GITLINKS_ANSWER or holds more than
    _GITLINKS_MOST gitlinks, or reads that differ (a session wrote the index: every way git
    might read it counts). git runs as user, the session's account: the index is attacker
    bytes for its C parser, never for a root launcher's capabilities."""
    import shutil

    from nsconfine._kernel.accounts import scratch_directory

    git = shutil.which("git", path=_SYSTEM_PATH)
    limit = shutil.which("prlimit", path=_SYSTEM_PATH)
    if git is None or limit is None:
        return None
    sha256 = _uses_sha256(gitdir)
    if len(indexes) > 1 + _SHARED_INDEXES:
        return None
    try:  # never TMPDIR's: another account may write it (scratch_directory)
        own = scratch_directory("nsconfine-index-")
    except OSError:
        return None
    as_user = os.geteuid() == 0 and user.uid != 0
    opened: list[int] = []  # the index files, as git is given them
    try:
        try:
            # Each opened as found, no link followed (a running session of the workspace may
            # swap one for a symlink at any moment: git, root's perhaps, would follow it, to
            # a FIFO or a device too); git reads it through its own fd (/proc/self/fd).
            gitdir_fd = _syscalls.open_no_symlinks(gitdir)
            try:
                for entry in indexes:
                    fd = _opened_index(gitdir_fd, entry.name)
                    if fd is not None:
                        opened.append(fd)
                        os.symlink(f"/proc/self/fd/{fd}", os.path.join(own, entry.name))
                    elif entry.name == "index":
                        return None  # not a regular file, or too large: not for the report
            finally:
                os.close(gitdir_fd)
            for name in _SCRATCH_DIRECTORIES:
                os.mkdir(os.path.join(own, name))
            with open(os.path.join(own, "HEAD"), "w") as head:
                head.write("ref: refs/heads/main\n")
            with open(os.path.join(own, "config"), "w") as config:
                config.write(
                    "[core]\n\trepositoryformatversion = 1\n[extensions]\n\tobjectformat = "
                    f"{'sha256' if sha256 else 'sha1'}\n"
                )
            if as_user:
                # The account reads its git directory, which stays the launcher's: given to the
                # account, another process of it could swap a name there for a symlink between
                # two chowns, and be given what it leads to. (Modes set whatever the umask.)
                os.chmod(own, 0o755)
                for name in (*_SCRATCH_DIRECTORIES, "HEAD", "config"):
                    os.chmod(
                        os.path.join(own, name), 0o755 if name in _SCRATCH_DIRECTORIES else 0o644
                    )
        except OSError:
            return None
        answers: set[bytes] = set()
        gitlinks: list[bytes] = []
        for threads in _READS:
            answer = _git_answer(
                [limit, *_GIT_LIMITS, git], own, threads, opened, user if as_user else None
            )
            if answer is None:
                return None  # (the others would take as long to fail)
            digest, gitlinks = answer
            answers.add(digest)
    finally:
        shutil.rmtree(own, ignore_errors=True)
        for fd in opened:
            os.close(fd)
    if len(answers) != 1:
        return None
    return [os.fsdecode(name) for name in gitlinks]


# How git is run on a session's index: within memory and time it cannot pass (a version 4
# index's names may grow with the square of its entries: a 1.9 MB index took git 878 MB), and
# read as each index.threads value reads it (1: in order; 2: extensions by the end-of-index
# offset; 3: entries by the offset table too, with the fewest threads that do: a large index
# read with 64 of them would pass the memory limit).
_SCRATCH_DIRECTORIES = ("objects", "refs", "work")  # in the git directory _gitlinks makes
_GIT_LIMITS = ("--as=1073741824", "--cpu=3", "--")  # (git reads 600,000 entries in 0.5 s)
_GIT_DEADLINE = 10.0  # seconds: a git blocked without using CPU is given up on
_READS = ("1", "2", "3")
_GITLINKS_ANSWER = 64 << 20  # the most of git's answer read; past it, the index is named
_GITLINKS_MOST = 4096  # the most gitlinks of one index kept; past them, the index is named
_SHARED_INDEXES = 16  # the most shared indexes a git directory may hold for its index to be read


def _opened_index(gitdir_fd: int, name: str) -> int | None:
    """An fd of the index file name in the git directory open at gitdir_fd, opened without
    following a link or waiting; None unless it is a regular file of at most _INDEX_READ."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=gitdir_fd)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > _INDEX_READ:
        os.close(fd)
        return None
    return fd


def _git_answer(
    command: list[str], own: str, threads: str, fds: Sequence[int], user: RunAs | None
) -> tuple[bytes, list[bytes]] | None:
    """What `git ls-files --stage -z` in the git directory own says, read as index.threads
    says: its sha256, and the paths of its gitlinks; None if it fails, says more than
    _GITLINKS_ANSWER, or names more than _GITLINKS_MOST gitlinks. fds: the index files the
    git directory's links lead to (git keeps them, at their numbers). user: the account git
    runs as, with no supplementary group (None: the launcher's)."""
    import shutil
    import subprocess

    environ = {
        "PATH": _SYSTEM_PATH, "HOME": own, "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull, "GIT_DIR": own,
        "GIT_WORK_TREE": os.path.join(own, "work"), "GIT_INDEX_FILE": os.path.join(own, "index"),
    }  # fmt: skip
    arguments = ["-c", f"index.threads={threads}", "-c", "core.fsmonitor=false"]
    # It dies with the launcher (a SIGKILL of it too): a session's index can keep git reading
    # for seconds, and it would read on as an orphan, of the session's account.
    setpriv = shutil.which("setpriv", path=_SYSTEM_PATH)
    if setpriv is None:
        return None
    try:
        git = subprocess.Popen(
            [setpriv, "--pdeathsig", "KILL", *command, *arguments, "ls-files", "--stage", "-z"],
            env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, pass_fds=fds,
            user=None if user is None else user.uid, group=None if user is None else user.gid,
            extra_groups=None if user is None else [],
        )  # fmt: skip
    except OSError:
        return None
    assert git.stdout is not None
    try:
        answer = _read_gitlinks(git.stdout.fileno(), time.monotonic() + _GIT_DEADLINE)
        status = git.wait(timeout=1) if answer is not None else None
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        if git.poll() is None:
            git.kill()  # blocked (on a FIFO swapped in), past its deadline, or writing on
            git.wait()
        git.stdout.close()
    return answer if status == 0 else None


def _read_gitlinks(fd: int, deadline: float) -> tuple[bytes, list[bytes]] | None:
    """The sha256 of all fd gives until its end, by deadline (a time.monotonic()), and the
    paths of the gitlink records (mode 160000) in it, read as it comes: a session's index
    can make the answer 64 MB, which held whole (and split) cost the launcher hundreds of MB.
    None if it has not ended by then, gives more than _GITLINKS_ANSWER, or names more than
    _GITLINKS_MOST gitlinks."""
    import hashlib

    digest = hashlib.sha256()
    gitlinks: list[bytes] = []
    size = 0
    partial = b""  # the last record read, until its NUL comes
    while (left := deadline - time.monotonic()) > 0:
        if not _syscalls.wait_fd(fd, left):
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return digest.digest(), gitlinks
        digest.update(chunk)
        size += len(chunk)
        if size > _GITLINKS_ANSWER:
            return None
        records = (partial + chunk).split(b"\0")
        partial = records.pop()
        for record in records:
            if record.startswith(b"160000 "):
                gitlinks.append(record.partition(b"\t")[2])
        if len(gitlinks) > _GITLINKS_MOST:
            return None
    return None


def _uses_sha256(gitdir: str) -> bool:
    """Does gitdir's repository say its objects are sha256? Its config, or (a linked worktree's
    git directory has none of its own) the config of the directory its commondir names."""
    configs = [os.path.join(gitdir, "config")]
    common = _syscalls.read_untrusted(os.path.join(gitdir, "commondir"), 4096)
    if common:
        named = os.fsdecode(common.rstrip(b"\r\n").split(b"\0", 1)[0])
        configs.append(os.path.join(gitdir, named, "config"))
    for path in configs:
        config = (_syscalls.read_untrusted(path, 1 << 20) or b"").lower()
        if b"sha256" in config and b"objectformat" in config:
            return True
    return False


def _base_entries(plan: Plan) -> list[p.Entry]:
    assert plan.protection is not None
    derived = {entry.dest for entry in plan.protection.entries}
    return [entry for entry in plan.entries if entry.dest not in derived]


def _holders(entries: Iterable[p.Entry]) -> dict[str, p.Entry]:
    """The entries that can hold a place (not a remount, not a link), by destination."""
    holders: dict[str, p.Entry] = {}
    for entry in entries:
        if entry.kind is not Kind.REMOUNT_RO and entry.kind is not Kind.SYMLINK:
            holders.setdefault(entry.dest, entry)
    return holders


def read_only_holder(entries: Iterable[p.Entry], place: str) -> p.Entry | None:
    """The innermost of entries strictly holding place, if it is a read-only bind (its mount
    keeps place read-only, whatever is mounted there); else None."""
    return _read_only_holder(_holders(entries), place)


def _read_only_holder(holders: Mapping[str, p.Entry], place: str) -> p.Entry | None:
    holder = None if place == "/" else _innermost(holders, os.path.dirname(place))
    return holder if _read_only_bind(holder) else None


def pin_parents(entries: Sequence[p.Entry]) -> list[p.Entry]:
    """A writable self-bind of every directory between a writable bind and an entry inside
    it: `mv lib lib.old` would otherwise take a read-only lib/config.py along and leave room
    for a forged one. Only directories that exist (a missing one is an entry's own stub), and
    none inside a read-only bind (which no rename there can leave, and which a writable one
    would make writable)."""
    writable = [e.dest for e in entries if e.kind is Kind.BIND and e.mode is Mode.RW]
    taken = {entry.dest for entry in entries}
    holders = _holders(entries)
    pins: dict[str, p.Entry] = {}
    for entry in entries:
        for top in writable:
            if inside(entry.dest, top) is None:
                continue
            parent = os.path.dirname(entry.dest)
            while (
                parent != top
                and parent not in taken
                and _read_only_holder(holders, parent) is None
                and os.path.isdir(parent)
            ):
                pins.setdefault(parent, p.rw_bind(parent, parent, PIN_REASON))
                parent = os.path.dirname(parent)
    return list(pins.values())


class _Scan:
    """One look at the writable trees, remembering what it depended on."""

    def __init__(self, entries: Sequence[p.Entry]) -> None:
        # Where the session writes, (dest, resolved source, source as written) each: git
        # directories a pointer names there are the session's to change.
        self.writable = [
            (e.dest, _resolved(e.source), e.source)
            for e in entries
            if e.kind is Kind.BIND and e.mode is Mode.RW
        ]
        self.observed: Observed = {}
        # The files whose content decides what is protected (.git pointers, commondirs), as
        # first read, by digest (a session may pad each with a megabyte past the NUL where git
        # stops): a write through a shared mapping whose page was already written changes no
        # time of the file, and only reading it again tells.
        self.contents: dict[str, str | None] = {}
        self.repositories: list[str] = []
        self.pointers: list[str] = []
        self.found: list[str] = []  # every git directory protected, for a refusal to name
        self.indexes: list[tuple[str, str]] = []  # (working tree, its git directory)
        self.links: list[str] = []  # every symlink met (LINKS_KEPT at most), never followed
        self.links_left_out = False  # more were met than kept
        # Config the host's tools read where they are started (STARTED_IN, those the plan
        # protects), met below a tree's top outside a repository's root: never read-only.
        self.started_in: list[str] = []
        self.listed: set[str] = set()  # every directory looked through
        self.seen = 0
        self.entries = 0

    def stat(self, path: str) -> os.stat_result | None:
        """path's lstat (None if there is none), its identity remembered: as the scan first
        saw it, never newer. A directory listed, then looked at again (.claude, for the names
        it protects), may have changed between the two; remembered as of the second look, a
        repository a running session made in it then would never be looked for again."""
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            self.observed.setdefault(path, None)
            return None
        except OSError as error:
            refuse_if_short_of_fds(error)
            raise PlanError(f"{printable(path)} cannot be looked at: {error.strerror}") from error
        self.observed.setdefault(path, _syscalls.changing_identity(info))
        return info

    def mode(self, path: str) -> int:
        """path's mode without following a symlink, 0 if there is none (remembered)."""
        info = self.stat(path)
        return 0 if info is None else info.st_mode

    def listing(self, directory: str) -> _Listing:
        """What the scan needs of directory's entries (a _Listing). One the launcher cannot
        list is refused: git finds a .git in it by name all the same (a directory with its
        search bit but not its read bit)."""
        listing = _Listing()
        if self.stat(directory) is None:
            return listing
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    self.entries += 1
                    if self.entries > ENTRIES_SCANNED:
                        raise PlanError(self._too_large(directory, ENTRIES_SCANNED, "files and"))
                    listing.add(entry)
                    if len(listing.directories) > REPOSITORY_SCAN:
                        raise PlanError(self._too_large(directory, REPOSITORY_SCAN, ""))
        except NotADirectoryError:
            return _Listing()
        except FileNotFoundError as error:  # a session's rmdir, as the scan went by
            raise PlanError(
                f"{printable(directory)} was removed while nsconfine looked through the "
                "workspace for repositories (something in it is changing the workspace): "
                "launch again"
            ) from error
        except OSError as error:
            refuse_if_short_of_fds(error)
            raise PlanError(
                f"{printable(directory)} cannot be listed ({error.strerror}): nsconfine looks "
                "through the workspace for the repositories whose trusted files it keeps "
                "read-only, and git on the host finds one there by name all the same; let the "
                "launcher's account read it (chmod u+r), then launch again"
            ) from error
        self.listed.add(directory)
        return listing

    def count(self, what: str) -> None:
        self.seen += 1
        if self.seen > REPOSITORY_SCAN:
            raise PlanError(self._too_large(what, REPOSITORY_SCAN, ""))

    @staticmethod
    def _too_large(what: str, bound: int, files: str) -> str:
        kinds = f"{files} directories".strip()
        return (
            f"{printable(what)} holds more than {bound:,} {kinds} (outside node_modules and "
            "virtualenvs): nsconfine looks through all of them for repositories whose trusted "
            "files it keeps read-only, and will not protect less than it says; make the "
            "workspace smaller, or --unprotect every protected name"
        )

    def keep_link(self, path: str) -> None:
        if len(self.links) < LINKS_KEPT:
            self.links.append(path)
        else:
            self.links_left_out = True

    def shown(self, real: str) -> tuple[str, str] | None:
        """(the sandbox's name, the host's name as the plan writes it) of a real path that
        lies in one of the session's writable binds; None elsewhere."""
        for dest, source, written in self.writable:
            if within(real, source):
                rest = real[len(source.rstrip("/")) :]
                return dest + rest, written.rstrip("/") + rest
        return None

    # ------------------------------------------------------------ one writable tree

    def tree(
        self,
        dest: str,
        source: str,
        names: Sequence[tuple[str, str, str]],
        trees: Sequence[tuple[str, str]],
    ) -> list[p.Entry]:
        """The protected entries of one writable tree, shown at dest, read at source."""
        git_names = [item for item in names if item[0].startswith(".git/")]
        tree_names = [item for item in names if not item[0].startswith(".git/")]
        top = _resolved(source)
        # The host paths the sandbox covers with another writable tree: scanned as that one.
        covered = [
            top + other[len(dest.rstrip("/")) :] for other, _ in trees if inside(other, dest)
        ]
        entries: list[p.Entry] = []

        def protect(base: str, relative: str, kind: str, reason: str, name: str) -> None:
            target = self.to_protect(base, relative, kind, name)
            named = None if target is None else self.shown(target[0])
            if target is not None and named is not None:
                why = f"{reason}: read-only, so the host never runs what a session wrote"
                entries.append(p.ro_bind(named[1], named[0], why, stub=target[1]))

        started_in = {name.split("/", 1)[0] for name, _, _ in tree_names} & STARTED_IN
        git_directories = self.scan(top, covered, started_in)
        for directory in self.remembered(top, git_directories):
            git_directories.append(directory)
        for base in self.repositories:
            if not within(base, top):
                continue
            for name, kind, reason in tree_names:
                first = name.split("/", 1)[0] + "/"
                if first in ONLY_WHERE_PRESENT and not stat.S_ISDIR(self.mode(base + "/" + first)):
                    continue
                protect(base, name, kind, reason, name)
        if git_names:
            for pointer in self.pointers:
                named = self.shown(pointer) if within(pointer, top) else None
                if named is not None:
                    why = "a gitdir pointer: git on the host follows it; read-only"
                    entries.append(p.ro_bind(named[1], named[0], why))
            for gitdir in self.git_directories(git_directories):
                for name, kind, reason in git_names:
                    protect(gitdir, name[len(".git/") :], kind, reason, name)
        self.remember(top, [g for g in git_directories if within(g, top)])
        return entries

    def scan(self, top: str, covered: Sequence[str], started_in: Set[str]) -> list[str]:
        """Look through the tree at top (real), not through symlinks, never below a covered
        path (another writable tree shows its own there): every repository (the top first,
        whose own trusted files are protected, repository or not) goes to self.repositories,
        every .git pointer file to self.pointers, the config named in started_in found in any
        other directory to self.started_in; the git directories found as they are (a .git
        directory, a bare one) are returned, to be looked into further."""
        git_directories: list[str] = []
        pending = [top]
        while pending:
            directory = pending.pop()
            listing = self.listing(directory)
            dot_git = listing.get(".git")
            hg = listing.get(".hg")
            if dot_git is not None:
                if dot_git.is_dir(follow_symlinks=False):
                    git_directories.append(dot_git.path)
                    self.indexes.append((directory, dot_git.path))
                elif dot_git.is_file(follow_symlinks=False):
                    self.pointers.append(dot_git.path)
                else:
                    raise PlanError(
                        f"{printable(dot_git.path)} is a {_file_type(self.mode(dot_git.path))}: "
                        "a session may have planted it, for the host's git to follow or read; "
                        "remove it (a worktree's .git is a file)"
                    )
            if hg is not None and not hg.is_dir(follow_symlinks=False):
                raise PlanError(
                    f"{printable(hg.path)} is a {_file_type(self.mode(hg.path))}: Mercurial on the "
                    "host follows it and runs the hooks of the hgrc it leads to; remove it"
                )
            if directory != top and dot_git is None and hg is None:
                self.started_in += [e.path for e in listing.config if e.name in started_in]
            else:
                self.repositories.append(directory)
                if len(self.repositories) > MAX_REPOSITORIES:
                    raise PlanError(
                        f"the workspace {printable(top)} holds more than {MAX_REPOSITORIES} "
                        "repositories, counting its top: nsconfine keeps the trusted files of "
                        "each (and the top's, repository or not) read-only, and a "
                        f"launch can protect at most {REPOSITORIES_SHOWN}; remove some, or "
                        "--unprotect the protected names"
                    )
            if _looks_bare(listing):  # the top too: git in the workspace would use it
                git_directories.append(directory)
            for entry in listing.directories:
                if entry.name not in _NOT_LOOKED_INTO and entry.path not in covered:
                    self.count(top)
                    pending.append(entry.path)
            for entry in listing.links:
                if entry.name not in _NOT_LOOKED_INTO:
                    self.keep_link(entry.path)
        return git_directories

    # ------------------------------------------------------------ git directories

    def git_directories(self, starts: Sequence[str]) -> list[str]:
        """Every git directory reached from starts (each a .git directory, a bare one, or a
        remembered one) and from the pointers: from each, the one its commondir names, every
        submodule's under modules/ (at any depth: a name may hold slashes, a submodule have
        its own) and every linked worktree's under worktrees/. Each gets all of git's
        protected names, whatever it is (an empty stub changes nothing where git does not
        look). Not through symlinks; PlanError past REPOSITORY_SCAN directories, or for a
        pointer the session could re-point."""
        found: list[str] = []
        # Each with what it is to git, and whether a listing (or a look) already saw it as a
        # directory: one that is no longer one changed while the launch looked, and skipping
        # it would leave it writable once it is a directory again (a session exchanging .git
        # and a symlink to it, again and again).
        pending = [(start, "gitdir", True) for start in starts]
        for pointer in self.pointers:
            gitdir = self.named_directory(pointer, "gitdir: ")
            if gitdir is not None:
                pending.append((gitdir, "gitdir", False))
                self.indexes.append((os.path.dirname(pointer), gitdir))
        while pending:
            directory, what, seen_as_one = pending.pop()
            mode = self.mode(directory)
            if not stat.S_ISDIR(mode):
                if seen_as_one:
                    raise SandboxUnavailable(
                        f"{printable(directory)} changed while the launch looked at it (a "
                        f"directory, then {file_kind(mode) if mode else 'gone'}): a session of "
                        "the workspace may be changing it; nothing was run, launch again"
                    )
                continue  # gone, a symlink or a file: git would not use it as a directory here
            self.count(directory)
            listing = self.listing(directory)
            if what == "name":  # a directory under modules/ that is part of a name
                pending += [(d, _module(self.listing(d)), True) for d in _subdirectories(listing)]
                continue
            if directory in found:
                continue  # named again, as a worktree's commondir names its repository's
            found.append(directory)
            # git takes config and hooks from the directory commondir names: protected as well
            if "commondir" in listing:
                common = self.named_directory(directory + "/commondir")
                if common is not None:
                    pending.append((common, "gitdir", False))
            for part, kind in (("modules", None), ("worktrees", "gitdir")):
                if part in listing and listing[part].is_dir(follow_symlinks=False):
                    inner = self.listing(listing[part].path)
                    pending += [
                        (d, kind or _module(self.listing(d)), True) for d in _subdirectories(inner)
                    ]
            if what == "module":  # its name may go on: modules/a is one, modules/a/b another
                pending += [
                    (d, _module(self.listing(d)), True)
                    for d in _subdirectories(listing, skip=_GIT_DIRECTORY_PARTS)
                ]
        self.found += [directory for directory in found if directory not in self.found]
        return found

    def named_directory(self, named_by: str, prefix: str = "") -> str | None:
        """The directory a git file names (a .git pointer: "gitdir: PATH"; a commondir: PATH),
        relative to the directory that holds the file, as git resolves it, as a real path; None
        if there is none to read, or it lies where the session cannot write (not the session's
        to change). PlanError if the session could change where it leads: a symlink, or a
        directory left by `..`, where the session writes (the directories on the way to it are
        pinned)."""
        self.stat(named_by)
        raw = _read_whole(named_by)
        self.contents.setdefault(named_by, _digest_of(raw))
        # As git reads it: the whole file less its trailing newlines (spaces are kept), then
        # as a C string (a NUL ends it, after a newline too), bytes as they are.
        text = os.fsdecode(raw.rstrip(b"\r\n").split(b"\0", 1)[0]) if raw else ""
        named = text[len(prefix) :]
        if not text.startswith(prefix) or not named:
            return None
        looked, end = _syscalls.lookups(_resolved(os.path.dirname(named_by)), named)
        for path in looked:
            self.stat(path)
            if within(path, "/proc") or (not within(end, path) and self.shown(path)):
                raise PlanError(
                    f"{printable(named_by)} names {printable(named)}, which leads "
                    f"through {printable(path)}: the session can change that, and so where the "
                    "host's git goes; name the git directory by a path of plain directories, "
                    "then launch again"
                )
        return end if self.shown(end) is not None else None

    # ------------------------------------------------------------ protected paths

    def to_protect(self, base: str, relative: str, kind: str, name: str) -> tuple[str, str] | None:
        """The path to bind read-only for relative under base (the protected name's path
        there), and what to make there if it is missing at launch: that path itself; or, if a
        directory on the way is missing, that directory (an empty read-only one blocks
        everything below it); or, if a file is in the way of a directory, that file (kept as
        it is, so the directory cannot take its place). Refused: a symlink, FIFO, socket or
        device on the way (a session may have planted it: the host would follow a symlink,
        and read from a FIFO what the session writes through the read-only bind)."""
        path = base
        parts = relative.split("/")
        for index, part in enumerate(parts):
            path = os.path.join(path, part)
            last = index == len(parts) - 1
            mode = self.mode(path)
            if not mode:
                return path, kind if last else "dir"
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise PlanError(
                    f"{printable(path)} is a {_file_type(mode)}, where a file the host trusts "
                    "belongs: a session may have planted it; remove it (or --unprotect "
                    f"{printable(name)})"
                )
            if not last and not stat.S_ISDIR(mode):
                return path, "file"  # in the way of the directory: kept, so none can be made
            if not last and (is_stub(path) or not self.mode(path)):
                # Another session's stub, or one its session's end removed since the look
                # above: judged as the missing one it is (and now is).
                return path, "dir"
        return path, kind

    # ------------------------------------------------------------ remembered git directories

    def remembered(self, top: str, found: Sequence[str]) -> list[str]:
        """The git directories launches of this tree protected before that are still
        directories, reached without a symlink (a session cannot make one look like nothing
        between two launches to have the next leave it writable)."""
        record = _record_path(top)
        if record is None:
            return []
        self.stat(record)
        raw = _syscalls.read_untrusted(record, _WHOLE_FILE_BYTES) or b""
        kept = []
        for relative in os.fsdecode(raw).split("\0"):
            if not relative or relative.startswith("/") or ".." in relative.split("/"):
                continue
            path = top if relative == "." else os.path.join(top, relative)
            if path not in found and self.directory_below(top, relative):
                kept.append(path)
        return kept

    def directory_below(self, top: str, relative: str) -> bool:
        """Is top/relative a directory reached with no symlink on the way (each step
        remembered)?"""
        path = top
        for part in relative.split("/"):
            if part == ".":
                continue
            path = os.path.join(path, part)
            if not stat.S_ISDIR(self.mode(path)):
                return False
        return True

    def remember(self, top: str, git_directories: Sequence[str]) -> None:
        """Record the tree's git directories for later launches (best effort: a launcher
        without writable records protects what each launch finds)."""
        record = _record_path(top)
        if record is None:
            return
        relative = sorted({os.path.relpath(g, top) for g in git_directories})
        # The tree's own path first, for the prune (_prune_remembered); a look takes only the
        # relative ones.
        data = os.fsencode("\0".join([top, *relative]))
        try:
            if not relative:
                # Nothing to remember, no record: a record of every tree ever planned would
                # grow without end, and every launch's lint looks through the records.
                if os.path.lexists(record):
                    os.unlink(record)
            elif _syscalls.read_untrusted(record, _WHOLE_FILE_BYTES) != data:
                temporary = f"{record}.{os.getpid()}"
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(temporary, flags, 0o600)
                try:
                    try:
                        os.write(fd, data)
                    finally:
                        os.close(fd)
                    os.replace(temporary, record)
                except OSError:  # (a full cache): no half-written file left behind
                    with contextlib.suppress(OSError):
                        os.unlink(temporary)
                    raise
            self.stat(record)
        except (OSError, PlanError):
            return


def _read_whole(path: str) -> bytes | None:
    """The whole of a file git reads whole, read as read_untrusted does; PlanError past
    _WHOLE_FILE_BYTES (git would go on reading where the plan stopped)."""
    raw = _syscalls.read_untrusted(path, _WHOLE_FILE_BYTES + 1)
    if raw is None and _is_regular_file(path):  # there, and not to be read by the launcher
        raise PlanError(
            f"{printable(path)} cannot be read: git reads it to find the directory it takes "
            "config and hooks from (a root git on the host, whatever its mode), and nsconfine "
            "keeps that directory read-only; let the launcher's account read it (chmod u+r), "
            "then launch again"
        )
    if raw is not None and len(raw) > _WHOLE_FILE_BYTES:
        raise PlanError(
            f"{printable(path)} is larger than {_WHOLE_FILE_BYTES:,} bytes: git reads it whole, "
            "to find the directory it takes config and hooks from; no real one is; remove it"
        )
    return raw


def _is_regular_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


# The names whose presence the scan asks about: a repository's signs, a git directory's, and
# where a git directory keeps others.
_SIGNS = frozenset(
    {".git", ".hg", "HEAD", "objects", "refs", "commondir", "config", "modules", "worktrees"}
)
_NOT_LOOKED_INTO = NOT_SCANNED | {".git", ".hg"}  # (a repository's own are looked at apart)


class _Listing:
    """What the scan needs of one directory's entries: those named in _SIGNS or STARTED_IN,
    its subdirectories and its symlinks; never every entry (a session may put millions of
    files in one)."""

    __slots__ = ("config", "directories", "links", "signs")

    def __init__(self) -> None:
        self.signs: dict[str, os.DirEntry[str]] = {}
        self.config: list[os.DirEntry[str]] = []  # named in STARTED_IN
        self.directories: list[os.DirEntry[str]] = []  # not symlinks to one
        self.links: list[os.DirEntry[str]] = []

    def add(self, entry: os.DirEntry[str]) -> None:
        if entry.name in _SIGNS:
            self.signs[entry.name] = entry
        elif entry.name in STARTED_IN:
            self.config.append(entry)
        if entry.is_dir(follow_symlinks=False):
            self.directories.append(entry)
        elif entry.is_symlink():
            self.links.append(entry)

    def __contains__(self, name: str) -> bool:
        return name in self.signs

    def __getitem__(self, name: str) -> os.DirEntry[str]:
        return self.signs[name]

    def get(self, name: str) -> os.DirEntry[str] | None:
        return self.signs.get(name)


def _looks_bare(listing: _Listing) -> bool:
    """Would git take this directory for a git directory, by what a session cannot easily
    remove: a HEAD beside objects, refs or a commondir, or objects and refs (git also checks
    that HEAD is valid, which the session controls; a HEAD may be a symlink)."""
    head, objects, refs = "HEAD" in listing, "objects" in listing, "refs" in listing
    return (head and (objects or refs or "commondir" in listing)) or (objects and refs)


def _module(listing: _Listing) -> str:
    """What a directory under modules/ is: a submodule's git directory ("module") if it has any
    of a git directory's signs (its HEAD may be gone, its config stays), else part of a
    name."""
    signs = ("HEAD", "config", "objects", "refs", "commondir")
    return "module" if any(sign in listing for sign in signs) else "name"


def _subdirectories(listing: _Listing, skip: frozenset[str] = frozenset()) -> list[str]:
    """The directories of a listing (not symlinks to one), but those named in skip."""
    return [entry.path for entry in listing.directories if entry.name not in skip]


MAX_REPOSITORIES = 64  # the scan stops counting here: far past what MAX_PROTECTED_MOUNTS allows


def _record_path(top: str) -> str | None:
    """Where the git directories of the tree at top are remembered (named by its device,
    inode and path, in the launcher's own records), or None where there are no records to
    keep. The path too: a file system gives a freed inode out again at once, and the next
    task's workspace must not be protected by what a session planted in the last one's."""
    from nsconfine._digest import sha256_hex

    try:
        directory = _git_directories()
        info = os.stat(top)
    except (OSError, SandboxUnavailable):
        return None
    where = sha256_hex(os.fsencode(top))[:16]
    return os.path.join(directory, f"{info.st_dev}-{info.st_ino}-{where}")


# The directories of remembered git directories made and checked by this process, each with
# its device and inode then: a plan looks at it twice per writable tree, and the checks walk
# every directory above it (~0.14 ms each time).
_checked_directories: dict[str, tuple[int, int]] = {}


def _git_directories() -> str:
    """The directory of remembered git directories, beside the records of mount points
    wherever they are kept (the account's cache, or /tmp/nsconfine-UID for an account with no
    cache it can write): made and checked private once, and again if it is no longer the
    directory checked (removed, or replaced: only this account can, see require_private)."""
    from nsconfine._kernel.accounts import make_private_directory, require_private
    from nsconfine._kernel.stub_records import records

    directory = os.path.join(os.path.dirname(records()), "git-directories")
    checked = _checked_directories.get(directory)
    if checked is None or _lstat_identity(directory) != checked:
        make_private_directory(directory)
        require_private(directory)
        info = os.lstat(directory)
        _checked_directories[directory] = (info.st_dev, info.st_ino)
        _prune_remembered(directory)
    return directory


_PRUNED = ".pruned"  # in the directory of remembered git directories: the last prune's time


def _prune_remembered(directory: str) -> None:
    """Remove the records a week old whose tree is gone, or is another directory at its path
    now: a broker that makes a workspace per task left one for each, for good. Not younger
    ones (a launcher in another mount namespace may see a live tree elsewhere), nor those
    that name no tree (written before they did: rewritten, with it, by their tree's next
    launch). At most once a day, when a process first looks at the records."""
    from nsconfine._kernel.stub_records import PRUNE_EVERY_SECONDS, STALE_AFTER_SECONDS

    marker = os.path.join(directory, _PRUNED)
    with contextlib.suppress(OSError):
        if os.lstat(marker).st_mtime > time.time() - PRUNE_EVERY_SECONDS:
            return
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        os.utime(marker)
        stale_before = time.time() - STALE_AFTER_SECONDS
        with os.scandir(directory) as listing:
            for entry in listing:
                if entry.name == _PRUNED or not entry.is_file(follow_symlinks=False):
                    continue
                if entry.stat(follow_symlinks=False).st_mtime < stale_before and _tree_gone(
                    entry.path
                ):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
    except OSError:
        pass  # pruned by a later launcher's first look


def _tree_gone(record: str) -> bool:
    """Is the tree record names (its first, absolute, entry) no longer the directory at that
    path whose device, inode and path name the record? False for a record naming none."""
    from nsconfine._digest import sha256_hex

    raw = _syscalls.read_untrusted(record, _WHOLE_FILE_BYTES) or b""
    top = os.fsdecode(raw.split(b"\0", 1)[0])
    if not top.startswith("/"):
        return False
    try:
        info = os.stat(top)
    except OSError:
        return True
    name = f"{info.st_dev}-{info.st_ino}-{sha256_hex(os.fsencode(top))[:16]}"
    return os.path.basename(record) != name


def _lstat_identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


def _resolved(path: str) -> str:
    try:
        return _syscalls.realpath(path)
    except OSError as error:
        raise PlanError(f"{printable(path)} cannot be resolved: {error.strerror}") from error


def _file_type(mode: int) -> str:
    """What a file that is neither a regular file nor a directory is, for a refusal (mode 0:
    it was gone when its mode was asked for)."""
    if not mode or stat.S_ISDIR(mode) or stat.S_ISREG(mode):  # (it was neither when listed)
        return "name that changed as it was looked at (gone, or replaced)"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"
