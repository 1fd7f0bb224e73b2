"""Files the host trusts, kept read-only inside the session's writable workspace.

A session writes its workspace; the host later runs git, direnv, editors and agents there,
which trust what they find: `git config core.fsmonitor '…'` in a workspace runs on the host's
next `git status`. So these paths are read-only in every session, at the workspace's top and
in every repository inside it that exists at launch (any depth; not inside node_modules or a
virtualenv):

- an existing one is bound read-only onto itself (whatever it is: a file where a protected
  directory belongs is kept too, so that the directory cannot take its place);
- a missing one is made at launch as an empty file or directory, bound read-only (so it cannot
  be created), and removed after the session;
- every directory between the workspace and a protected path is bound onto itself (writable,
  as it was), which makes it a mount point: renaming it (`mv .git .git.old`, then a fresh
  `.git/config`) fails with EBUSY instead of carrying the protection away.

A bare git repository (HEAD, objects and refs in the directory itself) is a git directory of
its own, protected as a .git is. Mercurial's names apply where a .hg is.

git's own trusted files are protected in every git directory of such a repository: its own
(.git), each submodule's (.git/modules/NAME), each linked worktree's (.git/worktrees/NAME),
and the one a `.git` file points to or a commondir names, where the session writes (its
workspace or run directory): `config` and `hooks` (git runs what they name), and `commondir`,
which names the directory git takes config and hooks from. A missing commondir is made holding
".", the git directory itself, which changes nothing for git. A pointer the session could
re-point (through a symlink of its own) is refused.

The list is the caller's to extend (`--protect PATH`, relative to the workspace) or shorten
(`--unprotect NAME`). Anything else a session wrote (Makefiles, scripts, venvs, a repository
it created itself) stays untrusted input to the host.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence

from nsconfine import _plan as p
from nsconfine import _syscalls
from nsconfine._errors import PlanError
from nsconfine._mountpoints import is_stub
from nsconfine._plan import printable, within

# The session's writable binds, each as (where the sandbox shows it, its resolved source).
Writable = Sequence[tuple[str, str]]

# (name relative to a repository, what to make if missing, why the host trusts it). Names under
# .git/ apply to every git directory of the repository (see the module's docstring).
PROTECTED: tuple[tuple[str, str, str], ...] = (
    (".git/config", "file", "git runs what it names on the host (core.fsmonitor, aliases)"),
    (".git/config.worktree", "file", "git reads it as config with extensions.worktreeConfig"),
    (".git/hooks", "dir", "git runs these hooks on the host"),
    (".git/commondir", "commondir", "git takes its config and hooks from the directory it names"),
    (".gitmodules", "file", "git clones and runs submodule URLs and commands from it"),
    (".envrc", "file", "direnv runs it in the host's shell"),
    (".vscode", "dir", "the editor runs tasks and settings from it on the host"),
    (".idea", "dir", "the IDE runs run-configurations from it on the host"),
    (".claude/settings.json", "file", "Claude Code on the host runs its hooks and commands"),
    (".claude/settings.local.json", "file", "Claude Code on the host runs its hooks"),
    (".claude/commands", "dir", "Claude Code on the host runs these commands"),
    (".claude/agents", "dir", "Claude Code on the host runs these agents"),
    (".mcp.json", "file", "agents on the host start the MCP servers it names"),
    (".codex", "dir", "Codex on the host reads its settings and commands"),
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
NOT_SCANNED = frozenset({"node_modules", ".venv", "venv", "__pycache__", ".tox"})
# Names inside a version control directory, protected only where that directory is (as git's
# are): an empty read-only stand-in would stop `hg init`, and look like a repository.
ONLY_WHERE_PRESENT = (".hg/",)
# Each repository adds up to two dozen read-only binds (64 take about 4,600 of bwrap's
# arguments), and bwrap takes at most 9,000.
MAX_REPOSITORIES = 64


def protected_names(protect: Iterable[str], unprotect: Iterable[str]) -> list[tuple[str, str, str]]:
    """The default list less unprotect, plus protect (each a path relative to a repository)."""
    dropped = {name.strip("/") for name in unprotect}
    names = [item for item in PROTECTED if item[0] not in dropped]
    known = {name for name, _, _ in names}
    for extra in protect:
        name = os.path.normpath(extra.strip("/"))
        if name.startswith("..") or (os.path.isabs(extra) and not extra.startswith("/")):
            raise PlanError(f"--protect {printable(extra)} must lie inside the workspace")
        if name not in known and name not in dropped:
            names.append((name, "file", "named by --protect: the host trusts it"))
            known.add(name)
    return names


def repositories(workspace: str) -> list[tuple[str, bool]]:
    """The workspace and every repository inside it, each with whether it is a bare git
    repository (itself a git directory: HEAD, objects and refs): one whose .git is a pointer
    file or a git directory with a HEAD, one with a Mercurial .hg, or a bare one (not looked
    into). Found without following symlinks. PlanError when there are more than
    MAX_REPOSITORIES, or more than REPOSITORY_SCAN directories to look through."""
    found = [(workspace, False)]
    queue = [workspace]
    seen = 0
    while queue:
        directory = queue.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False) or entry.name in NOT_SCANNED:
                continue
            if entry.name == ".git":
                continue  # a git directory: looked through by git_directories()
            seen += 1
            if seen > REPOSITORY_SCAN:
                raise PlanError(
                    f"the workspace {printable(workspace)} holds more than {REPOSITORY_SCAN:,} "
                    "directories (outside node_modules and virtualenvs): nsconfine looks through "
                    "all of them for git repositories whose trusted files it keeps read-only, "
                    "and will not protect less than it says; make the workspace smaller, or "
                    "--unprotect every protected name"
                )
            if _is_bare_repository(entry.path):
                found.append((entry.path, True))
                continue  # a git directory: what git trusts there is protected as .git's
            if _is_repository(entry.path):
                found.append((entry.path, False))
            queue.append(entry.path)
    if len(found) - 1 > MAX_REPOSITORIES:
        raise PlanError(
            f"the workspace {printable(workspace)} holds {len(found) - 1} git repositories: "
            f"nsconfine keeps the trusted files of each read-only, at most {MAX_REPOSITORIES} "
            "in one plan (each adds up to two dozen binds); remove some, or --unprotect the "
            "protected names"
        )
    return found


def _is_repository(directory: str) -> bool:
    dot_git = os.path.join(directory, ".git")
    mode = _lstat_mode(dot_git)
    if stat.S_ISREG(mode) or (stat.S_ISDIR(mode) and os.path.lexists(dot_git + "/HEAD")):
        return True
    return stat.S_ISDIR(_lstat_mode(os.path.join(directory, ".hg")))


def _is_bare_repository(directory: str) -> bool:
    return stat.S_ISREG(_lstat_mode(os.path.join(directory, "HEAD"))) and all(
        stat.S_ISDIR(_lstat_mode(os.path.join(directory, name))) for name in ("objects", "refs")
    )


def _lstat_mode(path: str) -> int:
    """The file's mode, not through a symlink; 0 if there is none."""
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def git_directories(repository: str, writable: Writable) -> list[str]:
    """Each git directory of a repository that lies where the session writes: .git itself, or
    the one a .git pointer file names; the one each names as its commondir; every submodule's
    under modules/ (at any depth: a name may hold slashes, a submodule have its own) and every
    linked worktree's under worktrees/. Each gets all of git's protected names, whatever it
    is (an empty stub changes nothing where git does not look). Not through symlinks;
    PlanError past REPOSITORY_SCAN directories, or for a pointer the session could re-point."""
    dot_git = os.path.join(repository, ".git")
    mode = _lstat_mode(dot_git)
    if not mode:
        return []
    if stat.S_ISLNK(mode):
        raise PlanError(
            f"{printable(dot_git)} is a symlink: a session may have planted it to make the "
            "launcher read what it points to; remove it (a worktree's .git is a file)"
        )
    top = _named_directory(dot_git, writable, "gitdir: ") if stat.S_ISREG(mode) else dot_git
    if top is None or os.path.islink(top) or not os.path.isdir(top):
        return []
    found: list[str] = []
    # (directory, what it is): "gitdir", or "name" (a directory under modules/ without a
    # HEAD: part of a submodule's name)
    pending = [(top, "gitdir")]
    seen = 0
    while pending:
        directory, what = pending.pop()
        seen += 1
        if seen > REPOSITORY_SCAN:
            raise PlanError(
                f"{printable(dot_git)} holds more than {REPOSITORY_SCAN:,} directories of "
                "submodules and worktrees: nsconfine will not protect less than it says"
            )
        if what == "name":
            pending += [(d, _module(d)) for d in _subdirectories(directory)]
            continue
        if directory in found:
            continue  # named again, as a worktree's commondir names its repository's
        found.append(directory)
        # git takes config and hooks from the directory commondir names: protected as well
        common = _named_directory(directory + "/commondir", writable)
        if common is not None and os.path.isdir(common) and not os.path.islink(common):
            pending.append((common, "gitdir"))
        pending += [(d, _module(d)) for d in _subdirectories(directory + "/modules")]
        pending += [
            (d, "gitdir")
            for d in _subdirectories(directory + "/worktrees")
            if os.path.lexists(d + "/HEAD")
        ]
    return found


