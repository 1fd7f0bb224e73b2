"""The bench's parts every section uses: rows and results, the round-robin, the launchers
compared, the world (a workspace and files) and the configuration."""

from __future__ import annotations

import ctypes
import fcntl
import gc
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

import nsconfine
from nsconfine._kernel import layers as _layers
from nsconfine._kernel import syscalls as _syscalls
from nsconfine._kernel.accounts import run_as
from nsconfine._launch.stage import open_entry_fds
from nsconfine._plan.bwrap_args import (
    ARGS_FD,
    FIRST_DATA_FD,
    INFO_FD,
    SECCOMP_FD,
    bwrap_options,
    encode_options,
)
from nsconfine._plan.model import Plan, has_own_network
from nsconfine._plan.protect import refreshed
from nsconfine._preflight.checks import proven_bwrap

if TYPE_CHECKING:
    from nsconfine._plan.options import Network

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
    "scale",
    "size",
    "cli",
    "network",
)
EXEC_ARGV: Final = ("/bin/echo", "-n", "x")  # its first output is the proof that it exec'd
TRUE_ARGV: Final = ("/bin/true",)
# Its output is the wall clock as it exits (date writes at exit, then returns from main).
END_ARGV: Final = ("/bin/date", "+%s%N")
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


def floor_plan(plan: Plan) -> Plan:
    """The plan a launch of plan runs, with the empty protected files and directories that
    nsconfine makes at each launch (and removes after) made once, as the floor's bwrap needs
    them: and those they then protect in turn (a .claude directory protects names within)."""
    for _ in range(4):
        _make_stubs(plan)
        again = refreshed(plan)
        if again is plan:
            break
        plan = again
    return plan


def _make_stubs(plan: Plan) -> None:
    owner = (plan.user.uid, plan.user.gid) if os.geteuid() == 0 else None
    for entry in plan.entries:
        if entry.stub is not None and not os.path.lexists(entry.source):
            make_owned(entry.source, None if entry.stub == "dir" else "", owner)


def make_owned(path: str, content: str | None, owner: tuple[int, int] | None) -> None:
    """Make the directory (content None) or the file at path, whose parent is there, and give
    it to owner: with no symlink followed on the way or at it (the bench, run as root, makes
    its world in directories the sessions' account owns, which can plant one at any moment;
    by path, root wrote and chowned where it led). OSError if something is in the way."""
    parent = _syscalls.open_no_symlinks(os.path.dirname(path))
    try:
        name = os.path.basename(path)
        if content is None:
            os.mkdir(name, 0o755, dir_fd=parent)
            flags = os.O_RDONLY | os.O_DIRECTORY
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        made = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=parent)
        try:
            if content:
                with open(made, "w", closefd=False) as file:
                    file.write(content)
            if owner is not None:
                os.fchown(made, *owner)
        finally:
            os.close(made)
    finally:
        os.close(parent)


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
        self.floor_plan = floor_plan(plan)
        # What the bench wrote, written out: on this VM's ext4, making a file in a directory
        # near unwritten data costs 0.2-0.9 ms instead of ~10 us, and only nsconfine (which
        # makes the mount points of missing protected paths) pays it. The bench's own set-up
        # must not be a launch's cost (benchmarks/README.md says what a written one costs).
        os.sync()
        # bwrap resolves each bind's path itself: its own cost, the floor's.
        self.options = without_info(bwrap_options(self.floor_plan, bind_fds=False))
        self.encoded = encode_options(self.options)
        own_network = has_own_network(plan.network)
        self.seccomp = _layers.seccomp_program(plan.nested_userns is not None, own_network) or b""
        # As root, bwrap runs as the session's account in every variant, as nsconfine runs it.
        self.ids = (plan.user.uid, plan.user.gid) if os.geteuid() == 0 else None

    def nsconfine(self, argv: Sequence[str], stdout: int) -> Waiter:
        """nsconfine.spawn: lint, pins, proven bwrap, launch with the namespace check."""
        return nsconfine.spawn(self.plan, list(argv), stdout=stdout).wait

    def floor(self, argv: Sequence[str], stdout: int) -> Waiter:
        """The same bwrap vector and seccomp filter, bwrap spawned directly (a vfork-style
        clone, as root after taking the session's ids): no reaper, no shim, no check."""
        pid = self.floor_pid(argv, stdout)
        return lambda: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    def floor_pid(self, argv: Sequence[str], stdout: int, stderr: int = -1) -> int:
        """floor's bwrap, started: its pid. stderr -1: the bench's own."""
        made = [_memfd("bench-args", self.encoded)]
        try:
            # fds 3..8 as a launch has them (4, 5, 7 and 8 unused here), then the data fds.
            filter_fd = _memfd("bench-seccomp", self.seccomp)
            made += [made[0], made[0], filter_fd, made[0], made[0]]
            assert made.index(filter_fd) + ARGS_FD == SECCOMP_FD
            assert len(made) + ARGS_FD == FIRST_DATA_FD
            # The data memfds and copied files, as a launch does.
            open_entry_fds(self.floor_plan, made)
            flags, uid, gid = 0, 0, 0
            if self.ids is not None:
                flags, (uid, gid) = _syscalls.SPAWN_SET_IDS, self.ids
            pid = _syscalls.spawn(
                os.fsencode(self.bwrap),
                [os.fsencode(a) for a in (self.bwrap, "--args", str(ARGS_FD), "--", *argv)],
                (),
                stdout=stdout,
                stderr=stderr,
                pass_fds=made,
                flags=flags,
                uid=uid,
                gid=gid,
            )
        finally:
            for fd in set(made):
                os.close(fd)
        return pid

    def naive(self, argv: Sequence[str], stdout: int) -> Waiter:
        """subprocess.Popen with pass_fds and a preexec_fn setting PDEATHSIG via ctypes."""
        data_fds: list[int] = []
        try:
            open_entry_fds(self.floor_plan, data_fds)
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


