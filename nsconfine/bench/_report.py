"""The run's report: targets judged, the machine, the JSON, the table and the plot."""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import psutil

import nsconfine
from nsconfine.bench._core import (
    SCHEMA,
    Config,
    Results,
)
from nsconfine.bench._scale import RUNNER_FILES


@dataclass(frozen=True, slots=True)
class Target:
    """A goal, judged on this run's numbers."""

    name: str
    goal: str
    value: float
    limit: float
    unit: str
    higher_is_better: bool = False
    verdict: bool | None = None  # met or not by the goal's own rule, whatever the value

    def to_json(self) -> dict[str, Any]:
        met = self.value >= self.limit if self.higher_is_better else self.value <= self.limit
        if self.verdict is not None:
            met = self.verdict
        return {
            "name": self.name,
            "goal": self.goal,
            "value": self.value,
            "limit": self.limit,
            "unit": self.unit,
            "met": met,
            "value_over_limit": self.value / self.limit if self.limit else math.inf,
        }


def targets(results: Results) -> list[Target]:
    """Each goal this run has the numbers for."""
    found: list[Target] = []

    def ratio(name: str, baseline: str, key: str = "p50") -> float | None:
        ours, theirs = results.p(name, key), results.p(baseline, key)
        return None if ours is None or theirs is None else ours / theirs

    def goal(
        name: str,
        what: str,
        value: float | None,
        limit: float,
        unit: str,
        higher: bool = False,
        verdict: bool | None = None,
    ) -> None:
        if value is not None:  # a section this run skipped has no numbers for it
            found.append(Target(name, what, value, limit, unit, higher, verdict))

    for mode in ("exec", "exit"):
        for key in ("p50", "p99"):
            goal(
                f"spawn-{mode}-{key}-vs-floor",
                f"nsconfine.spawn {key} (to {mode}) <= 1.10x the bwrap floor",
                ratio(f"launch.{mode}.nsconfine", f"launch.{mode}.floor", key),
                1.10,
                "x",
            )
    end, end_floor = results.p("launch.end.nsconfine"), results.p("launch.end.floor")
    goal(
        "end-of-session",
        "a session's end (the command's exit to wait() returning) p50 <= 0.5 ms over the "
        "bwrap floor's",
        None if end is None or end_floor is None else end - end_floor,
        0.5,
        "ms",
    )
    goal(
        "pool-layers-p50",
        "Pool warm launch p50 with the layers <= 1.2x without them",
        ratio("layers.pool.on", "layers.pool.off"),
        1.2,
        "x",
    )
    runs = [
        value
        for name in results.rows
        if name.startswith("pool.launch.warm.run")
        and (value := ratio(name, name.replace(".launch.warm.", ".process."))) is not None
    ]
    goal(
        "pool-warm-vs-process",
        f"Pool.launch() p50 (to exec) <= 1.0x a bare posix_spawn of the payload to exit, in "
        f"each of {len(runs)} runs (the value: the worst run's)",
        max(runs, default=None),
        1.0,
        "x",
    )
    goal(
        "pool-in-flight-32",
        "32 Pool.launch() at once p50 <= 1.2x 32 bare posix_spawns at once",
        ratio("pool.launch.warm.in-flight-32", "pool.process.in-flight-32"),
        1.2,
        "x",
    )
    sizes = sorted(
        {name.split(".")[1] for name in results.rows if name.startswith("size.")},
        key=lambda label: int(label[:-3]) * (1024 if label.endswith("GiB") else 1),
    )
    for label in sizes:
        limit = 1.5 if label.endswith("GiB") else 1.0
        goal(
            f"faster-than-naive-{label}",
            f"naive p50 / nsconfine p50 at {label} >= {limit}",
            ratio(f"size.{label}.naive", f"size.{label}.nsconfine"),
            limit,
            "x",
            higher=True,
        )
    plan_big = results.p("plan.binds-1000")
    goal(
        "plan-default",
        "default plan build+compile p50 <= 200 us",
        results.p("plan.binds-0"),
        200.0,
        "us",
    )
    goal(
        "plan-1000-binds",
        "1000-bind plan build+compile p50 <= 20 ms",
        None if plan_big is None else plan_big / 1000,
        20.0,
        "ms",
    )
    goal(
        "launch-1000-binds",
        "1000-bind launch p50 <= 10x the 0-bind launch",
        ratio("binds.nsconfine.1000", "binds.nsconfine.0"),
        10.0,
        "x",
    )
    for name in results.derived:
        if name.startswith("concurrency_rate_ratio_"):
            level = name.rsplit("_", 1)[1]
            goal(
                f"concurrency-rate-{level}",
                f"launches/s with {level} in flight, each on its own workspace, >= 0.8x the "
                "bwrap floor's at the same concurrency",
                results.derived[name],
                0.8,
                "x",
                higher=True,
            )
    for kind in ("none", "proxy"):
        goal(
            f"held-fds-{kind}",
            f'fds the launcher holds per live session (network "{kind}") <= 4',
            results.p(f"scale.held.{kind}.fds"),
            4.0,
            "fds",
        )
    listed = f"runner_files_{RUNNER_FILES}_refused"
    refused = results.derived.get(listed)
    goal(
        f"runner-files-{RUNNER_FILES}",
        f"a session listing {RUNNER_FILES:,} runner files: plan+launch p50 <= 10x a bare one, or "
        "refused at plan time by a message that says what to do (names --ro DIR)"
        + ("" if refused is None else f"; refused (the value: the time to the refusal): {refused}"),
        ratio(f"scale.runner-files.{RUNNER_FILES}", "scale.runner-files.0"),
        10.0,
        "x",
        verdict=None if refused is None else "--ro" in refused,
    )
    for key, label in (("", ""), ("_pyc", " (bytecode cache)")):
        goal(
            "import" + key.replace("_", "-"),
            f"import nsconfine <= 20 ms (p50 over python -c pass){label}",
            results.derived.get(f"import{key}_ms"),
            20.0,
            "ms",
        )
        goal(
            "cli-overhead" + key.replace("_", "-"),
            f"nsconfine run - (python + bwrap floor) p50 <= 15 ms{label}",
            results.derived.get(f"cli_overhead{key}_ms"),
            15.0,
            "ms",
        )
    for key in ("p50", "p99"):
        goal(
            f"network-launch-{key}",
            f'a "proxy" session launch {key} (to exit) <= 1.15x the same with "none"',
            ratio("network.launch.proxy", "network.launch.none", key),
            1.15,
            "x",
        )
    goal(
        "network-request-p50",
        "a small GET through the proxy p50 <= 1 ms more than straight to the server",
        results.derived.get("network_request_added_p50_ms"),
        1.0,
        "ms",
    )
    for how, label in (("plain", "plain HTTP"), ("tunnel", "a CONNECT tunnel")):
        goal(
            f"network-download-{how}",
            f"a large download through the proxy ({label}) p50 >= 0.8x straight from the server",
            ratio(f"network.download.{how}", "network.download.direct"),
            0.8,
            "x",
            higher=True,
        )
    return found