def _module(directory: str) -> str:
    return "gitdir" if os.path.lexists(directory + "/HEAD") else "name"


def _subdirectories(directory: str) -> list[str]:
    """The directories in directory (not symlinks to one); none if it cannot be read."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    return [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]


def _named_directory(named_by: str, writable: Writable, prefix: str = "") -> str | None:
    """The directory a git file names (a .git pointer: "gitdir: PATH"; a commondir: PATH),
    relative to the directory that holds the file, as git resolves it; None if there is none
    to read, or it lies where the session cannot write (not the session's to change).
    PlanError if the session could change where it leads: a symlink, or a directory left by
    `..`, where the session writes (the directories on the way to it are pinned)."""
    raw = _syscalls.read_untrusted(named_by, 4096)
    # As git reads it: the whole file less its trailing newlines (spaces are kept), then as a C
    # string (a NUL ends it, after a newline too), bytes as they are.
    text = os.fsdecode(raw.rstrip(b"\r\n").split(b"\0", 1)[0]) if raw else ""
    named = text[len(prefix) :]
    if not text.startswith(prefix) or not named:
        return None
    looked, end = _syscalls.lookups(_syscalls.realpath(os.path.dirname(named_by)), named)
    for path in looked:
        if within(path, "/proc") or (not within(end, path) and _writable_path(path, writable)):
            raise PlanError(
                f"{printable(named_by)} names {printable(named)}, which leads "
                f"through {printable(path)}: the session can change that, and so where the "
                "host's git goes; name the git directory by a path of plain directories, then "
                "launch again"
            )
    return _writable_path(end, writable)


def _writable_path(real: str, writable: Writable) -> str | None:
    """A real path as the sandbox names it, if it lies in one of the session's writable
    binds (dest, resolved source)."""
    for dest, source in writable:
        if within(real, source):
            return dest + real[len(source.rstrip("/")) :]
    return None


def protected_entries(
    workspace: str,
    writable: Writable,
    protect: Sequence[str] = (),
    unprotect: Sequence[str] = (),
) -> list[p.Entry]:
    """A read-only entry for each protected path of each repository in the workspace (made at
    launch if missing), and of each git directory they use where the session writes (the
    workspace, or its run directory). The directories above them are pinned by the session
    layer, as for any read-only path inside a writable bind."""
    names = protected_names(protect, unprotect)
    if not names:
        return []
    git_names = [item for item in names if item[0].startswith(".git/")]
    tree_names = [item for item in names if not item[0].startswith(".git/")]
    entries: dict[str, p.Entry] = {}

    def protect_path(base: str, relative: str, kind: str, reason: str, name: str) -> None:
        target = _to_protect(base, relative, kind, name)
        if target is not None:
            path, stub = target
            why = f"{reason}: read-only, so the host never runs what a session wrote"
            entries.setdefault(path, p.ro_bind(path, path, why, stub=stub))

    for base, bare in repositories(workspace):
        if bare:
            for name, kind, reason in git_names:
                protect_path(base, name[len(".git/") :], kind, reason, name)
            continue
        pointer = os.path.join(base, ".git")
        if git_names and os.path.isfile(pointer) and not os.path.islink(pointer):
            why = "a gitdir pointer: git on the host follows it; read-only"
            entries.setdefault(pointer, p.ro_bind(pointer, pointer, why))
        for gitdir in git_directories(base, writable) if git_names else []:
            for name, kind, reason in git_names:
                protect_path(gitdir, name[len(".git/") :], kind, reason, name)
        for name, kind, reason in tree_names:
            top = name.split("/", 1)[0] + "/"
            if top in ONLY_WHERE_PRESENT and not os.path.isdir(os.path.join(base, top)):
                continue
            protect_path(base, name, kind, reason, name)
    return list(entries.values())


def _to_protect(base: str, relative: str, kind: str, name: str) -> tuple[str, str] | None:
    """The path to bind read-only for relative under base (the protected name's path there),
    and what to make there if it is missing at launch: that path itself; or, if a directory on
    the way is missing, that directory (an empty read-only one blocks everything below it);
    or, if a file is in the way of a directory, that file (kept as it is, so the directory
    cannot take its place). Refused: a symlink, FIFO, socket or device on the way (a session
    may have planted it: the host would follow a symlink, and read from a FIFO what the
    session writes through the read-only bind)."""
    path = base
    parts = relative.split("/")
    for index, part in enumerate(parts):
        path = os.path.join(path, part)
        last = index == len(parts) - 1
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return path, kind if last else "dir"
        except OSError as error:
            raise PlanError(f"{printable(path)} cannot be protected: {error.strerror}") from None
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise PlanError(
                f"{printable(path)} is a {_file_type(mode)}, where a file the host trusts "
                "belongs: a session may have planted it; remove it (or --unprotect "
                f"{printable(name)})"
            )
        if not last and not stat.S_ISDIR(mode):
            return path, "file"  # in the way of the directory: kept, so none can be made
        if not last and is_stub(path):
            return path, "dir"  # another session's stub: judged as the missing directory it is
    return path, kind


def _file_type(mode: int) -> str:
    """What a file that is neither a regular file nor a directory is, for a refusal."""
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"