@dataclass(slots=True)
class Burst:
    """Launches in flight: a call is one round, `level` threads started together on a barrier,
    thread i taking `each` samples of sample(i) in turn; it returns the round's wall time (the
    barrier to the last thread's end, ns). Every round's samples are kept, in order, so that
    a round-robin's warm-up rounds can be left out (kept)."""

    level: int
    each: int
    sample: Callable[[int], int]
    rounds: list[list[int]] = field(default_factory=list)

    def __call__(self) -> int:
        barrier = threading.Barrier(self.level + 1)
        measured: list[int] = []
        failures: list[BaseException] = []

        def worker(index: int) -> None:
            try:
                barrier.wait()
                for _ in range(self.each):
                    measured.append(self.sample(index))
            except BaseException as failure:  # raised by the calling thread below
                failures.append(failure)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(self.level)]
        for thread in threads:
            thread.start()
        barrier.wait()
        began = _now()
        for thread in threads:
            thread.join()
        wall = _now() - began
        if failures:
            raise failures[0]
        self.rounds.append(measured)
        return wall

    def kept(self, warmup: int) -> list[int]:
        """The samples of every round after the first warmup."""
        return [value for measured in self.rounds[warmup:] for value in measured]


class Live(Protocol):
    """A running session the bench holds: a Sandbox, or a floor's bwrap (FloorSession)."""

    def kill(self) -> None: ...

    def wait(self) -> int: ...


LiveT = TypeVar("LiveT", bound=Live)


