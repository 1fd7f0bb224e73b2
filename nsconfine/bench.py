"""The bench: what a confined launch costs, next to the floors it is built on.

Run `python -m nsconfine.bench` (the full run, about two minutes) or `--smoke` (CI, seconds).
Every section runs its variants round-robin in one process, so a noisy machine slows them
alike and the ratios hold. benchmarks/README.md says what each row measures.

The floors are what nsconfine cannot beat: the same bwrap argument vector started with
os.posix_spawn (bwrap's own cost), and /bin/true started with os.posix_spawn (a process's cost).
The naive launcher is what the obvious subprocess code costs: Popen with a preexec_fn, which
makes CPython fork instead of vfork, so it slows down as the launcher grows.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import gc
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import psutil

import nsconfine
from nsconfine import _layers, _syscalls
from nsconfine._accounts import run_as
from nsconfine._bwrap_args import (
    ARGS_FD,
    FIRST_DATA_FD,
    INFO_FD,
    SECCOMP_FD,
    bwrap_options,
    encode_options,
)
from nsconfine._errors import NsconfineError
from nsconfine._executor import open_entry_fds, own_namespaces
from nsconfine._pins import verify_pins
from nsconfine._plan import Plan
from nsconfine._policy import check_plan
from nsconfine._preflight import proven_bwrap
from nsconfine._syscalls import memfd_sealed

SCHEMA: Final = 1
SECTIONS: Final = (
    "launch",
    "pool",
    "layers",
    "checks",
    "plan",
    "binds",
    "concurrency",
    "memory",
    "size",
    "cli",
)
EXEC_ARGV: Final = ("/bin/echo", "-n", "x")  # its first output is the proof that it exec'd
TRUE_ARGV: Final = ("/bin/true",)
SLEEP_ARGV: Final = ("/bin/sleep", "1000")
HIGH_FD: Final = 64  # posix_spawn sources are moved up here so no dup2 clobbers another source
PR_SET_PDEATHSIG: Final = 1
MEMFD_SEALS: Final = (
    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
)
OTHER_SANDBOXES: Final = ("firejail", "nsjail")
SESSION_USER: Final = "nobody"  # whom sessions run as when the bench runs as root

# Launch as a function: start argv with stdout on the given fd, return "wait for its status".
Waiter = Callable[[], int]
Starter = Callable[[Sequence[str], int], Waiter]

_now = time.perf_counter_ns


class BenchError(Exception):
    """A launch under measurement did not do what it must (a wrong status or output)."""


# ---------------------------------------------------------------- statistics and rows


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values, interpolated between neighbours."""
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(slots=True)
class Row:
    """One measured quantity: its samples (in unit), and the row it is compared with."""

    section: str
    name: str
    unit: str
    samples: list[float]
    baseline: str | None = None
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    def stats(self) -> dict[str, float]:
        """n, p50, p95, p99, mean, min and max of the samples."""
        ordered = sorted(self.samples)
        return {
            "n": len(ordered),
            "p50": percentile(ordered, 0.50),
            "p95": percentile(ordered, 0.95),
            "p99": percentile(ordered, 0.99),
            "mean": sum(ordered) / len(ordered) if ordered else math.nan,
            "min": ordered[0] if ordered else math.nan,
            "max": ordered[-1] if ordered else math.nan,
        }


@dataclass(slots=True)
class Results:
    """Everything one run measured, in the order it was measured."""

    rows: dict[str, Row] = field(default_factory=dict)
    derived: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows[row.name] = row
        return row

    def p(self, name: str, key: str = "p50") -> float | None:
        row = self.rows.get(name)
        return None if row is None or not row.samples else row.stats()[key]


def _ms(samples_ns: Sequence[int]) -> list[float]:
    return [value / 1e6 for value in samples_ns]


def _us(samples_ns: Sequence[int]) -> list[float]:
    return [value / 1e3 for value in samples_ns]


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


@dataclass(slots=True)
class Task:
    """One variant of a round-robin: a function returning one sample in nanoseconds."""

    name: str
    run: Callable[[], int]
    rounds: int
    warmup: int = 2


