"""Hostile paths meet a refusal, never a traceback: a runner directory swapped for a symlink
while plans are built, a protected directory 1,100 levels deep, an unreadable protected file,
a path of 3,000 components to explain, a very deep XDG_CONFIG_HOME, a name with a Unicode
line break. Every walk over a host
path is iterative (Python 3.11's os.walk recurses), and an OS error on such a path is a
refusal naming it, in the API and in the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from helpers import (
    cli,
    give_to_session_user,
    session,
    session_dirs,
    session_gid,
    session_options,
    session_uid,
    sh,
    swap_with_symlink,
)

import nsconfine

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


@pytest.mark.usefixtures("open_walk")
def test_a_runner_directory_swapped_while_plans_are_built_is_refused(tmp_path: Path) -> None:
    """While a host process swaps the directory of a runner file for a symlink and back,
    every plan is built or refused (PlanError naming a path), never an OSError; with paths
    opened by openat2, and by the fallback walk, forced."""
    workspace, run_dir, elsewhere = session_dirs(tmp_path, "ws", "run", "elsewhere")
    lib = tmp_path / "checkout" / "lib"
    lib.mkdir(parents=True)
    (lib / "config.py").write_text("real config\n")
    (elsewhere / "config.py").write_text("elsewhere\n")
    give_to_session_user(lib.parent, lib, elsewhere)
    stop = threading.Event()
    swapper = threading.Thread(target=swap_with_symlink, args=(lib, elsewhere, stop), daemon=True)
    swapper.start()
    outcomes: list[str] = []
    try:
        for _ in range(100):
            try:
                session(workspace, run_dir, ro=[lib / "config.py"]).plan()
                outcomes.append("planned")
            except nsconfine.NsconfineError as refused:
                outcomes.append(f"refused: {refused}")
            except Exception as error:  # the failure this test looks for
                outcomes.append(f"{type(error).__name__}: {error}")
    finally:
        stop.set()
        swapper.join()
    failures = [o for o in outcomes if not o.startswith(("planned", "refused"))]
    assert failures == [], failures[:3]
    assert "planned" in outcomes


def _nested(top: Path, depth: int) -> None:
    """depth directories, each inside the last, below top (by fd: the path grows too long),
    each the session's account's (os.walk in give_to_session_user would recurse)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
            if os.geteuid() == 0:
                os.chown(fd, session_uid(), session_gid())
    finally:
        os.close(fd)


def _remove_nested(top: Path) -> None:
    """Remove what _nested made, a level at a time (shutil.rmtree recurses too)."""
    while (top / "d" / "d").exists():
        os.rename(top / "d" / "d", top / "next")
        os.rmdir(top / "d")
        os.rename(top / "next", top / "d")
    if (top / "d").exists():
        os.rmdir(top / "d")


@pytest.mark.parametrize("name", ["x\u2028y", "x\u2029y", "c\x85d"])
def test_a_repository_under_a_name_with_a_unicode_line_break_launches_protected(
    ws_run: tuple[Path, Path], name: str
) -> None:
    """A session makes a repository under a directory whose name holds U+2028, U+2029 or
    U+0085, which the kernel writes into the mount table as they are: the next launch still
    runs, its .git/config read-only (attackers' pass: the mount table was split into lines at
    them, every later launch of the workspace was refused, and the refusal blamed bwrap)."""
    workspace, run_dir = ws_run
    repository = workspace / name
    subprocess.run(["git", "init", "-q", str(repository)], check=True)
    give_to_session_user(workspace)
    status, output = sh(
        session(workspace, run_dir).plan(), f"echo x >> '{repository}/.git/config' || echo refused"
    )
    assert "refused" in output, (status, output)


def test_a_deeply_nested_protected_directory_is_checked_without_recursion(
    ws_run: tuple[Path, Path],
) -> None:
    """1,100 directories nested inside the protected .vscode: each later launch is checked and
    runs (or is refused), with no RecursionError."""
    vscode = ws_run[0] / ".vscode"
    vscode.mkdir()
    give_to_session_user(vscode)
    _nested(vscode, 1100)
    try:
        for _ in range(2):
            result = cli("run", *session_options(*ws_run), "--", "/bin/true")
            assert "Traceback" not in result.stderr, result.stderr[-2000:]
            assert result.returncode == 0, result.stderr
    finally:
        _remove_nested(vscode)


