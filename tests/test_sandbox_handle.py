"""The Sandbox handle's Popen-shaped contract, on real sessions: wait(timeout) raises
TimeoutExpired and the session goes on; leaving a `with` block kills and reaps it; each
handle carries its launch's timings, in order."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import session, session_dirs

import nsconfine

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


@pytest.fixture
def sleeper_plan(tmp_path: Path) -> nsconfine.Plan:
    return session(*session_dirs(tmp_path, "ws", "run")).plan()


def test_wait_timeout_raises_timeout_expired_and_the_session_goes_on(
    sleeper_plan: nsconfine.Plan,
) -> None:
    sandbox = nsconfine.spawn(sleeper_plan, ["/bin/sleep", "60"])
    try:
        with pytest.raises(nsconfine.TimeoutExpired) as raised:
            sandbox.wait(timeout=0.2)
        assert isinstance(raised.value, TimeoutError)
        assert (raised.value.pid, raised.value.timeout) == (sandbox.pid, 0.2)
        assert sandbox.poll() is None  # still running
    finally:
        sandbox.kill()
    assert sandbox.wait(timeout=30) == -9


def test_leaving_the_with_block_kills_and_reaps(sleeper_plan: nsconfine.Plan) -> None:
    with nsconfine.spawn(sleeper_plan, ["/bin/sleep", "60"]) as sandbox:
        assert sandbox.returncode is None
    assert sandbox.returncode == -9
    with pytest.raises(ProcessLookupError):
        os.kill(sandbox.command_pid, 0)


def test_each_handle_carries_its_launch_timings_in_order(sleeper_plan: nsconfine.Plan) -> None:
    with nsconfine.spawn(sleeper_plan, ["/bin/true"]) as spawned:
        spawned.wait(timeout=30)
    with nsconfine.Pool(sleeper_plan, refill="inline") as pool:
        launched = pool.launch(["/bin/true"])
        launched.wait(timeout=30)
    stages = ["started", "linted", "namespaces", "built", "confirmed", "exec"]
    for timings in (spawned.timings, launched.timings):
        assert list(timings) == stages
        values = [timings[stage] for stage in stages]
        assert values == sorted(values)
        assert values[0] >= 0


def test_handles_cannot_be_made_by_hand() -> None:
    with pytest.raises(TypeError):
        nsconfine.Sandbox()
