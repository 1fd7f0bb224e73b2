"""Sections that time launches: launch, pool, layers, binds, concurrency, size."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psutil

import nsconfine
from nsconfine._kernel import layers as _layers
from nsconfine.bench._core import (
    OTHER_SANDBOXES,
    TRUE_ARGV,
    BenchError,
    Burst,
    Config,
    Launchers,
    Results,
    Row,
    Starter,
    Task,
    Waiter,
    World,
    _check_status,
    _ms,
    _now,
    _progress,
    interleave,
    until_end,
    until_exec,
    until_exit,
    world,
)

EMPTY_ROW = "launch.exit.nsconfine-empty-workspace"


def bench_launch(results: Results, w: World, config: Config) -> None:
    """Launch latency of the default plan: nsconfine, bwrap floor, naive, no sandbox; and
    nsconfine on a workspace that holds none of the protected paths (every mount point made
    and removed at each launch, as in an empty workspace), to exit, against the same floor."""
    empty = w.session(own=0).plan()  # before Launchers writes the world out
    launchers = Launchers(w.bwrap, w.session().plan())
    variants: tuple[tuple[str, Starter], ...] = (
        ("nsconfine", launchers.nsconfine),
        ("floor", launchers.floor),
        ("naive", launchers.naive),
        ("process", launchers.process),
    )
    tasks = []
    for name, start in variants:
        tasks.append(Task(f"launch.exec.{name}", until_exec(start), config.launches))
        tasks.append(Task(f"launch.exit.{name}", until_exit(start, w.devnull), config.launches))

    def in_empty(argv: Sequence[str], stdout: int) -> Waiter:
        return nsconfine.spawn(empty, list(argv), stdout=stdout).wait

    tasks.append(Task(EMPTY_ROW, until_exit(in_empty, w.devnull), config.launches))
    for name, start in variants[:2]:
        tasks.append(Task(f"launch.end.{name}", until_end(start), config.launches))
    _progress(f"launch latency: {len(tasks)} variants x {config.launches} rounds")
    samples = interleave(tasks)
    notes = {
        "nsconfine": "nsconfine.spawn (lint, pins, proven bwrap, namespace check)",
        "floor": "same bwrap vector via os.posix_spawn, no check",
        "naive": "subprocess.Popen + preexec_fn prctl (fork)",
        "process": "no sandbox: os.posix_spawn of the payload",
    }
    baselines = {"nsconfine": "floor", "floor": "process", "naive": "floor", "process": None}
    for mode in ("exec", "exit"):
        for name, _ in variants:
            baseline = baselines[name]
            results.add(
                Row(
                    "launch",
                    f"launch.{mode}.{name}",
                    "ms",
                    _ms(samples[f"launch.{mode}.{name}"]),
                    baseline=None if baseline is None else f"launch.{mode}.{baseline}",
                    note=notes[name],
                )
            )
    results.add(
        Row(
            "launch",
            EMPTY_ROW,
            "ms",
            _ms(samples[EMPTY_ROW]),
            baseline="launch.exit.floor",
            note="nsconfine.spawn in a workspace holding no protected path: its mount points "
            "made and removed each launch",
        )
    )
    end_notes = {
        "nsconfine": "the payload's exit to wait() returning: the sandbox's last process gone",
        "floor": "the payload's exit to bwrap's exit status",
    }
    for name in end_notes:
        results.add(
            Row(
                "launch",
                f"launch.end.{name}",
                "ms",
                _ms(samples[f"launch.end.{name}"]),
                baseline="launch.end.floor" if name == "nsconfine" else None,
                note=end_notes[name],
            )
        )
    for other in OTHER_SANDBOXES:
        found = shutil.which(other)
        reason = "not installed" if found is None else f"found at {found}; no row implemented"
        results.skipped.append({"name": f"launch.exit.{other}", "reason": reason})


POOL_IN_FLIGHT = 32


def bench_pool(results: Results, w: World, config: Config) -> None:
    """Warm launches from a Pool against a bare posix_spawn of the payload, in runs of their
    own (a fresh Pool each), then warm against cold nsconfine.spawn in a Pool of their own
    (a cold launch's teardown goes on in the kernel after it, and would slow the runs' warm
    launches that follow it), then 32 at once. Every sample starts with the pool staged: its
    refill runs between launches, as a broker's gaps allow, never during one (the bare
    spawn's samples wait for it too)."""
    plan = w.session().plan()
    launchers = Launchers(w.bwrap, plan)
    bare = until_exit(launchers.process, w.devnull)
    runs = config.pool_runs
    _progress(f"pool: {runs} runs of warm launches and bare spawns x {config.launches} rounds")
    for run in range(1, runs + 1):
        with nsconfine.Pool(plan) as pool:
            staged = _staged(pool)
            samples = interleave(
                [
                    Task(
                        f"pool.launch.warm.run{run}", staged(_launch_call(pool, w)), config.launches
                    ),
                    Task(f"pool.process.run{run}", staged(bare), config.launches),
                ]
            )
        results.add(
            Row(
                "pool",
                f"pool.launch.warm.run{run}",
                "ms",
                _ms(samples[f"pool.launch.warm.run{run}"]),
                baseline=f"pool.process.run{run}",
                note=f"run {run} of {runs}: Pool.launch() of /bin/true, until it returns (the "
                "command has exec'd)",
            )
        )
        results.add(
            Row(
                "pool",
                f"pool.process.run{run}",
                "ms",
                _ms(samples[f"pool.process.run{run}"]),
                note=f"run {run} of {runs}: no sandbox, os.posix_spawn of the payload, to exit",
            )
        )
    _pool_against_cold(results, w, config, plan, launchers.nsconfine)
    _pool_in_flight(results, w, config, plan, bare)


