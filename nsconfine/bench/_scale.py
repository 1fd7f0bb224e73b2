"""The scale section: a launcher holding many live sessions, and a session listing many runner
files, each next to its floor from the same run. (Launches in flight: the concurrency section.)

- held: the launcher's RSS and open fds with 150 idle sessions (smoke: 10), less the same
  before they started, per session: network "none", network "proxy", and the floor (bwrap
  started by os.posix_spawn, which the launcher keeps nothing of but a pid); the kinds in
  turn, the order alternating between rounds.
- runner files: `Session(ro=[10,000 files]).plan()`, spawn and wait of /bin/true, against the
  same with no runner file (a bare launch): or, if the plan is refused, the time until the
  refusal, whose message is kept.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import Final

import psutil

import nsconfine
from nsconfine.bench._core import (
    SLEEP_ARGV,
    TRUE_ARGV,
    Config,
    FloorSession,
    Launchers,
    Live,
    Results,
    Row,
    Task,
    World,
    _check_status,
    _ms,
    _now,
    _progress,
    interleave,
    live,
    sleeper,
)

RUNNER_FILES: Final = 10_000
# A proxy session's one allowed host, pinned so that no name is looked up: nothing connects.
HELD_HOST: Final = "held.test=127.0.0.1"


def bench_scale(results: Results, w: World, config: Config) -> None:
    """Many live sessions, many runner files (see the module's docstring)."""
    _held(results, w, config)
    _runner_files(results, w, config)


def _held(results: Results, w: World, config: Config) -> None:
    count, rounds = config.held_sessions, config.memory_rounds
    none = w.session().plan()
    floor = Launchers(w.bwrap, none)
    starts: dict[str, Callable[[], Live]] = {
        "none": sleeper(none, w.devnull),
        "proxy": sleeper(w.session(network="proxy", allow_hosts=[HELD_HOST]).plan(), w.devnull),
        # Its stderr, like the sessions', is not the bench's: a leaked floor holds no pipe.
        "floor": lambda: FloorSession(floor.floor_pid(SLEEP_ARGV, w.devnull, w.devnull)),
    }
    me = psutil.Process()
    kib: dict[str, list[float]] = {name: [] for name in starts}
    fds: dict[str, list[float]] = {name: [] for name in starts}
    _progress(f"scale: the launcher holding {count} live sessions of each kind x {rounds} rounds")
    for start in starts.values():  # what a launcher opens once (the proxy's own) is not counted
        with live(1, start):
            pass
    for round_number in range(rounds):
        order = list(starts) if round_number % 2 == 0 else list(starts)[::-1]
        for name in order:
            gc.collect()
            rss_before, fds_before = me.memory_info().rss, me.num_fds()
            with live(count, starts[name]):
                gc.collect()
                kib[name].append((me.memory_info().rss - rss_before) / 1024 / count)
                fds[name].append((me.num_fds() - fds_before) / count)
    what = {
        "none": 'sessions (network "none")',
        "proxy": 'sessions (network "proxy": its listener and accept thread)',
        "floor": "floor sessions (bwrap by os.posix_spawn: a pid)",
    }
    for unit, key, samples in (("KiB", "rss", kib), ("fds", "fds", fds)):
        for name in starts:
            results.add(
                Row(
                    "scale",
                    f"scale.held.{name}.{key}",
                    unit,
                    samples[name],
                    note=f"the launcher's {key} with {count} live {what[name]} less before, each",
                )
            )


def _runner_files(results: Results, w: World, config: Config) -> None:
    files = [w.make(os.path.join("runner", f"r{i:05d}"), f"{i}\n") for i in range(RUNNER_FILES)]
    refusals: list[str] = []

    def launch(ro: list[str]) -> Callable[[], int]:
        def sample() -> int:
            began = _now()
            try:
                plan = w.session(ro=ro).plan()
            except nsconfine.PlanError as refused:
                ended = _now()
                refusals.append(str(refused))
                return ended - began
            status = nsconfine.spawn(plan, list(TRUE_ARGV), stdout=w.devnull).wait()
            ended = _now()
            _check_status(status, "/bin/true")
            return ended - began

        return sample

    rounds = config.runner_file_rounds
    _progress(f"scale: a session listing {RUNNER_FILES:,} runner files x {rounds} rounds")
    samples = interleave(
        [
            Task("bare", launch([]), rounds, warmup=1),
            Task("listed", launch(files), rounds, warmup=1),
        ]
    )
    refused = refusals[-1] if refusals else None
    if refused is not None and len(refusals) != rounds + 1:
        refused = f"refused {len(refusals)} times of {rounds + 1}: {refused}"
    results.derived[f"runner_files_{RUNNER_FILES}_refused"] = refused
    outcome = "launched" if refused is None else f"refused at plan time: {refused}"
    results.add(
        Row(
            "scale",
            "scale.runner-files.0",
            "ms",
            _ms(samples["bare"]),
            note="a bare launch: Session(...).plan(), spawn and wait of /bin/true",
        )
    )
    results.add(
        Row(
            "scale",
            f"scale.runner-files.{RUNNER_FILES}",
            "ms",
            _ms(samples["listed"]),
            baseline="scale.runner-files.0",
            note=f"the same with ro=[{RUNNER_FILES:,} files] ({outcome})",
        )
    )
