"""The public API as a user writes it, checked by mypy and never run (pytest collects only
test_*.py). What it must accept is written plainly; each misuse it must refuse carries a
`# type: ignore[CODE]` that mypy --strict (warn_unused_ignores) reports as unused the day the
misuse type-checks: a choice typed as a plain str again, a renamed keyword still accepted."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import nsconfine
import nsconfine.aio

WORKSPACE, RUN_DIR = "/srv/sessions/coder/ws", Path("/srv/sessions/coder/run")


def accepted() -> nsconfine.Plan:
    session = nsconfine.Session(
        workspace=WORKSPACE,
        run_dir=RUN_DIR,
        ro=[Path("/srv/checkout/runner.py")],
        harness=["/usr/local/bin/agent@sha256:" + "ab" * 32],
        pass_env=["RUNNER_LOG_LEVEL"],
        setenv={"CI": "1"},
        network="proxy",
        allow_hosts=["pypi.org"],
        home_mode="fresh",
        workspace_mode="ro",
        terminal_env=False,
        allow_nested_userns="its harness runs bwrap itself",
        limits={"processes": 512, "tmp": "256M"},
        binds=[nsconfine.Bind("/srv/data", "/srv/data", "ro", "the data it reads")],
    )
    return session.plan()


def launched(plan: nsconfine.Plan) -> tuple[bytes | None, bytes | None]:
    argv = ["make", "test"]
    pipe, stdout = subprocess.PIPE, subprocess.STDOUT
    with nsconfine.spawn(plan, argv, stdin=pipe, stdout=pipe, stderr=stdout, env={"CI": "1"}) as s:
        try:
            return s.communicate(b"input", timeout=60)
        except subprocess.TimeoutExpired:
            s.kill()
            return s.communicate()


async def launched_from_a_loop(plan: nsconfine.Plan) -> int:
    process = await nsconfine.aio.spawn(plan, ["make"], stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    first: bytes = await process.stdout.readline()
    async with nsconfine.aio.Pool(plan, size=2) as pool, await pool.launch(["true"]) as other:
        await other.communicate()
    return len(first) + await process.wait()


def refused() -> None:
    nsconfine.Session(workspace=WORKSPACE, run_dir=RUN_DIR, network="nonee")  # type: ignore[arg-type]
    nsconfine.Session(workspace=WORKSPACE, run_dir=RUN_DIR, home_mode="tmp")  # type: ignore[arg-type]
    nsconfine.Session(workspace=WORKSPACE, run_dir=RUN_DIR, workspace_mode="w")  # type: ignore[arg-type]
    nsconfine.Session(workspace=WORKSPACE, run_dir=RUN_DIR, binds=["/opt/x"])  # type: ignore[list-item]
    nsconfine.Session(workspace=WORKSPACE, run_dir=RUN_DIR, terminal_env="no")  # type: ignore[arg-type]
    nsconfine.Session(workspace=WORKSPACE, run_dir=RUN_DIR, env=["TERM"])  # type: ignore[call-arg]
    nsconfine.Session(workspace=WORKSPACE, run_dir=RUN_DIR, pass_terminal=False)  # type: ignore[call-arg]
    nsconfine.Session(WORKSPACE, RUN_DIR)  # type: ignore[call-arg]
    nsconfine.Session(run_dir=RUN_DIR)  # type: ignore[call-arg]
    plan = accepted()
    nsconfine.spawn(plan, ["true"]).communicate("text")  # type: ignore[arg-type]
    nsconfine.aio.Pool(plan, 2)  # type: ignore[call-arg]
