"""The soak's faults: bwrap killed at each stage, the launcher killed, hostile payloads, no
fds, a full file system, and a bwrap changed after its proof.

Each scenario must end in a clear refusal (an NsconfineError and its code) or the status the
payload gives, leave nothing of its sessions alive and no mount or file behind, and deliver
every byte its sessions wrote. bwrap is killed before its namespaces exist by a wrapper that
kills itself before it execs bwrap (NSCONFINE_BWRAP, in a root-owned directory); during the
set-up by a thread that watches for the sandbox's init; staged and running, from psutil.
Launchers that must die, run out of fds or meet a full file system are child interpreters
running child_main.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import psutil

import nsconfine
from nsconfine.bench._core import SESSION_USER, World, _progress, children
from nsconfine.bench._held import (
    SETTLE_SECONDS,
    Pipe,
    Snapshot,
    Watched,
    leaks,
    lost_bytes,
    one_session,
    read_all,
    set_subreaper,
    settle,
)

CLEAR: Final = ("sandbox-unavailable", "plan-refused", "usage")  # the codes of a refusal
TREE_SCRIPT: Final = (
    'trap "" TERM; for i in 1 2 3 4 5 6 7 8; do (for j in $(seq 25); do sleep 1000 & done; '
    "wait) & done; sleep 0.5; echo ready; wait"
)


@dataclass(slots=True)
class Fault:
    """One fault: how it ended, what it lost and what it left."""

    name: str
    outcome: str = ""
    lost: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def survived(self) -> bool:
        return not self.problems and self.lost == 0


def refusal(call: Callable[[], object]) -> str:
    """Run call, which must refuse with an NsconfineError: its code, or a problem."""
    try:
        result = call()
    except nsconfine.NsconfineError as error:
        return error.code
    if isinstance(result, nsconfine.Sandbox):
        result.kill()
        result.wait()
    raise AssertionError(f"it ran ({result!r}) where it had to be refused")


def clear(outcome: str) -> bool:
    """Is outcome the code of a refusal?"""
    return outcome in CLEAR


class Faults:
    """The fault scenarios, run one at a time in this launcher (or a child launcher)."""

    def __init__(self, w: World, root: str, flood_mib: int, log: int) -> None:
        self.w = w
        self.root = root  # root-owned, readable by all: fake bwraps live here
        self.flood_mib = flood_mib
        self.log = log
        self.plan = w.session().plan()
        self.results: list[Fault] = []

    def run(self, name: str, scenario: Callable[[Fault], None], watched: Watched) -> None:
        fault = Fault(name)
        before = Snapshot.take(watched)
        try:
            scenario(fault)
        except Exception as error:  # a scenario's surprise is a fault not survived
            fault.problems.append(f"{type(error).__name__}: {error}")
        fault.problems += settle(before.processes | before.zombies)
        after = Snapshot.take(watched).settled(before, watched)
        _, leaked = leaks(before, after)
        fault.problems += [p for p in leaked if not p.startswith(("rss", "threads", "fds"))]
        if after.fds > before.fds:
            fault.problems.append(f"fds +{after.fds - before.fds}")
        verdict = "survived" if fault.survived else "FAILED"
        _progress(f"soak fault {name}: {verdict}: {fault.outcome} {'; '.join(fault.problems)}")
        self.results.append(fault)

    # ------------------------------------------------------------ bwrap killed

    @contextlib.contextmanager
    def fake_bwrap(self, script: str) -> Iterator[str]:
        """NSCONFINE_BWRAP pointing at a root-owned script wrapping the real bwrap."""
        path = os.path.join(self.root, "bwrap")
        with open(path, "w") as file:
            file.write(f"#!/bin/sh\n{script}\n")
        os.chmod(path, 0o755)
        saved = os.environ.get("NSCONFINE_BWRAP")
        os.environ["NSCONFINE_BWRAP"] = path
        try:
            yield path
        finally:
            if saved is None:
                del os.environ["NSCONFINE_BWRAP"]
            else:
                os.environ["NSCONFINE_BWRAP"] = saved
            os.unlink(path)

    def bwrap_killed_before_namespaces(self, fault: Fault) -> None:
        """bwrap's process dies before it has made a namespace: spawn and a Pool refuse."""
        trigger = os.path.join(self.root, "die")
        script = f'[ -e {trigger} ] && kill -KILL $$\nexec {self.w.bwrap} "$@"'
        with self.fake_bwrap(script):
            nsconfine.spawn(self.plan, ["/bin/true"], stdout=self.w.devnull).wait()  # proven
            open(trigger, "w").close()
            try:
                spawned = refusal(lambda: self.spawn_quiet(["/bin/true"]))
                with nsconfine.Pool(self.plan) as pool:
                    pooled = refusal(lambda: pool.launch(["/bin/true"], stderr=self.log))
            finally:
                os.unlink(trigger)
        fault.outcome = f"spawn: {spawned}, Pool.launch: {pooled}"
        if not clear(spawned) or not clear(pooled):
            fault.problems.append("no clear refusal")

    def spawn_quiet(
        self,
        argv: Sequence[str],
        *,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
    ) -> nsconfine.Sandbox:
        """spawn, its stdout to /dev/null and its stderr to the log unless given."""
        stdout = self.w.devnull if stdout is None else stdout
        stderr = self.log if stderr is None else stderr
        return nsconfine.spawn(self.plan, list(argv), stdin=stdin, stdout=stdout, stderr=stderr)

    def bwrap_killed_in_setup(self, fault: Fault) -> None:
        """bwrap killed as soon as its sandbox's init exists (namespaces made, mounts being
        built), raced by a watcher thread: each launch refuses, or runs if the kill was late."""
        tries = 10
        stages: dict[str, int] = {}
        outcomes: dict[str, int] = {}
        for _ in range(tries):
            stop = threading.Event()
            hit: list[str] = []

            def watch(stop: threading.Event = stop, hit: list[str] = hit) -> None:
                while not stop.is_set():
                    for reaper in children(os.getpid()):
                        for monitor in children(reaper):
                            inits = children(monitor)
                            if inits:
                                shim = any(children(init) for init in inits)
                                with contextlib.suppress(ProcessLookupError):
                                    os.kill(monitor, signal.SIGKILL)
                                hit.append("shim started" if shim else "namespaces made")
                                return

            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                try:
                    sandbox = self.spawn_quiet(["/bin/true"])
                    outcome = f"ran, status {sandbox.wait()}"
                except nsconfine.NsconfineError as error:
                    outcome = error.code
            finally:
                stop.set()
                watcher.join()
            stage = hit[0] if hit else "missed"
            stages[stage] = stages.get(stage, 0) + 1
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if not clear(outcome) and not outcome.startswith("ran"):
                fault.problems.append(f"killed at {stage}: {outcome}")
        fault.outcome = f"{tries} tries, killed at {stages}: {outcomes}"

    def _bwrap_monitors(self) -> list[psutil.Process]:
        return [
            p
            for p in psutil.Process().children(recursive=True)
            if p.name() == "bwrap"
            and (parent := p.parent()) is not None
            and parent.name() != "bwrap"
        ]

    def staged_bwrap_killed(self, fault: Fault) -> None:
        """A Pool's staged sandbox (the shim waiting for its command) loses bwrap, then its
        pid 1: the next launch runs on a fresh sandbox, status and output whole, or refuses."""
        outcomes = []
        for victim in ("bwrap", "init"):
            with nsconfine.Pool(self.plan) as pool:
                if not pool.wait_staged(30):
                    raise AssertionError("the pool could not stage a sandbox")
                monitors = self._bwrap_monitors()
                if len(monitors) != 1:
                    raise AssertionError(f"{len(monitors)} staged bwraps, not 1")
                target = monitors[0]
                if victim == "init":
                    target = target.children()[0]
                target.kill()
                target.wait(5)
                result = one_session(pool.launch, 2, self.w.devnull, self.log)
                outcomes.append(f"{victim} killed: {result.problem or 'the next launch ran'}")
                if result.problem is not None:  # (a command that never ran wrote nothing)
                    fault.problems.append(f"{victim} killed: {result.problem}")
        fault.outcome = "; ".join(outcomes)

    def bwrap_killed_running(self, fault: Fault) -> None:
        """bwrap killed while the command runs (spawn and Pool): the handle ends, everything
        inside dies, and what the command wrote before arrives."""
        written = b"written before the kill\n"
        argv = ["/bin/sh", "-c", f"echo '{written.decode().strip()}'; exec sleep 1000"]
        results = []
        with nsconfine.Pool(self.plan) as pool:
            for name, launch in (("spawn", self.spawn_quiet), ("pool", pool.launch)):
                with Pipe() as out:
                    sandbox = launch(argv, stdout=out.write, stderr=self.log)
                    out.close_write()
                    received = os.read(out.read, len(written))  # it has written: kill bwrap
                    inside = psutil.Process(sandbox.pid).children(recursive=True)
                    [monitor] = [p for p in inside if p.ppid() == sandbox.pid]
                    monitor.kill()
                    status = sandbox.wait(SETTLE_SECONDS)
                    received += read_all(out.read)
                outlived = psutil.wait_procs(inside, timeout=SETTLE_SECONDS)[1]
                results.append(f"{name}: status {status}")
                fault.lost += lost_bytes(written, received)
                if outlived:
                    fault.problems.append(f"{name}: {len(outlived)} processes outlived it")
        fault.outcome = ", ".join(results)

    # ------------------------------------------------------------ hostile payloads

    def tree_ignoring_term(self, fault: Fault) -> None:
        """200 sleepers in 8 subshells, all ignoring SIGTERM: terminate() leaves them and
        wait(timeout) times out, then kill() ends them all; kill() alone, and leaving `with`
        (a Pool's session), too."""
        results = []
        with nsconfine.Pool(self.plan) as pool:
            for how in ("terminate-wait-kill", "kill", "pool-with-exit"):
                launch = pool.launch if how.startswith("pool") else self.spawn_quiet
                with Pipe() as out:
                    sandbox = launch(
                        ["/bin/sh", "-c", TREE_SCRIPT], stdout=out.write, stderr=self.log
                    )
                    out.close_write()
                    ready = os.read(out.read, 6)
                    tree = psutil.Process(sandbox.pid).children(recursive=True)
                    sleepers = sum(1 for p in tree if p.name() == "sleep")
                    if how == "terminate-wait-kill":
                        sandbox.terminate()
                        try:
                            sandbox.wait(timeout=1.0)
                            fault.problems.append("the tree ended on a SIGTERM it ignores")
                        except TimeoutError:
                            pass
                        sandbox.kill()
                    elif how == "kill":
                        sandbox.kill()
                    else:
                        with sandbox:
                            pass
                    status = sandbox.wait()
                    rest = read_all(out.read)
                alive = [p for p in tree if p.is_running() and p.status() != "zombie"]
                results.append(f"{how}: {sleepers} sleepers, status {status}")
                fault.lost += lost_bytes(b"ready\n", ready + rest)
                if sleepers < 200:
                    fault.problems.append(f"{how}: only {sleepers} sleepers started")
                if alive:
                    fault.problems.append(f"{how}: {len(alive)} of the tree alive after wait()")
        fault.outcome = ", ".join(results)

    def stdout_closed(self, fault: Fault) -> None:
        """The payload writes, closes its stdout and exits 3 later: EOF early, status 3."""
        argv = ["/bin/sh", "-c", "printf before; exec 1>&-; sleep 0.2; exit 3"]
        with Pipe() as out:
            sandbox = self.spawn_quiet(argv, stdout=out.write)
            out.close_write()
            received = read_all(out.read)
            status = sandbox.wait()
        fault.outcome = f"status {status}, {len(received)} bytes"
        fault.lost = lost_bytes(b"before", received)
        if status != 3:
            fault.problems.append(f"status {status}, not 3")

    def stdout_flooded(self, fault: Fault) -> None:
        """The payload writes flood_mib MiB as fast as it can: every byte arrives, in order."""
        size = self.flood_mib << 20
        began = time.monotonic()
        with Pipe() as out:
            argv = ["/usr/bin/head", "-c", str(size), "/dev/zero"]
            sandbox = self.spawn_quiet(argv, stdout=out.write)
            out.close_write()
            received = wrong = 0
            while chunk := os.read(out.read, 1 << 20):
                received += len(chunk)
                wrong += len(chunk) - chunk.count(0)
            status = sandbox.wait()
        rate = received / (1 << 20) / (time.monotonic() - began)
        fault.outcome = f"status {status}, {received >> 20} MiB at {rate:.0f} MiB/s"
        fault.lost = size - received + wrong
        if status != 0:
            fault.problems.append(f"status {status}")

    def stdin_never_read(self, fault: Fault) -> None:
        """The payload never reads its stdin: the launcher's writes stop with EAGAIN (a full
        pipe), the status comes, and then no process holds the pipe (EPIPE)."""
        results = []
        with nsconfine.Pool(self.plan) as pool:
            for name, launch in (("spawn", self.spawn_quiet), ("pool", pool.launch)):
                with Pipe() as into:
                    argv = ["/bin/sh", "-c", "sleep 0.3; exit 4"]
                    sandbox = launch(argv, stdin=into.read, stdout=self.w.devnull, stderr=self.log)
                    into.close_read()
                    os.set_blocking(into.write, False)
                    written = 0
                    with contextlib.suppress(BlockingIOError):
                        while True:
                            written += os.write(into.write, b"x" * 65536)
                    status = sandbox.wait()
                    try:
                        os.write(into.write, b"x")
                        fault.problems.append(f"{name}: its stdin is still held after it ended")
                    except BrokenPipeError:
                        pass
                results.append(f"{name}: {written} bytes unread, status {status}")
                if status != 4:
                    fault.problems.append(f"{name}: status {status}, not 4")
        fault.outcome = ", ".join(results)

    # ------------------------------------------------------------ bwrap changed after its proof

    def bwrap_changed(self, fault: Fault) -> None:
        """A copy of bwrap, proven by a first launch, then made non-executable, executable by
        root only, replaced by a fake that runs the command unconfined, by /bin/true, and
        removed: each launch is refused, and the fake never runs the command."""
        path = os.path.join(self.root, "bwrap-copy")
        escaped = os.path.join(self.root, "escaped")
        fake = (
            "#!/bin/sh\n"
            f'case "$1" in --help|--version) exec {self.w.bwrap} "$@";; esac\n'
            f"touch {escaped}\nexit 0\n"
        )

        def install(content: bytes | None, mode: int = 0o755) -> None:
            if content is None:
                shutil.copyfile(self.w.bwrap, path + ".new")
            else:
                with open(path + ".new", "wb") as file:
                    file.write(content)
            os.chmod(path + ".new", mode)
            os.rename(path + ".new", path)  # replaced, as a package upgrade replaces it

        saved = os.environ.get("NSCONFINE_BWRAP")
        os.environ["NSCONFINE_BWRAP"] = path
        outcomes = []
        try:
            with open("/bin/true", "rb") as true_file:
                true_binary = true_file.read()
            changes: list[tuple[str, Callable[[], None]]] = [
                ("chmod 0644", lambda: os.chmod(path, 0o644)),
                ("chmod 0700", lambda: os.chmod(path, 0o700)),
                ("a fake", lambda: install(fake.encode())),
                ("/bin/true", lambda: install(true_binary)),
                ("removed", lambda: os.unlink(path)),
            ]
            for name, change in changes:
                install(None)
                self.spawn_quiet(["/bin/true"]).wait()  # proven
                with nsconfine.Pool(self.plan, refill="inline") as pool:
                    change()
                    spawned = refusal(lambda: self.spawn_quiet(["/bin/true"]))
                    # Its staged sandbox was built by the proven bwrap; the next is refused.
                    first = one_session(pool.launch, 0, self.w.devnull, self.log)
                    pooled = refusal(lambda: pool.launch(["/bin/true"], stderr=self.log))
                outcomes.append(f"{name}: spawn {spawned}, Pool {pooled}")
                if not clear(spawned) or not clear(pooled):
                    fault.problems.append(f"{name}: no clear refusal")
                if first.problem is not None:
                    fault.problems.append(f"{name}: the staged launch failed: {first.problem}")
            if os.path.exists(escaped):
                fault.problems.append("the fake bwrap ran a command")
        finally:
            if saved is None:
                del os.environ["NSCONFINE_BWRAP"]
            else:
                os.environ["NSCONFINE_BWRAP"] = saved
            for leftover in (path, path + ".new", escaped):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)
        fault.outcome = "; ".join(outcomes)

    # ------------------------------------------------------------ child launchers

    def child(
        self, scenario: str, *args: str, pass_fds: Sequence[int] = (), unshare: bool = False
    ) -> subprocess.Popen[bytes]:
        """A launcher of its own (child_main), on this world's workspace and run dir."""
        command = [
            sys.executable,
            "-P",
            "-c",
            "import sys; from nsconfine.bench._faults import child_main; "
            "sys.exit(child_main(sys.argv[1:]))",
            scenario,
            self.w.workspace,
            self.w.run_dir,
            *args,
        ]
        if unshare:  # a mount namespace of its own, private: its tmpfs is nobody else's
            command = ["unshare", "--mount", "--propagation", "private", *command]
        return subprocess.Popen(command, stdout=subprocess.PIPE, pass_fds=pass_fds)

    def launcher_killed(self, fault: Fault, how: signal.Signals) -> None:
        """A child launcher with three spawned sessions, a Pool's launched one and a staged
        one, all running, is killed: every session ends, and what they wrote arrives."""
        stubs_before = set(os.listdir(self.w.workspace))
        with Pipe() as out:
            launcher = self.child("launcher", str(out.write), pass_fds=[out.write])
            out.close_write()
            assert launcher.stdout is not None
            report = json.loads(launcher.stdout.readline())
            expected = b"".join(
                f"session {i} running\n".encode() for i in range(report["sessions"])
            )
            received = b""
            deadline = time.monotonic() + SETTLE_SECONDS
            while len(received) < len(expected) and time.monotonic() < deadline:
                received += os.read(out.read, 4096)
            launcher.send_signal(how)
            launcher.wait()
            # EOF: no process holds the sessions' stdout any more.
            if not select.select([out.read], [], [], SETTLE_SECONDS)[0]:
                fault.problems.append("the sessions' stdout is still held")
            else:
                received += read_all(out.read)
        fault.lost = lost_bytes(expected, b"".join(sorted(received.splitlines(keepends=True))))
        # The mount points its sessions made stay (docs/limits.md) until the next
        # session of the workspace ends: run one.
        left = set(os.listdir(self.w.workspace)) - stubs_before
        self.spawn_quiet(["/bin/true"]).wait()
        fault.outcome = (
            f"launcher {how.name}: exit {launcher.returncode}; {report['processes']} "
            f"processes of its {report['sessions']} sessions and staged sandbox ended; "
            f"{len(left)} mount points it left removed by the next session"
        )

    def out_of_fds(self, fault: Fault) -> None:
        """A child launcher at RLIMIT_NOFILE with 0 to 60 fds free spawns, and launches from
        a Pool: each launch runs or is refused clearly, and leaves no fd or process behind."""
        report = self._child_report(self.child("emfile"))
        fault.problems += report["problems"]
        fault.outcome = ", ".join(f"{k}: {v}" for k, v in sorted(report["outcomes"].items()))

    def file_system_full(self, fault: Fault) -> None:
        """The workspace and run dir on a small tmpfs of the child's own, full: with no inode
        left the launch is refused (its mount points cannot be made); with no block left the
        session runs, meets ENOSPC itself, and its stdout arrives."""
        report = self._child_report(self.child("enospc", self.root, unshare=True))
        fault.problems += report["problems"]
        fault.lost += report["lost"]
        fault.outcome = report["outcome"]

    def _child_report(self, launcher: subprocess.Popen[bytes]) -> dict[str, Any]:
        stdout, _ = launcher.communicate(timeout=300)
        if launcher.returncode != 0:
            raise AssertionError(f"the child launcher exited {launcher.returncode}")
        report: dict[str, Any] = json.loads(stdout)
        return report