def _pool_against_cold(
    results: Results, w: World, config: Config, plan: nsconfine.Plan, cold: Starter
) -> None:
    """Warm launches from a Pool against cold nsconfine.spawn of the same plan, to exec and to
    exit."""
    _progress(f"pool: warm launches and cold spawns x {config.launches} rounds")
    with nsconfine.Pool(plan) as pool:

        def warm(argv: Sequence[str], stdout: int) -> Waiter:
            return pool.launch(list(argv), stdout=stdout).wait

        staged = _staged(pool)
        samples = interleave(
            [
                Task("pool.exec.warm", staged(until_exec(warm)), config.launches),
                Task("pool.exec.cold", staged(until_exec(cold)), config.launches),
                Task("pool.exit.warm", staged(until_exit(warm, w.devnull)), config.launches),
                Task("pool.exit.cold", staged(until_exit(cold, w.devnull)), config.launches),
            ]
        )
    for mode in ("exec", "exit"):
        results.add(
            Row(
                "pool",
                f"pool.{mode}.warm",
                "ms",
                _ms(samples[f"pool.{mode}.warm"]),
                baseline=f"pool.{mode}.cold",
                note="Pool.launch of a staged sandbox: one sendmsg, then exec",
            )
        )
        results.add(
            Row(
                "pool",
                f"pool.{mode}.cold",
                "ms",
                _ms(samples[f"pool.{mode}.cold"]),
                note="nsconfine.spawn, the same plan",
            )
        )


def _staged(pool: nsconfine.Pool) -> Callable[[Callable[[], int]], Callable[[], int]]:
    """sample, taken once pool has staged its sandboxes (their refill is not timed)."""

    def staged_then(sample: Callable[[], int]) -> Callable[[], int]:
        def run() -> int:
            if not pool.wait_staged(60):
                raise BenchError("the pool could not stage its sandboxes")
            return sample()

        return run

    return staged_then


def _launch_call(pool: nsconfine.Pool, w: World) -> Callable[[], int]:
    """Pool.launch() of /bin/true until it returns (the command has exec'd); then its end."""

    def sample() -> int:
        began = _now()
        sandbox = pool.launch(list(TRUE_ARGV), stdout=w.devnull)
        ended = _now()
        _check_status(sandbox.wait(), "/bin/true from the pool")
        return ended - began

    return sample


