"""Warm launches from nsconfine.Pool next to cold nsconfine.spawn, on the default session plan.

    python benchmarks/bench_pool.py [--launches N] [--json]

Rows (all ms, p50/p95/p99): `exec'd` is call → the payload's first byte read by the launcher
(`/bin/echo -n x` on a pipe, as nsconfine.bench measures it); `returned` is call → launch()
returned (the shim's exec succeeded); `exited` is call → `/bin/true` exited and reaped. Before
each warm launch the bench waits until the pool is staged again, so every launch is warm; the
variants run round-robin. A program that measures and reports; no test asserts on its times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import nsconfine

Launch = Callable[..., nsconfine.Sandbox]


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    at = fraction * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def exec_sample(launch: Launch) -> tuple[float, float]:
    """(call → returned, call → echo's byte) in ms."""
    read_end, write_end = os.pipe()
    start = time.perf_counter_ns()
    sandbox = launch(["/bin/echo", "-n", "x"], stdout=write_end)
    returned = time.perf_counter_ns()
    os.close(write_end)
    if os.read(read_end, 1) != b"x":
        raise RuntimeError("the payload did not print")
    seen = time.perf_counter_ns()
    os.close(read_end)
    sandbox.wait()
    return (returned - start) / 1e6, (seen - start) / 1e6


def exit_sample(launch: Launch) -> float:
    start = time.perf_counter_ns()
    status = launch(["/bin/true"]).wait()
    if status != 0:
        raise RuntimeError(f"/bin/true exited {status}")
    return (time.perf_counter_ns() - start) / 1e6


def bench_warm_launch(launches: int) -> dict[str, dict[str, float]]:
    """Every row's p50/p95/p99 in ms, from `launches` samples per row."""
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "ws"))
        os.mkdir(os.path.join(root, "run"))
        plan = nsconfine.Session(
            workspace=os.path.join(root, "ws"), run_dir=os.path.join(root, "run")
        ).plan()
        background = nsconfine.Pool(plan, refill="background")
        inline = nsconfine.Pool(plan, refill="inline")
        pool_plan = background.plan

        def cold(argv: list[str], **kwargs: Any) -> nsconfine.Sandbox:
            return nsconfine.spawn(pool_plan, argv, **kwargs)

        variants: dict[str, tuple[Launch, Callable[[], object]]] = {
            "pool.background": (background.launch, lambda: background.wait_staged(30)),
            "pool.inline": (inline.launch, lambda: None),
            "spawn.cold": (cold, lambda: None),
        }
        samples: dict[str, list[float]] = {}
        try:
            for round_number in range(launches + 2):  # two warm-up rounds, discarded
                names = list(variants)
                shift = round_number % len(names)
                for name in names[shift:] + names[:shift]:
                    launch, ready = variants[name]
                    ready()
                    returned, seen = exec_sample(launch)
                    ready()
                    exited = exit_sample(launch)
                    if round_number >= 2:
                        samples.setdefault(f"{name}.returned", []).append(returned)
                        samples.setdefault(f"{name}.exec'd", []).append(seen)
                        samples.setdefault(f"{name}.exited", []).append(exited)
        finally:
            background.close()
            inline.close()
    return {
        row: {f"p{q}": percentile(values, q / 100) for q in (50, 95, 99)}
        for row, values in sorted(samples.items())
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args(argv)
    rows = bench_warm_launch(options.launches)
    if options.json:
        print(json.dumps({"launches": options.launches, "rows": rows}, indent=2))
        return 0
    print(f"{'row':28} {'p50':>8} {'p95':>8} {'p99':>8}  ms, n={options.launches}")
    for row, values in rows.items():
        print(f"{row:28} {values['p50']:8.3f} {values['p95']:8.3f} {values['p99']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