# ---------------------------------------------------------------- child launchers


def _child_plan(workspace: str, run_dir: str) -> nsconfine.Plan:
    user = SESSION_USER if os.geteuid() == 0 else None
    return nsconfine.Session(workspace=workspace, run_dir=run_dir, user=user).plan()


def _child_launcher(plan: nsconfine.Plan, out: int) -> int:
    """Start the sessions of launcher_killed, report, and wait to be killed."""
    script = 'echo "session $0 running"; exec sleep 1000'
    sandboxes = [
        nsconfine.spawn(plan, ["/bin/sh", "-c", script, str(i)], stdout=out) for i in range(3)
    ]
    pool = nsconfine.Pool(plan)
    sandboxes.append(pool.launch(["/bin/sh", "-c", script, "3"], stdout=out))
    pool.wait_staged(30)
    os.close(out)
    processes = len(psutil.Process().children(recursive=True))
    print(json.dumps({"sessions": len(sandboxes), "processes": processes}), flush=True)
    while True:
        signal.pause()


def _with_fds_free(free: int, launch: Callable[[], nsconfine.Sandbox]) -> str:
    """Open fds up to RLIMIT_NOFILE but free, launch, close them: 'ran', a code, or a
    problem (any other exception)."""
    ballast: list[int] = []
    try:
        with contextlib.suppress(OSError):
            while True:
                ballast.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
        for _ in range(min(free, len(ballast))):
            os.close(ballast.pop())
        try:
            status = launch().wait()
        except nsconfine.NsconfineError as error:
            return error.code
        except Exception as error:
            return f"{type(error).__name__}: {error}"
        return "ran" if status == 0 else f"status {status}"
    finally:
        for fd in ballast:
            os.close(fd)