# ---------------------------------------------------------------- output


def machine() -> dict[str, Any]:
    """What this run ran on."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(
                (
                    line.split(":", 1)[1].strip()
                    for line in cpuinfo
                    if line.startswith("model name")
                ),
                model,
            )
    except OSError:
        pass
    distribution = "unknown"
    try:
        with open("/etc/os-release") as release:
            for line in release:
                if line.startswith("PRETTY_NAME="):
                    distribution = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": psutil.virtual_memory().total / (1 << 30),
        "kernel": platform.release(),
        "distribution": distribution,
        "load_average": os.getloadavg(),
    }


def versions(bwrap: str | None) -> dict[str, str]:
    """The software this run measured."""
    bwrap_version = "unavailable"
    if bwrap is not None:
        done = subprocess.run([bwrap, "--version"], capture_output=True, text=True, check=False)
        bwrap_version = done.stdout.strip() or "unknown"
    return {
        "nsconfine": nsconfine.__version__,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "glibc": os.confstr("CS_GNU_LIBC_VERSION") or "unknown",
        "psutil": psutil.__version__,
        "bwrap": f"{bwrap} ({bwrap_version})",
    }


def report(results: Results, config: Config, bwrap: str | None, elapsed: float) -> dict[str, Any]:
    """All numbers of the run, as JSON data."""
    rows = []
    for row in results.rows.values():
        stats = row.stats()
        record: dict[str, Any] = {
            "section": row.section,
            "name": row.name,
            "unit": row.unit,
            **stats,
            "baseline": row.baseline,
            "ratio_p50": None,
            "ratio_p99": None,
            "note": row.note,
            "extra": row.extra,
        }
        if row.baseline is not None and row.baseline in results.rows:
            base = results.rows[row.baseline].stats()
            record["ratio_p50"] = stats["p50"] / base["p50"]
            record["ratio_p99"] = stats["p99"] / base["p99"]
        rows.append(record)
    return {
        "schema": SCHEMA,
        "smoke": config.smoke,
        "launches": config.launches,
        "elapsed_s": elapsed,
        "machine": machine(),
        "versions": versions(bwrap),
        "rows": rows,
        "targets": [target.to_json() for target in targets(results)],
        "derived": results.derived,
        "skipped": results.skipped,
        "samples": {row.name: row.samples for row in results.rows.values()},
    }


def _number(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"


def table(data: dict[str, Any]) -> str:
    """The run as text a person reads."""
    header = ("row", "n", "p50", "p95", "p99", "unit", "x p50", "x p99", "baseline", "note")
    lines: list[tuple[str, ...]] = [header]
    for row in data["rows"]:
        ratio50 = "-" if row["ratio_p50"] is None else f"{row['ratio_p50']:.2f}"
        ratio99 = "-" if row["ratio_p99"] is None else f"{row['ratio_p99']:.2f}"
        one = row["n"] == 1
        lines.append(
            (
                row["name"],
                str(row["n"]),
                _number(row["p50"]),
                "-" if one else _number(row["p95"]),
                "-" if one else _number(row["p99"]),
                row["unit"],
                ratio50,
                ratio99,
                row["baseline"] or "-",
                row["note"],
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    out = []
    section = ""
    for index, line in enumerate(lines):
        current = "" if index == 0 else line[0].split(".")[0]
        if current != section:
            out.append("")
            section = current
        cells = [
            cell.rjust(width) if 1 <= i <= 7 else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line[:-1], widths, strict=True))
        ]
        out.append("  ".join(cells) + "  " + line[-1])
    out.append("")
    for name, value in data["derived"].items():
        if isinstance(value, float):
            out.append(f"{name}: {value:.3f}")
    out.append("")
    out.append("targets:")
    for target in data["targets"]:
        verdict = "met   " if target["met"] else "MISSED"
        out.append(
            f"  {verdict} {target['name']}: {target['value']:.3f} {target['unit']} "
            f"(limit {target['limit']:g} {target['unit']}; {target['goal']})"
        )
    for skipped in data["skipped"]:
        out.append(f"skipped {skipped['name']}: {skipped['reason']}")
    return "\n".join(out).lstrip("\n") + "\n"


def plot(data: dict[str, Any], path: str) -> None:
    """Latency CDFs of the launch rows, to path."""
    import matplotlib  # type: ignore[import-not-found,unused-ignore]  # the [plot] extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for axis, mode in zip(axes, ("exec", "exit"), strict=True):
        for row in data["rows"]:
            if row["section"] != "launch" or f".{mode}." not in row["name"]:
                continue
            values = sorted(data["samples"][row["name"]])
            fractions = [(i + 1) / len(values) for i in range(len(values))]
            axis.step(values, fractions, where="post", label=row["name"].split(".")[-1])
        axis.set_xscale("log")
        axis.set_xlabel(f"call to payload {'exec' if mode == 'exec' else 'exit'} (ms)")
        axis.set_title(f"launch latency, call to {mode}")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    axes[0].set_ylabel("fraction of launches")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


# ---------------------------------------------------------------- command line