def test_an_unreadable_protected_file_is_refused_by_oci_bundle(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A protected file the launcher cannot read (.envrc of mode 000) is still protected: the
    bundle binds it read-only, as a launch does (it is opened by O_PATH, which needs no read
    permission). As root, a directory of that name too deep to open is refused in one line
    naming it, as a launch refuses it."""
    envrc = ws_run[0] / ".envrc"
    envrc.write_text("export X=1\n")
    envrc.chmod(0)
    if os.geteuid() == 0:  # root opens a file of mode 000: a path too long to open, instead
        envrc.unlink()
        envrc.mkdir()
        give_to_session_user(envrc)
        _nested(envrc, 2100)
    try:
        result = cli("oci-bundle", *session_options(*ws_run), str(tmp_path / "bundle"))
    finally:
        if envrc.is_dir():
            _remove_nested(envrc)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    if os.geteuid() != 0:
        assert result.returncode == 0, result.stderr
        config = json.loads((tmp_path / "bundle" / "config.json").read_text())
        (mount,) = [m for m in config["mounts"] if m["destination"] == str(envrc)]
        assert "ro" in mount["options"], mount
        return
    assert result.returncode in (65, 69), result.stderr
    assert ".envrc" in result.stderr


def test_explain_answers_for_a_path_of_2000_components(ws_run: tuple[Path, Path]) -> None:
    """explain of a path 2,000 components long (the kernel's longest path holds 2,047) answers
    (not visible), with no traceback."""
    result = cli("explain", "/" + "a/" * 2000, *session_options(*ws_run))
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 1, result.stderr
    assert "not visible" in result.stdout


def test_a_very_deep_xdg_config_home_is_planned(ws_run: tuple[Path, Path], tmp_path: Path) -> None:
    """A launcher whose XDG_CONFIG_HOME is 3,000 components deep gets its plan (the deny rules
    under it kept), with no traceback; and a session runs."""
    deep = str(tmp_path) + "/c" * 3000
    environ = {**os.environ, "XDG_CONFIG_HOME": deep}
    result = cli("plan", *session_options(*ws_run), env=environ)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 0, result.stderr
    assert deep in result.stdout
    ran = cli("run", *session_options(*ws_run), "--", "/bin/true", env=environ)
    assert ran.returncode == 0, ran.stderr[-2000:]


def test_the_session_sees_the_nested_directory_read_only(ws_run: tuple[Path, Path]) -> None:
    """The twin of the nested-directory test's claim that the check ran: a session cannot
    write into the deep protected .vscode (it is bound read-only), where the workspace is."""
    vscode = ws_run[0] / ".vscode"
    vscode.mkdir()
    _nested(vscode, 3)
    give_to_session_user(ws_run[0])
    _status, output = sh(
        session(*ws_run).plan(),
        f"touch {vscode}/d/d/d/x 2>/dev/null && echo WROTE-PROTECTED; "
        f"touch {ws_run[0]}/y && echo WROTE-WORKSPACE",
    )
    assert "WROTE-PROTECTED" not in output, output
    assert "WROTE-WORKSPACE" in output, output


def test_a_kept_plan_whose_workspace_became_a_symlink_is_refused(tmp_path: Path) -> None:
    """A plan is kept (a broker's, a Pool's template) while its workspace is renamed away and a
    symlink to another directory put in its place (by whoever can write the workspace's
    parent: a session given it, or the next workspace's owner): launching the kept plan is
    refused by the lint, naming the symlink, and nothing lands in the other directory (bwrap
    would bind what the link leads to, writable). Mutation pass, stop 35: shown failing (the
    command wrote into the other directory) with lint's _refuse_symlinks_in_writable call
    dropped."""
    workspace, run_dir, other = session_dirs(tmp_path, "ws", "run", "other")
    plan = session(workspace, run_dir).plan()
    assert nsconfine.spawn(plan, ["/bin/true"]).wait() == 0  # the control: as it was planned
    workspace.rename(tmp_path / "ws-away")
    workspace.symlink_to(other)
    with pytest.raises(nsconfine.PlanError, match="is a symlink") as refused:
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {workspace}/landed"]).wait()
    assert str(workspace) in refused.value.message
    assert sorted(other.iterdir()) == []


@pytest.mark.parametrize("swapped", ["workspace", "run directory"])
def test_a_kept_plans_writable_bind_swapped_for_a_symlink_leads_no_stub_elsewhere(
    tmp_path: Path, swapped: str
) -> None:
    """A kept plan's workspace or run directory exchanged for a symlink to a directory its
    session's account may not write (whoever can write their parent can, between the plan and
    a launch, or during one): the launch is refused before it makes anything, naming the
    symlink, and nothing is made or given to the session's account there. (Attackers' pass,
    stop 43: the launch resolved the link, made its mount points there as the launcher, and
    kept a `home` made for the run directory, the session's account's, and its dotfile stubs
    the session had written into meanwhile: a root launcher planted them in another user's
    home.)"""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    other = tmp_path / "other"  # the launcher's, which the session's account may enter
    other.mkdir(mode=0o755)
    plan = session(workspace, run_dir).plan()
    assert nsconfine.spawn(plan, ["/bin/true"]).wait() == 0  # the control: as it was planned
    moved = workspace if swapped == "workspace" else run_dir
    moved.rename(tmp_path / "away")
    moved.symlink_to(other)
    with pytest.raises(nsconfine.PlanError, match="symlink") as refused:
        nsconfine.spawn(plan, ["/bin/true"]).wait()
    assert str(moved) in refused.value.message
    assert sorted(other.iterdir()) == []