def _child_emfile(plan: nsconfine.Plan) -> dict[str, Any]:
    outcomes: dict[str, int] = {}
    problems: list[str] = []
    me = psutil.Process()
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    nsconfine.spawn(plan, ["/bin/true"], stdout=devnull).wait()  # proven and warm
    with nsconfine.Pool(plan, refill="inline") as pool:
        pool.launch(["/bin/true"], stdout=devnull).wait()
    gc.collect()
    fds_before = me.num_fds()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # (Below about 128 no launch works at all: the C child moves its fds above 64, and a
    # launch holds some 40 of its own.)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    for free in range(61):
        for name in ("spawn", "pool"):
            if name == "spawn":
                outcome = _with_fds_free(
                    free, lambda: nsconfine.spawn(plan, ["/bin/true"], stdout=devnull)
                )
            else:
                with nsconfine.Pool(plan, refill="inline") as pool:  # one staged, then starved
                    outcome = _with_fds_free(
                        free, lambda: pool.launch(["/bin/true"], stdout=devnull)
                    )
            key = f"{name} {outcome if outcome in CLEAR or outcome == 'ran' else 'unclear'}"
            outcomes[key] = outcomes.get(key, 0) + 1
            if outcome not in CLEAR and outcome != "ran" and len(problems) < 5:
                problems.append(f"{name} with {free} fds free: {outcome}")
            gc.collect()
            if settle(set()):
                problems.append(f"{name} with {free} fds free: processes left")
            if me.num_fds() > fds_before:
                problems.append(f"{name} with {free} fds free: {me.num_fds() - fds_before} fds")
                fds_before = me.num_fds()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if nsconfine.spawn(plan, ["/bin/true"], stdout=devnull).wait() != 0:
        problems.append("no launch works afterwards")
    return {"outcomes": outcomes, "problems": problems}


