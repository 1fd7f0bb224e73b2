"""Whole `nsconfine` processes from two or more installs, interleaved, next to bare bwrap.

    python benchmarks/bench_cli.py [--rounds N] [--rows run,plan,...] NAME=VENV [NAME=VENV ...]

Each VENV is a virtual environment with nsconfine installed (its `bin/nsconfine` console script
and `bin/python`); the interpreter running this script (with nsconfine's bench, and bwrap)
supplies the floor: the same session's bwrap, spawned directly, to /bin/true's exit, as
`python -m nsconfine.bench --only cli` measures it. Rows per install: `run` (`nsconfine run
SESSION -- /bin/true`, the console script), `run-m` (`python -m nsconfine run …`), `plan`,
`check` and `import` (`python -c 'import nsconfine'`); and once, `python -c pass`. Each install
keeps its own XDG_CACHE_HOME (its bwrap proof and records, warmed before measuring: installs
that write proofs differently would otherwise prove bwrap again in turn) and its bytecode
cache. Variants run round-robin (nsconfine.bench's interleave). benchmarks/cli-breakdown.md
has a run and where each millisecond goes. A program that measures and reports; no test
asserts on its times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import nsconfine
from nsconfine.bench._core import Launchers, Task, interleave, until_exit, world

SUBCOMMANDS = ("run", "run-m", "plan", "check", "import")


def command(venv: str, row: str, session: list[str]) -> list[str]:
    python, script = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "nsconfine")
    return {
        "run": [script, "run", *session, "--", "/bin/true"],
        "run-m": [python, "-m", "nsconfine", "run", *session, "--", "/bin/true"],
        "plan": [script, "plan", *session],
        "check": [script, "check"],
        "import": [python, "-c", "import nsconfine"],
    }[row]


def whole_process(argv: list[str], env: dict[str, str], devnull: int) -> int:
    """Nanoseconds from spawning argv to having reaped it (its stdout: devnull)."""
    began = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1)])
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    ended = time.perf_counter_ns()
    if status != 0:
        raise SystemExit(f"{' '.join(argv)} exited with status {status}")
    return ended - began


def sampler(argv: list[str], env: dict[str, str], devnull: int) -> Callable[[], int]:
    return lambda: whole_process(argv, env, devnull)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--rows", default=",".join(SUBCOMMANDS), help="a subset of the rows")
    parser.add_argument("installs", nargs="+", metavar="NAME=VENV")
    options = parser.parse_args()
    installs = dict(given.split("=", 1) for given in options.installs)
    os.chdir("/")  # -c and -m put the working directory first on sys.path
    # Python's own bytecode cache: an installed package has its .pyc files.
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="nsconfine-bench-cli-") as caches, world(0) as w:
        user = ["--user", "nobody"] if os.geteuid() == 0 else []
        session = ["--workspace", w.workspace, "--run-dir", w.run_dir, *user]
        tasks = []
        for name, venv in installs.items():
            env = {**base, "XDG_CACHE_HOME": os.path.join(caches, name)}
            for row in options.rows.split(","):
                argv = command(venv, row, session)
                whole_process(argv, env, w.devnull)  # warm: its proof, its bytecode
                tasks.append(Task(f"{row}.{name}", sampler(argv, env, w.devnull), options.rounds))
        python = [os.path.join(next(iter(installs.values())), "bin", "python"), "-c", "pass"]
        tasks.append(Task("python", sampler(python, base, w.devnull), options.rounds))
        floor = Launchers(w.bwrap, w.session().plan()).floor
        tasks.append(Task("bwrap", until_exit(floor, w.devnull), options.rounds))
        load = os.getloadavg()[0]
        print(f"{len(tasks)} variants x {options.rounds} rounds, load {load:.1f}", file=sys.stderr)
        samples = interleave(tasks)
    p50 = {name: statistics.median(values) / 1e6 for name, values in samples.items()}
    low = {name: min(values) / 1e6 for name, values in samples.items()}
    print(f"{'row':14} {'p50':>7} {'min':>7} {'p50-bwrap':>10} {'p50-python':>11}  (ms)")
    for name in samples:
        over = f"{p50[name] - p50['bwrap']:+10.1f}" if name.startswith("run") else " " * 10
        print(
            f"{name:14} {p50[name]:7.1f} {low[name]:7.1f} {over} {p50[name] - p50['python']:+11.1f}"
        )
    print(f"nsconfine {nsconfine.__version__} (floor from {nsconfine.__file__})", file=sys.stderr)


if __name__ == "__main__":
    main()