def _pool_in_flight(
    results: Results, w: World, config: Config, plan: nsconfine.Plan, bare: Callable[[], int]
) -> None:
    """POOL_IN_FLIGHT Pool.launch() calls at once from a Pool of that size, staged before each
    round, against as many bare spawns at once."""
    level, rounds = POOL_IN_FLIGHT, config.pool_in_flight_rounds
    _progress(f"pool: {level} launches in flight x {rounds} rounds")
    with nsconfine.Pool(plan, size=level) as pool:
        launch = _launch_call(pool, w)
        bursts = {
            "launch.warm": Burst(level, 1, lambda _thread: launch()),
            "process": Burst(level, 1, lambda _thread: bare()),
        }
        staged = _staged(pool)
        interleave([Task(name, staged(burst), rounds, 1) for name, burst in bursts.items()])
    notes = {
        "launch.warm": f"{level} Pool.launch() at once from a Pool of {level}, until each returns",
        "process": f"{level} bare os.posix_spawn of the payload at once, each to its exit",
    }
    for name, burst in bursts.items():
        results.add(
            Row(
                "pool",
                f"pool.{name}.in-flight-{level}",
                "ms",
                _ms(burst.kept(1)),
                baseline=None if name == "process" else f"pool.process.in-flight-{level}",
                note=notes[name],
            )
        )


@contextmanager
def layers_off() -> Iterator[None]:
    """Every kernel layer switched off (the test suite's door), to measure what they cost."""
    saved = _layers.DISABLED_FOR_TESTS
    _layers.DISABLED_FOR_TESTS = frozenset(_layers.LAYERS)
    try:
        yield
    finally:
        _layers.DISABLED_FOR_TESTS = saved


def bench_layers(results: Results, w: World, config: Config) -> None:
    """What the kernel layers (seccomp, keyring, Landlock, no nested user namespaces) cost:
    a cold spawn and a warm Pool launch with them and without them."""
    plan = w.session().plan()
    launchers = Launchers(w.bwrap, plan)

    def without_layers(argv: Sequence[str], stdout: int) -> Waiter:
        with layers_off():
            return launchers.nsconfine(argv, stdout)

    tasks = [
        Task("layers.spawn.on", until_exec(launchers.nsconfine), config.launches),
        Task("layers.spawn.off", until_exec(without_layers), config.launches),
    ]
    _progress(f"layers: spawn with and without them x {config.launches} rounds")
    samples = interleave(tasks)
    # A pool stages in the background, so each pool runs in a phase of its own.
    for label in ("on", "off"):
        with contextlib.ExitStack() as stack:
            if label == "off":
                stack.enter_context(layers_off())
            pool = stack.enter_context(nsconfine.Pool(plan))

            def warm(argv: Sequence[str], stdout: int, pool: nsconfine.Pool = pool) -> Waiter:
                return pool.launch(list(argv), stdout=stdout).wait

            def staged(pool: nsconfine.Pool = pool) -> int:
                if not pool.wait_staged(30):
                    raise BenchError("the pool could not stage a sandbox")
                return until_exec(warm)()

            _progress(f"layers: warm pool launches, layers {label} x {config.launches} rounds")
            samples[f"layers.pool.{label}"] = interleave(
                [Task(f"layers.pool.{label}", staged, config.launches)]
            )[f"layers.pool.{label}"]
    notes = {
        "spawn": "nsconfine.spawn to exec",
        "pool": "Pool.launch of a staged sandbox, to exec (each pool in a phase of its own)",
    }
    for kind in ("spawn", "pool"):
        for label in ("on", "off"):
            results.add(
                Row(
                    "layers",
                    f"layers.{kind}.{label}",
                    "ms",
                    _ms(samples[f"layers.{kind}.{label}"]),
                    baseline=f"layers.{kind}.off" if label == "on" else None,
                    note=f"{notes[kind]}, layers {label}",
                )
            )


def bench_binds(results: Results, w: World, config: Config) -> None:
    """Launch latency (call to exit) against bind count, nsconfine and the bwrap floor."""
    tasks = []
    for n in config.bind_counts:
        launchers = Launchers(w.bwrap, w.session(n).plan())
        rounds = config.bind_rounds(n)
        warmup = 1 if n >= 300 else 2
        for name, start in (("nsconfine", launchers.nsconfine), ("floor", launchers.floor)):
            tasks.append(Task(f"binds.{name}.{n}", until_exit(start, w.devnull), rounds, warmup))
    _progress(f"launch against bind count: {config.bind_counts}")
    samples = interleave(tasks)
    for n in config.bind_counts:
        for name in ("nsconfine", "floor"):
            results.add(
                Row(
                    "binds",
                    f"binds.{name}.{n}",
                    "ms",
                    _ms(samples[f"binds.{name}.{n}"]),
                    baseline=f"binds.{name}.0"
                    if n
                    else ("binds.floor.0" if name != "floor" else None),
                    note=f"{name}, {n} extra binds, call to exit",
                )
            )


