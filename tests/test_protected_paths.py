"""Protected paths: what the host trusts in a workspace (.git/config and hooks, .envrc, editor
and agent settings, shell rc files, Mercurial's config, dev-container files) stays read-only,
in every repository git or Mercurial would use, however a session prepared it between
launches; and what a session could still write is named after it.

Each test plants the attack for real and launches real sessions; each protection has a twin
showing the check fail without it.
"""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    SESSION_USER,
    attempt,
    cli,
    give_to_session_user,
    open_up,
    outcome_without_hanging,
    pids_with,
    python_child,
    session,
    session_dirs,
    session_options,
    wait_until_gone,
)

import nsconfine
from nsconfine._kernel.accounts import launcher_account
from nsconfine._plan.model import Kind, Mode

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


# ------------------------------------------------------------------ files the host trusts

PROTECTED_FILES = [
    ".git/config",
    ".gitmodules",
    ".envrc",
    # (hostile review, stop 44: mise runs the hooks and env scripts of a config it was told to
    # trust, by its path, on the host's next cd: a session's edit ran)
    "mise.toml",
    ".mise.toml",
    ".claude/settings.json",
    ".claude/settings.local.json",
    # (agents' pass, stop 44: Claude Code on the host submits these prompts by itself, and
    # loads its rules as instructions; in a project's own .claude the session wrote them)
    ".claude/scheduled_tasks.json",
    ".claude/loop.md",
    ".mcp.json",
    ".bashrc",
    ".zshrc",
    ".profile",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".hg/hgrc",
    # (mutation pass, stop 35: .gemini and .zed were never tried; in a directory the project
    # already has, as in none)
    ".gemini/settings.json",
    ".zed/tasks.json",
]
PROTECTED_DIRS = [
    ".git/hooks",
    ".vscode",
    ".idea",
    ".claude/commands",
    ".claude/agents",
    ".claude/hooks",
    ".claude/skills",
    ".claude/rules",
    ".claude/workflows",
    ".claude/routines",
    ".agents/skills",  # Codex's repository skills (agents' pass, stop 44)
    ".codex",
    ".cursor",
    ".gemini",
    ".zed",
]


def _git_script(workspace: Path) -> str:
    return f"""
set -e
cd {workspace}
export GIT_CONFIG_NOSYSTEM=1 GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@a GIT_COMMITTER_NAME=a
export GIT_COMMITTER_EMAIL=a@a
echo more >> README
git add README
git commit -q -m two
git branch feature
git tag v1
git push -q {workspace}/remote.git main
git fetch -q {workspace}/remote.git main
git log --oneline | wc -l
"""


def test_git_keeps_working_with_protected_paths(repo: tuple[Path, Path]) -> None:
    """add, commit, branch, tag, push and fetch to a local remote all work in a session."""
    plan = session(*repo).plan()
    status, output = attempt(plan, _git_script(repo[0]))
    assert status == 0, output
    assert output.split()[-1] == "2"


@pytest.mark.parametrize("relative", PROTECTED_FILES + PROTECTED_DIRS)
def test_protected_paths_cannot_be_written_or_created(
    repo: tuple[Path, Path], relative: str
) -> None:
    """Each protected path, existing or not, at the top and in a nested repository, can be
    neither written, created, removed nor replaced. (Mercurial's, as git's, where its
    directory is: made here; Claude Code's and Codex's in a project's own .claude or .agents,
    made here too, and where there is none. Gemini CLI's and Zed's: in a .gemini or .zed made
    here, and where there is none.)"""
    workspace = repo[0]
    if relative.startswith((".hg/", ".claude/", ".agents/", ".gemini/", ".zed/")):
        for base in (workspace, workspace / "vendor" / "lib"):
            (base / relative.split("/")[0]).mkdir()
        give_to_session_user(workspace)
    plan = session(*repo).plan()
    for base in (workspace, workspace / "vendor" / "lib"):
        target = base / relative
        before = target.read_bytes() if target.is_file() else None
        attack = (
            f"mkdir -p {target.parent} 2>/dev/null; "
            f"(echo evil > {target}) 2>/dev/null; (echo evil >> {target}) 2>/dev/null; "
            f"(mkdir -p {target}/x && echo evil > {target}/x/y) 2>/dev/null; "
            f"rm -rf {target} 2>/dev/null; (echo evil > {target}) 2>/dev/null; true"
        )
        attempt(plan, attack)
        if before is not None:
            assert target.read_bytes() == before, target
        elif target.is_dir():
            assert not any(target.rglob("y")), target
        else:
            assert not target.exists() or "evil" not in target.read_text(), target


# A directory kept read-only (a protected one, or an --ro one in the workspace) that holds a
# repository, or what looks like one (objects/ and refs/): where the repository's own
# protection went, a directory inside must stay as read-only as the one that holds it.
REPOSITORIES_IN_READ_ONLY = {
    "a cloned skill": (".claude/skills/my-skill", "git", None),
    "a look-alike in .vscode": (".vscode/x", "look-alike", None),
    "an --ro directory holding one": ("vendor/lib", "git", "vendor"),
    "an --ro repository": ("vendor/lib", "git", "vendor/lib"),
}


@pytest.mark.parametrize("case", REPOSITORIES_IN_READ_ONLY)
def test_a_repository_inside_a_read_only_directory_stays_read_only(
    tmp_path: Path, case: str
) -> None:
    """Nothing in a repository inside a read-only directory can be written: not its files,
    not its git directory, not a new file beside them. (The directories between the
    workspace and a repository's protected files are bound writable, so that renaming them
    cannot carry those files away; inside a read-only directory they must not be.)"""
    relative, kind, read_only = REPOSITORIES_IN_READ_ONLY[case]
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    where = workspace / relative
    where.mkdir(parents=True)
    (where / "SKILL.md").write_text("trusted\n")
    if kind == "git":
        subprocess.run(["git", "init", "-q", str(where)], check=True)
    else:
        (where / "objects").mkdir()
        (where / "refs").mkdir()
    give_to_session_user(workspace)
    ro = [str(workspace / read_only)] if read_only else []
    plan = session(workspace, run_dir, ro=ro).plan()
    head = where / ".git" / "HEAD"
    head_before = head.read_bytes() if head.exists() else None
    status, output = attempt(
        plan,
        f"echo control > {workspace}/control && cd {where} && "
        f"(echo evil >> SKILL.md) 2>/dev/null && echo wrote-file; "
        f"(echo evil > new.sh) 2>/dev/null && echo wrote-new; "
        f"(echo evil > .git/HEAD) 2>/dev/null && echo wrote-head; true",
    )
    assert status == 0, output  # the control: the session ran, and wrote where it may
    assert (workspace / "control").exists(), output
    assert "wrote" not in output, output
    assert (where / "SKILL.md").read_text() == "trusted\n"
    assert not (where / "new.sh").exists()
    assert (head.read_bytes() if head.exists() else None) == head_before


def test_a_repository_bound_writable_inside_a_read_only_directory_is_protected(
    tmp_path: Path,
) -> None:
    """A writable bind inside a read-only one (`--ro sub`, then sub/inner writable: a build
    directory) is writable again below it: a repository there keeps its config, hooks and
    trusted files read-only, as anywhere the session writes."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    inner = workspace / "sub" / "inner"
    inner.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(inner)], check=True)
    give_to_session_user(workspace)
    binds = [
        nsconfine.Bind(str(workspace / "sub"), str(workspace / "sub"), "ro", "vendored"),
        nsconfine.Bind(str(inner), str(inner), "rw", "its build directory"),
    ]
    plan = session(workspace, run_dir, binds=binds).plan()
    config_before = (inner / ".git" / "config").read_bytes()
    _, output = attempt(
        plan,
        f"cd {inner} && (echo '[core] fsmonitor = evil' >> .git/config) 2>/dev/null && "
        "echo wrote-config; (echo evil > .git/hooks/post-checkout) 2>/dev/null && "
        "echo wrote-hook; (echo evil > .envrc) 2>/dev/null && echo wrote-envrc; "
        "(echo built > out.o) 2>/dev/null && echo wrote-build; true",
    )
    assert "wrote-build" in output, output  # the control: the bind is writable
    for refused in ("wrote-config", "wrote-hook", "wrote-envrc"):
        assert refused not in output, output
    assert (inner / ".git" / "config").read_bytes() == config_before
    assert not (inner / ".git" / "hooks" / "post-checkout").exists()


def test_a_writable_bind_inside_a_protected_directory_is_refused_not_dropped(
    tmp_path: Path,
) -> None:
    """A writable bind asked for inside a directory the plan keeps read-only (a protected
    .claude/skills) would not be writable: the plan is refused, saying which keeps it so,
    rather than built without it."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    inner = workspace / ".claude" / "skills" / "tool" / "inner"
    inner.mkdir(parents=True)
    give_to_session_user(workspace)
    bind = nsconfine.Bind(str(inner), str(inner), "rw", "the tool's scratch")
    with pytest.raises(nsconfine.PlanError, match=r"read-only.*skills"):
        session(workspace, run_dir, binds=[bind]).plan()


def test_renaming_a_directory_cannot_carry_git_config_away(repo: tuple[Path, Path]) -> None:
    """`mv .git .git.old` and a fresh .git/config fail; the host's .git/config is unchanged."""
    workspace = repo[0]
    before = (workspace / ".git" / "config").read_text()
    plan = session(*repo).plan()
    attempt(
        plan,
        f"cd {workspace}; mv .git .git.old; mkdir -p .git; "
        "printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' > .git/config; true",
    )
    assert (workspace / ".git" / "config").read_text() == before
    assert "fsmonitor" not in (workspace / ".git" / "config").read_text()


def test_the_manifest_lists_each_protected_path_with_its_reason(repo: tuple[Path, Path]) -> None:
    """Each protected path is a read-only entry with its reason; --unprotect drops one and
    --protect adds one, with the reason the caller gives."""
    workspace = repo[0]
    plan = session(*repo).plan()
    entries = {e.dest: e for e in plan.entries}
    for relative in (".git/config", ".envrc", ".vscode"):
        entry = entries[str(workspace / relative)]
        assert entry.mode == "ro"
        assert "host" in entry.reason
    fewer = session(*repo, unprotect=[".envrc"], protect=["Makefile"]).plan()
    dests = {e.dest for e in fewer.entries}
    assert str(workspace / ".envrc") not in dests
    assert str(workspace / "Makefile") in dests