def interleave(tasks: Sequence[Task]) -> dict[str, list[int]]:
    """Run the tasks round-robin, each round starting one task later, so that no variant
    always follows the same neighbour; a task with fewer rounds drops out when done."""
    samples: dict[str, list[int]] = {task.name: [] for task in tasks}
    gc.collect()
    total = max(task.warmup + task.rounds for task in tasks)
    for round_number in range(total):
        shift = round_number % len(tasks)
        for task in [*tasks[shift:], *tasks[:shift]]:
            if round_number >= task.warmup + task.rounds:
                continue
            value = task.run()
            if round_number >= task.warmup:
                samples[task.name].append(value)
    return samples


# ---------------------------------------------------------------- the launchers


def _check_status(status: int, what: str) -> None:
    if status != 0:
        raise BenchError(f"{what} exited with status {status}")


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, MEMFD_SEALS)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _high_copy(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)


def make_stubs(plan: Plan) -> None:
    """Make the empty protected files and directories that nsconfine makes at each launch (and
    removes after), once: the floor runs bwrap on the same options, which need them."""
    for entry in plan.entries:
        if entry.stub is not None and not os.path.lexists(entry.source):
            if entry.stub == "dir":
                os.mkdir(entry.source)
            else:
                open(entry.source, "x").close()
            if os.geteuid() == 0:
                os.chown(entry.source, plan.user.uid, plan.user.gid)


def without_info(options: Sequence[str]) -> list[str]:
    """The options less `--info-fd 4`: a floor that checks nothing needs no report. The
    seccomp filter stays: the floor is bwrap with the same program."""
    at = list(options).index("--info-fd")
    if options[at + 1] != str(INFO_FD):
        raise BenchError("the plan's options lack --info-fd 4")
    return [*options[:at], *options[at + 2 :]]


_libc: ctypes.CDLL | None = None


def _set_pdeathsig() -> None:
    assert _libc is not None
    if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


FD_OPTIONS = ("--ro-bind-data", "--file")  # the options whose argument is an fd number


