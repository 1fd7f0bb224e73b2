"""The bench's command line: which sections, how many launches, how to report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Final

from nsconfine._errors import NsconfineError
from nsconfine.bench._checks import (
    bench_checks,
    bench_plan,
)
from nsconfine.bench._cli import (
    bench_cli,
)
from nsconfine.bench._core import (
    SECTIONS,
    Config,
    Results,
    World,
    _progress,
    world,
)
from nsconfine.bench._launches import (
    bench_binds,
    bench_concurrency,
    bench_launch,
    bench_layers,
    bench_pool,
    bench_size,
    size_child,
)
from nsconfine.bench._memory import (
    bench_memory,
)
from nsconfine.bench._network import (
    bench_network,
)
from nsconfine.bench._report import (
    plot,
    report,
    table,
)
from nsconfine.bench._scale import (
    bench_scale,
)
from nsconfine.bench._soak import (
    bench_soak,
)

SECTION_FUNCTIONS: Final[dict[str, Callable[[Results, World, Config], None]]] = {
    "launch": bench_launch,
    "pool": bench_pool,
    "layers": bench_layers,
    "checks": bench_checks,
    "plan": bench_plan,
    "binds": bench_binds,
    "concurrency": bench_concurrency,
    "memory": bench_memory,
    "scale": bench_scale,
    "size": bench_size,
    "cli": bench_cli,
    "network": bench_network,
    "soak": bench_soak,  # only when asked for (--only soak): it counts, for minutes
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nsconfine.bench",
        description="Measure nsconfine's launch cost against the bwrap and process floors.",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="few launches and small counts (CI; under a minute)"
    )
    parser.add_argument(
        "--launches",
        type=int,
        metavar="N",
        help="repetitions of each launch variant (default 200, smoke 5)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print every number as JSON instead of the table"
    )
    parser.add_argument("--plot", metavar="FILE", help="draw the launch latency CDFs (matplotlib)")
    parser.add_argument(
        "--only",
        metavar="SECTIONS",
        help=f"comma-separated subset of {','.join(SECTIONS)}, or soak (never run unasked)",
    )
    parser.add_argument("--size-child", type=int, metavar="MIB", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; return the exit status (psutil is there: nsconfine/bench/__main__.py)."""
    # The child interpreters it times must import the installed nsconfine: run from a clone,
    # `python -m`/`-c` would put the source tree (without its compiled module) first.
    os.environ["PYTHONSAFEPATH"] = "1"
    # A launch holds an fd for each of its bind sources until bwrap has them (about 60), so
    # 128 launches in flight pass the usual soft limit of 1,024 (a live session holds 3). As a
    # broker starting that many at once would, take the hard limit (the soak lowers it again
    # to show 150 live sessions under 1,024).
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    arguments = _parser().parse_args(argv)
    launches = arguments.launches or (5 if arguments.smoke else 200)
    if launches < 1:
        print("nsconfine bench: --launches must be at least 1", file=sys.stderr)
        return 64
    if arguments.size_child is not None:
        json.dump(size_child(arguments.size_child, launches), sys.stdout)
        return 0
    sections = SECTIONS if arguments.only is None else tuple(arguments.only.split(","))
    unknown = [name for name in sections if name not in SECTION_FUNCTIONS]
    if unknown:
        print(
            f"nsconfine bench: unknown section {', '.join(unknown)} (choose from "
            f"{', '.join(SECTION_FUNCTIONS)})",
            file=sys.stderr,
        )
        return 64
    if arguments.plot is not None:
        from importlib.util import find_spec

        if find_spec("matplotlib") is None:
            print(
                "nsconfine bench: --plot needs matplotlib: pip install 'nsconfine[plot]'",
                file=sys.stderr,
            )
            return 69
    config = Config(arguments.smoke, launches)
    results = Results()
    began = time.monotonic()
    bwrap = None
    try:
        with world(1000) as w:
            bwrap = w.bwrap
            for name in sections:
                SECTION_FUNCTIONS[name](results, w, config)
    except NsconfineError as refused:
        print(f"nsconfine bench: {refused}", file=sys.stderr)
        return refused.exit_status
    data = report(results, config, bwrap, time.monotonic() - began)
    if arguments.json:
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(table(data))
    if arguments.plot is not None:
        plot(data, arguments.plot)
        _progress(f"latency CDFs drawn to {arguments.plot}")
    return 1 if results.derived.get("soak_failures") else 0
