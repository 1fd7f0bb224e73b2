"""Sections that time the Python steps of a launch: checks and plan."""

from __future__ import annotations

import os
from collections.abc import Callable

import nsconfine
from nsconfine._kernel.syscalls import memfd_sealed
from nsconfine._launch.confirm import own_namespaces
from nsconfine._plan.bwrap_args import (
    bwrap_options,
    encode_options,
)
from nsconfine._policy.lint import check_plan
from nsconfine._policy.pins import verify_pins
from nsconfine._preflight.checks import proven_bwrap
from nsconfine.bench._core import (
    Config,
    Results,
    Row,
    Task,
    World,
    _now,
    _progress,
    _us,
    interleave,
)


def bench_checks(results: Results, w: World, config: Config) -> None:
    """The Python steps of nsconfine.spawn beyond bwrap, each on its own."""
    plan = w.session().plan()
    big = w.session(1000).plan()
    encoded = encode_options(bwrap_options(plan))

    def timed(action: Callable[[], object]) -> Callable[[], int]:
        def sample() -> int:
            began = _now()
            action()
            return _now() - began

        return sample

    def args_memfd() -> None:
        os.close(memfd_sealed("nsconfine-args", encoded))

    steps: list[tuple[str, Callable[[], object], str]] = [
        ("check_plan", lambda: check_plan(plan), "policy lint: realpath of every bind"),
        ("verify_pins", lambda: verify_pins(plan), "harness digests (none in this plan)"),
        ("proven_bwrap", proven_bwrap, "find bwrap, stat + sha256 its identity"),
        ("options", lambda: encode_options(bwrap_options(plan)), "bwrap_options + encode"),
        ("memfd", args_memfd, "one sealed memfd (the args; a launch makes 3)"),
        ("own_namespaces", own_namespaces, "the launcher's namespace ids (cached)"),
        ("check_plan.1000", lambda: check_plan(big), "policy lint, 1000 binds"),
    ]
    rounds = config.plan_rounds
    tasks = [
        Task(f"checks.{name}", timed(action), rounds // 20 if name.endswith("1000") else rounds)
        for name, action, _ in steps
    ]
    _progress(f"spawn's checks: {len(tasks)} steps x {rounds} rounds")
    samples = interleave(tasks)
    for name, _, note in steps:
        results.add(
            Row("checks", f"checks.{name}", "us", _us(samples[f"checks.{name}"]), note=note)
        )


def bench_plan(results: Results, w: World, config: Config) -> None:
    """Plan cost: Session(...).plan() + bwrap_options + encode_options, against bind count."""
    counts = (0, 10, 100, 1000)

    def build(binds: int) -> Callable[[], int]:
        ro = w.files[:binds]

        def sample() -> int:
            began = _now()
            plan = nsconfine.Session(workspace=w.workspace, run_dir=w.run_dir, ro=ro).plan()
            encode_options(bwrap_options(plan))
            return _now() - began

        return sample

    rounds = {
        0: config.plan_rounds,
        10: config.plan_rounds // 2,
        100: config.plan_rounds // 10,
        1000: max(3, config.plan_rounds // 60),
    }
    tasks = [Task(f"plan.binds-{n}", build(n), rounds[n]) for n in counts]
    _progress(f"plan cost: binds {counts}")
    samples = interleave(tasks)
    for n in counts:
        results.add(
            Row(
                "plan",
                f"plan.binds-{n}",
                "us",
                _us(samples[f"plan.binds-{n}"]),
                baseline=None if n == 0 else "plan.binds-0",
                note="default session" if n == 0 else f"+{n} read-only file binds",
            )
        )
