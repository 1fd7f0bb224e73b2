"""The one gate every launch passes (spawn, a Pool's launch, the CLI): a plan the lint refuses,
a pinned harness that changed, a launcher whose children's statuses would be lost are refused
before anything runs; the refused command leaves no trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import (
    SESSION_USER,
    open_up,
    session,
    session_dirs,
)

import nsconfine
import nsconfine._launch.programs
from nsconfine._kernel.accounts import run_as
from nsconfine._plan import model as p
from nsconfine._selftest.world import World

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


def test_a_refused_bind_runs_nothing(tmp_path: Path, trace_file: Path) -> None:
    """A plan that binds a secret, built by hand past Session, is refused by spawn itself."""
    open_up(tmp_path)
    (tmp_path / "world").mkdir()
    with World(str(tmp_path / "world"), run_as(SESSION_USER)).running() as world:
        plan = world.plan()
        secret = world.secrets["~/.ssh/id_ed25519"]
        weakened = plan.replace(entries=(*plan.entries, p.ro_bind(secret, secret, "wants it")))
        session_dirs(tmp_path, "ws")
        with pytest.raises(nsconfine.PlanError, match=r"\.ssh"):
            nsconfine.spawn(weakened, ["/bin/sh", "-c", f"touch {trace_file}"])
    assert not trace_file.exists()


def test_a_changed_pinned_harness_runs_nothing(tmp_path: Path, trace_file: Path) -> None:
    """A harness whose content no longer matches its pin is refused before launch."""
    open_up(tmp_path)
    (tmp_path / "world").mkdir()
    with World(str(tmp_path / "world"), run_as(SESSION_USER)).running() as world:
        plan = world.plan()
        with open(world.harness, "a") as harness:
            harness.write(f"touch {trace_file}\n")
        with pytest.raises(nsconfine.PlanError, match="sha256"):
            nsconfine.spawn(plan, [world.harness])
    assert not trace_file.exists()


def test_a_pool_checks_pins_at_launch(tmp_path: Path) -> None:
    """A pinned harness rewritten after its sandbox was staged is refused at launch."""
    import hashlib

    workspace, run_dir, tools = session_dirs(tmp_path, "ws", "run", "tools")
    harness = tools / "agent"
    harness.write_text("#!/bin/sh\necho agent\n")
    harness.chmod(0o755)
    digest = hashlib.sha256(harness.read_bytes()).hexdigest()
    plan = session(workspace, run_dir, harness=[f"{harness}@sha256:{digest}"]).plan()
    marker = workspace / "ran"
    with nsconfine.Pool(plan) as pool:
        assert pool.wait_staged(30)
        harness.write_text(f"#!/bin/sh\ntouch {marker}\n")
        with pytest.raises(nsconfine.PlanError, match="sha256"):
            pool.launch([str(harness)]).wait(timeout=30)
    assert not marker.exists()