def bench_concurrency(results: Results, w: World, config: Config) -> None:
    """Launches per second with 1, 8, 32 and 128 threads each doing spawn + wait of /bin/true
    in a loop, each thread on a workspace of its own, against the floor the same way."""
    levels = config.concurrency_levels
    own = [Launchers(w.bwrap, w.session(own=i).plan()) for i in range(max(levels))]
    _progress(f"concurrency: a first launch on each of {len(own)} workspaces, not timed")
    for launchers in own:  # as the floor's stubs are made before it is timed
        until_exit(launchers.nsconfine, w.devnull)()
    tasks: list[Task] = []
    bursts: dict[str, Burst] = {}
    for level in levels:
        for name in ("nsconfine", "floor"):
            starts = [getattr(launchers, name) for launchers in own]

            def sample(thread: int, starts: list[Starter] = starts) -> int:
                return until_exit(starts[thread], w.devnull)()

            key = f"concurrency.{name}.{level}"
            bursts[key] = Burst(level, config.concurrency_each(level), sample)
            # One warm-up round, of the cheapest configurations only.
            tasks.append(Task(key, bursts[key], config.concurrency_rounds, int(level == 1)))
    _progress(f"concurrency: {levels} in flight, {config.concurrency_rounds} rounds")
    walls = interleave(tasks)
    for task in tasks:
        level = bursts[task.name].level
        latencies = bursts[task.name].kept(task.warmup)
        rate = len(latencies) / (sum(walls[task.name]) / 1e9)
        results.add(
            Row(
                "concurrency",
                task.name,
                "ms",
                _ms(latencies),
                baseline=f"concurrency.floor.{level}"
                if ".nsconfine." in task.name
                else ("concurrency.floor.1" if level > 1 else None),
                note=f"{rate:.0f} launches/s; latency of each spawn+wait, each thread on "
                "a workspace of its own",
                extra={"launches_per_s": rate},
            )
        )
    for level in levels:
        ours = results.rows[f"concurrency.nsconfine.{level}"].extra["launches_per_s"]
        floor = results.rows[f"concurrency.floor.{level}"].extra["launches_per_s"]
        results.derived[f"concurrency_rate_ratio_{level}"] = ours / floor


def size_child(mib: int, rounds: int) -> dict[str, Any]:
    """In a fresh interpreter holding mib MiB of touched memory: nsconfine vs naive vs floor."""
    ballast = bytearray(mib << 20)
    ballast[::4096] = b"\x01" * len(range(0, len(ballast), 4096))  # touch every page
    rss = psutil.Process().memory_info().rss
    with world(0) as w:
        launchers = Launchers(w.bwrap, w.session().plan())
        samples = interleave(
            [
                Task("nsconfine", until_exec(launchers.nsconfine), rounds),
                Task("naive", until_exec(launchers.naive), rounds),
                Task("floor", until_exec(launchers.floor), rounds),
            ]
        )
    del ballast
    return {"mib": mib, "rss_mib": rss / (1 << 20), "samples": samples}


def bench_size(results: Results, w: World, config: Config) -> None:
    """Spawn latency when the launcher holds 20 MiB and 1 GiB (each in its own interpreter)."""
    rounds = config.few
    for mib in config.sizes_mib:
        _progress(f"launcher size: {mib} MiB, {rounds} rounds (child interpreter)")
        command = [
            sys.executable,
            "-m",
            "nsconfine.bench",
            "--size-child",
            str(mib),
            "--launches",
            str(rounds),
        ]
        done = subprocess.run(command, stdout=subprocess.PIPE, check=True)
        report = json.loads(done.stdout)
        label = f"{mib}MiB" if mib < 1024 else f"{mib // 1024}GiB"
        for name in ("nsconfine", "naive", "floor"):
            baseline = {"nsconfine": "naive", "naive": "floor", "floor": None}[name]
            results.add(
                Row(
                    "size",
                    f"size.{label}.{name}",
                    "ms",
                    _ms(report["samples"][name]),
                    baseline=None if baseline is None else f"size.{label}.{baseline}",
                    note=f"launcher RSS {report['rss_mib']:.0f} MiB; call to payload exec'd",
                    extra={"launcher_rss_mib": report["rss_mib"]},
                )
            )