class Launchers:
    """The four ways of starting a command this bench compares, on one plan."""

    def __init__(self, bwrap: str, plan: Plan) -> None:
        global _libc
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        self.bwrap = bwrap
        self.plan = plan
        # bwrap resolves each bind's path itself: its own cost, the floor's.
        self.options = without_info(bwrap_options(plan, bind_fds=False))
        make_stubs(plan)
        self.encoded = encode_options(self.options)
        self.seccomp = _layers.seccomp_program(plan) or b""
        # As root, bwrap runs as the session's account in every variant, as nsconfine runs it.
        self.ids = (plan.user.uid, plan.user.gid) if os.geteuid() == 0 else None

    def nsconfine(self, argv: Sequence[str], stdout: int) -> Waiter:
        """nsconfine.spawn: lint, pins, proven bwrap, launch with the namespace check."""
        return nsconfine.spawn(self.plan, list(argv), stdout=stdout).wait

    def floor(self, argv: Sequence[str], stdout: int) -> Waiter:
        """The same bwrap vector and seccomp filter, bwrap spawned directly (a vfork-style
        clone, as root after taking the session's ids): no reaper, no shim, no check."""
        made = [_memfd("bench-args", self.encoded)]
        try:
            # fds 3..8 as a launch has them (4, 5, 7 and 8 unused here), then the data fds.
            filter_fd = _memfd("bench-seccomp", self.seccomp)
            made += [made[0], made[0], filter_fd, made[0], made[0]]
            assert made.index(filter_fd) + ARGS_FD == SECCOMP_FD
            assert len(made) + ARGS_FD == FIRST_DATA_FD
            open_entry_fds(self.plan, made)  # the data memfds and copied files, as a launch does
            flags, uid, gid = 0, 0, 0
            if self.ids is not None:
                flags, (uid, gid) = _syscalls.SPAWN_SET_IDS, self.ids
            pid = _syscalls.spawn(
                os.fsencode(self.bwrap),
                [os.fsencode(a) for a in (self.bwrap, "--args", str(ARGS_FD), "--", *argv)],
                (),
                stdout=stdout,
                pass_fds=made,
                flags=flags,
                uid=uid,
                gid=gid,
            )
        finally:
            for fd in set(made):
                os.close(fd)
        return lambda: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    def naive(self, argv: Sequence[str], stdout: int) -> Waiter:
        """subprocess.Popen with pass_fds and a preexec_fn setting PDEATHSIG via ctypes."""
        data_fds: list[int] = []
        try:
            open_entry_fds(self.plan, data_fds)
            # Popen keeps fds at their own numbers, so the options name those numbers.
            numbers = {str(FIRST_DATA_FD + i): str(fd) for i, fd in enumerate(data_fds)}
            options = [
                numbers[option] if i and self.options[i - 1] in FD_OPTIONS else option
                for i, option in enumerate(self.options)
            ]
            filter_fd = _memfd("bench-seccomp", self.seccomp)
            options = [str(filter_fd) if o == str(SECCOMP_FD) and i and options[i - 1] ==
                       "--seccomp" else o for i, o in enumerate(options)]  # fmt: skip
            args_fd = _memfd("bench-args", encode_options(options))
            ids: dict[str, Any] = {}
            if self.ids is not None:
                ids = {"user": self.ids[0], "group": self.ids[1], "extra_groups": []}
            try:
                process = subprocess.Popen(
                    [self.bwrap, "--args", str(args_fd), "--", *argv],
                    stdout=stdout,
                    env={},
                    pass_fds=(args_fd, filter_fd, *data_fds),
                    preexec_fn=_set_pdeathsig,
                    **ids,
                )
            finally:
                os.close(args_fd)
                os.close(filter_fd)
        finally:
            for fd in data_fds:
                os.close(fd)
        return process.wait

    @staticmethod
    def process(argv: Sequence[str], stdout: int) -> Waiter:
        """No sandbox: argv itself via os.posix_spawn."""
        source = _high_copy(stdout)
        try:
            pid = os.posix_spawn(
                argv[0], list(argv), {}, file_actions=[(os.POSIX_SPAWN_DUP2, source, 1)]
            )
        finally:
            os.close(source)
        return lambda: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def until_exec(start: Starter) -> Callable[[], int]:
    """Nanoseconds from the call to the payload's first byte on a pipe (it has exec'd)."""

    def sample() -> int:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            began = _now()
            waiter = start(EXEC_ARGV, write_end)
            os.close(write_end)
            write_end = -1
            first = os.read(read_end, 1)
            ended = _now()
            _check_status(waiter(), "the exec payload")
        finally:
            if write_end >= 0:
                os.close(write_end)
            os.close(read_end)
        if first != b"x":
            raise BenchError(f"the exec payload wrote {first!r}, not b'x'")
        return ended - began

    return sample


def until_exit(start: Starter, devnull: int) -> Callable[[], int]:
    """Nanoseconds from the call to the payload's exit status (waited for)."""

    def sample() -> int:
        began = _now()
        status = start(TRUE_ARGV, devnull)()
        ended = _now()
        _check_status(status, "/bin/true")
        return ended - began

    return sample


# ---------------------------------------------------------------- the world


@dataclass(slots=True)
class World:
    """The bench's files: a workspace, a run directory and files to bind read-only."""

    root: str
    workspace: str
    run_dir: str
    files: list[str]
    devnull: int
    bwrap: str

    def session(self, binds: int = 0) -> nsconfine.Session:
        return nsconfine.Session(
            workspace=self.workspace,
            run_dir=self.run_dir,
            ro=self.files[:binds],
            user=SESSION_USER if os.geteuid() == 0 else None,
        )


@contextmanager
def world(files: int) -> Iterator[World]:
    """A temporary directory holding the bench's session, removed afterwards."""
    root = tempfile.mkdtemp(prefix="nsconfine-bench-")
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        workspace = os.path.join(root, "ws")
        run_dir = os.path.join(root, "run")
        binds = os.path.join(root, "binds")
        for path in (workspace, run_dir, binds):
            os.mkdir(path)
        paths = []
        for index in range(files):
            path = os.path.join(binds, f"f{index:04d}")
            with open(path, "w") as file:
                file.write(f"{index}\n")
            paths.append(path)
        if os.geteuid() == 0:  # the sessions' account owns the bench's world
            os.chmod(root, 0o755)
            account = run_as(SESSION_USER)
            for path in (root, workspace, run_dir, binds, *paths):
                os.chown(path, account.uid, account.gid)
        yield World(root, workspace, run_dir, paths, devnull, proven_bwrap())
    finally:
        os.close(devnull)
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- sections


