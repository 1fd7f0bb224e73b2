"""A workspace the session controls cannot redirect a bind, nor change what the host trusts.

Between launches (and while another session of the same workspace runs) a session can plant
symlinks where the broker will put the next workspace or mount point, rename directories that
hold read-only files, and write the files the host later trusts (.git/config, .envrc, editor
and agent settings, shell rc files). Each test plants the attack for real and launches real
sessions; each protection has a twin showing the check fail without it.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import SESSION_USER, give_to_session_user, open_up, session, session_dirs

import nsconfine
from nsconfine._plan import Kind

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


def run(plan: nsconfine.Plan, script: str) -> tuple[int, str]:
    """A shell snippet's status and output, in a session; -1 and the refusal if refused."""
    import tempfile

    with tempfile.TemporaryFile() as out:
        try:
            sandbox = nsconfine.spawn(plan, ["/bin/sh", "-c", script], stdout=out, stderr=out)
        except (nsconfine.NsconfineError, OSError) as refused:
            return -1, str(refused)
        status = sandbox.wait(timeout=60)
        out.seek(0)
        return status, out.read().decode(errors="replace")


# ------------------------------------------------------------------ redirected binds


def test_a_planted_symlink_where_the_next_workspace_goes_is_refused(tmp_path: Path) -> None:
    """Session A plants `42 -> ../checkout/lib` in its workspace, where the broker later puts
    session B's workspace; B's plan also binds checkout/lib read-only: refused, and the
    canonical file is unchanged."""
    tasks, run_a, run_b = session_dirs(tmp_path, "tasks", "run-a", "run-b")
    lib = tmp_path / "checkout" / "lib"
    lib.mkdir(parents=True)
    (lib / "runner.py").write_text("canonical\n")
    open_up(lib)
    give_to_session_user(lib)  # as a broker's own checkout would be: only the alias refuses
    plan_a = session(tasks, run_a).plan()
    assert run(plan_a, f"ln -s ../checkout/lib {tasks}/42")[0] == 0
    with pytest.raises(nsconfine.PlanError, match="read-only"):
        session(tasks / "42", run_b, ro=[lib]).plan()
    assert (lib / "runner.py").read_text() == "canonical\n"


def _swapper(directory: Path, target: Path, stop: threading.Event) -> None:
    """Swap directory with a symlink to target, and back, staying in each state from a
    fraction of a millisecond to longer than a launch: every moment of a launch is hit."""
    import random

    rng = random.Random(7)
    real = directory.with_name(directory.name + ".real")
    link = directory.with_name(directory.name + ".link")
    while not stop.is_set():
        try:
            os.symlink(target, link)
            os.rename(directory, real)
            os.rename(link, directory)
            time.sleep(rng.choice((0.0002, 0.002, 0.02)))
            os.rename(directory, link)
            os.rename(real, directory)
            os.unlink(link)
            time.sleep(rng.choice((0.0002, 0.002, 0.05)))
        except OSError:
            pass


def test_a_concurrent_swapper_cannot_redirect_a_read_only_bind(tmp_path: Path) -> None:
    """While a host process swaps the workspace's lib/ for a symlink to elsewhere, every
    launch either is refused or shows lib/config.py read-only with its real content: nothing
    is bound read-write that the manifest says is ro, and no secret is read."""
    workspace, run_dir, elsewhere = session_dirs(tmp_path, "ws", "run", "elsewhere")
    lib = workspace / "lib"
    lib.mkdir()
    (lib / "config.py").write_text("real config\n")
    (elsewhere / "config.py").write_text("secret elsewhere\n")
    give_to_session_user(lib, elsewhere)
    plan = session(workspace, run_dir, ro=[lib / "config.py"]).plan()
    probe = f"cat {lib}/config.py; echo tampered >> {lib}/config.py && echo WROTE"
    stop = threading.Event()
    swapper = threading.Thread(target=_swapper, args=(lib, elsewhere, stop), daemon=True)
    swapper.start()
    outcomes = []
    try:
        for _ in range(60):
            outcomes.append(run(plan, probe))
    finally:
        stop.set()
        swapper.join()
    ran = [output for status, output in outcomes if status != -1]
    for output in ran:
        assert "WROTE" not in output, outcomes
        assert "secret elsewhere" not in output, outcomes
    assert (elsewhere / "config.py").read_text() == "secret elsewhere\n"
    assert "tampered" not in (lib / "config.py").read_text()
    assert ran, outcomes


def test_a_symlinked_home_in_the_run_dir_is_refused(tmp_path: Path) -> None:
    """A session that replaced run/home with a symlink to elsewhere: the next launch is
    refused by name, and nothing is created there."""
    workspace, run_dir, elsewhere = session_dirs(tmp_path, "ws", "run", "elsewhere")
    plan = session(workspace, run_dir).plan()
    home = run_dir / "home"
    if home.exists():
        home.rmdir()
    home.symlink_to(elsewhere / "planted-home")
    status, output = run(plan, "true")
    assert status == -1
    assert "home" in output
    assert not (elsewhere / "planted-home").exists()