def _fill(directory: str) -> None:
    """Fill directory's file system: its blocks with one file, its inodes with empty ones."""
    with contextlib.suppress(OSError), open(os.path.join(directory, "blocks"), "wb") as file:
        while True:
            file.write(b"\0" * 4096)
            file.flush()
    with contextlib.suppress(OSError):
        os.mkdir(os.path.join(directory, "inodes"))
        for index in range(1_000_000):
            open(os.path.join(directory, "inodes", str(index)), "w").close()


def _child_enospc(root: str) -> dict[str, Any]:
    """In a private mount namespace: a 1 MiB tmpfs with 64 inodes holds the workspace and run
    dir (the account's); fill it, launch; free the inodes only, launch."""
    import pwd

    problems: list[str] = []
    mount_point = tempfile.mkdtemp(prefix="full-", dir=root)
    os.chmod(mount_point, 0o755)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=64,mode=0755", "tmpfs", mount_point],
        check=True,
    )
    workspace, run_dir = (os.path.join(mount_point, name) for name in ("ws", "run"))
    for directory in (workspace, run_dir):
        os.mkdir(directory)
        if os.geteuid() == 0:
            entry = pwd.getpwnam(SESSION_USER)
            os.chown(directory, entry.pw_uid, entry.pw_gid)
    plan = _child_plan(workspace, run_dir)
    _fill(mount_point)
    outcomes = []
    # No inode left: the mount points for the protected paths cannot be made.
    try:
        nsconfine.spawn(plan, ["/bin/true"]).wait()
        outcomes.append("no inodes: ran")
    except nsconfine.NsconfineError as error:
        outcomes.append(f"no inodes: {error.code}")
    except Exception as error:
        problems.append(f"no inodes: {type(error).__name__}: {error}")
    problems += [f"no inodes: {left}" for left in settle(set())]
    left = os.listdir(workspace)
    # Inodes back, blocks still full: the session runs and meets ENOSPC itself.
    shutil.rmtree(os.path.join(mount_point, "inodes"))
    script = f"echo out; if echo data > {run_dir}/f 2>/dev/null; then exit 0; else exit 9; fi"
    lost = 0
    with Pipe() as out:
        try:
            sandbox = nsconfine.spawn(plan, ["/bin/sh", "-c", script], stdout=out.write)
            out.close_write()
            lost = lost_bytes(b"out\n", read_all(out.read))
            status = sandbox.wait()
            outcomes.append(f"no blocks: status {status}")
            if status != 9:
                problems.append(f"no blocks: status {status}, not 9 (ENOSPC)")
        except nsconfine.NsconfineError as error:
            outcomes.append(f"no blocks: {error.code}")
    problems += [f"no blocks: {left}" for left in settle(set())]
    stubs = os.listdir(workspace)
    if stubs or left:
        problems.append(f"mount points left in the workspace: {left or stubs}")
    return {"outcome": ", ".join(outcomes), "lost": lost, "problems": problems}


def child_main(argv: Sequence[str]) -> int:
    """A launcher the soak can kill, starve of fds or give a full file system."""
    scenario, workspace, run_dir, *rest = argv
    set_subreaper(True)  # what its sessions leave is its own to find (settle)
    plan = _child_plan(workspace, run_dir)
    if scenario == "launcher":
        return _child_launcher(plan, int(rest[0]))
    if scenario == "emfile":
        report = _child_emfile(plan)
    elif scenario == "enospc":
        report = _child_enospc(rest[0])
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    json.dump(report, sys.stdout)
    return 0
