"""What holds only for a root launcher: sessions never hold host uid 0.

Every test here is marked `root`: skipped when the suite does not run as root (CI runs it as
root and again as an unprivileged user), and such a skip is not a failure with
NSCONFINE_MUST_WORK=1.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import give_to_session_user, session, session_dirs

import nsconfine

pytestmark = [pytest.mark.root, pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


@pytest.fixture
def ws_run(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace and run directory the session user owns."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    return workspace, run_dir


def test_a_root_launch_without_user_is_refused(ws_run: tuple[Path, Path]) -> None:
    """As root, a session that names no --user is refused and runs nothing."""
    marker = ws_run[0] / "ran"
    plan = nsconfine.Session(workspace=ws_run[0], run_dir=ws_run[1]).plan()
    with pytest.raises(nsconfine.SandboxUnavailable, match="--user"):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {marker}"])
    assert not marker.exists()


def test_cli_root_launch_without_user_exits_69(ws_run: tuple[Path, Path]) -> None:
    """The CLI says the same in one line and exits 69."""
    marker = ws_run[0] / "ran"
    result = subprocess.run(
        [sys.executable, "-m", "nsconfine", "run", "--workspace", str(ws_run[0]), "--run-dir",
         str(ws_run[1]), "--", "/bin/sh", "-c", f"touch {marker}"],
        capture_output=True, text=True, cwd="/", timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 69, result.stderr
    assert result.stderr.count("\n") == 1
    assert "--user" in result.stderr
    assert not marker.exists()


def test_the_run_dirs_must_be_writable_by_the_user(tmp_path: Path) -> None:
    """As root, a workspace the session user cannot write is refused by name."""
    workspace, run_dir = tmp_path / "ws", tmp_path / "run"
    workspace.mkdir()
    run_dir.mkdir()
    give_to_session_user(run_dir)
    with pytest.raises(nsconfine.PlanError, match=f"workspace {workspace}"):
        session(workspace, run_dir).plan()
