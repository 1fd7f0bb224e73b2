"""Files the host trusts, kept read-only inside the session's writable workspace.

A session writes its workspace; the host later runs git, direnv, editors and agents there,
which trust what they find: `git config core.fsmonitor '…'` in a workspace runs on the host's
next `git status`. So these paths are read-only in every session, at the workspace's top and
in every repository inside it that exists at launch:

- an existing one is bound read-only onto itself;
- a missing one is made at launch as an empty file or directory, bound read-only (so it cannot
  be created), and removed after the session;
- every directory between the workspace and a protected path is bound onto itself (writable,
  as it was), which makes it a mount point: renaming it (`mv .git .git.old`, then a fresh
  `.git/config`) fails with EBUSY instead of carrying the protection away.

The list is the caller's to extend (`--protect PATH`, relative to the workspace) or shorten
(`--unprotect NAME`). Anything else a session wrote (Makefiles, scripts, venvs, a repository
it created itself) stays untrusted input to the host.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence

from nsconfine import _plan as p
from nsconfine._errors import PlanError
from nsconfine._plan import printable

# (name relative to the workspace or a repository, "file" or "dir", why the host trusts it)
PROTECTED: tuple[tuple[str, str, str], ...] = (
    (".git/config", "file", "git runs what it names on the host (core.fsmonitor, aliases)"),
    (".git/hooks", "dir", "git runs these hooks on the host"),
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
)

# The repository scan: this deep below the workspace, at most this many directories, never
# into these (large, generated, or git's own).
REPOSITORY_DEPTH = 4
REPOSITORY_SCAN = 5_000
NOT_SCANNED = frozenset({".git", "node_modules", ".venv", "venv", "__pycache__", ".tox"})


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


def repositories(workspace: str) -> list[str]:
    """The workspace and every git repository inside it (a directory with a .git, file or
    directory), not through symlinks, within REPOSITORY_DEPTH and REPOSITORY_SCAN."""
    found = [workspace]
    queue = [(workspace, 0)]
    seen = 0
    while queue and seen < REPOSITORY_SCAN:
        directory, depth = queue.pop(0)
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False) or entry.name in NOT_SCANNED:
                continue
            seen += 1
            if os.path.lexists(os.path.join(entry.path, ".git")):
                found.append(entry.path)
            if depth + 1 < REPOSITORY_DEPTH:
                queue.append((entry.path, depth + 1))
    return found


def protected_entries(
    workspace: str, protect: Sequence[str] = (), unprotect: Sequence[str] = ()
) -> list[p.Entry]:
    """A read-only entry for each protected path of each repository in the workspace (made
    empty at launch if missing). The directories above them are pinned by the session layer,
    as for any read-only path inside a writable bind."""
    names = protected_names(protect, unprotect)
    entries: dict[str, p.Entry] = {}
    for base in repositories(workspace):
        pointer = os.path.join(base, ".git")
        if ".git/config" in {name for name, _, _ in names} and os.path.isfile(pointer):
            why = "a gitdir pointer: git on the host follows it; read-only"
            entries.setdefault(pointer, p.ro_bind(pointer, pointer, why))
        for name, kind, reason in names:
            if name.startswith(".git/") and not os.path.isdir(os.path.join(base, ".git")):
                continue  # not a repository (or a worktree): nothing of git's to protect here
            target = _first_missing_or_whole(base, name)
            if target is None:
                continue
            path, is_whole = target
            stub = kind if is_whole else "dir"
            why = f"{reason}: read-only, so the host never runs what a session wrote"
            entries.setdefault(path, p.ro_bind(path, path, why, stub=stub))
    return list(entries.values())


def _first_missing_or_whole(base: str, name: str) -> tuple[str, bool] | None:
    """The path to protect for name under base: name itself if every directory above it
    exists, else the first missing directory on the way (an empty read-only one blocks
    everything below it). Refused: a symlink on the way (a session may have planted it)."""
    path = base
    parts = name.split("/")
    for index, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return path, index == len(parts) - 1
        except OSError as error:
            raise PlanError(f"{printable(path)} cannot be protected: {error.strerror}") from None
        if stat.S_ISLNK(mode):
            raise PlanError(
                f"{printable(path)} is a symlink, where a file the host trusts belongs: a "
                "session may have planted it; remove it (or --unprotect "
                f"{printable(name)})"
            )
        if index < len(parts) - 1 and not stat.S_ISDIR(mode):
            return None  # .git is a file (a worktree or submodule): its config lives elsewhere
    return path, True