def test_a_read_only_file_in_the_workspace_stays_read_only_after_a_rename(
    tmp_path: Path,
) -> None:
    """`mv lib lib.old` cannot carry a read-only runner file in the workspace away to leave a
    writable one in its place (its directory is a mount point: EBUSY)."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    (lib := workspace / "lib").mkdir()
    (lib / "config.py").write_text("real\n")
    give_to_session_user(lib)
    plan = session(workspace, run_dir, ro=[lib / "config.py"]).plan()
    _, output = run(
        plan, f"mv {lib} {lib}.old; mkdir -p {lib}; echo forged > {lib}/config.py; cat {lib}/*"
    )
    assert "forged" not in output, output
    assert (lib / "config.py").read_text() == "real\n"


# ------------------------------------------------------------------ files the host trusts

PROTECTED_FILES = [
    ".git/config",
    ".gitmodules",
    ".envrc",
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".mcp.json",
    ".bashrc",
    ".zshrc",
    ".profile",
    ".bash_profile",
]
PROTECTED_DIRS = [".git/hooks", ".vscode", ".idea", ".claude/commands", ".claude/agents", ".codex"]


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace that is a git repository with a commit, and a bare remote beside it, and a
    nested repository inside it; owned by the session's account."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    environ = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path)}

    def git(where: Path, *args: str) -> None:
        subprocess.run(["git", "-c", "safe.directory=*", "-C", str(where), *args], check=True,
                       capture_output=True, env=environ)  # fmt: skip

    git(workspace, "init", "-q", "-b", "main")
    (workspace / "README").write_text("hello\n")
    (workspace / ".envrc").write_text("export SAFE=1\n")
    git(workspace, "add", "README", ".envrc")
    git(workspace, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    (nested := workspace / "vendor" / "lib").mkdir(parents=True)
    git(nested, "init", "-q")
    git(workspace, "init", "-q", "--bare", str(workspace / "remote.git"))
    give_to_session_user(workspace)
    return workspace, run_dir


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
    status, output = run(plan, _git_script(repo[0]))
    assert status == 0, output
    assert output.split()[-1] == "2"


@pytest.mark.parametrize("relative", PROTECTED_FILES + PROTECTED_DIRS)
def test_protected_paths_cannot_be_written_or_created(
    repo: tuple[Path, Path], relative: str
) -> None:
    """Each protected path, existing or not, at the top and in a nested repository, can be
    neither written, created, removed nor replaced."""
    workspace = repo[0]
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
        run(plan, attack)
        if before is not None:
            assert target.read_bytes() == before, target
        elif target.is_dir():
            assert not any(target.rglob("y")), target
        else:
            assert not target.exists() or "evil" not in target.read_text(), target


def test_renaming_a_directory_cannot_carry_git_config_away(repo: tuple[Path, Path]) -> None:
    """`mv .git .git.old` and a fresh .git/config fail; the host's .git/config is unchanged."""
    workspace = repo[0]
    before = (workspace / ".git" / "config").read_text()
    plan = session(*repo).plan()
    run(
        plan,
        f"cd {workspace}; mv .git .git.old; mkdir -p .git; "
        "printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' > .git/config; true",
    )
    assert (workspace / ".git" / "config").read_text() == before
    assert "fsmonitor" not in (workspace / ".git" / "config").read_text()


def test_no_stub_is_left_behind(repo: tuple[Path, Path]) -> None:
    """After the session, the workspace holds nothing nsconfine created only as a mount
    point: the files and directories are exactly those before it."""
    workspace = repo[0]
    before = sorted(str(p) for p in workspace.rglob("*"))
    plan = session(*repo).plan()
    assert run(plan, "true")[0] == 0
    assert sorted(str(p) for p in workspace.rglob("*")) == before


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


def test_without_protection_git_config_is_writable(repo: tuple[Path, Path]) -> None:
    """The twin: with every path unprotected, the session rewrites .git/config."""
    workspace = repo[0]
    from nsconfine._protect import PROTECTED

    plan = session(*repo, unprotect=[name for name, _, _ in PROTECTED]).plan()
    assert not any(e.dest.endswith(".git/config") for e in plan.entries if e.kind is Kind.BIND)
    run(plan, f"echo '# rewritten' >> {workspace}/.git/config")
    assert "# rewritten" in (workspace / ".git" / "config").read_text()


def test_the_session_account_owns_nothing_new_outside(tmp_path: Path) -> None:
    """Stub creation never follows a planted symlink out of the workspace."""
    workspace, run_dir, elsewhere = session_dirs(tmp_path, "ws", "run", "elsewhere")
    (workspace / ".vscode").symlink_to(elsewhere)
    plan_or_refusal: object
    try:
        plan_or_refusal = session(workspace, run_dir).plan()
    except nsconfine.PlanError as refused:
        plan_or_refusal = refused
    if isinstance(plan_or_refusal, nsconfine.Plan):
        run(plan_or_refusal, "true")
    assert list(elsewhere.iterdir()) == []


def test_protection_holds_for_the_session_user(tmp_path: Path) -> None:
    """The control: the session's account can write its workspace's ordinary files."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    plan = session(workspace, run_dir).plan()
    assert run(plan, f"echo ok > {workspace}/ordinary.txt")[0] == 0
    assert (workspace / "ordinary.txt").read_text() == "ok\n"
    if SESSION_USER:
        assert (workspace / "ordinary.txt").owner() == SESSION_USER
