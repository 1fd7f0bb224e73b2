"""The mount points a launch makes (the stubs of missing protected paths) and their records:
each launch removes what it made, and none while another session, another launcher's
records or an OCI bundle still sits on it; a killed launcher's stubs go with the next
session; stubs are never made through a planted symlink; the records directory is the
account's own, wherever the launcher's environment points, and is never written through a
symlink; a session cannot lock another's stubs away."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from helpers import (
    SESSION_USER,
    attempt,
    session,
    session_dirs,
)

import nsconfine

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


def test_no_stub_is_left_behind(repo: tuple[Path, Path]) -> None:
    """After the session, the workspace holds nothing nsconfine created only as a mount
    point: the files and directories are exactly those before it."""
    workspace = repo[0]
    before = sorted(str(p) for p in workspace.rglob("*"))
    plan = session(*repo).plan()
    assert attempt(plan, "true")[0] == 0
    after = sorted(str(p) for p in workspace.rglob("*"))
    assert set(after) ^ set(before) == set(), set(after) ^ set(before)
    assert after == before


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
        attempt(plan_or_refusal, "true")
    assert list(elsewhere.iterdir()) == []


def test_a_concurrent_session_keeps_its_protection(repo: tuple[Path, Path], tmp_path: Path) -> None:
    """Session A (another launcher process) ends while session B of the same workspace runs:
    B's protected paths stay protected, and no stub is left once both have ended."""
    from helpers import python_child

    workspace = repo[0]
    (run_b,) = session_dirs(tmp_path, "run-b")
    before = sorted(str(p) for p in workspace.rglob("*"))
    first = python_child(
        """
        plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3] or None)
        nsconfine.spawn(plan, ["sleep", "1.5"]).wait()
        """,
        str(workspace), str(repo[1]), SESSION_USER or "",
    )  # fmt: skip
    time.sleep(0.7)  # A is running: B's launch finds A's stubs
    plan_b = session(workspace, run_b).plan()
    _status, output = attempt(
        plan_b,
        f"cd {workspace}; sleep 2.5; (echo evil > .mcp.json) 2>/dev/null; "
        "(mkdir -p .vscode && echo {{}} > .vscode/tasks.json) 2>/dev/null; ls -a",
    )
    assert first.wait(timeout=60) == 0
    assert (
        not (workspace / ".mcp.json").exists()
        or "evil" not in (workspace / ".mcp.json").read_text()
    )
    assert not (workspace / ".vscode" / "tasks.json").exists(), output
    after = sorted(str(p) for p in workspace.rglob("*"))
    assert set(after) ^ set(before) == set(), set(after) ^ set(before)
    assert after == before


def test_a_stub_turned_into_a_dangling_symlink_is_a_clean_refusal(repo: tuple[Path, Path]) -> None:
    """A plan built, then its stub's place made a dangling symlink before the launch: a clean
    refusal (never an OSError that reads as the command failing)."""
    workspace = repo[0]
    plan = session(*repo).plan()
    (workspace / ".mcp.json").symlink_to("/nonexistent")
    with pytest.raises(nsconfine.NsconfineError):
        nsconfine.spawn(plan, ["/bin/true"]).wait()


def test_stubs_of_a_killed_launcher_go_with_the_next_session(repo: tuple[Path, Path]) -> None:
    """A launcher killed with SIGKILL leaves its stubs; the next session of the workspace
    adopts them and removes them when it ends."""
    from helpers import python_child

    workspace = repo[0]
    before = sorted(str(p) for p in workspace.rglob("*"))
    launcher = python_child(
        """
        plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3] or None)
        nsconfine.spawn(plan, ["sleep", "600"])
        print("launched", flush=True)
        sys.stdin.read()
        """,
        str(workspace), str(repo[1]), SESSION_USER or "",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert launcher.stdout is not None
    assert launcher.stdin is not None
    with launcher.stdin, launcher.stdout:
        assert launcher.stdout.readline() == "launched\n"
        launcher.kill()
        launcher.wait()
    assert (workspace / ".mcp.json").exists()  # left behind (its sandbox dies with it)
    assert attempt(session(*repo).plan(), "true")[0] == 0
    assert sorted(str(p) for p in workspace.rglob("*")) == before


def test_an_oci_bundle_keeps_its_stubs_while_it_exists(
    repo: tuple[Path, Path], tmp_path: Path
) -> None:
    """The mount points `oci-bundle` makes for missing protected paths stay while the bundle
    exists, whatever sessions of the workspace start and end meanwhile (a running container
    would otherwise lose them, and write .envrc on the host); they go with the first session
    to end after the bundle is removed."""
    from helpers import cli, session_options

    workspace = repo[0]
    bundle = tmp_path / "bundle"
    made = cli("oci-bundle", *session_options(*repo), str(bundle))
    assert made.returncode == 0, made.stderr
    assert (workspace / ".mcp.json").exists()
    assert attempt(session(*repo).plan(), "true")[0] == 0
    assert (workspace / ".mcp.json").exists()
    import shutil

    shutil.rmtree(bundle)
    assert attempt(session(*repo).plan(), "true")[0] == 0
    assert not (workspace / ".mcp.json").exists()