@pytest.mark.parametrize(
    "given_by", ["cli", "session", "profile", "profile {workspace}", "profile $NAME"]
)
def test_an_absolute_protect_path_in_the_workspace_is_kept_read_only(
    tmp_path: Path, given_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--protect WORKSPACE/deploy.yml` protects that file, as `--protect deploy.yml` does, from
    the command line, Session and a profile alike (attackers' pass: its leading "/" was
    stripped and the rest taken from the workspace, WORKSPACE/tmp/.../deploy.yml, so the
    manifest showed an empty directory made at WORKSPACE/tmp and the session overwrote the
    host's deploy.yml). A profile's `{workspace}/deploy.yml` is that path too (it was taken
    as a name, and an empty directory `{workspace}` made in the workspace); so is one that
    begins with a variable, `$NAME/deploy.yml` (it was taken as a name too)."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    monkeypatch.setenv("NSCONFINE_TEST_WORKSPACE", str(workspace))
    deploy = workspace / "deploy.yml"
    deploy.write_text("target: production\n")
    give_to_session_user(deploy)
    overwrite = "echo PWNED > deploy.yml"
    if given_by == "cli":
        ran = cli("run", *session_options(workspace, run_dir), "--protect", str(deploy), "--",
                  "/bin/sh", "-c", overwrite)  # fmt: skip
        assert ran.returncode == 2, ran.stderr  # sh's: the file is read-only
    else:
        if given_by == "session":
            options: dict[str, Any] = {"protect": [str(deploy)]}
        else:
            profile = tmp_path / "deploy.toml"
            named = {
                "profile {workspace}": "{workspace}/deploy.yml",
                "profile $NAME": "$NSCONFINE_TEST_WORKSPACE/deploy.yml",
            }.get(given_by, str(deploy))
            profile.write_text(f'description = "a deploy role"\nprotect = ["{named}"]\n')
            profile.chmod(0o644)
            options = {"profile": [str(profile)]}
        plan = session(workspace, run_dir, **options).plan()
        protected = [e for e in plan.entries if "named by --protect" in e.reason]
        assert [(e.dest, e.mode) for e in protected] == [(str(deploy), "ro")]
        status, output = attempt(plan, overwrite)
        assert status != 0, output
    assert deploy.read_text() == "target: production\n"
    assert sorted(p.name for p in workspace.iterdir()) == ["deploy.yml"]


@pytest.mark.parametrize(
    ("option", "given", "said"),
    [
        ("protect", "/etc/passwd", "relative to the workspace"),
        ("protect", "{run_dir}/notes", "relative to the workspace"),
        ("protect", "{workspace}/../run", "relative to the workspace"),
        ("protect", "{workspace}", "is the workspace itself"),
        ("unprotect", "/etc/passwd", "relative to the workspace"),
        ("unprotect", "{workspace}", "is the workspace itself"),
        ("unprotect", ".evnrc", "names no protected path"),
        ("unprotect", ".git", "names no protected path"),
    ],
)
def test_a_protect_or_unprotect_path_that_names_nothing_protectable_is_refused(
    ws_run: tuple[Path, Path], option: str, given: str, said: str
) -> None:
    """A protect path outside the workspace (or the workspace itself) is refused at plan time,
    saying what to name instead, from the command line as from Session (it was taken as a
    path under the workspace, and protected nothing it named). So is an unprotect naming no
    protected path (a typo, a directory whose files are listed, a path outside): it used to be
    dropped without a word, and the caller believed the path writable."""
    workspace, run_dir = ws_run
    path = given.format(workspace=workspace, run_dir=run_dir)
    with pytest.raises(nsconfine.PlanError, match=said):
        session(workspace, run_dir, **{option: [path]}).plan()
    refused = cli("plan", *session_options(workspace, run_dir), f"--{option}", path)
    assert refused.returncode == 65, refused.stderr
    assert said in refused.stderr


def test_a_profile_protect_name_is_expanded_only_after_a_placeholder(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A profile's protect name that begins with a brace but no placeholder (a cookiecutter
    template's `{{cookiecutter.slug}}/deploy.yml`) is a name as before; one whose placeholder
    is followed by a variable the launcher does not set is a usage error naming it, not a
    traceback (attackers' pass: refused as not absolute, and an AssertionError)."""
    workspace, run_dir = ws_run
    (workspace / "{{cookiecutter.slug}}").mkdir()
    give_to_session_user(workspace / "{{cookiecutter.slug}}")
    profile = tmp_path / "template.toml"
    profile.write_text('description = "t"\nprotect = ["{{cookiecutter.slug}}/deploy.yml"]\n')
    profile.chmod(0o644)
    plan = session(workspace, run_dir, profile=[str(profile)]).plan()
    named = [e.dest for e in plan.entries if "named by --protect" in e.reason]
    assert named == [str(workspace / "{{cookiecutter.slug}}" / "deploy.yml")]
    profile.write_text('description = "t"\nprotect = ["{workspace}/$NSCONFINE_UNSET_X/x.yml"]\n')
    with pytest.raises(nsconfine.UsageError, match="does not set"):
        session(workspace, run_dir, profile=[str(profile)]).plan()
    refused = cli("plan", *session_options(workspace, run_dir), "--profile", str(profile))
    assert (refused.returncode, "Traceback" in refused.stderr) == (64, False), refused.stderr


def test_an_absolute_unprotect_path_in_the_workspace_drops_that_name(
    repo: tuple[Path, Path],
) -> None:
    """`--unprotect WORKSPACE/.envrc` leaves .envrc writable, as `--unprotect .envrc` does (it
    was stripped of its leading "/" and matched no name: nothing was dropped, silently)."""
    workspace = repo[0]
    plan = session(*repo, unprotect=[str(workspace / ".envrc")]).plan()
    dests = {e.dest for e in plan.entries}
    assert str(workspace / ".envrc") not in dests
    assert str(workspace / ".git" / "config") in dests


def test_a_protect_name_that_begins_with_two_dots_is_inside_the_workspace(
    ws_run: tuple[Path, Path],
) -> None:
    """`--protect ..env` is a file in the workspace, kept read-only (it was refused as if it
    left the workspace); `--protect ../x` still is refused."""
    workspace, run_dir = ws_run
    plan = session(workspace, run_dir, protect=["..env"]).plan()
    entries = {e.dest: e.mode for e in plan.entries}
    assert entries[str(workspace / "..env")] == "ro"
    with pytest.raises(nsconfine.PlanError, match="must lie inside the workspace"):
        session(workspace, run_dir, protect=["../x"]).plan()


def test_without_protection_git_config_is_writable(repo: tuple[Path, Path]) -> None:
    """The twin: with every path unprotected, the session rewrites .git/config."""
    workspace = repo[0]
    from nsconfine._plan.protect import PROTECTED

    plan = session(*repo, unprotect=[name for name, _, _ in PROTECTED]).plan()
    assert not any(e.dest.endswith(".git/config") for e in plan.entries if e.kind is Kind.BIND)
    attempt(plan, f"echo '# rewritten' >> {workspace}/.git/config")
    assert "# rewritten" in (workspace / ".git" / "config").read_text()


def test_protection_holds_for_the_session_user(tmp_path: Path) -> None:
    """The control: the session's account can write its workspace's ordinary files."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    plan = session(workspace, run_dir).plan()
    assert attempt(plan, f"echo ok > {workspace}/ordinary.txt")[0] == 0
    assert (workspace / "ordinary.txt").read_text() == "ok\n"
    if SESSION_USER:
        assert (workspace / "ordinary.txt").owner() == SESSION_USER


# ------------------------------------------------------------------ pointers, links and renames


def _host_git(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The host's git in the workspace, as the host user would run it (no global config)."""
    environ = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(workspace.parent)}
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(workspace), *args],
        capture_output=True, text=True, env=environ, check=False,
    )  # fmt: skip


def _reported_after(repo: tuple[Path, Path], script: str) -> list[str]:
    """What untrusted_config names after a session of repo's plan that ran script (which must
    succeed)."""
    made = nsconfine.spawn(session(*repo).plan(), ["/bin/sh", "-c", script])
    assert made.wait() == 0
    return made.untrusted_config or []


def _assert_named(written: list[str], workspace: Path, *links: str) -> None:
    """Each of links (relative to workspace) is in the report written."""
    for link in links:
        assert str(workspace / link) in written, (link, written)


_EVIL_CONFIG = "[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch /tmp/pwned\\n"


def test_commondir_cannot_redirect_git_config(repo: tuple[Path, Path]) -> None:
    """A session cannot point .git/commondir at a directory of its own, whose config (and
    hooks) the host's git would then run."""
    workspace = repo[0]
    plan = session(*repo).plan()
    attempt(
        plan,
        f"cd {workspace}; mkdir -p evil; cp -r .git/objects .git/refs .git/HEAD evil/; "
        f"printf '{_EVIL_CONFIG}' > evil/config; echo ../evil > .git/commondir; true",
    )
    assert _host_git(workspace, "config", "--get", "core.fsmonitor").stdout == ""
    assert _host_git(workspace, "status", "--short").returncode == 0


def test_git_works_with_commondir_protected(repo: tuple[Path, Path]) -> None:
    """The control for the test above: git in the session and on the host keeps working."""
    plan = session(*repo).plan()
    status, output = attempt(plan, _git_script(repo[0]))
    assert status == 0, output
    assert _host_git(repo[0], "log", "--oneline").stdout.count("\n") == 2


@pytest.mark.parametrize("linked", [".git/config", ".git/hooks/pre-commit", ".envrc"])
def test_a_hardlink_cannot_keep_a_protected_file_writable(
    repo: tuple[Path, Path], linked: str
) -> None:
    """A second name for a protected file (made by an earlier session, before the file was
    protected) does not make it writable: the launch is refused, or the file is unchanged."""
    workspace = repo[0]
    target = workspace / linked
    if not target.exists():
        target.write_text("#!/bin/sh\n")
    give_to_session_user(target)
    before = target.read_text()
    os.link(target, workspace / "notes.txt")
    plan = session(*repo).plan()
    attempt(plan, f"echo evil >> {workspace}/notes.txt")
    assert target.read_text() == before


@pytest.fixture
def repo_with_submodule(repo: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """The repo fixture with a submodule `sub` and a linked worktree `wt` beside it."""
    workspace = repo[0]
    environ = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path)}
    source = tmp_path / "sub-source"

    def git(where: Path, *args: str) -> None:
        subprocess.run(
            ["git", "-c", "safe.directory=*", "-c", "protocol.file.allow=always",
             "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(where), *args],
            check=True, capture_output=True, env=environ,
        )  # fmt: skip

    source.mkdir()
    git(source, "init", "-q")
    git(source, "commit", "-q", "--allow-empty", "-m", "s")
    git(workspace, "submodule", "-q", "add", str(source), "sub")
    git(workspace, "worktree", "add", "-q", str(workspace / "wt"))
    give_to_session_user(workspace)
    return repo


@pytest.mark.parametrize(
    "relative",
    [".git/modules/sub/config", ".git/modules/sub/hooks/x", ".git/worktrees/wt/commondir"],
)
def test_submodule_and_worktree_git_dirs_are_protected(
    repo_with_submodule: tuple[Path, Path], relative: str
) -> None:
    """A submodule's git directory (.git/modules/NAME) and a linked worktree's are protected
    like the repository's own."""
    workspace = repo_with_submodule[0]
    target = workspace / relative
    before = target.read_text() if target.exists() else None
    plan = session(*repo_with_submodule).plan()
    attempt(plan, f"(printf '{_EVIL_CONFIG}' >> {target}) 2>/dev/null; true")
    if before is None:
        assert not target.exists()
    else:
        assert target.read_text() == before


def test_a_deep_repository_is_protected(repo: tuple[Path, Path]) -> None:
    """A repository six levels below the workspace is found and protected."""
    workspace = repo[0]
    deep = workspace / "a" / "b" / "c" / "d" / "e" / "deep"
    deep.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(deep)], check=True, capture_output=True)
    give_to_session_user(workspace)
    plan = session(*repo).plan()
    assert str(deep / ".git" / "config") in {e.dest for e in plan.entries}


def test_a_repository_scan_cut_short_refuses_the_plan(
    repo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workspace with more directories than the scan looks through is refused by name,
    never protected less than it says."""
    from nsconfine._plan import protect as _protect

    monkeypatch.setattr(_protect, "REPOSITORY_SCAN", 20)
    for index in range(30):
        (repo[0] / f"d{index}").mkdir()
    with pytest.raises(nsconfine.PlanError, match="directories"):
        session(*repo).plan()


@pytest.mark.parametrize("layout", ["workspace-in-run-dir", "the-same", "profile-bind-above"])
def test_a_writable_bind_at_or_above_the_workspace_is_refused(tmp_path: Path, layout: str) -> None:
    """The host's git run in the workspace looks for a repository in every directory above it:
    one the session can write (its run directory holding the workspace, or a profile's bind of
    {workspace}/..) would give it a repository there whose config runs on the host, which
    the scan (of the workspace, and below) never sees. An attacker's pass: `git init` in the
    run directory, core.fsmonitor set, and the host's `git status` in the workspace ran it with
    no warning. Refused, saying how to lay them out."""
    base = session_dirs(tmp_path, "base")[0]
    if layout == "workspace-in-run-dir":
        run_dir = base
        workspace = session_dirs(base, "ws")[0]
        options: dict[str, object] = {}
    elif layout == "the-same":
        workspace = run_dir = base
        options = {}
    else:
        workspace, run_dir = session_dirs(base, "ws", "run")
        profile = tmp_path / "above.toml"
        profile.write_text(
            'description = "x"\n[[bind]]\nsource = "{workspace}/.."\nmode = "rw"\n'
            'reason = "the parent"\n'
        )
        profile.chmod(0o644)
        options = {"profile": [str(profile)]}
    with pytest.raises(nsconfine.PlanError, match="at or above the workspace"):
        session(workspace, run_dir, **options).plan()


def test_a_scan_past_its_entries_refuses_the_plan(
    repo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workspace whose directories hold more entries in all than the scan looks through
    (here 1,000, in one directory) is refused by name: a session that made millions of files
    there held every launch for seconds and the launcher's memory for hundreds of MB (an
    attacker's pass: 2,000,000 empty files, `run` 6.5 s and 660 MiB)."""
    from nsconfine._plan import protect as _protect

    monkeypatch.setattr(_protect, "ENTRIES_SCANNED", 1_000)
    crowded = repo[0] / "crowded"
    crowded.mkdir()
    for index in range(1_500):
        (crowded / f"f{index}").touch()
    with pytest.raises(nsconfine.PlanError, match="1,000 files and directories"):
        session(*repo).plan()


def test_a_scan_holds_what_it_needs_of_a_directory_not_every_entry(
    repo: tuple[Path, Path],
) -> None:
    """A directory of 100,000 files costs the plan's scan what it needs of it (its signs of a
    repository, its subdirectories and links), not every entry at once: its peak memory stays
    far below the ~30 MB that holding an entry object for each took."""
    import tracemalloc

    crowded = repo[0] / "crowded"
    crowded.mkdir()
    for index in range(100_000):
        (crowded / f"f{index}").touch()
    tracemalloc.start()
    try:
        session(*repo).plan()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


@pytest.mark.parametrize("name", [".claude", ".vscode"])
def test_a_file_where_a_protected_directory_goes_stays(repo: tuple[Path, Path], name: str) -> None:
    """A regular file where a protected directory belongs is kept read-only: the session cannot
    replace it by the directory the host trusts."""
    workspace = repo[0]
    (blocker := workspace / "vendor" / "lib" / name).write_text("a file\n")
    give_to_session_user(workspace)
    plan = session(*repo).plan()
    attempt(
        plan,
        f"cd {blocker.parent}; rm -f {name}; mkdir -p {name}/commands; "
        f"echo evil > {name}/settings.json; echo evil > {name}/tasks.json; true",
    )
    assert blocker.is_file()
    assert blocker.read_text() == "a file\n"


def test_many_repositories_are_refused_by_what_they_are(repo: tuple[Path, Path]) -> None:
    """A workspace with more repositories than one plan can protect is refused, saying so (not
    blaming runner files)."""
    for index in range(400):
        subprocess.run(["git", "init", "-q", str(repo[0] / f"r{index}")], check=True,
                       capture_output=True)  # fmt: skip
    with pytest.raises(nsconfine.PlanError, match="repositories") as refused:
        session(*repo).plan()
    assert "runner files" not in refused.value.message


def test_the_refusal_of_many_repositories_says_how_it_counts_them(tmp_path: Path) -> None:
    """A workspace with 64 repositories below a top that is none is refused as holding more
    than 64: the scan counts the top too (its trusted files are protected, repository or not),
    and the refusal says so (acceptance re-check: "more than 64" of exactly 64)."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    for index in range(64):
        subprocess.run(["git", "init", "-q", str(workspace / f"r{index}")], check=True,
                       capture_output=True)  # fmt: skip
    with pytest.raises(nsconfine.PlanError, match="repositories") as refused:
        session(workspace, run_dir).plan()
    assert "more than 64 repositories, counting its top" in refused.value.message


@pytest.mark.parametrize("target", ["/etc/shadow", "fifo"])
def test_a_git_symlink_at_the_workspace_top_is_never_followed(tmp_path: Path, target: str) -> None:
    """A session plants `.git -> /etc/shadow` (or a FIFO) at its workspace's top: the next plan
    is refused by name, without the launcher opening what it points to (a FIFO would hang it,
    a root launcher would read any file)."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    if target == "fifo":
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        target = str(fifo)
    (workspace / ".git").symlink_to(target)
    outcome = outcome_without_hanging(
        lambda: session(workspace, run_dir).plan(), "the planted .git"
    )
    assert isinstance(outcome, nsconfine.PlanError), outcome
    assert ".git" in str(outcome)


# ------------------------------------------------------------------ redirects of trusted files
# Each plants, between launches, what would let the next session write a file the host's git
# trusts: a FIFO (a read-only mount does not stop writes through one), a symlink that leads
# into what the session writes, a commondir or gitdir pointer naming a git directory the
# protection did not cover.


def _launch(repo: tuple[Path, Path], script: str) -> tuple[int, str]:
    """attempt() in a session of the repo fixture, whose plan may be refused too."""
    try:
        plan = session(*repo).plan()
    except nsconfine.PlanError as refused:
        return -1, str(refused)
    return attempt(plan, script)


def _plant_config(path: Path) -> str:
    """A session's script that writes an fsmonitor command into path; prints `wrote` if it
    could."""
    return f"(printf '{_EVIL_CONFIG}' >> {shlex.quote(str(path))} && echo wrote) 2>/dev/null; true"


@pytest.mark.parametrize("relative", [".git/config", ".envrc", ".vscode/settings.json"])
def test_a_fifo_at_or_in_a_protected_path_is_refused(
    repo: tuple[Path, Path], relative: str
) -> None:
    """A FIFO where a trusted file goes (or inside a protected directory) would be written
    through its read-only bind, and read by the host's git, direnv or editor: refused."""
    workspace = repo[0]
    fifo = workspace / relative
    fifo.parent.mkdir(exist_ok=True)
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    give_to_session_user(workspace)
    status, output = _launch(repo, _plant_config(fifo))
    assert "wrote" not in output
    assert status == -1, output
    assert f"{relative} is a FIFO" in output


def test_a_socket_at_a_protected_path_is_refused_by_what_it_is(repo: tuple[Path, Path]) -> None:
    """A unix socket at .envrc: refused, and the refusal says what is there (it used to say the
    path had changed during the launch, and to launch again)."""
    import socket

    workspace = repo[0]
    (workspace / ".envrc").unlink()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(workspace / ".envrc"))
        give_to_session_user(workspace)
        status, output = _launch(repo, "true")
    assert status == -1, output
    assert ".envrc is a socket" in output


@pytest.mark.parametrize("chain", [False, True])
def test_a_hook_symlink_into_what_the_session_writes_is_refused(
    repo: tuple[Path, Path], chain: bool
) -> None:
    """A hook that is a symlink to a file the session can make later (a dangling link into the
    run directory), or to a system file through a link in the run directory the session can
    re-point: either way the host's git would run what the session wrote. Refused."""
    workspace, run_dir = repo
    hook = workspace / ".git" / "hooks" / "pre-commit"
    if chain:
        (run_dir / "link").symlink_to("/usr/bin")
        hook.symlink_to(run_dir / "link" / "true")
    else:
        hook.symlink_to(run_dir / "hook")
    give_to_session_user(workspace, run_dir)
    status, output = _launch(
        repo,
        f"printf '#!/bin/sh\\necho evil\\n' > {run_dir}/hook; chmod +x {run_dir}/hook; "
        f"ln -sfn {run_dir} {run_dir}/link; echo planted",
    )
    assert status == -1, output
    assert "pre-commit is a symlink" in output


def test_a_refused_symlinked_git_directory_names_the_unprotect_that_works(
    repo: tuple[Path, Path],
) -> None:
    """The refusal of a symlinked .git/hooks offers `--unprotect .git/hooks`, the name that
    does drop it (it offered `--unprotect hooks`, which does nothing)."""
    workspace = repo[0]
    hooks = workspace / ".git" / "hooks"
    hooks.rename(workspace / "hooks-real")
    hooks.symlink_to(workspace / "hooks-real")
    with pytest.raises(nsconfine.PlanError, match=r"--unprotect \.git/hooks"):
        session(*repo).plan()


def test_a_commondir_naming_a_workspace_directory_protects_that_directory(
    repo: tuple[Path, Path],
) -> None:
    """A .git whose commondir (written before it was protected) names `../common`: git takes
    config and hooks from there, so the next session cannot write them."""
    workspace = repo[0]
    dot_git, common = workspace / ".git", workspace / "common"
    common.mkdir()
    for name in ("config", "hooks", "objects", "refs", "info", "description"):
        if (dot_git / name).exists():
            (dot_git / name).rename(common / name)
    (dot_git / "commondir").write_text("../common\n")
    give_to_session_user(workspace)
    assert _host_git(workspace, "status", "--short").returncode == 0  # git does use it
    _, output = _launch(repo, _plant_config(common / "config"))
    assert "wrote" not in output, output
    assert _host_git(workspace, "config", "--get", "core.fsmonitor").stdout == ""


def test_a_git_directory_in_the_run_dir_is_protected(repo: tuple[Path, Path]) -> None:
    """A workspace whose .git points into the run directory (`git init --separate-git-dir`),
    which the session writes as freely as its workspace: that git directory's config is
    protected too."""
    workspace, run_dir = repo
    moved = run_dir / "gitdir"
    (workspace / ".git").rename(moved)
    (workspace / ".git").write_text(f"gitdir: {moved}\n")
    give_to_session_user(workspace, run_dir)
    assert _host_git(workspace, "status", "--short").returncode == 0  # git does use it
    _, output = _launch(repo, _plant_config(moved / "config"))
    assert "wrote" not in output, output
    assert _host_git(workspace, "config", "--get", "core.fsmonitor").stdout == ""


def test_a_gitdir_pointer_through_a_symlink_is_refused(repo: tuple[Path, Path]) -> None:
    """A nested repository whose .git file names `../lnk`, a symlink to its real git
    directory: the session could re-point lnk at a git directory of its own. Refused."""
    workspace = repo[0]
    nested = workspace / "vendor" / "lib"
    (nested / ".git").rename(workspace / "vendor" / "realgit")
    (workspace / "vendor" / "lnk").symlink_to("realgit")
    (nested / ".git").write_text("gitdir: ../lnk\n")
    give_to_session_user(workspace)
    status, output = _launch(repo, "true")
    assert status == -1, output
    assert "leads through" in output
    assert output.rstrip().endswith("launch again")


# ----------------------------------------------------------- git directories as git finds them


def _host_git_config(where: Path) -> str:
    return _host_git(where, "config", "--get", "core.fsmonitor").stdout


def test_per_worktree_config_is_protected(repo: tuple[Path, Path]) -> None:
    """With extensions.worktreeConfig (set by `git sparse-checkout`), git reads
    .git/config.worktree too: protected like .git/config."""
    workspace = repo[0]
    _host_git(workspace, "config", "extensions.worktreeConfig", "true")
    give_to_session_user(workspace)
    _, output = _launch(repo, _plant_config(workspace / ".git" / "config.worktree"))
    assert "wrote" not in output, output
    assert _host_git_config(workspace) == ""


def test_a_pointer_is_read_as_git_reads_it(repo: tuple[Path, Path]) -> None:
    """A .git file naming `gd ` (a trailing space, which git keeps): the directory git uses is
    the one protected, not a decoy `gd` beside it."""
    nested = repo[0] / "vendor" / "lib"
    (nested / ".git").rename(nested / "gd ")
    (nested / "gd").mkdir()
    (nested / ".git").write_text("gitdir: gd \n")
    give_to_session_user(repo[0])
    assert _host_git(nested, "status", "--short").returncode == 0  # git does use `gd `
    _, output = _launch(repo, _plant_config(nested / "gd " / "config"))
    assert "wrote" not in output, output
    assert _host_git_config(nested) == ""


def test_a_git_directory_under_a_directory_named_worktrees_is_protected_whole(
    repo: tuple[Path, Path],
) -> None:
    """`git init --separate-git-dir=ws/worktrees/app ws/app`: a repository's own git
    directory, whatever its parent is called; its config is protected."""
    workspace = repo[0]
    app, gitdir = workspace / "app", workspace / "worktrees" / "app"
    gitdir.parent.mkdir()
    subprocess.run(["git", "init", "-q", f"--separate-git-dir={gitdir}", str(app)], check=True)
    give_to_session_user(workspace)
    _, output = _launch(repo, _plant_config(gitdir / "config"))
    assert "wrote" not in output, output
    assert _host_git_config(app) == ""


def test_a_hook_symlink_through_proc_is_refused(repo: tuple[Path, Path]) -> None:
    """/proc/self/cwd means the launcher's directory to the launcher and the hook's to the
    host's git: a symlink whose way passes through /proc is refused, whatever the launcher's
    working directory."""
    nested = repo[0] / "vendor" / "lib"
    (nested / ".git" / "hooks" / "pre-commit").symlink_to("/proc/self/cwd/tools/hook.sh")
    give_to_session_user(repo[0])
    status, output = _launch(repo, "true")
    assert status == -1, output
    assert "/proc" in output


@pytest.mark.parametrize("pointer", [".git", ".git/commondir"])
def test_a_nul_in_a_pointer_is_read_as_git_reads_it(repo: tuple[Path, Path], pointer: str) -> None:
    """A NUL in a .git file or a commondir: git reads the path up to it, and so does the plan
    (it used to raise ValueError from deep inside, a traceback from the CLI)."""
    nested = repo[0] / "vendor" / "lib"
    if pointer == ".git":
        (nested / ".git").rename(repo[0] / "vendor" / "libgit")
        (nested / ".git").write_bytes(b"gitdir: ../libgit\0trailing\n")
        config = repo[0] / "vendor" / "libgit" / "config"
    else:
        (nested / ".git" / "commondir").write_bytes(b".\0../../..\n")
        config = nested / ".git" / "config"
    give_to_session_user(repo[0])
    status, output = _launch(repo, _plant_config(config))
    assert status == 0, output
    assert "wrote" not in output


def test_a_repository_with_a_non_utf8_name_launches(repo: tuple[Path, Path]) -> None:
    """A repository named with a byte that is not UTF-8 (`r\\xff`): its protected paths are
    mount points, and the mount table holds them as bytes; every later launch used to end in
    a UnicodeDecodeError traceback."""
    workspace = repo[0]
    odd = os.path.join(os.fsencode(workspace), b"r\xff")
    subprocess.run([b"git", b"init", b"-q", odd], check=True)
    give_to_session_user(workspace)
    status, output = _launch(repo, _plant_config(Path(os.fsdecode(odd)) / ".git" / "config"))
    assert status == 0, output
    assert "wrote" not in output


def test_a_pointer_cut_at_a_nul_after_its_newline_is_read_as_git_reads_it(
    repo: tuple[Path, Path],
) -> None:
    """`gitdir: gd\\n\\0`: git drops trailing newlines from the whole file first, then stops at
    the NUL, so it uses `gd\\n`; the plan protects that one, not a decoy `gd`."""
    nested = repo[0] / "vendor" / "lib"
    real = nested / "gd\n"
    (nested / ".git").rename(real)
    (nested / "gd").mkdir()
    (nested / ".git").write_bytes(b"gitdir: gd\n\0")
    give_to_session_user(repo[0])
    assert _host_git(nested, "status", "--short").returncode == 0  # git does use `gd\n`
    _, output = _launch(repo, _plant_config(real / "config"))
    assert "wrote" not in output, output
    assert _host_git_config(nested) == ""


def test_mercurial_is_protected_only_where_it_is(repo: tuple[Path, Path]) -> None:
    """.hg/hgrc is protected in a Mercurial repository; where there is no .hg, none is made
    (an empty read-only .hg would stop `hg init` and look like a repository to the host's
    tools), as for git at the workspace's top."""
    workspace = repo[0]
    plan = session(*repo).plan()
    assert not any(e.dest.startswith(f"{workspace}/.hg") for e in plan.entries)
    (workspace / ".hg").mkdir()
    give_to_session_user(workspace)
    plan = session(*repo).plan()
    assert any(e.dest == f"{workspace}/.hg/hgrc" for e in plan.entries)


@pytest.mark.parametrize(
    ("where", "relative"),
    [("sub", ".hg/hgrc"), (".", ".hg/hgrc-not-shared"), (".", ".hg/sharedpath")],
)
def test_mercurial_repositories_are_protected_wherever_they_are(
    repo: tuple[Path, Path], where: str, relative: str
) -> None:
    """A Mercurial repository below the workspace's top (no .git there) is found and its
    config protected; so are .hg/hgrc-not-shared (read as config too, Mercurial 5.7 on) and
    .hg/sharedpath (it names the repository whose .hg/hgrc is read)."""
    base = repo[0] / where
    (base / ".hg").mkdir(parents=True)
    (base / ".hg" / "requires").write_text("store\n")
    give_to_session_user(repo[0])
    target = base / relative
    _, output = _launch(repo, _plant_config(target))
    assert "wrote" not in output, output


def test_a_bare_repository_in_the_workspace_is_protected(repo: tuple[Path, Path]) -> None:
    """A bare repository (remote.git: HEAD, objects and refs, no .git) has a config git runs
    from too (`git -C remote.git status` with core.fsmonitor): protected like a .git."""
    bare = repo[0] / "remote.git"
    _, output = _launch(repo, _plant_config(bare / "config"))
    assert "wrote" not in output, output
    assert _host_git_config(bare) == ""


# ----------------------------------------------------------- repositories found at every launch
# What makes a directory a repository must be what git itself uses, and no change a session
# makes to it between launches may make the next launch protect less: a missing HEAD, a
# bare-looking directory beside a .git, a plan kept from before the repository existed.


def _session_then_host_git(repo: tuple[Path, Path], hide: str, write: str) -> tuple[str, str]:
    """One session runs hide (between two launches, as a session can), the next one write;
    the outputs of both."""
    _, hidden = _launch(repo, hide)
    _, wrote = _launch(repo, write)
    return hidden, wrote


def test_a_git_directory_without_head_is_still_protected(repo: tuple[Path, Path]) -> None:
    """A session moves vendor/lib/.git/HEAD away; the next one writes that repository's
    config and puts HEAD back: the host's git must not run what it wrote."""
    nested = repo[0] / "vendor" / "lib"
    _, output = _session_then_host_git(
        repo,
        f"mv {nested}/.git/HEAD {nested}/HEAD.away",
        f"{_plant_config(nested / '.git' / 'config')}; mv {nested}/HEAD.away {nested}/.git/HEAD",
    )
    assert "wrote" not in output, output
    assert _host_git_config(nested) == ""


def test_a_bare_look_alike_beside_a_git_directory_hides_nothing(repo: tuple[Path, Path]) -> None:
    """A session makes HEAD, objects/ and refs/ beside vendor/lib/.git (a bare repository's
    look): the next one still cannot write vendor/lib/.git/config."""
    nested = repo[0] / "vendor" / "lib"
    _, output = _session_then_host_git(
        repo,
        f"cd {nested} && cp .git/HEAD HEAD && mkdir -p objects refs",
        _plant_config(nested / ".git" / "config"),
    )
    assert "wrote" not in output, output
    assert _host_git_config(nested) == ""


def test_a_bare_look_alike_cannot_free_a_submodule_pointer(
    repo_with_submodule: tuple[Path, Path],
) -> None:
    """A submodule `sub` made to look bare: the next session still cannot re-point sub/.git
    at a git directory of its own, which the host's `git status` at the top would use."""
    workspace = repo_with_submodule[0]
    sub = workspace / "sub"
    before = (sub / ".git").read_text()
    _session_then_host_git(
        repo_with_submodule,
        f"cd {sub} && echo 'ref: refs/heads/main' > HEAD && mkdir -p objects refs",
        f"cd {workspace} && cp -r .git/modules/sub evil && "
        f"printf '{_EVIL_CONFIG}' >> evil/config; (echo 'gitdir: ../evil' > sub/.git) 2>/dev/null;"
        " true",
    )
    assert (sub / ".git").read_text() == before
    assert _host_git_config(sub) == ""


def test_a_bare_repository_with_a_symlinked_head_is_protected(repo: tuple[Path, Path]) -> None:
    """git takes a HEAD that is a symlink to refs/heads/… as a repository's (old git made
    them): remote.git with one still has its config protected."""
    bare = repo[0] / "remote.git"
    (bare / "HEAD").unlink()
    (bare / "HEAD").symlink_to("refs/heads/main")
    give_to_session_user(repo[0])
    assert _host_git(bare, "rev-parse", "--git-dir").returncode == 0  # git does use it
    _, output = _launch(repo, _plant_config(bare / "config"))
    assert "wrote" not in output, output
    assert _host_git_config(bare) == ""


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_nested_git_that_is_no_file_or_directory_is_refused(
    repo: tuple[Path, Path], kind: str
) -> None:
    """A nested `.git` that is a symlink (into the run directory, where a session writes a
    git directory of its own) or a FIFO is refused by name, as at the workspace's top."""
    workspace, run_dir = repo
    dot_git = workspace / "app" / ".git"
    dot_git.parent.mkdir()
    if kind == "symlink":
        dot_git.symlink_to(run_dir / "gd")
    else:
        os.mkfifo(dot_git)
    give_to_session_user(workspace)
    status, output = _launch(repo, "true")
    assert status == -1, output
    assert "app/.git" in output


def test_a_submodule_git_directory_without_head_is_still_protected(
    repo_with_submodule: tuple[Path, Path],
) -> None:
    """A session moves .git/modules/sub/HEAD away; the next one writes that git directory's
    config (the host's `git status` at the top runs it) and puts HEAD back: refused."""
    workspace = repo_with_submodule[0]
    modules = workspace / ".git" / "modules" / "sub"
    _, output = _session_then_host_git(
        repo_with_submodule,
        f"mv {modules}/HEAD {workspace}/HEAD.away",
        f"{_plant_config(modules / 'config')}; mv {workspace}/HEAD.away {modules}/HEAD",
    )
    assert "wrote" not in output, output
    assert _host_git_config(workspace / "sub") == ""


def test_a_plan_kept_across_launches_protects_what_each_launch_finds(
    tmp_path: Path,
) -> None:
    """One plan, built on an empty workspace and launched again and again (as a broker keeps
    one per role): `git init` in one launch, `git config core.fsmonitor` in the next must not
    reach the host."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    plan = session(workspace, run_dir).plan()
    assert attempt(plan, f"git init -q {workspace}/app")[0] == 0
    attempt(plan, f"git -C {workspace}/app config core.fsmonitor 'touch /tmp/pwned'; true")
    assert _host_git_config(workspace / "app") == ""


def test_a_plan_kept_across_launches_is_refreshed_by_what_its_workspace_holds(
    tmp_path: Path,
) -> None:
    """A launch runs the plan its workspace now calls for: the very plan object the last
    launch found while nothing it protects changed (a file written, a stub made and removed),
    a new one as soon as a repository appears, and the first one again once it is gone."""
    from nsconfine._plan.protect import refreshed

    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    plan = session(workspace, run_dir).plan()
    first = refreshed(plan)
    (workspace / "notes.txt").write_text("x\n")
    assert refreshed(plan) is first
    subprocess.run(["git", "init", "-q", str(workspace / "app")], check=True)
    found = refreshed(plan)
    assert f"{workspace}/app/.git/config" in {e.dest for e in found.entries}
    (workspace / "more.txt").write_text("x\n")
    assert refreshed(plan) is found
    shutil.rmtree(workspace / "app")
    assert f"{workspace}/app/.git/config" not in {e.dest for e in refreshed(plan).entries}


def test_a_repository_made_while_the_workspace_is_scanned_is_found_by_the_next_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session running beside a launch can make a repository in a directory the launch's
    scan has just listed. That scan misses it; the next look must not take the directory as
    seen (its identity after the change was remembered: the scan stats docs again for its
    protected names), or every later launch of the plan leaves that repository's config
    writable. Found by an attacker's pass (in a .claude, then protected name by name, as
    docs/conf.json is here); the scan is stopped at the right moment here."""
    from nsconfine._plan import protect

    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    claude = workspace / "docs"  # (a directory holding a protected name, and other files)
    (claude / "commands").mkdir(parents=True)
    (claude / "conf.json").write_text("{}\n")
    plan = session(workspace, run_dir, protect=["docs/conf.json"]).plan()
    (workspace / "notes.txt").write_text("x\n")  # the next launch looks again
    listing = protect._Scan.listing

    def listing_then_repository(scan: protect._Scan, directory: str) -> protect._Listing:
        found = listing(scan, directory)
        if directory == str(claude) and not (claude / "x").exists():
            (claude / "x" / ".git").mkdir(parents=True)
        return found

    monkeypatch.setattr(protect._Scan, "listing", listing_then_repository)
    protect.refreshed(plan)  # raced: x is not in its listing
    monkeypatch.undo()
    config = f"{claude}/x/.git/config"
    assert config in {entry.dest for entry in protect.refreshed(plan).entries}


def test_a_stub_removed_while_the_workspace_is_scanned_is_judged_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another session's .claude stub is removed as that session ends, after the scan has
    seen .claude as a directory and before it asks whether it is a stub. The plan must be
    the one a missing .claude gives, as it is a moment later; it took .claude for a plain
    directory and the stub directory came with another name's reason, so a Pool whose refill
    staged then restaged at its next launch (its fresh look gave the first reason). Found
    profiling Pool.launch (about 1 in 100 refills), stopped at the right moment here."""
    from nsconfine._kernel.stub_records import is_stub
    from nsconfine._plan import protect

    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    plan = session(workspace, run_dir).plan()
    claude = f"{workspace}/.claude"
    first = nsconfine.spawn(plan, ["sleep", "60"])  # holds the .claude stub
    try:
        assert os.path.isdir(claude)

        def is_stub_after_the_session_ends(path: str) -> bool:
            if path == claude and first.returncode is None:
                first.kill()
                first.wait()
                assert not os.path.lexists(claude)  # its session's end removed the stub
            return is_stub(path)

        monkeypatch.setattr(protect, "is_stub", is_stub_after_the_session_ends)
        raced = protect.refreshed(plan)
    finally:
        first.kill()
        first.wait()

    def claude_entries(plan: nsconfine.Plan) -> set[tuple[str, str | None, str]]:
        return {(e.dest, e.stub, e.reason) for e in plan.entries if "/.claude" in e.dest}

    assert claude_entries(raced) == claude_entries(plan)  # as built with no .claude there


def test_a_pool_protects_what_each_launch_finds(tmp_path: Path) -> None:
    """A Pool's sandboxes were staged before the repository existed: each launch still
    protects the repositories its workspace holds when it is handed its command."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    with nsconfine.Pool(session(workspace, run_dir).plan(), refill="inline") as pool:
        assert pool.launch(["git", "init", "-q", f"{workspace}/app"]).wait() == 0
        pool.launch(
            ["git", "-C", f"{workspace}/app", "config", "core.fsmonitor", "touch /tmp/pwned"]
        ).wait()
    assert _host_git_config(workspace / "app") == ""


def _replace_file(target: Path) -> None:
    """The host replaces target by rename, as `git config` and editors do."""
    replacement = target.with_name(target.name + ".new")
    replacement.write_text(target.read_text())
    give_to_session_user(replacement)
    replacement.rename(target)


def _replace_directory(target: Path) -> None:
    """The host removes the directory target and makes it again (a checkout of a branch
    without it, then back)."""
    shutil.rmtree(target)
    target.mkdir()
    give_to_session_user(target)


@pytest.mark.parametrize(
    ("relative", "replace", "times"),
    [
        (".git/config", _replace_file, 1),
        (".envrc", _replace_file, 1),
        (".git/config", _replace_file, 2),
        (".git/hooks", _replace_directory, 1),
        (".vscode", _replace_directory, 1),
    ],
)
def test_a_pool_protects_a_file_the_host_replaced_after_staging(
    repo: tuple[Path, Path], relative: str, replace: Callable[[Path], None], times: int
) -> None:
    """The host replaces a protected file or directory while a sandbox waits staged (`git
    config` renames config.lock over .git/config; an editor saves .envrc by rename; a checkout
    removes .vscode and makes it again): the launch then keeps the new one read-only, as spawn
    does. Attackers' passes: the staged bind was gone (the kernel detaches a mount whose file
    is replaced) and the session wrote the new file, whose fsmonitor the host's git ran; then,
    once the check compared the file's device and inode, a second `git config` gave the file
    its first inode number back, and a directory made again took the number of the one removed
    (nothing holds the old file once its bind is detached)."""
    workspace = repo[0]
    target = workspace / relative
    if relative == ".vscode":
        target.mkdir()
        give_to_session_user(target)
    written = target / "tasks.json" if target.is_dir() else target
    with nsconfine.Pool(session(*repo).plan(), size=1, refill="inline") as pool:
        assert pool.wait_staged(60)
        for _ in range(times):
            replace(target)
        launched = pool.launch(["/bin/sh", "-c", _plant_config(written)], stdout=subprocess.PIPE)
        output = launched.communicate()[0]
    assert output is not None
    assert b"wrote" not in output, output
    assert not written.exists() or "fsmonitor" not in written.read_text()


def _moved_aside(target: Path) -> Path:
    """A session that does not protect target (one begun before its repository was made) moves
    it aside and puts one of its own at its path: the staged bind follows what was moved."""
    directory = target.is_dir()
    target.rename(target.with_name(target.name + ".old"))
    if directory:
        target.mkdir()
    else:
        target.write_text("")
    give_to_session_user(target)
    return target / "pre-commit" if directory else target


def _linked_elsewhere(target: Path) -> Path:
    """Such a session gives target a second name where the session writes."""
    other = target.parent.parent / "notes.txt"
    os.link(target, other)
    return other


def _hook_leading_out(target: Path) -> Path:
    """Such a session puts a hook into target that leads to a file where the session writes."""
    os.symlink("../../hook.sh", target / "pre-commit")
    written = target.parent.parent / "hook.sh"
    written.write_text("")
    give_to_session_user(written)
    return written


@pytest.mark.parametrize(
    ("relative", "change"),
    [
        (".git/config", _moved_aside),
        (".git/hooks", _moved_aside),
        (".git/config", _linked_elsewhere),
        (".git/hooks", _hook_leading_out),
    ],
)
def test_a_pool_protects_what_another_session_changed_after_staging(
    repo: tuple[Path, Path], relative: str, change: Callable[[Path], Path]
) -> None:
    """Another session of the workspace, which does not protect a repository (it began before
    the repository was made), changes its trusted files while a sandbox waits staged: moves
    .git/config aside and puts its own there; gives it a second name; puts a hook in .git/hooks
    leading to its own file. The launch then protects, or refuses, as spawn would. Attacker's
    pass, stop 38: the staged read-only bind followed what was moved aside, and the launch
    checked nothing but the paths its scan read and the mount table, which none of this
    changes: the session wrote the new config, and the host's config through its second name."""
    workspace = repo[0]
    target = workspace / relative
    with nsconfine.Pool(session(*repo).plan(), size=1, refill="inline") as pool:
        assert pool.wait_staged(60)
        written = change(target)
        try:
            launched = pool.launch(
                ["/bin/sh", "-c", _plant_config(written)], stdout=subprocess.PIPE
            )
        except nsconfine.PlanError as refused:  # as spawn refuses a second name, a hook leading out
            output = str(refused).encode()
        else:
            output = launched.communicate()[0] or b""
    assert b"wrote" not in output, output
    assert not written.exists() or "fsmonitor" not in written.read_text()


def test_a_staged_sandbox_keeps_little_of_a_full_protected_directory(
    repo: tuple[Path, Path],
) -> None:
    """A session fills a protected directory with thousands of long names: a staged sandbox
    does not keep each one's path (the hostile review of the check above, stop 38: ~35 MiB per
    sandbox for one filled .git/hooks, 1.2 GiB for eight); past a few thousand it keeps none,
    and a launch stages afresh, which still finds a hook put in since."""
    import tracemalloc

    workspace = repo[0]
    hooks = workspace / ".git" / "hooks"
    deep = hooks / ("d" * 240) / ("e" * 240) / ("f" * 240)
    deep.mkdir(parents=True)
    for number in range(3000):
        (deep / f"{number:05d}{'x' * 200}").touch()  # ~3.5 MB of host paths in all
    tracemalloc.start()
    try:
        with nsconfine.Pool(session(*repo).plan(), size=1, refill="inline") as pool:
            assert pool.wait_staged(60)
            _, peak = tracemalloc.get_traced_memory()
            written = _hook_leading_out(hooks)
            try:
                launched = pool.launch(
                    ["/bin/sh", "-c", _plant_config(written)], stdout=subprocess.PIPE
                )
            except nsconfine.PlanError as refused:
                output = str(refused).encode()
            else:
                output = launched.communicate()[0] or b""
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, peak
    assert b"wrote" not in output, output


def test_a_pointer_rewritten_in_place_after_staging_is_read_again(tmp_path: Path) -> None:
    """Another session of the workspace re-points a repository's .git file while a sandbox
    waits staged, through a shared mapping whose page it had already written: none of the
    file's times change (the kernel sets them at a page's first write fault only). From a
    directory outside the workspace to one inside, which the launch must then protect, as
    spawn does. Hostile review, stop 38: the launch looked again only where a time changed,
    and the session wrote the git directory's config, which the host's git then ran."""
    import mmap

    from nsconfine._plan.protect import PROTECTED

    workspace, run_dir, elsewhere = session_dirs(tmp_path, "ws", "run", "nx")  # alike in length
    tree, gitdir = workspace / "wt", workspace / "gd"
    tree.mkdir()
    gitdir.mkdir()
    # Every name protected at a repository's root there already, so that no launch makes a
    # stub beside the pointer (which would change its directory's times)
    for top in (workspace, tree):
        for name in {name.split("/")[0] for name, _, _ in PROTECTED} - {".git", ".hg"}:
            (top / name).touch()
    pointer = tree / ".git"
    before, after = f"gitdir: {elsewhere}/gd\n".encode(), f"gitdir: {gitdir}\n".encode()
    assert len(before) == len(after)
    pointer.write_bytes(before)
    give_to_session_user(tree, gitdir, *tree.iterdir(), *workspace.iterdir())
    made = "mkdir -p gd/objects gd/refs && echo 'ref: refs/heads/main' > gd/HEAD"
    evil = f"{made}; {_plant_config(gitdir / 'config')}"
    with open(pointer, "r+b") as file, mmap.mmap(file.fileno(), 0) as mapped:
        mapped[0:1] = mapped[0:1]  # its one write fault, which sets its times
        with nsconfine.Pool(session(workspace, run_dir).plan(), size=1, refill="inline") as pool:
            assert pool.wait_staged(60)
            mapped[:] = after
            try:
                launched = pool.launch(["/bin/sh", "-c", evil], stdout=subprocess.PIPE)
            except nsconfine.PlanError as refused:
                output = str(refused).encode()
            else:
                output = launched.communicate()[0] or b""
    assert b"wrote" not in output, output
    assert not (gitdir / "config").exists() or "fsmonitor" not in (gitdir / "config").read_text()


def test_a_plan_keeps_little_of_the_pointers_a_session_wrote(repo: tuple[Path, Path]) -> None:
    """What a plan keeps of the files whose content decides what is protected (to read them
    again at launch) is a digest, not the files: a session can pad each commondir with a
    megabyte after the NUL where git stops reading, and a broker kept them all, for each of
    its last 64 plans (hostile review, stop 38: 73 MB per plan of 70 worktrees)."""
    commondir = repo[0] / ".git" / "commondir"
    commondir.write_bytes(b".\0" + b"x" * 500_000)
    give_to_session_user(commondir)
    protection = session(*repo).plan().protection
    assert protection is not None
    kept = [what for path, what in protection.contents if path == str(commondir)]
    assert kept, protection.contents
    assert sum(len(what or "") for what in kept) < 1000


def test_a_writable_bind_in_a_read_only_workspace_is_protected(tmp_path: Path) -> None:
    """The reviewer's workspace is read-only but for WORKSPACE/notes: a repository in notes
    keeps its config read-only, and notes' own top its trusted files."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    notes = workspace / "notes"
    subprocess.run(["git", "init", "-q", str(notes)], check=True)
    give_to_session_user(workspace)
    plan = session(workspace, run_dir, profile=["reviewer"]).plan()
    _, output = attempt(
        plan, f"{_plant_config(notes / '.git' / 'config')}; echo x > {notes}/.envrc"
    )
    assert "wrote" not in output, output
    assert _host_git_config(notes) == ""
    assert not (notes / ".envrc").exists()


def test_config_a_session_made_is_reported_after_it(tmp_path: Path) -> None:
    """A repository the session made during the session (its config written before any
    launch could protect it) is listed on the handle once the session has ended; a session
    that made none lists nothing."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    plan = session(workspace, run_dir).plan()
    quiet = nsconfine.spawn(plan, ["/bin/true"])
    quiet.wait()
    assert quiet.untrusted_config == []
    made = nsconfine.spawn(plan, ["git", "init", "-q", f"{workspace}/app"])
    assert made.wait() == 0
    written = made.untrusted_config or []
    assert str(workspace / "app" / ".git" / "config") in written
    assert str(workspace / "app" / ".git" / "hooks") in written


def test_agent_config_a_session_wrote_below_the_top_is_reported(tmp_path: Path) -> None:
    """Agents and editors read their project config from the directory they are started in
    (Claude Code's .claude, .mcp.json, .vscode), which may be any directory of a workspace:
    below its top and outside any repository's root, where nothing is kept read-only, config
    the session made or changed is named once it has ended; config it left alone, and a
    session that wrote none, name nothing."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    app, lib, docs = workspace / "packages" / "app", workspace / "lib", workspace / "docs"
    tool, tooling = workspace / "packages" / "tool", workspace / "tooling" / "vscode"
    skill = tool / ".claude" / "skills" / "deploy"
    for directory in (app, lib / ".vscode", docs / ".vscode", skill, tooling):
        directory.mkdir(parents=True)
    for config in (lib / ".vscode", docs / ".vscode", tooling):
        (config / "tasks.json").write_text("{}\n")
    (skill / "SKILL.md").write_text("trusted\n")
    (tool / ".vscode").symlink_to("../../tooling/vscode")  # config kept elsewhere, linked
    stash = workspace / "stash"  # an earlier session's, by a name nothing reads
    stash.mkdir()
    (stash / "settings.json").write_text("{}\n")
    give_to_session_user(workspace)
    time.sleep(1.5)  # the config now predates the sessions by more than the report's slack
    plan = session(workspace, run_dir).plan()
    quiet = nsconfine.spawn(plan, ["/bin/true"])
    quiet.wait()
    assert quiet.untrusted_config == []
    script = (
        f"mkdir {app}/.claude && echo '{{}}' > {app}/.claude/settings.json && "
        f"echo '{{}}' > {app}/.mcp.json && echo '{{\"x\": 1}}' > {lib}/.vscode/tasks.json && "
        f"echo 'allowed-tools: Bash' >> {skill}/SKILL.md && echo x >> {tool}/.vscode/tasks.json"
        f" && ln -s ../../stash {lib}/../packages/app/.cursor"
    )
    wrote = nsconfine.spawn(plan, ["/bin/sh", "-c", script])
    assert wrote.wait() == 0
    written = wrote.untrusted_config or []
    for path in (app / ".claude", app / ".mcp.json", lib / ".vscode", tool / ".claude"):
        assert str(path) in written, (path, written)
    assert str(tool / ".vscode") in written, written  # through its link
    assert str(app / ".cursor") in written, written  # a link made now, to what is older
    assert str(docs / ".vscode") not in written, written


def test_agent_config_past_what_the_report_looks_through_names_the_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report looks through so many entries of such config in all (a session could plant
    millions, and every later session's end would pay for them): past that, it names the
    workspace, which it could not clear."""
    from nsconfine._plan import protect

    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    for package in range(3):
        (workspace / f"p{package}" / ".vscode" / "many").mkdir(parents=True)
        for name in range(4):
            (workspace / f"p{package}" / ".vscode" / "many" / str(name)).write_text("{}")
    give_to_session_user(workspace)
    time.sleep(1.5)  # the config now predates the session by more than the report's slack
    plan = session(workspace, run_dir).plan()
    sandbox = nsconfine.spawn(plan, ["/bin/true"])
    sandbox.wait()
    assert sandbox.untrusted_config == []  # all of it looked through: nothing changed
    monkeypatch.setattr(protect, "_STARTED_IN_ENTRIES", 10)
    sandbox = nsconfine.spawn(plan, ["/bin/true"])
    sandbox.wait()
    assert sandbox.untrusted_config == [str(workspace)]


def test_run_reports_config_the_session_made(tmp_path: Path) -> None:
    """`nsconfine run` says on stderr which host-executed config the session could write."""
    from helpers import cli, session_options

    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    done = cli("run", *session_options(workspace, run_dir), "--", "git", "init", "-q", "app")
    assert done.returncode == 0, done.stderr
    assert f"{workspace}/app/.git/config" in done.stderr
    quiet = cli("run", *session_options(workspace, run_dir), "--", "true")
    assert quiet.stderr == ""


def test_what_a_workspace_costs_a_launch_is_bounded(tmp_path: Path) -> None:
    """Each repository adds a score of read-only mount points (bwrap's cost grows with their
    square, and each holds a launcher fd): past the bound the plan is refused, saying how
    many it would take and what to do."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    for index in range(24):
        subprocess.run(["git", "init", "-q", str(workspace / f"r{index}")], check=True)
    give_to_session_user(workspace)
    with pytest.raises(nsconfine.PlanError, match="mount points") as refused:
        session(workspace, run_dir).plan()
    assert "--unprotect" in refused.value.message


# ------------------------------------------------------------------ config git and Mercurial take
# Each is a place the host's git or hg takes config from, that a session can write, and that
# the launch neither kept read-only nor named in untrusted_config after it.

_BARE_TOP = (
    "mkdir -p objects refs && echo 'ref: refs/heads/main' > HEAD && printf '[core]\\n"
    "\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tworktree = .\\n' > config"
)


def test_a_workspace_top_made_to_look_bare_is_reported_and_then_protected(
    tmp_path: Path,
) -> None:
    """A session makes the workspace's own top a bare repository (HEAD, objects/, refs/ and a
    config with core.worktree = .): the host's git in the workspace, or in any directory of
    it without a repository of its own, uses it and runs its core.fsmonitor. Made during the
    session, its config must be named after it; from the next launch on, kept read-only."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    plan = session(workspace, run_dir).plan()
    made = nsconfine.spawn(plan, ["/bin/sh", "-c", f"cd {workspace} && {_BARE_TOP}"])
    assert made.wait() == 0
    assert _host_git(workspace, "rev-parse", "--git-dir").stdout.strip() == "."  # git uses it
    assert str(workspace / "config") in (made.untrusted_config or [])
    _, output = attempt(session(workspace, run_dir).plan(), _plant_config(workspace / "config"))
    assert "wrote" not in output, output
    assert _host_git_config(workspace) == ""


def test_the_reviewers_notes_made_to_look_bare_are_protected(tmp_path: Path) -> None:
    """The same at the top of a writable bind inside a read-only workspace: the reviewer's
    notes made a bare repository by one session stay read-only in the next."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    notes = workspace / "notes"
    attempt(session(workspace, run_dir, profile=["reviewer"]).plan(), f"cd {notes} && {_BARE_TOP}")
    assert _host_git(notes, "rev-parse", "--git-dir").stdout.strip() == "."  # git uses it
    plan = session(workspace, run_dir, profile=["reviewer"]).plan()
    _, output = attempt(plan, _plant_config(notes / "config"))
    assert "wrote" not in output, output
    assert _host_git_config(notes) == ""


def test_a_symlinked_hg_below_the_top_is_refused_or_protected(repo: tuple[Path, Path]) -> None:
    """Mercurial finds a repository where `.hg` is a directory *or a symlink to one* (it
    follows it: `hg status` in sub runs the [hooks] of the hgrc it leads to; Mercurial 7.2).
    A session plants `sub/.hg -> ../hgd` and writes hgd/hgrc: that must be named after the
    session, and the next launch must refuse the symlink (as a `.git` symlink is refused) or
    keep what it leads to read-only."""
    workspace = repo[0]
    plant = (
        f"cd {workspace} && mkdir -p sub hgd && printf 'store\\n' > hgd/requires && "
        "ln -s ../hgd sub/.hg && echo '[ui]' > hgd/hgrc"
    )
    made = nsconfine.spawn(session(*repo).plan(), ["/bin/sh", "-c", plant])
    assert made.wait() == 0
    assert made.untrusted_config, "the hgrc the session wrote is not named"
    _, output = _launch(repo, _plant_config(workspace / "hgd" / "hgrc"))
    assert "wrote" not in output, output


def test_a_commondir_longer_than_a_page_is_read_as_git_reads_it(repo: tuple[Path, Path]) -> None:
    """git reads a commondir whole (and resolves `./` after `./` as it goes), the plan read
    only its first 4,096 bytes: 2,100 times `./` then `x` names vendor/lib/.git/x to git, and
    vendor/lib/.git itself to the plan. x's config is what the host's git runs: protected."""
    nested = repo[0] / "vendor" / "lib"
    common = nested / ".git" / "x"
    (common / "objects").mkdir(parents=True)
    (common / "refs").mkdir()
    (nested / ".git" / "commondir").write_text("./" * 2100 + "x\n")
    give_to_session_user(repo[0])
    assert _host_git(nested, "rev-parse", "--git-common-dir").stdout.strip().endswith("/x")
    _, output = _launch(repo, _plant_config(common / "config"))
    assert "wrote" not in output, output
    assert _host_git_config(nested) == ""


def test_a_repository_made_in_the_reviewers_notes_is_reported(tmp_path: Path) -> None:
    """A repository the reviewer makes in its notes during the session is named after it,
    as one made in a writable workspace is (the workspace's read-only bind above notes hid
    everything below it from the report)."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    notes = workspace / "notes"
    plan = session(workspace, run_dir, profile=["reviewer"]).plan()
    made = nsconfine.spawn(plan, ["git", "init", "-q", f"{notes}/app"])
    assert made.wait() == 0
    assert str(notes / "app" / ".git" / "config") in (made.untrusted_config or [])


def _as_account(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The host's git run as the account that owns the workspace (the launcher itself when
    unprivileged; as root, the session's account), as the host user works there."""
    environ = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}
    as_user = ["runuser", "-u", SESSION_USER, "--"] if SESSION_USER else []
    return subprocess.run(
        [*as_user, "git", "-c", "safe.directory=*", "-c", "user.name=h", "-c", "user.email=h@h",
         "-C", str(workspace), *args],
        capture_output=True, text=True, env=environ, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("relative", "host"),
    [
        (".git/config", ("config", "user.name", "Host User")),  # config.lock renamed over it
        (".envrc", ("checkout", "-q", "HEAD~1", "--", ".envrc")),  # unlinked, written anew
    ],
)
def test_a_protected_file_the_host_replaces_during_a_session_is_not_left_to_it(
    repo: tuple[Path, Path], relative: str, host: tuple[str, ...]
) -> None:
    """The host's git replaces a protected file while a session runs (`git config` renames
    config.lock over .git/config; `git checkout` unlinks and writes a tracked .envrc): the
    read-only bind held the old inode, so the session can write the new file. It must not be
    able to, or the report after it must name the file (it named nothing: the path was
    read-only in the plan)."""
    workspace = repo[0]
    (workspace / ".envrc").write_text("export SAFE=2\n")
    _as_account(workspace, "commit", "-q", "-am", "two")
    give_to_session_user(workspace)
    target, go = workspace / relative, workspace / "go"
    script = (
        f"while [ ! -e {go} ]; do sleep 0.05; done; "
        f"(printf '{_EVIL_CONFIG}' >> {target} && echo wrote) 2>/dev/null; true"
    )
    read, write = os.pipe()
    sandbox = nsconfine.spawn(session(*repo).plan(), ["/bin/sh", "-c", script], stdout=write)
    os.close(write)
    try:
        before = os.stat(target)
        done = _as_account(workspace, *host)
        assert done.returncode == 0, done.stderr
        after = os.stat(target)  # the host did replace it (its inode number may be reused)
        assert (after.st_ino, after.st_ctime_ns) != (before.st_ino, before.st_ctime_ns)
        go.touch()
    finally:
        if not go.exists():  # a failed step above: the session would wait for ever
            sandbox.kill()
        status = sandbox.wait()
    output = os.read(read, 4096).decode()
    os.close(read)
    assert status == 0, output
    if "wrote" in output:
        assert str(target) in (sandbox.untrusted_config or []), output


# How a session adds its gitlink to the index, and hides it: not at all; behind an index whose
# mtime it set back (the report read only indexes written since the session began); in a split
# index, whose entries live in the shared index file the index names; in a split index's entry
# that replaces a shared one (git writes its name stripped: the shared entry's is meant).
_GITLINK_ADDED = {
    "as-is": "git update-index --add --cacheinfo 160000,$sha,node_modules/evil",
    "backdated": "git update-index --add --cacheinfo 160000,$sha,node_modules/evil; "
    "touch -d 2001-01-01 .git/index",
    "split": "git update-index --split-index --add --cacheinfo 160000,$sha,node_modules/evil",
    "split-replaced": "git update-index --split-index --add --cacheinfo "
    "100644,$(git hash-object -w README),node_modules/evil; "
    "git update-index --cacheinfo 160000,$sha,node_modules/evil",
}


@pytest.mark.parametrize("hidden", sorted(_GITLINK_ADDED))
def test_a_repository_in_node_modules_made_a_submodule_is_reported(
    repo: tuple[Path, Path], hidden: str
) -> None:
    """A session makes a repository in node_modules (never looked into) and adds it to the
    index of the workspace's repository as a gitlink (no .gitmodules needed): the host's
    `git status` at the top then runs `git status` in it, and its core.fsmonitor. Never kept
    read-only, it must at least be named after the session, however the index hides it (the
    repository, or the index itself where its entry's name is the shared index's)."""
    workspace = repo[0]
    evil, index = workspace / "node_modules" / "evil", workspace / ".git" / "index"
    script = (
        f"set -e; export GIT_CONFIG_NOSYSTEM=1; git init -q {evil}; cd {evil}; "
        "git -c user.name=a -c user.email=a@a commit -q --allow-empty -m x; "
        f"sha=$(git rev-parse HEAD); cd {workspace}; {_GITLINK_ADDED[hidden]}"
    )
    written = _reported_after(repo, script)  # read first: the host's git rewrites the index
    if hidden.startswith("split"):
        assert list((workspace / ".git").glob("sharedindex.*"))
    assert "node_modules/evil" in _host_git(workspace, "status", "--short").stdout  # looked into
    assert any(path.startswith(str(evil)) or path == str(index) for path in written), written


# Writes .git/index as git reads it, with a gitlink to argv[2] (a path as git takes it), after
# an entry whose flags ask for extended flags in a version 2 index (git honours them in any
# version: a parser that does not is out of step from there on, and misses the gitlink).
_INDEX_WRITER = r"""
import hashlib, struct, sys
def entry(name, mode, oid, extended=False):
    flags = len(name) | (0x4000 if extended else 0)
    body = struct.pack(">10I", 0, 0, 0, 0, 0, 0, mode, 0, 0, 0) + oid + struct.pack(">H", flags)
    body += (struct.pack(">H", 0) if extended else b"") + name
    return body + b"\0" * (((len(body) + 8) & ~7) - len(body))
desync = sys.argv[1] == "desync"
entries = [entry(b"README", 0o100644, b"\x22" * 20, extended=True)] if desync else []
gitlink = entry(sys.argv[2].encode(), 0o160000, b"\x11" * 20)
if sys.argv[1] == "ieot":  # in order, README alone; by the offset table, the gitlink, kept
    # in an optional extension (ignored in order): git reads the table with index.threads > 1
    head, readme = b"DIRC" + struct.pack(">II", 2, 1), entry(b"README", 0o100644, b"\x22" * 20)
    extensions = len(head) + len(readme)
    kept = b"ZZZZ" + struct.pack(">I", len(gitlink)) + gitlink
    table = struct.pack(">III", 1, extensions + 8, 1)
    ieot = b"IEOT" + struct.pack(">I", len(table)) + table
    eoie = struct.pack(">I", extensions) + hashlib.sha1(kept[:8] + ieot[:8]).digest()
    data = head + readme + kept + ieot + b"EOIE" + struct.pack(">I", 24) + eoie
else:
    entries.append(gitlink)
    data = b"DIRC" + struct.pack(">II", 2, len(entries)) + b"".join(entries)
open(sys.argv[3], "wb").write(data + hashlib.sha1(data).digest())
"""


@pytest.mark.parametrize("how", ["desync", "ieot", "absolute", "symlinked", "worktree-outside"])
def test_a_gitlink_git_reads_where_a_parser_would_not_is_reported(
    repo: tuple[Path, Path], tmp_path: Path, how: str
) -> None:
    """Indexes as git reads them, where a parser of nsconfine's own did not (attackers' passes
    found each): extended flags in a version 2 index put it out of step before a gitlink; a
    gitlink that only a read by the index's offset table finds (a host whose git config says
    index.threads = 4 reads it so); a gitlink by absolute path (into the run directory);
    .git/index a symlink to an index in node_modules; the index of a linked worktree that lies
    outside the workspace. git on the host enters each gitlink; each must be named (the index
    that holds it, at least)."""
    workspace, run_dir = repo
    outside = how in ("absolute", "worktree-outside")
    evil = run_dir / "evil" if outside else workspace / "node_modules" / "evil"
    name = str(evil) if outside else "node_modules/evil"
    index = workspace / ".git" / "index"
    host_tree = workspace
    if how == "worktree-outside":
        host_tree = tmp_path / "outside"
        assert _host_git(workspace, "worktree", "add", "-q", str(host_tree)).returncode == 0
        give_to_session_user(workspace, host_tree)
        index = workspace / ".git" / "worktrees" / "outside" / "index"
    writer = workspace / "writer.py"
    writer.write_text(_INDEX_WRITER)
    give_to_session_user(writer)
    target = workspace / "node_modules" / "idx" if how == "symlinked" else index
    script = (
        f"set -e; export GIT_CONFIG_NOSYSTEM=1; git init -q {evil}; mkdir -p {target.parent}; "
        f"python3 {writer} {how} {name} {target}; rm {writer}"
    )
    if how == "symlinked":
        script += f"; rm {index}; ln -s ../node_modules/idx {index}"
    written = _reported_after(repo, script)
    threads = ["-c", "index.threads=4"] if how == "ieot" else []
    assert "160000" in _host_git(host_tree, *threads, "ls-files", "-s").stdout  # git on the host
    assert str(index) in written or any(path.startswith(str(evil)) for path in written), written


def test_a_gitlink_to_a_repository_not_made_yet_is_reported(repo: tuple[Path, Path]) -> None:
    """A session adds a gitlink (or a link) into node_modules, where nothing is yet, so that a
    later session makes the repository git will enter: each session's report judged only what
    changed during it, and neither named anything. The first names where the repository
    would be."""
    workspace = repo[0]
    script = (
        f"set -e; cd {workspace}; export GIT_CONFIG_NOSYSTEM=1; git update-index --add "
        "--cacheinfo 160000,1111111111111111111111111111111111111111,node_modules/evil; "
        "ln -s node_modules/pkg lib; mkdir -p node_modules/b/c x; ln -s b/c node_modules/a; "
        "ln -s node_modules/a/../../x/evil up; touch node_modules/file; ln -s node_modules/file f"
    )
    written = _reported_after(repo, script)
    assert str(workspace / "node_modules" / "evil") in written, written
    # A link to nothing yet; one whose `..` follows a link the scan never met (as written it
    # leads where the scan looks, the kernel takes it into node_modules); one to a file there
    # (a later session puts a repository in its place).
    _assert_named(written, workspace, "lib", "up", "f")


def test_the_index_is_read_in_no_directory_another_account_could_swap(
    repo: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report reads a written index in a scratch directory of its own, never in $TMPDIR:
    a launcher's TMPDIR may be a directory another account writes, which renamed the fresh
    directory away and put a symlink at its name, and the launcher (root) wrote HEAD and
    config through it onto a file of its choosing (attackers' pass). The scratch directory is
    made in a sticky, root-owned /tmp, where no other account renames it."""
    workspace = repo[0]
    others = tmp_path / "others-tmp"
    others.mkdir()
    others.chmod(0o777)  # anyone may rename what lies in it
    monkeypatch.setenv("TMPDIR", str(others))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (tempfile reads TMPDIR once)
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args: Any, **kwargs: Any) -> str:
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording_mkdtemp)
    script = (
        f"set -e; cd {workspace}; export GIT_CONFIG_NOSYSTEM=1; git update-index --add "
        "--cacheinfo 160000,1111111111111111111111111111111111111111,node_modules/evil"
    )
    written = _reported_after(repo, script)
    assert str(workspace / "node_modules" / "evil") in written, written
    assert made, "the index was not read"
    assert not [path for path in made if path.startswith(str(others))], made


def test_a_report_that_cannot_be_finished_names_the_workspace(
    repo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error while the report looks (a file gone between two looks, a scratch directory
    that cannot be removed) names the workspace as a whole: it ended `nsconfine run` with
    output-failed and status 74, the session's status and every warning lost."""
    from nsconfine._plan import protect

    def failing(*_args: object) -> list[str]:
        raise OSError(errno.ENOENT, "gone while it was looked at", "x")

    monkeypatch.setattr(protect, "_gitlinks_unscanned", failing)
    assert _reported_after(repo, "true") == [str(repo[0])]


def test_a_link_to_nothing_yet_is_judged_where_it_really_leads(
    repo: tuple[Path, Path], tmp_path: Path
) -> None:
    """A link to nothing is judged by what of its way exists, resolved: through another path
    to the workspace (a host symlink, as /var/run is /run) into node_modules it is named, as
    written it was not; through `..` to a place the scan looks, it is not (a checkout of a
    tree with such a link named it)."""
    workspace = repo[0]
    alias = tmp_path / "alias"
    alias.symlink_to(workspace)
    script = (
        f"set -e; cd {workspace}; mkdir -p docs; ln -s {alias}/node_modules/evil through; "
        "ln -s ../generated/out.txt docs/out.txt"
    )
    written = _reported_after(repo, script)
    assert str(workspace / "through") in written, written
    assert str(workspace / "docs" / "out.txt") not in written, written


# Adds a gitlink to node_modules/evil (a repository the session made) to the shared index of
# a split index, in place, its name and trailing hash kept: .git/index itself is not touched.
_SHARED_INDEX_WRITER = r"""
import glob, struct, sys
sha = bytes.fromhex(sys.argv[1])
path = glob.glob(".git/sharedindex.*")[0]
raw = open(path, "rb").read()
version, count = struct.unpack(">II", raw[4:12])
offset, entries = 12, []
for _ in range(count):
    end = raw.index(b"\0", offset + 62)
    following = offset + (end - offset + 8) // 8 * 8
    entries.append((raw[offset + 62 : end], raw[offset:following]))
    offset = following
name = b"node_modules/evil"
entry = struct.pack(">10I", 0, 0, 0, 0, 0, 0, 0o160000, 0, 0, 0) + sha
entry += struct.pack(">H", len(name)) + name
entry += b"\0" * (8 - len(entry) % 8)
entries = sorted([*entries, (name, entry)])
body = b"".join(entry for _name, entry in entries)
open(path, "wb").write(raw[:4] + struct.pack(">II", version, count + 1) + body + raw[offset:])
"""


def test_a_gitlink_written_into_an_older_split_index_is_reported(repo: tuple[Path, Path]) -> None:
    """One session splits the index (nothing to name); a later one writes a gitlink into the
    shared index only. The index, unchanged since before that session, was skipped by its
    times, and its shared index never read: the shared index's times count too."""
    workspace = repo[0]
    evil = workspace / "node_modules" / "evil"
    first = nsconfine.spawn(session(*repo).plan(), ["git", "update-index", "--split-index"])
    assert first.wait() == 0
    assert first.untrusted_config == []
    time.sleep(1.5)  # the index now predates the next session by more than the report's slack
    writer = workspace / "writer.py"
    writer.write_text(_SHARED_INDEX_WRITER)
    give_to_session_user(writer)
    script = (
        f"set -e; export GIT_CONFIG_NOSYSTEM=1; git init -q {evil}; cd {evil}; "
        "git -c user.name=a -c user.email=a@a commit -q --allow-empty -m x; "
        f"cd {workspace}; python3 {writer} $(git -C {evil} rev-parse HEAD)"
    )
    written = _reported_after(repo, script)
    assert "160000" in _host_git(workspace, "ls-files", "-s", "node_modules").stdout
    assert any(path.startswith(str(evil)) for path in written), written


@pytest.mark.parametrize("where", ["run-directory", "node_modules"])
def test_a_workspace_link_to_a_repository_the_scan_skips_is_reported(
    repo: tuple[Path, Path], where: str
) -> None:
    """The scan never follows a symlink, nor looks in the run directory or a node_modules: a
    session that makes a repository there and links it into the workspace (ws/proj -> the
    run directory's proj) had the host's git in ws/proj run its core.fsmonitor, and named
    nothing. A link the session made to a directory it could write and the scan skipped is
    named; a link to a directory the scan looks through is not (a repository there is
    named by itself)."""
    workspace, run_dir = repo
    outside = run_dir / "proj" if where == "run-directory" else workspace / "node_modules" / "p"
    link, scanned = workspace / "proj", workspace / "scanned"
    script = (
        f"set -e; export GIT_CONFIG_NOSYSTEM=1; git init -q {outside}; "
        f"printf '{_EVIL_CONFIG}' >> {outside}/.git/config; ln -s {outside} {link}; "
        f"ln -s {workspace}/vendor {scanned}"
    )
    written = _reported_after(repo, script)
    assert _host_git_config(link) == "touch /tmp/pwned\n"  # what the host's git would run
    assert str(link) in written, written
    assert str(scanned) not in written, written


def test_an_index_git_cannot_be_asked_about_cheaply_is_named(
    repo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """git reading a session's index must not take the launcher with it: a version 4 index's
    names can grow with the square of its entries (a 1.9 MB index took git 878 MB), and a
    gitdir can hold 100,000 shared indexes (24 s of links). Past what is read of git's answer
    (here made 100 bytes), or past 16 shared indexes, the index itself is named."""
    import nsconfine._plan.protect as protect

    workspace = repo[0]
    index = workspace / ".git" / "index"
    monkeypatch.setattr(protect, "_GITLINKS_ANSWER", 100)
    made = nsconfine.spawn(session(*repo).plan(), ["touch", str(index)])  # two entries: 110 bytes
    assert made.wait() == 0
    assert str(index) in (made.untrusted_config or [])
    monkeypatch.undo()
    script = f"cd {workspace}/.git; for i in $(seq 17); do : > sharedindex.$i; done; touch index"
    made = nsconfine.spawn(session(*repo).plan(), ["/bin/sh", "-c", script])
    assert made.wait() == 0
    assert str(index) in (made.untrusted_config or [])


def test_a_link_re_pointed_through_node_modules_later_is_reported(repo: tuple[Path, Path]) -> None:
    """One session makes links through a link in node_modules that leads back to where the
    scan looks (nothing to name); a later one re-points that node_modules link at a repository
    it made there, touching neither workspace link. The host's git, run after `cd` through
    either, enters the repository: the later session's report names them (by where they lead
    now, changed during it)."""
    workspace = repo[0]
    first = (
        f"set -e; cd {workspace}; mkdir -p sub node_modules; ln -s ../sub node_modules/k; "
        "ln -s node_modules/k tools; ln -s node_modules/k/later dang"
    )
    _reported_after(repo, first)
    time.sleep(1.5)  # the links now predate the next session by more than the report's slack
    second = (
        f"set -e; cd {workspace}; export GIT_CONFIG_NOSYSTEM=1; git init -q node_modules/evil; "
        "git init -q node_modules/evil/later; ln -sfn evil node_modules/k"
    )
    written = _reported_after(repo, second)
    _assert_named(written, workspace, "tools", "dang")


# What one session builds in node_modules (never looked into, so never named), and what its
# report must name once a later session has only moved node_modules/p into view: config the
# host's tools read where they start; a link to a repository the session made in node_modules;
# a repository whose index records a gitlink to one in its own node_modules.
_BUILT_OUT_OF_VIEW = {
    "config": (
        "mkdir -p node_modules/p/.vscode; echo '{}' > node_modules/p/.vscode/tasks.json; "
        "echo 'export EVIL=1' > node_modules/p/.envrc",
        ["sub/.vscode", "sub/.envrc"],
    ),
    "link": (
        "git init -q node_modules/evil; mkdir -p node_modules/p; "
        "ln -s $PWD/node_modules/evil node_modules/p/tool",
        ["sub/tool"],
    ),
    "gitlink": (
        "git init -q node_modules/p; cd node_modules/p; git init -q node_modules/evil; "
        "git -C node_modules/evil -c user.name=a -c user.email=a@a commit -q --allow-empty -m e; "
        "git update-index --add --cacheinfo "
        "160000,$(git -C node_modules/evil rev-parse HEAD),node_modules/evil",
        ["sub/node_modules/evil/.git/config"],
    ),
}


@pytest.mark.parametrize("built", sorted(_BUILT_OUT_OF_VIEW))
def test_what_a_session_moved_into_view_is_reported(repo: tuple[Path, Path], built: str) -> None:
    """A later session that only renames a directory out of node_modules changes the times of
    that directory alone, not of what it holds: the report, which went by times, named none
    of it (attacker's pass, stop 40; the host's `git status` ran the fsmonitor of a repository
    so revealed). What sits in a directory the launch's scan did not see there is new."""
    workspace = repo[0]
    script, named = _BUILT_OUT_OF_VIEW[built]
    _reported_after(repo, f"set -e; export GIT_CONFIG_NOSYSTEM=1; cd {workspace}; {script}")
    time.sleep(1.5)  # what it built now predates the next session by more than the slack
    written = _reported_after(repo, f"set -e; cd {workspace}; mv node_modules/p sub")
    _assert_named(written, workspace, *named)
    assert (workspace / "sub").is_dir()


def _launcher_of(plan: nsconfine.Plan, how: str) -> tuple[Callable[[str], list[str]], Any]:
    """A way to run scripts in sessions of the one plan, one after another (spawn, or a Pool's
    warm launches), each returning its report; and what to close after."""
    pool = nsconfine.Pool(plan, refill="inline") if how.startswith("pool") else None

    def reported(script: str) -> list[str]:
        argv = ["/bin/sh", "-c", f"set -e; {script}"]
        made = pool.launch(argv) if pool is not None else nsconfine.spawn(plan, argv)
        assert made.wait() == 0
        return made.untrusted_config or []

    return reported, pool


# Session 1 builds, in w/node_modules (never looked into), a repository `evil` and a git
# directory `c` whose index records evil as a gitlink; session 2 only gives w that git
# directory, by moving it there or by a pointer to it.
_INDEX_BUILT_OUT_OF_VIEW = (
    "mkdir -p w/node_modules; cd w; git init -q node_modules/evil; "
    "git -C node_modules/evil -c user.name=a -c user.email=a@a commit -q --allow-empty -m e; "
    "git init -q node_modules/t; mv node_modules/t/.git node_modules/c; rm -r node_modules/t; "
    "mkdir t; echo 'gitdir: ../node_modules/c' > t/.git; "
    "git -C t update-index --add --cacheinfo "
    "160000,$(git -C node_modules/evil rev-parse HEAD),node_modules/evil; rm -r t"
)
_GIT_DIRECTORY_GIVEN = {
    "moved": "mv node_modules/c .git",
    "pointer": "echo 'gitdir: node_modules/c' > .git",
}


@pytest.mark.parametrize("given", sorted(_GIT_DIRECTORY_GIVEN))
def test_a_git_directory_given_from_out_of_view_is_read(
    repo: tuple[Path, Path], given: str
) -> None:
    """The index of a git directory a session moved (or pointed) into a working tree the
    launch saw is old, and was not read: its gitlink into node_modules, which the host's `git
    status` in w enters, went unnamed (review of 7c499d8, stop 40). A git directory the launch
    did not see there is new."""
    workspace = repo[0]
    _reported_after(repo, f"set -e; export GIT_CONFIG_NOSYSTEM=1; cd {workspace}; "
                          f"{_INDEX_BUILT_OUT_OF_VIEW}")  # fmt: skip
    time.sleep(1.5)  # what it built now predates the next session by more than the slack
    written = _reported_after(repo, f"set -e; cd {workspace}/w; {_GIT_DIRECTORY_GIVEN[given]}")
    _assert_named(written, workspace, "w/node_modules/evil/.git/config")


@pytest.mark.parametrize("how", ["spawn", "pool", "spawn-proxy", "spawn-derived"])
def test_a_directory_moved_out_of_view_and_back_is_reported(
    repo: tuple[Path, Path], how: str
) -> None:
    """One plan, launched again and again (spawn, a Pool): a session moves src, seen when the
    plan was built, into node_modules and puts config in it; the next moves it back. Judged
    against the plan's own scan, src was a directory seen there, and its config old: named by
    neither (review of 7c499d8, stop 40). The next session's launch did not see it there.
    Its review: so too when the plan a launch runs is another than the one given (a proxy
    session's; one whose protection a session changed, by making a repository)."""
    workspace = repo[0]
    (workspace / "src").mkdir()
    give_to_session_user(workspace / "src")
    network = "proxy" if how.endswith("proxy") else None
    reported, pool = _launcher_of(session(*repo, network=network).plan(), how)
    try:
        if how.endswith("derived"):
            reported(f"cd {workspace}; git init -q made-during-a-session")
        reported(
            f"cd {workspace}; mv src node_modules/src 2>/dev/null || "
            "{ mkdir -p node_modules; mv src node_modules/src; }; "
            "mkdir node_modules/src/.vscode; echo '{}' > node_modules/src/.vscode/tasks.json; "
            "echo 'export EVIL=1' > node_modules/src/.envrc"
        )
        time.sleep(1.5)  # what it wrote now predates the next session by more than the slack
        _assert_named(reported(f"cd {workspace}; mv node_modules/src src"), workspace,
                      "src/.vscode", "src/.envrc")  # fmt: skip
    finally:
        if pool is not None:
            pool.close()


@pytest.mark.parametrize("how", ["spawn", "pool"])
def test_config_made_once_is_named_once(repo: tuple[Path, Path], how: str) -> None:
    """Config a session made below a directory it made is named after that session, and not
    after every later one of the same plan (review of 7c499d8, stop 40: the directory, new to
    the plan's own scan, was judged new at each session's end)."""
    workspace = repo[0]
    reported, pool = _launcher_of(session(*repo).plan(), how)
    try:
        made = f"cd {workspace}; mkdir -p pkg/.vscode; echo '{{}}' > pkg/.vscode/tasks.json"
        _assert_named(reported(made), workspace, "pkg/.vscode")
        time.sleep(1.5)  # past the slack the report gives times
        assert reported("true") == []
    finally:
        if pool is not None:
            pool.close()


def test_a_link_through_proc_is_reported(repo: tuple[Path, Path]) -> None:
    """/proc/self/cwd is the launcher's working directory to the launcher, and the host shell's
    own to the shell that `cd`s through the link: a link through /proc (or /dev/fd) is named,
    whatever it leads to from the launcher."""
    workspace = repo[0]
    script = (
        f"set -e; cd {workspace}; ln -s /proc/self/cwd/node_modules/evil tools; "
        "ln -s /proc p; ln -s p/self/cwd/node_modules/evil viaproc"
    )
    written = _reported_after(repo, script)
    _assert_named(written, workspace, "tools", "viaproc")


# Session 1 leaves a link in the workspace that leads where the scan does not look (named after
# it); session 2 changes only what lies behind the link, in a way no time of the link or of
# the place it leads to shows: the host's git, run after `cd` through it, runs session 2's
# config (attacker's pass, stop 41).
_BEHIND_AN_OLD_LINK = {
    "config-in-place": (
        "git init -q node_modules/r; ln -s node_modules/r lnk",
        "printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' >> node_modules/r/.git/config",
    ),
    "repository-above": (
        "mkdir -p node_modules/x; ln -s node_modules/x lnk",
        "git init -q node_modules",
    ),
    "way-re-pointed": (
        "mkdir -p node_modules/a; git init -q node_modules/evil; ln -s a node_modules/hop; "
        "ln -s node_modules/hop lnk",
        "ln -sfn evil node_modules/hop",
    ),
    "through-proc": (
        "mkdir -p node_modules/r; ln -s /proc/self/cwd/node_modules/r lnk",
        "git init -q node_modules/r",
    ),
}


@pytest.mark.parametrize("change", sorted(_BEHIND_AN_OLD_LINK))
def test_a_link_to_where_the_scan_does_not_look_is_named_while_it_stands(
    repo: tuple[Path, Path], change: str
) -> None:
    """What a link leads to where the scan does not look, no time tells the report whether a
    session changed (config rewritten in place, a repository made above it, a link on its way
    re-pointed, a way through /proc): such a link is named after every session while it
    stands, not only after the one that made it."""
    workspace = repo[0]
    plant, change_behind = _BEHIND_AN_OLD_LINK[change]
    prefix = f"set -e; cd {workspace}; export GIT_CONFIG_NOSYSTEM=1; "
    _assert_named(_reported_after(repo, prefix + plant), workspace, "lnk")
    time.sleep(1.5)  # the link now predates the next session by more than the report's slack
    _assert_named(_reported_after(repo, prefix + change_behind), workspace, "lnk")


def test_a_link_to_a_file_where_the_scan_does_not_look_is_named_once(
    repo: tuple[Path, Path],
) -> None:
    """A link to a file in node_modules (`bin/tsc -> ../node_modules/.bin/tsc`) is no place
    the host's git is run in: named after the session that made it (a later one could make
    a repository of its place, and the link, then a directory's, is named again), not after
    every session (the review of 6dfcc49: ordinary repositories' warnings after every
    session). One to a directory there is (as the test above)."""
    workspace = repo[0]
    made = (
        f"set -e; cd {workspace}; mkdir -p bin node_modules/.bin; echo x > node_modules/.bin/tsc; "
        "ln -s ../node_modules/.bin/tsc bin/tsc"
    )
    _assert_named(_reported_after(repo, made), workspace, "bin/tsc")
    time.sleep(1.5)  # the link now predates the next session by more than the report's slack
    assert _reported_after(repo, "true") == []
    remade = f"cd {workspace}; rm node_modules/.bin/tsc; git init -q node_modules/.bin/tsc"
    _assert_named(_reported_after(repo, remade), workspace, "bin/tsc")


def test_config_through_a_link_where_the_scan_looks_is_named_once(
    repo: tuple[Path, Path],
) -> None:
    """Config below the top that links to a file where the scan looks (docs/) is named after
    the session that made it, and not after a later one that changed nothing on its way."""
    workspace = repo[0]
    made = (
        f"set -e; cd {workspace}; mkdir -p sub/.claude docs/a; echo '{{}}' > docs/a/s.json; "
        "ln -s ../../docs/a/s.json sub/.claude/settings.json"
    )
    _assert_named(_reported_after(repo, made), workspace, "sub/.claude")
    time.sleep(1.5)  # past the slack the report gives times
    assert _reported_after(repo, f"cd {workspace}; mkdir -p docs/b; echo x > docs/b/x") == []


# Session 1 puts config below the workspace's top as a link (or through one) to a file it can
# go on writing; session 2 changes only what the link leads to (attacker's pass, stop 41: the
# host's Claude Code started in sub/ ran session 2's SessionStart hook).
_CONFIG_THROUGH_A_LINK = {
    "nested-link-to-node_modules": (
        "mkdir -p sub/.claude node_modules/y; echo '{}' > node_modules/y/s.json; "
        "ln -s ../../node_modules/y/s.json sub/.claude/settings.json",
        "echo '{\"hooks\": {}}' > node_modules/y/s.json",
    ),
    "nested-link-to-run-dir": (
        "mkdir -p sub/.vscode; echo '{}' > {run}/t.json; ln -s {run}/t.json sub/.vscode/tasks.json",
        "echo '{\"tasks\": []}' > {run}/t.json",
    ),
    "nested-way-re-pointed": (
        "mkdir -p sub/.claude docs/a docs/b; echo '{}' > docs/a/s.json; echo '{}' > docs/b/s.json; "
        "ln -s a docs/hop; ln -s ../../docs/hop/s.json sub/.claude/settings.json",
        "ln -sfn b docs/hop",
    ),
    "through-proc": (
        "mkdir -p sub/node_modules/c; echo '{}' > sub/node_modules/c/settings.json; "
        "ln -s /proc/self/cwd/node_modules/c sub/.claude",
        "rm sub/node_modules/c/settings.json; echo '{}' > sub/node_modules/c/settings.json",
    ),
    # (the review of 6dfcc49: what a directory on the way holds, swapped by two renames)
    "directory-on-the-way-swapped": (
        "mkdir -p sub/.claude lib/a/b lib/c/b; echo '{}' > lib/a/b/settings.json; "
        "echo '{\"hooks\": {}}' > lib/c/b/settings.json; "
        "ln -s ../../lib/a/b/settings.json sub/.claude/settings.json",
        "mv lib/a lib/old; mv lib/c lib/a",
    ),
    "linked-directory-swapped": (
        "mkdir -p lib/d lib/e; echo '{}' > lib/d/settings.json; "
        "echo '{\"hooks\": {}}' > lib/e/settings.json; mkdir sub; ln -s ../lib/d sub/.claude",
        "mv lib/d lib/old; mv lib/e lib/d",
    ),
}


@pytest.mark.parametrize("change", sorted(_CONFIG_THROUGH_A_LINK))
def test_config_below_the_top_is_judged_by_where_its_links_lead(
    repo: tuple[Path, Path], change: str
) -> None:
    """Config below the workspace's top (named when a session made or changed it) is judged by
    every link met in it and on their ways, and what they lead to: a file a link leads to,
    rewritten in place; a link on the way, re-pointed; a way through /proc, which leads
    elsewhere for each process, whatever its times."""
    workspace, run_dir = repo
    plant, change_behind = (
        script.replace("{run}", str(run_dir)) for script in _CONFIG_THROUGH_A_LINK[change]
    )
    prefix = f"set -e; cd {workspace}; "
    config = "sub/.vscode" if "run-dir" in change else "sub/.claude"
    _assert_named(_reported_after(repo, prefix + plant), workspace, config)
    time.sleep(1.5)  # past the slack the report gives times
    _assert_named(_reported_after(repo, prefix + change_behind), workspace, config)


def test_links_that_cannot_be_resolved_cheaply_name_the_workspace(
    repo: tuple[Path, Path],
) -> None:
    """Links that loop through long chains of other links cost each way's resolution ms
    (a session's 254 such links held the report 42 s): one that the kernel refuses as too
    many links is named, and past a budget of time the workspace is."""
    workspace = repo[0]
    script = f"set -e; cd {workspace}; ln -s loop loop; ln -s loop/x/y/z dangling"
    made = nsconfine.spawn(session(*repo).plan(), ["/bin/sh", "-c", script])
    assert made.wait() == 0
    assert str(workspace / "dangling") in (made.untrusted_config or [])


_GIT_OF_THE_REPORT = """
import tempfile
from nsconfine._plan.protect import _git_answer

own = tempfile.mkdtemp()
print("reading", flush=True)
sleeps = f'exec -a "sleep {sys.argv[1]}" sleep 600'  # (as helpers.sleeper)
_git_answer(["/bin/bash", "-c", sleeps], own, "1", [], None)
"""


def test_the_report_s_git_dies_with_the_launcher() -> None:
    """The git the report runs on a session's index (which can keep it reading for seconds)
    dies with the launcher, a SIGKILL of it too: it read on as an orphan, of the session's
    account (attacker's pass, stop 41). A stand-in git that sleeps, run as the report runs
    git."""
    marker = f"nsconfine-report-git-{os.getpid()}-{time.monotonic_ns()}"
    child = python_child(_GIT_OF_THE_REPORT, marker, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "reading"
        deadline = time.monotonic() + 30
        while not (git := set(pids_with(marker)) - {child.pid}) and time.monotonic() < deadline:
            time.sleep(0.02)  # (the launcher's own command line holds the marker too)
        assert git, "the stand-in git never started"
    finally:
        child.kill()
        child.communicate()
    assert wait_until_gone(marker, 10) == [], "the report's git outlived its launcher"


def test_an_index_of_many_unscanned_gitlinks_is_named_once(repo: tuple[Path, Path]) -> None:
    """An index with thousands of gitlinks into node_modules named each place (760,000 of them
    took the report 49 s and gave `run` 6.8 million warning lines): past 16 in one index, the
    index itself is named, once."""
    workspace = repo[0]
    script = (
        f"set -e; cd {workspace}; export GIT_CONFIG_NOSYSTEM=1; for i in $(seq 20); do printf "
        "'160000 1111111111111111111111111111111111111111 0\\tnode_modules/m%s\\n' $i; done | "
        "git update-index --index-info"
    )
    written = _reported_after(repo, script)
    assert written == [str(workspace / ".git" / "index")], written


def test_the_report_reads_git_s_answer_without_holding_it(repo: tuple[Path, Path]) -> None:
    """git's answer on a session's index is read as it comes, never held whole: an index of
    100,000 entries (a 6 MB answer) costs the launcher a few MB at most (a crafted one of
    900,000 gitlinks cost it 391 MiB, three at once 1 GiB, in an attacker's pass)."""
    import tracemalloc

    workspace = repo[0]
    script = (
        f"set -e; cd {workspace}; export GIT_CONFIG_NOSYSTEM=1; seq 100000 | sed "
        "'s/^/100644 e69de29bb2d1d6434b8b29ae775ad8c2e48c5391 0\\tf/' | "
        "git update-index --index-info"
    )
    made = nsconfine.spawn(session(*repo).plan(), ["/bin/sh", "-c", script])
    assert made.wait() == 0
    tracemalloc.start()
    try:
        written = made.untrusted_config
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert written == [], written
    assert peak < 4 << 20, peak


def test_an_index_of_more_gitlinks_than_are_read_is_named(
    repo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past _GITLINKS_MOST gitlinks (here made 3), the index is named, not its gitlinks read
    on; below it (the twin), each place is."""
    import nsconfine._plan.protect as protect

    workspace = repo[0]
    script = (
        f"set -e; cd {workspace}; export GIT_CONFIG_NOSYSTEM=1; for i in $(seq 5); do printf "
        "'160000 1111111111111111111111111111111111111111 0\\tnode_modules/m%s\\n' $i; "
        "done | git update-index --index-info"
    )
    monkeypatch.setattr(protect, "_GITLINKS_MOST", 3)
    assert _reported_after(repo, script) == [str(workspace / ".git" / "index")]
    monkeypatch.undo()
    written = _reported_after(repo, script)
    assert len(written) == 5, written
    assert str(workspace / ".git" / "index") not in written


def test_git_that_waits_on_something_is_given_up_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A git blocked without using CPU (a FIFO another running session of the workspace
    swapped in for the index as it was opened: its CPU limit never comes) is given up on at
    its deadline, killed, and counts as an index that cannot be told; it held the report
    until something wrote to the FIFO."""
    import nsconfine._plan.protect as protect

    monkeypatch.setattr(protect, "_GIT_DEADLINE", 0.5)
    waiter = tmp_path / "waiter"
    waiter.write_text("#!/bin/sh\nexec sleep 600\n")
    waiter.chmod(0o755)
    began = time.monotonic()
    assert protect._git_answer([str(waiter)], str(tmp_path), "1", (), None) is None
    assert time.monotonic() - began < 60  # (not a speed check: sleep 600 was not waited for)
    assert not pids_with(str(waiter))


def test_more_new_links_than_are_looked_at_name_the_workspace(repo: tuple[Path, Path]) -> None:
    """Each new link is resolved after the session (a link with a 4,000-byte target cost
    glibc's realpath 0.1 s, and 200 of them held `run` 22 s): past 256 new links, none is
    looked at and the workspace itself is named; 10 links to where the scan looks name
    nothing."""
    workspace = repo[0]
    plan = session(*repo).plan()
    for count, named in ((10, False), (300, True)):
        links = workspace / f"links{count}"
        script = f"mkdir {links}; for i in $(seq {count}); do ln -s ../vendor {links}/$i; done"
        made = nsconfine.spawn(plan, ["/bin/sh", "-c", script])
        assert made.wait() == 0
        assert (str(workspace) in (made.untrusted_config or [])) is named, made.untrusted_config


def test_more_links_than_a_scan_keeps_name_the_workspace(
    repo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan remembers LINKS_KEPT links at most (here 20: the launcher's memory stays
    bounded however many a session makes); past it, the report cannot judge the others and
    names the workspace. 10 links name nothing."""
    from nsconfine._plan import protect as _protect

    monkeypatch.setattr(_protect, "LINKS_KEPT", 20)
    workspace = repo[0]
    for count, named in ((10, False), (30, True)):
        links = workspace / f"old{count}"
        links.mkdir()
        for index in range(count):
            (links / str(index)).symlink_to("../vendor")
        give_to_session_user(workspace)
        made = nsconfine.spawn(session(*repo).plan(), ["/bin/true"])
        assert made.wait() == 0
        assert (str(workspace) in (made.untrusted_config or [])) is named, made.untrusted_config


def test_an_index_too_large_to_read_whole_is_reported(repo: tuple[Path, Path]) -> None:
    """An index the session grew past what the report reads (64 MiB) could hold a gitlink
    after that point: the index itself is named, as the report cannot say it holds none."""
    index = repo[0] / ".git" / "index"
    made = nsconfine.spawn(
        session(*repo).plan(),
        ["/bin/sh", "-c", f"head -c {(64 << 20) + 1} /dev/zero >> {index}"],
    )
    assert made.wait() == 0
    assert str(index) in (made.untrusted_config or [])


@pytest.mark.parametrize("relative", [".devcontainer/devcontainer.json", ".devcontainer.json"])
def test_a_dev_container_config_is_protected(repo: tuple[Path, Path], relative: str) -> None:
    """VS Code's Dev Containers run a devcontainer.json's `initializeCommand` on the host
    (before the container is made, on "Reopen in Container"): trusted as .vscode is."""
    target = repo[0] / relative
    _, output = _launch(
        repo, f"mkdir -p {target.parent}; (echo '{{}}' > {target} && echo wrote) 2>/dev/null; true"
    )
    assert "wrote" not in output, output


def test_a_repository_in_a_directory_the_launcher_cannot_list_is_not_hidden(
    tmp_path: Path,
) -> None:
    """A session makes app a repository with a core.fsmonitor, then `chmod 0311 app`: listing
    app needs its read bit, looking a name up in it only the search bit, so the host's git
    (the same account, for an unprivileged launcher) still finds app/.git and runs the
    command, while the launcher's scan, listing nothing there, neither named it after the
    session nor protected it in the next (or refused it). A root launcher lists it all the
    same: this fails as an unprivileged launcher only."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    app = workspace / "app"
    made = nsconfine.spawn(
        session(workspace, run_dir).plan(),
        ["/bin/sh", "-c", f"set -e; git init -q {app}; chmod 0311 {app}"],
    )
    assert made.wait() == 0
    try:
        written = made.untrusted_config or []
        _, output = _launch((workspace, run_dir), _plant_config(app / ".git" / "config"))
        assert written, "the repository the session made is not named"
        assert "wrote" not in output, output
    finally:
        app.chmod(0o755)


def test_a_refusal_for_remembered_git_directories_names_them(tmp_path: Path) -> None:
    """A session makes 110 directories look bare (HEAD, objects/, refs/): the next plan is
    refused for the mount points they take. Once git's files are gone from all of them, the
    launcher still remembers them (as it must, while they are directories), so the workspace
    stays refused: the refusal must say what takes the mount points. It said "(1
    repositories)" and "remove repositories", with none left to find."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    make = "for i in $(seq 1 110); do mkdir -p b$i/objects b$i/refs; echo x > b$i/HEAD; done"
    assert attempt(session(workspace, run_dir).plan(), f"cd {workspace} && {make}")[0] == 0
    with pytest.raises(nsconfine.PlanError, match="mount points"):
        session(workspace, run_dir).plan()
    for index in range(1, 111):
        bare = workspace / f"b{index}"
        (bare / "HEAD").unlink()
        (bare / "objects").rmdir()
        (bare / "refs").rmdir()
    with pytest.raises(nsconfine.PlanError, match="mount points") as refused:
        session(workspace, run_dir).plan()
    assert any(f"{workspace}/b{index}" in refused.value.message for index in range(1, 111)), (
        refused.value.message
    )


@pytest.mark.parametrize("name", ["logs", "info"])
def test_a_linked_worktree_named_like_a_git_directory_part_is_protected(
    repo: tuple[Path, Path], tmp_path: Path, name: str
) -> None:
    """`git worktree add ../trees/logs`: the worktree's git directory is .git/worktrees/logs,
    and `logs` (like info, hooks, refs, objects, lfs, branches) was taken for a part of a git
    directory and passed over. Its commondir then stayed writable: a session points it at a
    directory of its own inside .git (never looked into), whose config the host's git in
    the worktree runs."""
    workspace = repo[0]
    outside = tmp_path / "trees" / name
    outside.parent.mkdir()
    open_up(outside.parent)
    give_to_session_user(outside.parent)
    done = _as_account(workspace, "worktree", "add", "-q", str(outside))
    assert done.returncode == 0, done.stderr
    gitdir = workspace / ".git" / "worktrees" / name
    evil = workspace / ".git" / "evil"
    script = (
        f"mkdir -p {evil}/objects {evil}/refs && printf '{_EVIL_CONFIG}' > {evil}/config && "
        f"(echo ../../evil > {gitdir}/commondir && echo wrote) 2>/dev/null; true"
    )
    _, output = _launch(repo, script)
    assert "wrote" not in output, output
    assert _host_git_config(outside) == ""


def test_only_trees_with_git_directories_are_remembered(tmp_path: Path) -> None:
    """The launcher remembers a tree's git directories (by the tree's device and inode) so a
    session cannot hide one between launches; a tree without any leaves no record. Each
    workspace ever planned left one, empty: a broker's records grew without end, and every
    launch's lint looked through them (1,050 files here made it 3 ms). Twin: a repository's
    tree is remembered, and forgotten once it holds none."""
    from nsconfine._kernel.accounts import records_directory

    records = Path(records_directory("git-directories"))
    plain = session_dirs(tmp_path, "plain-ws", "plain-run")
    session(*plain).plan()
    assert not [path for path in records.iterdir() if _is_record_of(path, plain)]
    workspace, run_dir = session_dirs(tmp_path, "repo-ws", "repo-run")
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    session(workspace, run_dir).plan()
    assert [path for path in records.iterdir() if _is_record_of(path, (workspace, run_dir))]
    subprocess.run(["rm", "-rf", str(workspace / ".git")], check=True)
    session(workspace, run_dir).plan()
    assert not [path for path in records.iterdir() if _is_record_of(path, (workspace, run_dir))]


def test_the_remembered_git_directories_come_back_when_their_directory_is_removed(
    tmp_path: Path,
) -> None:
    """A launcher checks the directory of remembered git directories once, not at each of a
    plan's four looks (~0.14 ms each), and again once it is no longer that directory: one
    removed (a cache cleaned) is made and checked again, and the tree remembered there."""
    from nsconfine._kernel.accounts import records_directory

    records = Path(records_directory("git-directories"))
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    session(workspace, run_dir).plan()
    assert [path for path in records.iterdir() if _is_record_of(path, (workspace, run_dir))]
    shutil.rmtree(records)
    session(workspace, run_dir).plan()
    assert records.stat().st_mode & 0o777 == 0o700
    assert [path for path in records.iterdir() if _is_record_of(path, (workspace, run_dir))]


def test_the_records_of_workspaces_gone_are_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher remembers each repository workspace's git directories in a file of its
    own, which stayed after the workspace was removed: a broker that makes a workspace per
    task gained a file for each, for good (leaks' pass, stop 44: 100 tasks, 100 files). Once
    a day, those a week old whose workspace is gone (or another directory at its path) are
    removed; a live workspace's stays. (The records' directory is the test's own here.)"""
    from nsconfine._kernel.accounts import records_directory
    from nsconfine._plan import protect

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(protect, "_checked_directories", {})
    from nsconfine._kernel import stub_records

    stub_records.forget_records()
    try:
        records = Path(records_directory("git-directories"))
        trees = {name: session_dirs(tmp_path, f"{name}-ws", f"{name}-run") for name in
                 ("gone", "live")}  # fmt: skip
        for workspace, run_dir in trees.values():
            subprocess.run(["git", "init", "-q", str(workspace)], check=True)
            session(workspace, run_dir).plan()
        gone = [p for p in records.iterdir() if _is_record_of(p, trees["gone"])]
        live = [p for p in records.iterdir() if _is_record_of(p, trees["live"])]
        assert gone
        assert live
        shutil.rmtree(trees["gone"][0])
        week_ago = time.time() - 8 * 24 * 3600
        for record in [*records.iterdir()]:
            os.utime(record, (week_ago, week_ago))  # (the prune's mark too: a day past)
        monkeypatch.setattr(protect, "_checked_directories", {})  # (a launcher's first look)
        session(*trees["live"]).plan()
        assert [p.exists() for p in gone] == [False] * len(gone)
        assert [p.exists() for p in live] == [True] * len(live)
    finally:
        stub_records.forget_records()


def _is_record_of(record: Path, trees: Sequence[Path]) -> bool:
    return any(
        record.name.startswith(f"{info.st_dev}-{info.st_ino}-")
        for info in (tree.stat() for tree in trees)
    )


def test_remembered_git_directories_stay_with_their_workspace_s_path(tmp_path: Path) -> None:
    """A tree's remembered git directories are its own: another workspace that takes its
    inode (ext4 gives a freed one out again at once: rm -rf a task's workspace, mkdir the
    next's) at another path is not protected by them. Named by device and inode alone, a
    hostile session's bare-looking directories, removed again, made the next tenant's src/
    read-only and its symlinked src/config refused every launch (attacker's pass on shared
    state, stop 33). Moved to another path here, the inode is the very same."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    make = "mkdir -p src/objects src/refs && echo 'ref: refs/heads/main' > src/HEAD"
    assert attempt(session(workspace, run_dir).plan(), f"cd {workspace} && {make}")[0] == 0
    config = f"{workspace}/src/config"
    assert config in {e.dest for e in session(workspace, run_dir).plan().entries}  # remembered
    shutil.rmtree(workspace / "src" / "objects")
    shutil.rmtree(workspace / "src" / "refs")
    (workspace / "src" / "HEAD").unlink()
    assert config in {e.dest for e in session(workspace, run_dir).plan().entries}  # still
    other = tmp_path / "next-task"
    workspace.rename(other)
    (other / "src" / "config").write_text("x = 1\n")
    assert f"{other}/src/config" not in {e.dest for e in session(other, run_dir).plan().entries}


def test_git_reads_the_index_it_was_given_not_one_swapped_in_by_a_link(tmp_path: Path) -> None:
    """The index git reads for the report is the file found, opened without following a
    link: a running session of the workspace that swapped .git/index for a symlink between the
    listing and git's read had the launcher's git (root's) read what it led to, a FIFO or a
    device among them (attacker's pass on the root launcher, stop 32). Now that index cannot
    be told (None: it is named), and what the link leads to is never read."""
    from nsconfine._plan import protect

    gitdir = tmp_path / "ws" / ".git"
    gitdir.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    writer = tmp_path / "writer.py"
    writer.write_text(_INDEX_WRITER)
    for where, name in ((gitdir / "index", "own/sub"), (elsewhere / "index", "secret/sub")):
        run = subprocess.run([sys.executable, str(writer), "plain", name, str(where)], check=False)
        assert run.returncode == 0
    listed = protect._index_files(str(gitdir))  # the index, a regular file, as listed
    launcher = launcher_account()
    assert protect._gitlinks(str(gitdir), listed, launcher) == ["own/sub"]  # (git reads it)
    (gitdir / "index").unlink()
    (gitdir / "index").symlink_to(elsewhere / "index")  # swapped in after the listing
    assert protect._gitlinks(str(gitdir), listed, launcher) is None


@pytest.mark.root  # only a root launcher runs git as another account
def test_a_root_launcher_reads_a_session_s_index_with_git_as_the_session_s_account(
    repo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's git reads the index a session wrote (its gitlinks, for the report), a file
    of attacker bytes for git's C parser: as the session's account, never as root with every
    capability (found by an attacker's pass), in a git directory that stays root's. A git
    standing in for the host's says whose it ran as, and whose its git directory is."""
    from nsconfine._plan import protect

    place = Path(tempfile.mkdtemp(prefix="nsconfine-git-"))
    try:
        place.chmod(0o777)  # (the stand-in writes here as the session's account)
        for tool in ("prlimit", "setpriv"):  # (what runs git, from the same PATH)
            (place / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
        git = place / "git"
        git.write_text(
            f"#!/bin/sh\n/usr/bin/id -u >> {place}/ran-as\n"
            f'/usr/bin/stat -c %u "$GIT_DIR" "$GIT_DIR/config" "$GIT_DIR/HEAD" >> {place}/owners\n'
            f'/usr/bin/touch "$GIT_DIR/planted" 2>/dev/null && echo planted >> {place}/owners\n'
            "exit 1\n"
        )
        git.chmod(0o755)
        monkeypatch.setattr(protect, "_SYSTEM_PATH", str(place))
        written = _reported_after(repo, "export GIT_CONFIG_NOSYSTEM=1; : > a && git add a")
        assert str(repo[0] / ".git" / "index") in written  # git failed: the index is named
        ran_as = (place / "ran-as").read_text().split()
        assert ran_as, "the stand-in git did not run"
        assert set(ran_as) == {str(session(*repo).plan().user.uid)}
        # its git directory stays root's: another process of the account could swap a name in
        # it for a symlink between chowns of root's, and be given what it leads to (the review
        # of the first version of this change)
        assert set((place / "owners").read_text().split()) == {"0"}
    finally:
        shutil.rmtree(place)


def test_a_name_gone_as_it_was_looked_at_is_not_called_a_device() -> None:
    """A .git a racing session removed between the scan's listing and its look at the name's
    mode (0: none) is told as that, not as a planted device (an attacker's pass met it 100
    times in a race)."""
    from nsconfine._plan import protect

    assert protect._file_type(0) == "name that changed as it was looked at (gone, or replaced)"
    assert protect._file_type(0o020644) == "device"


def test_git_directories_are_remembered_where_the_mount_points_are_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An account with no cache it can write (a system account's HOME=/nonexistent, a unit's
    read-only home) keeps its records of mount points in /tmp/nsconfine-UID, and its
    remembered git directories with them: a repository a session hid between two launches
    stays protected. They had no such place, and were forgotten without a word (found by an
    attacker's pass on a broken launcher environment)."""
    from nsconfine._kernel import stub_records

    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setattr(stub_records, "FALLBACK_BASE", str(base))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "missing" / "cache"))
    stub_records.forget_records()
    try:
        workspace, run_dir = session_dirs(tmp_path, "ws", "run")
        make = "mkdir -p src/objects src/refs && echo 'ref: refs/heads/main' > src/HEAD"
        assert attempt(session(workspace, run_dir).plan(), f"cd {workspace} && {make}")[0] == 0
        config = f"{workspace}/src/config"
        assert config in {e.dest for e in session(workspace, run_dir).plan().entries}
        shutil.rmtree(workspace / "src" / "objects")
        shutil.rmtree(workspace / "src" / "refs")
        (workspace / "src" / "HEAD").unlink()
        assert config in {e.dest for e in session(workspace, run_dir).plan().entries}
        assert (base / f"nsconfine-{os.geteuid()}" / "git-directories").is_dir()
    finally:
        stub_records.forget_records()


def test_a_record_of_git_directories_that_cannot_be_written_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full cache (ENOSPC as the record is written) leaves no half-written temporary file
    in the records: each launch left one more (found by an attacker's pass on a broken
    launcher environment)."""
    import errno

    from nsconfine._kernel.accounts import records_directory

    records = Path(records_directory("git-directories"))
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(records)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    monkeypatch.setattr(os, "write", full)
    session(workspace, run_dir).plan()
    monkeypatch.undo()
    assert not [path for path in records.iterdir() if path.name.endswith(f".{os.getpid()}")]


def test_a_directory_removed_as_the_scan_goes_by_is_no_permission_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session churning directories in its workspace while another launch scans it: a
    directory removed between its stat and its listing was refused as one the launcher cannot
    read, "let the launcher's account read it (chmod u+r)" (its review, stop 39). It says what
    happened: launch again."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    (workspace / "churn").mkdir()
    give_to_session_user(workspace / "churn")
    real_scandir = os.scandir

    def removed_meanwhile(path: Any = ".") -> Any:
        if str(path).endswith("/churn"):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", removed_meanwhile)
    with pytest.raises(nsconfine.PlanError, match="launch again") as refused:
        session(workspace, run_dir).plan()
    assert "chmod" not in str(refused.value)


@pytest.mark.unprivileged
@pytest.mark.parametrize("unreadable", ["r/.git/commondir", "w/.git"])
def test_a_git_file_the_launcher_cannot_read_is_refused(tmp_path: Path, unreadable: str) -> None:
    """A session makes a commondir or a .git pointer its account (the launcher's) cannot read
    (chmod 000): the scan read it as absent, so the git directory it names went unprotected,
    and unnamed (attacker's pass, stop 40); a root git on the host reads it whatever its
    mode. Refused, as a directory it cannot list is; the control, readable, is protected."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    subprocess.run(["git", "init", "-q", str(workspace / "r")], check=True)
    subprocess.run(["git", "init", "-q", "--bare", str(workspace / "node_modules/c")], check=True)
    (workspace / "r/.git/commondir").write_text("../../node_modules/c\n")
    (workspace / "w").mkdir()
    (workspace / "w/.git").write_text(f"gitdir: {workspace}/node_modules/c\n")
    config = str(workspace / "node_modules/c/config")
    plan = session(workspace, run_dir).plan()
    assert any(e.source == config and e.mode is Mode.RO for e in plan.entries)
    (workspace / unreadable).chmod(0)
    with pytest.raises(nsconfine.PlanError, match=r"chmod u\+r") as refused:
        session(workspace, run_dir).plan()
    assert unreadable in str(refused.value)


def test_a_git_directory_swapped_for_a_symlink_while_the_launch_looks_is_refused(
    repo: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session of the workspace exchanges .git and a symlink to it, again and again: the
    scan's listing sees a directory, and its next look a symlink. The launch is refused, saying
    launch again, where it went on without protecting that git directory, which was a
    directory again by the time the session ran: the session wrote its config and hooks,
    and some reports after it said nothing (attackers' pass, stop 43)."""
    import nsconfine._plan.protect as protect

    workspace = repo[0]
    dot_git, aside = workspace / ".git", workspace / "git-aside"
    looked = protect._Scan.git_directories

    def swapped_meanwhile(scan: Any, starts: Sequence[str]) -> list[str]:
        if str(dot_git) in starts and dot_git.is_dir() and not dot_git.is_symlink():
            dot_git.rename(aside)
            dot_git.symlink_to(aside.name)
        return looked(scan, starts)

    monkeypatch.setattr(protect._Scan, "git_directories", swapped_meanwhile)
    try:
        with pytest.raises(nsconfine.SandboxUnavailable, match="launch again"):
            session(*repo).plan()
    finally:
        if dot_git.is_symlink():
            dot_git.unlink()
            aside.rename(dot_git)
    monkeypatch.undo()
    assert attempt(session(*repo).plan(), "echo x >> .git/config")[0] != 0  # the control
