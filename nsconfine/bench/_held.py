"""What a launcher holds and what a session delivers, for the soak: snapshots of the
launcher's fds, RSS, threads, descendants, mounts and files; the payloads whose status and
output are known; one session launched and checked."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import psutil

import nsconfine
from nsconfine.bench._core import children

PR_SET_CHILD_SUBREAPER: Final = 36
OUTPUT_BYTES: Final = 100_000  # more than a pipe holds: the launcher must read while it runs
SETTLE_SECONDS: Final = 10.0  # how long a session's processes may take to go after its end
# The launcher's RSS may grow by this much over a soak (allocator arenas of 32 threads, the
# interpreter's caches) before it counts as a leak: under 1 KiB per launch of a full soak.
RSS_SLACK_KIB: Final = 16 * 1024
# Writes $1 bytes of "$0\n" lines and exits with $2.
OUTPUT_SCRIPT: Final = 'yes "$0" | head -c "$1"; exit "$2"'


def set_subreaper(on: bool) -> None:
    """Make this process the one whatever its descendants orphan is reparented to."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def descendants() -> dict[int, str]:
    """Every process below this one, and its status (psutil's: "zombie", "sleeping", ...)."""
    found: dict[int, str] = {}
    for process in psutil.Process().children(recursive=True):
        try:
            found[process.pid] = process.status()
        except psutil.NoSuchProcess:
            continue
    return found


def _mounts() -> set[str]:
    with open("/proc/self/mountinfo") as file:
        return {" ".join(line.split()[:5]) for line in file}


@dataclass(slots=True)
class Watched:
    """The files a launcher may leave behind: everything under these trees (workspaces, run
    directories, the records of mount points), and what nsconfine makes in /tmp (the canary's
    directories, the records of an account without a home)."""

    trees: list[str]

    def files(self) -> set[str]:
        found: set[str] = set()
        for tree in self.trees:
            for top, directories, files in os.walk(tree):
                found.update(os.path.join(top, name) for name in [*directories, *files])
        ours = ("nsconfine-canary-", f"nsconfine-{os.geteuid()}")
        found.update(
            os.path.join("/tmp", name) for name in os.listdir("/tmp") if name.startswith(ours)
        )
        return found


@dataclass(slots=True)
class Snapshot:
    """What the launcher holds at one moment."""

    fds: int
    rss_kib: float
    threads: int
    processes: set[int]
    zombies: set[int]
    mounts: set[str]
    files: set[str]

    def settled(self, before: Snapshot, watched: Watched) -> Snapshot:
        """This snapshot, its new files looked at again a moment later: a file another
        launcher on the host has in /tmp for a moment (its canary) is not this one's."""
        if self.files - before.files:
            time.sleep(2)
            self.files = watched.files()
        return self

    @classmethod
    def take(cls, watched: Watched) -> Snapshot:
        gc.collect()
        me = psutil.Process()
        below = descendants()
        return cls(
            fds=me.num_fds(),
            rss_kib=me.memory_info().rss / 1024,
            threads=me.num_threads(),
            processes={pid for pid, status in below.items() if status != "zombie"},
            zombies={pid for pid, status in below.items() if status == "zombie"},
            mounts=_mounts(),
            files=watched.files(),
        )


LEAK_UNITS: Final = {
    "fds": "fds",
    "rss": "KiB",
    "threads": "threads",
    "processes": "processes",
    "zombies": "zombies",
    "mounts": "mounts",
    "files": "files",
}


def leaks(before: Snapshot, after: Snapshot) -> tuple[dict[str, float], list[str]]:
    """The growth of each resource, and what of it is a leak (named, for the report)."""
    grown = {
        "fds": float(after.fds - before.fds),
        "rss": after.rss_kib - before.rss_kib,
        "threads": float(after.threads - before.threads),
        "processes": float(len(after.processes - before.processes)),
        "zombies": float(len(after.zombies - before.zombies)),
        "mounts": float(len(after.mounts - before.mounts)),
        "files": float(len(after.files - before.files)),
    }
    problems = [
        f"{name} +{value:g}" for name, value in grown.items() if name != "rss" and value > 0
    ]
    if grown["rss"] > RSS_SLACK_KIB:
        problems.append(f"rss +{grown['rss']:.0f} KiB")
    problems += [f"new mount {line}" for line in sorted(after.mounts - before.mounts)[:3]]
    problems += [f"new file {path}" for path in sorted(after.files - before.files)[:3]]
    return grown, problems


def settle(before: set[int], timeout: float = SETTLE_SECONDS) -> list[str]:
    """Wait for every descendant not in `before` to end, reaping those reparented to this
    process; kill and name what is still alive after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        left = {pid: status for pid, status in descendants().items() if pid not in before}
        for pid, status in left.items():
            if status == "zombie" and pid in children(os.getpid()):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        alive = {pid for pid, status in left.items() if status != "zombie"}
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    named = []
    for pid in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(pid)
            named.append(f"{process.name()}[{pid}] of {process.username()} alive")
            process.kill()
    if alive:
        settle(before, 2.0)
    return named


# ---------------------------------------------------------------- one session


@dataclass(frozen=True, slots=True)
class Payload:
    """A command with the exit status and the output it must give."""

    argv: tuple[str, ...]
    status: int
    output: bytes


def payload(index: int) -> Payload:
    """The index-th launch of a run: /bin/true, /bin/false, or one writing OUTPUT_BYTES."""
    kind = index % 3
    if kind == 0:
        return Payload(("/bin/true",), 0, b"")
    if kind == 1:
        return Payload(("/bin/false",), 1, b"")
    token, status = f"soak-{index}", index % 256
    line = (token + "\n").encode()
    output = (line * (OUTPUT_BYTES // len(line) + 1))[:OUTPUT_BYTES]
    argv = ("/bin/sh", "-c", OUTPUT_SCRIPT, token, str(OUTPUT_BYTES), str(status))
    return Payload(argv, status, output)


class Launcher(Protocol):
    """spawn with its plan given, or a Pool's launch."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
    ) -> nsconfine.Sandbox: ...


class Pipe:
    """A pipe whose ends are closed once each (a second close could hit a reused number)."""

    def __init__(self) -> None:
        self.read, self.write = os.pipe2(os.O_CLOEXEC)

    def close_write(self) -> None:
        if self.write >= 0:
            os.close(self.write)
            self.write = -1

    def close_read(self) -> None:
        if self.read >= 0:
            os.close(self.read)
            self.read = -1

    def __enter__(self) -> Pipe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close_write()
        self.close_read()


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def lost_bytes(expected: bytes, received: bytes) -> int:
    """Bytes of expected that did not arrive (all of it if what came is not its start)."""
    if received == expected[: len(received)]:
        return len(expected) - len(received)
    return len(expected)


@dataclass(slots=True)
class Outcome:
    """One launch: what went wrong with it (nothing, when problem is None)."""

    lost: int = 0
    problem: str | None = None


def one_session(launch: Launcher, index: int, devnull: int, log: int) -> Outcome:
    """Run the index-th payload; its status and output must be the expected ones."""
    want = payload(index)
    with Pipe() as out:
        try:
            sandbox = launch(list(want.argv), stdin=devnull, stdout=out.write, stderr=log)
            out.close_write()
            received = read_all(out.read)
            status = sandbox.wait()
        except Exception as error:
            return Outcome(len(want.output), f"launch {index}: {type(error).__name__}: {error}")
    lost = lost_bytes(want.output, received)
    if status != want.status or received != want.output:
        return Outcome(
            lost, f"launch {index}: status {status} (want {want.status}), {lost} bytes lost"
        )
    return Outcome()
