"""The memory section: what a live session costs (measured with psutil)."""

from __future__ import annotations

import gc
import time
import tracemalloc

import psutil

from nsconfine.bench._core import (
    BenchError,
    Config,
    Results,
    Row,
    World,
    _progress,
    live,
    sleeper,
)


def _wait_for_payload(init_pid: int, name: str, timeout: float = 10.0) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(init_pid).children():
            try:
                if child.name() == name:
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.005)
    raise BenchError(f"no {name} under the sandbox's init {init_pid} after {timeout} s")


def bench_memory(results: Results, w: World, config: Config) -> None:
    """bwrap's memory per live session, and the Python bytes the launcher keeps for one."""
    plan = w.session().plan()
    count = config.live_sessions
    start = sleeper(plan, w.devnull)
    _progress(f"memory: {count} live sessions")

    # Pass 1, without tracemalloc: the processes' memory.
    per: dict[str, list[float]] = {
        key: []
        for key in ("monitor.rss", "init.rss", "bwrap.rss", "bwrap.uss", "bwrap.pss", "payload.rss")
    }
    with live(count, start) as sandboxes:
        for sandbox in sandboxes:
            payload = _wait_for_payload(sandbox.child_pid, "sleep")
            monitor_process = psutil.Process(sandbox.child_pid).parent()
            assert monitor_process is not None
            monitor = monitor_process.memory_full_info()
            init = psutil.Process(sandbox.child_pid).memory_full_info()
            mib = 1 << 20
            per["monitor.rss"].append(monitor.rss / mib)
            per["init.rss"].append(init.rss / mib)
            per["bwrap.rss"].append((monitor.rss + init.rss) / mib)
            per["bwrap.uss"].append((monitor.uss + init.uss) / mib)
            per["bwrap.pss"].append((monitor.pss + init.pss) / mib)
            per["payload.rss"].append(payload.memory_info().rss / mib)
    notes = {
        "monitor.rss": "bwrap's monitor, outside the sandbox",
        "init.rss": "bwrap's pid 1 inside the sandbox",
        "bwrap.rss": "monitor + init (shared pages counted in both)",
        "bwrap.uss": "monitor + init, pages no other process maps",
        "bwrap.pss": "monitor + init, shared pages divided among their sharers",
        "payload.rss": "the payload (sleep), not bwrap's",
    }
    for key, values in per.items():
        results.add(Row("memory", f"memory.{key}", "MiB", values, note=notes[key]))

    # Pass 2, traced: the Python bytes the launcher keeps per live session. (Its RSS and fds
    # per session, next to the floor's: the scale section.)
    gc.collect()
    tracemalloc.start()
    try:
        traced_before = tracemalloc.get_traced_memory()[0]
        with live(count, start):
            gc.collect()
            traced_after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    results.add(
        Row(
            "memory",
            "memory.launcher.python",
            "B",
            [(traced_after - traced_before) / count],
            note=f"tracemalloc delta / {count} live sessions",
        )
    )