def children(pid: int) -> list[int]:
    """pid's children, from /proc (every thread's): cheaper than psutil, for tight loops."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as file:
                found += [int(word) for word in file.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


@dataclass(slots=True)
class FloorSession:
    """A floor's bwrap (Launchers.floor_pid), killed and reaped as a Sandbox is."""

    pid: int
    ended: int | None = None  # its wait status, when kill() found it ended and reaped it

    def kill(self) -> None:
        """End its whole sandbox: its init killed (the floor's bwrap, killed alone, leaves its
        sandbox running, as nsconfine's reaper would not), then the bwrap itself. The bwrap is
        stopped first, so that it cannot clone the init between the look for it and the kill:
        one in about 1,000 killed as it started left its init running, pid 1 of its namespace,
        holding the bench's stderr."""
        os.kill(self.pid, signal.SIGSTOP)
        _, status = os.waitpid(self.pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            self.ended = status  # its command had ended, and its sandbox with it
            return
        # Children of a stopped process: none can be reaped (and its pid reused) meanwhile.
        inits = [fd for pid in children(self.pid) if (fd := _pidfd(pid)) is not None]
        try:
            for init in inits:
                signal.pidfd_send_signal(init, signal.SIGKILL)
            os.kill(self.pid, signal.SIGKILL)
            for init in inits:  # its init ended: no process of its pid namespace is left
                if not select.select([init], [], [], 10)[0]:
                    raise BenchError("a floor's sandbox outlived its kill by 10 s")
        finally:
            for init in inits:
                os.close(init)

    def wait(self) -> int:
        status = self.ended if self.ended is not None else os.waitpid(self.pid, 0)[1]
        return os.waitstatus_to_exitcode(status)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:  # it has ended since
        return None


def sleeper(plan: Plan, devnull: int) -> Callable[[], nsconfine.Sandbox]:
    """A function starting one idle session of plan (/bin/sleep, its stdio on devnull)."""

    def start() -> nsconfine.Sandbox:
        argv = list(SLEEP_ARGV)
        return nsconfine.spawn(plan, argv, stdin=devnull, stdout=devnull, stderr=devnull)

    return start


@contextmanager
def live(count: int, start: Callable[[], LiveT]) -> Iterator[list[LiveT]]:
    """count sessions started one after another and held; on leaving, all are killed, then
    all reaped (each wait() returns once its session has ended)."""
    started: list[LiveT] = []
    try:
        for _ in range(count):
            started.append(start())
        yield started
    finally:
        for session in started:
            session.kill()
        for session in started:
            session.wait()


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


def until_end(start: Starter) -> Callable[[], int]:
    """Nanoseconds from the payload's exit (the wall clock it writes as it exits) to its exit
    status, waited for: the end of a session, which the call's own start does not count in."""

    def sample() -> int:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            waiter = start(END_ARGV, write_end)
            os.close(write_end)
            write_end = -1
            status = waiter()
            ended = time.time_ns()
            written = os.read(read_end, 64)
        finally:
            if write_end >= 0:
                os.close(write_end)
            os.close(read_end)
        _check_status(status, "date")
        if not written.strip().isdigit():
            raise BenchError(f"date wrote {written!r}, not the time in nanoseconds")
        return ended - int(written)

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
    owner: tuple[int, int] | None  # the sessions' account (uid, gid) when the bench runs as root

    def session(
        self,
        binds: int = 0,
        network: Network | None = None,
        allow_hosts: Sequence[str] = (),
        *,
        ro: Sequence[str] | None = None,
        own: int | None = None,
    ) -> nsconfine.Session:
        """The bench's session with the first binds of its files read-only (or the files
        ro), on the bench's workspace or, given own, on a workspace and run directory of its
        own (the own-th, made on first use)."""
        workspace, run_dir = self.workspace, self.run_dir
        if own is not None:
            workspace = self.make(os.path.join("own", f"ws{own}"))
            run_dir = self.make(os.path.join("own", f"run{own}"))
        return nsconfine.Session(
            workspace=workspace,
            run_dir=run_dir,
            ro=self.files[:binds] if ro is None else ro,
            user=SESSION_USER if self.owner is not None else None,
            network=network,
            allow_hosts=allow_hosts,
        )

    def make(self, relative: str, content: str | None = None) -> str:
        """A directory (or, given content, a file) at relative under the root, with its
        missing parents, owned by the sessions' account; its path."""
        path = os.path.join(self.root, relative)
        if content is None and os.path.isdir(path) and not os.path.islink(path):
            return path
        if os.path.dirname(relative):
            self.make(os.path.dirname(relative))
        make_owned(path, content, self.owner)
        return path


@contextmanager
def world(files: int) -> Iterator[World]:
    """A temporary directory holding the bench's session, removed afterwards."""
    root = tempfile.mkdtemp(prefix="nsconfine-bench-")
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        owner = None
        if os.geteuid() == 0:  # the sessions' account owns the bench's world
            os.chmod(root, 0o755)
            account = run_as(SESSION_USER)
            owner = (account.uid, account.gid)
            os.chown(root, *owner)
        w = World(root, "", "", [], devnull, proven_bwrap(), owner)
        w.workspace, w.run_dir = w.make("ws"), w.make("run")
        w.files = [w.make(os.path.join("binds", f"f{i:04d}"), f"{i}\n") for i in range(files)]
        yield w
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
    def concurrency_levels(self) -> tuple[int, ...]:
        return (1, 8, 32, 128)

    def concurrency_each(self, level: int) -> int:
        """Launches each thread makes in a round at level in flight: at least 96 a round
        (smoke 32), and two a thread at the most in flight (smoke one)."""
        return max(1 if self.smoke else 2, math.ceil((32 if self.smoke else 96) / level))

    @property
    def concurrency_rounds(self) -> int:
        return 1 if self.smoke else 3

    @property
    def live_sessions(self) -> int:
        return 5 if self.smoke else 50

    @property
    def held_sessions(self) -> int:
        """Live sessions of the scale section's launcher (smoke: a few, for the rows)."""
        return 10 if self.smoke else 150

    @property
    def runner_file_rounds(self) -> int:
        return 2 if self.smoke else 10

    @property
    def pool_runs(self) -> int:
        """Repetitions of the pool section's warm launch against a bare spawn, each with a
        fresh Pool: its goal is judged on all of them."""
        return 5

    @property
    def pool_in_flight_rounds(self) -> int:
        return 1 if self.smoke else 10

    @property
    def sizes_mib(self) -> tuple[int, ...]:
        return (20, 256) if self.smoke else (20, 1024)

    @property
    def requests(self) -> int:
        return 20 if self.smoke else 1000

    @property
    def download_mib(self) -> int:
        return 4 if self.smoke else 256

    @property
    def download_rounds(self) -> int:
        return 2 if self.smoke else 10

    @property
    def memory_rounds(self) -> int:
        return 1 if self.smoke else 3