@dataclass(frozen=True, slots=True)
class Config:
    """Repetitions per section, from --launches and --smoke."""

    smoke: bool
    launches: int

    @property
    def few(self) -> int:
        return max(3, self.launches // 4)

    @property
    def bind_counts(self) -> tuple[int, ...]:
        return (0, 10, 100) if self.smoke else (0, 10, 100, 300, 1000)

    def bind_rounds(self, binds: int) -> int:
        if binds >= 1000:
            return max(2, self.launches // 40)
        if binds >= 300:
            return max(2, self.launches // 20)
        return self.few

    @property
    def plan_rounds(self) -> int:
        return 30 if self.smoke else 2000

    @property
    def concurrency_per_round(self) -> int:
        return 32 if self.smoke else 96

    @property
    def concurrency_rounds(self) -> int:
        return 1 if self.smoke else 3

    @property
    def live_sessions(self) -> int:
        return 5 if self.smoke else 50

    @property
    def sizes_mib(self) -> tuple[int, ...]:
        return (20, 256) if self.smoke else (20, 1024)


def bench_launch(results: Results, w: World, config: Config) -> None:
    """Launch latency of the default plan: nsconfine, bwrap floor, naive, no sandbox."""
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
    for other in OTHER_SANDBOXES:
        found = shutil.which(other)
        reason = "not installed" if found is None else f"found at {found}; no row implemented"
        results.skipped.append({"name": f"launch.exit.{other}", "reason": reason})


def bench_pool(results: Results, w: World, config: Config) -> None:
    """Warm launches from a Pool (staged ahead of need) against cold nsconfine.spawn."""
    plan = w.session().plan()
    launchers = Launchers(w.bwrap, plan)
    with nsconfine.Pool(plan) as pool:

        def warm(argv: Sequence[str], stdout: int) -> Waiter:
            return pool.launch(list(argv), stdout=stdout).wait

        def staged_then(sample: Callable[[], int]) -> Callable[[], int]:
            def run() -> int:  # only the launch itself is timed: restaging is ahead of need
                if not pool.wait_staged(30):
                    raise BenchError("the pool could not stage a sandbox")
                return sample()

            return run

        tasks = [
            Task("pool.exec.warm", staged_then(until_exec(warm)), config.launches),
            Task("pool.exec.cold", until_exec(launchers.nsconfine), config.launches),
            Task("pool.exit.warm", staged_then(until_exit(warm, w.devnull)), config.launches),
            Task("pool.exit.cold", until_exit(launchers.nsconfine, w.devnull), config.launches),
        ]
        _progress(f"pool: warm and cold launches x {config.launches} rounds")
        samples = interleave(tasks)
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
    """Launches per second with 1, 8 and 32 threads each doing spawn + wait."""
    launchers = Launchers(w.bwrap, w.session().plan())
    levels = (1, 8, 32)
    latencies: dict[str, list[int]] = {}
    walls: dict[str, list[int]] = {}
    counts: dict[str, int] = {}

    def one_round(name: str, start: Starter, level: int) -> None:
        per_thread = math.ceil(config.concurrency_per_round / level)
        barrier = threading.Barrier(level + 1)
        measured: list[int] = []
        failures: list[BaseException] = []

        def worker() -> None:
            try:
                barrier.wait()
                for _ in range(per_thread):
                    began = _now()
                    status = start(TRUE_ARGV, w.devnull)()
                    measured.append(_now() - began)
                    _check_status(status, "/bin/true")
            except BaseException as failure:  # reported by the main thread below
                failures.append(failure)

        threads = [threading.Thread(target=worker) for _ in range(level)]
        for thread in threads:
            thread.start()
        barrier.wait()
        began = _now()
        for thread in threads:
            thread.join()
        wall = _now() - began
        if failures:
            raise failures[0]
        key = f"concurrency.{name}.{level}"
        latencies.setdefault(key, []).extend(measured)
        walls.setdefault(key, []).append(wall)
        counts[key] = counts.get(key, 0) + len(measured)

    configs = [
        (name, start, level)
        for level in levels
        for name, start in (("nsconfine", launchers.nsconfine), ("floor", launchers.floor))
    ]
    _progress(f"concurrency: {levels} in flight, {config.concurrency_rounds} rounds")
    gc.collect()
    for name, start, _ in configs[:2]:  # warm-up
        one_round(name, start, 1)
    latencies.clear()
    walls.clear()
    counts.clear()
    for round_number in range(config.concurrency_rounds):
        shift = round_number % len(configs)
        for name, start, level in [*configs[shift:], *configs[:shift]]:
            one_round(name, start, level)
    for level in levels:
        for name in ("nsconfine", "floor"):
            key = f"concurrency.{name}.{level}"
            rate = counts[key] / (sum(walls[key]) / 1e9)
            results.add(
                Row(
                    "concurrency",
                    key,
                    "ms",
                    _ms(latencies[key]),
                    baseline=f"concurrency.floor.{level}"
                    if name == "nsconfine"
                    else ("concurrency.floor.1" if level > 1 else None),
                    note=f"{rate:.0f} launches/s; latency of each spawn+wait",
                    extra={"launches_per_s": rate},
                )
            )
    for level in levels:
        ours = results.rows[f"concurrency.nsconfine.{level}"].extra["launches_per_s"]
        floor = results.rows[f"concurrency.floor.{level}"].extra["launches_per_s"]
        results.derived[f"concurrency_rate_ratio_{level}"] = ours / floor


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
    """bwrap's memory per live session, and what the launcher keeps per live session."""
    plan = w.session().plan()
    count = config.live_sessions
    me = psutil.Process()
    _progress(f"memory: {count} live sessions")

    def start_all() -> list[nsconfine.Sandbox]:
        return [
            nsconfine.spawn(
                plan, list(SLEEP_ARGV), stdin=w.devnull, stdout=w.devnull, stderr=w.devnull
            )
            for _ in range(count)
        ]

    def stop_all(sandboxes: Sequence[nsconfine.Sandbox]) -> None:
        for sandbox in sandboxes:
            sandbox.kill()
        for sandbox in sandboxes:
            sandbox.wait()

    # Pass 1, without tracemalloc: the processes' memory and the launcher's RSS and fds.
    gc.collect()
    rss_before, fds_before = me.memory_info().rss, me.num_fds()
    sandboxes = start_all()
    try:
        gc.collect()
        rss_after, fds_after = me.memory_info().rss, me.num_fds()
        per: dict[str, list[float]] = {
            key: []
            for key in (
                "monitor.rss",
                "init.rss",
                "bwrap.rss",
                "bwrap.uss",
                "bwrap.pss",
                "payload.rss",
            )
        }
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
    finally:
        stop_all(sandboxes)
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

    # Pass 2, traced: the Python bytes the launcher keeps per live session.
    gc.collect()
    tracemalloc.start()
    try:
        traced_before = tracemalloc.get_traced_memory()[0]
        sandboxes = start_all()
        try:
            gc.collect()
            traced_after = tracemalloc.get_traced_memory()[0]
        finally:
            stop_all(sandboxes)
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
    results.add(
        Row(
            "memory",
            "memory.launcher.rss",
            "KiB",
            [(rss_after - rss_before) / 1024 / count],
            note=f"launcher RSS delta / {count} live sessions",
        )
    )
    results.add(
        Row(
            "memory",
            "memory.launcher.fds",
            "fds",
            [(fds_after - fds_before) / count],
            note="fds the launcher holds per live session",
        )
    )


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


def _time_process(argv: Sequence[str], devnull: int, env: dict[str, str]) -> int:
    began = _now()
    source = _high_copy(devnull)
    try:
        pid = os.posix_spawn(
            argv[0], list(argv), env, file_actions=[(os.POSIX_SPAWN_DUP2, source, 1)]
        )
    finally:
        os.close(source)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    ended = _now()
    _check_status(status, " ".join(argv))
    return ended - began


def _import_breakdown() -> dict[str, Any]:
    """`python -X importtime -c 'import nsconfine'`: its total and the costliest modules."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import nsconfine"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    parsed: list[tuple[int, int, str]] = []
    for line in lines[1:]:  # the first is the header
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|")
        parsed.append((int(self_us), int(cumulative_us), name.rstrip()))
    site_end = next((i for i, (_, _, name) in enumerate(parsed) if name.strip() == "site"), -1)
    ours = next(
        ((i, c) for i, (_, c, name) in enumerate(parsed) if name.strip() == "nsconfine"),
        (len(parsed) - 1, 0),
    )
    pulled = parsed[site_end + 1 : ours[0] + 1]
    top = sorted(pulled, key=lambda item: -item[0])[:10]
    return {
        "cumulative_us": ours[1],
        "modules": len(pulled),
        "top_self_us": [{"module": name.strip(), "self_us": s} for s, _, name in top],
    }


def bench_cli(results: Results, w: World, config: Config) -> None:
    """Whole-process `nsconfine run` against python's start-up plus the bwrap floor."""
    python = sys.executable
    user = ["--user", SESSION_USER] if os.geteuid() == 0 else []
    session_args = ["--workspace", w.workspace, "--run-dir", w.run_dir, *user, "--", *TRUE_ARGV]
    commands: dict[str, tuple[list[str], str]] = {
        "cli.run": (
            [python, "-m", "nsconfine", "run", *session_args],
            "python -m nsconfine run ... -- /bin/true",
        ),
        "cli.python": ([python, "-c", "pass"], "python -c pass"),
        "cli.import": ([python, "-c", "import nsconfine"], "python -c 'import nsconfine'"),
    }
    script = os.path.join(os.path.dirname(python), "nsconfine")
    if os.access(script, os.X_OK):
        commands["cli.script"] = (
            [script, "run", *session_args],
            f"console script {script} run ... -- /bin/true",
        )
    launchers = Launchers(w.bwrap, w.session().plan())
    rounds = config.few

    # The environment as given, and with a bytecode cache (PYTHONDONTWRITEBYTECODE=1 makes
    # every start compile nsconfine from source; an installed package has its .pyc files).
    as_given = dict(os.environ)
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = os.path.join(w.root, "pycache")
    environments = {"": as_given, ".pyc": cached}

    def whole_process(argv: Sequence[str], env: dict[str, str]) -> Callable[[], int]:
        return lambda: _time_process(argv, w.devnull, env)

    tasks = [
        Task(name + suffix, whole_process(argv, env), rounds)
        for name, (argv, _) in commands.items()
        for suffix, env in environments.items()
    ]
    tasks.append(Task("cli.bwrap", until_exit(launchers.floor, w.devnull), rounds))
    _progress(f"command line: {len(tasks)} commands x {rounds} rounds")
    samples = interleave(tasks)
    for suffix in environments:
        for name, (_, note) in commands.items():
            baseline = None if name == "cli.python" else "cli.python" + suffix
            shown = note + (" (bytecode cache)" if suffix else "")
            results.add(
                Row(
                    "cli",
                    name + suffix,
                    "ms",
                    _ms(samples[name + suffix]),
                    baseline=baseline,
                    note=shown,
                )
            )
    results.add(
        Row(
            "cli",
            "cli.bwrap",
            "ms",
            _ms(samples["cli.bwrap"]),
            note="bwrap floor: the same plan via os.posix_spawn, to exit",
        )
    )
    bw = results.p("cli.bwrap")
    assert bw is not None
    for suffix in environments:
        key = suffix.replace(".", "_")
        run, py, imp = (results.p(n + suffix) for n in ("cli.run", "cli.python", "cli.import"))
        assert run is not None
        assert py is not None
        assert imp is not None
        results.derived[f"cli_overhead{key}_ms"] = run - (py + bw)
        results.derived[f"import{key}_ms"] = imp - py
        script_p50 = results.p("cli.script" + suffix)
        if script_p50 is not None:
            results.derived[f"cli_script_overhead{key}_ms"] = script_p50 - (py + bw)
    results.derived["import_breakdown"] = _import_breakdown()


# ---------------------------------------------------------------- targets


@dataclass(frozen=True, slots=True)
class Target:
    """A goal of issue 3, judged on this run's numbers."""

    name: str
    goal: str
    value: float
    limit: float
    unit: str
    higher_is_better: bool = False

    def to_json(self) -> dict[str, Any]:
        met = self.value >= self.limit if self.higher_is_better else self.value <= self.limit
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

    def ratio(name: str, baseline: str, key: str) -> float | None:
        ours, theirs = results.p(name, key), results.p(baseline, key)
        return None if ours is None or theirs is None else ours / theirs

    for mode in ("exec", "exit"):
        for key in ("p50", "p99"):
            value = ratio(f"launch.{mode}.nsconfine", f"launch.{mode}.floor", key)
            if value is not None:
                found.append(
                    Target(
                        f"spawn-{mode}-{key}-vs-floor",
                        f"nsconfine.spawn {key} (to {mode}) <= 1.10x the bwrap floor",
                        value,
                        1.10,
                        "x",
                    )
                )
    layered = ratio("layers.pool.on", "layers.pool.off", "p50")
    if layered is not None:
        found.append(
            Target(
                "pool-layers-p50",
                "Pool warm launch p50 with the layers <= 1.2x without them",
                layered,
                1.2,
                "x",
            )
        )
    warm = results.p("pool.exec.warm", "p50")
    if warm is not None:
        found.append(
            Target("pool-warm-p50", "Pool warm launch p50 (to exec) <= 0.5 ms", warm, 0.5, "ms")
        )
    sizes = sorted(
        {name.split(".")[1] for name in results.rows if name.startswith("size.")},
        key=lambda label: int(label[:-3]) * (1024 if label.endswith("GiB") else 1),
    )
    for label in sizes:
        value = ratio(f"size.{label}.naive", f"size.{label}.nsconfine", "p50")
        if value is not None:
            limit = 1.5 if label.endswith("GiB") else 1.0
            found.append(
                Target(
                    f"faster-than-naive-{label}",
                    f"naive p50 / nsconfine p50 at {label} >= {limit}",
                    value,
                    limit,
                    "x",
                    higher_is_better=True,
                )
            )
    plan_default, plan_big = results.p("plan.binds-0"), results.p("plan.binds-1000")
    if plan_default is not None:
        found.append(
            Target(
                "plan-default",
                "default plan build+compile p50 <= 200 us",
                plan_default,
                200.0,
                "us",
            )
        )
    if plan_big is not None:
        found.append(
            Target(
                "plan-1000-binds",
                "1000-bind plan build+compile p50 <= 20 ms",
                plan_big / 1000,
                20.0,
                "ms",
            )
        )
    value = ratio("binds.nsconfine.1000", "binds.nsconfine.0", "p50")
    if value is not None:
        found.append(
            Target(
                "launch-1000-binds",
                "1000-bind launch p50 <= 10x the 0-bind launch",
                value,
                10.0,
                "x",
            )
        )
    for key, label in (("", ""), ("_pyc", " (bytecode cache)")):
        if f"import{key}_ms" in results.derived:
            found.append(
                Target(
                    "import" + key.replace("_", "-"),
                    f"import nsconfine <= 20 ms (p50 over python -c pass){label}",
                    results.derived[f"import{key}_ms"],
                    20.0,
                    "ms",
                )
            )
        if f"cli_overhead{key}_ms" in results.derived:
            found.append(
                Target(
                    "cli-overhead" + key.replace("_", "-"),
                    f"nsconfine run - (python + bwrap floor) p50 <= 15 ms{label}",
                    results.derived[f"cli_overhead{key}_ms"],
                    15.0,
                    "ms",
                )
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

SECTION_FUNCTIONS: Final[dict[str, Callable[[Results, World, Config], None]]] = {
    "launch": bench_launch,
    "pool": bench_pool,
    "layers": bench_layers,
    "checks": bench_checks,
    "plan": bench_plan,
    "binds": bench_binds,
    "concurrency": bench_concurrency,
    "memory": bench_memory,
    "size": bench_size,
    "cli": bench_cli,
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
        "--only", metavar="SECTIONS", help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    parser.add_argument("--size-child", type=int, metavar="MIB", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; return the exit status."""
    # The child interpreters it times must import the installed nsconfine: run from a clone,
    # `python -m`/`-c` would put the source tree (without its compiled module) first.
    os.environ["PYTHONSAFEPATH"] = "1"
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
            f"{', '.join(SECTIONS)})",
            file=sys.stderr,
        )
        return 64
    if arguments.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
