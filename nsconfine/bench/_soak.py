"""The soak section (`python -m nsconfine.bench --only soak`): many sessions from one
launcher, and faults, with nothing leaked or lost. It counts; it does not time.

Four runs of launches (spawn and Pool, in sequence and 32 in flight), each launch a payload
whose exit status and output are known (nsconfine.bench._held), must all end as expected and
leave the launcher as it was: its fds, RSS, threads, child processes and zombies, the host's
mount table, and the files nsconfine keeps (mount points in the workspace, their records in
$XDG_CACHE_HOME/nsconfine, its entries in /tmp), each counted before and after. Then 50
sessions in parallel, each with a workspace of its own, must each see only their own. Then 150
sessions must be alive at once with the launcher's soft limit of open files at the usual 1,024,
and all end when killed, leaving nothing behind. Then the faults (nsconfine.bench._faults).

The bench process makes itself a child subreaper for the section: whatever a session leaves
behind is reparented to it, so its descendants are every process the sessions made. The
records directory is a fresh one, so that other launchers on the host do not count.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final

import nsconfine
from nsconfine.bench._core import (
    SESSION_USER,
    Config,
    Results,
    Row,
    World,
    _progress,
    live,
    make_owned,
    sleeper,
)
from nsconfine.bench._faults import Fault, Faults
from nsconfine.bench._held import (
    LEAK_UNITS,
    Launcher,
    Outcome,
    Snapshot,
    Watched,
    leaks,
    one_session,
    read_all,
    set_subreaper,
)

IN_FLIGHT: Final = 32
ISOLATED: Final = 50
AT_ONCE: Final = 150  # sessions alive at once ...
SOFT_FILES: Final = 1024  # ... under the usual soft RLIMIT_NOFILE


@dataclass(frozen=True, slots=True)
class Counts:
    """How many launches each run of the soak makes, and how much a flood writes."""

    sequential: int
    parallel: int
    flood_mib: int


FULL: Final = Counts(sequential=10_000, parallel=2_000, flood_mib=256)
SMOKE: Final = Counts(sequential=300, parallel=200, flood_mib=64)  # CI: about two minutes


# ---------------------------------------------------------------- runs of launches


@dataclass(slots=True)
class Held:
    """A run of launches: how many ended exactly as expected."""

    name: str
    launches: int
    held: int = 0
    lost: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    grown: dict[str, float] = field(default_factory=dict)


def run_launches(
    name: str, launch: Launcher, count: int, in_flight: int, w: World, log: int
) -> Held:
    """count launches, in_flight at a time (1: in sequence)."""
    run = Held(name, count)
    began = time.monotonic()

    def one(index: int) -> Outcome:
        return one_session(launch, index, w.devnull, log)

    if in_flight == 1:
        outcomes: Iterator[Outcome] = map(one, range(count))
    else:
        executor = ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="soak")
        outcomes = executor.map(one, range(count))
    try:
        for done, outcome in enumerate(outcomes, 1):
            run.lost += outcome.lost
            if outcome.problem is None:
                run.held += 1
            elif len(run.problems) < 5:
                run.problems.append(outcome.problem)
            if done % 1000 == 0:
                _progress(f"soak {name}: {done}/{count}")
    finally:
        if in_flight > 1:
            executor.shutdown()
    run.seconds = time.monotonic() - began
    return run


# ---------------------------------------------------------------- isolation

ISOLATION_SCRIPT: Final = (
    # Wait until every session has started, then read our secret, and try every other's.
    'read go; cat "$0/secret"; for other in "$@"; do '
    'if cat "$other/secret" 2>/dev/null || ls "$other" >/dev/null 2>&1 '
    '|| touch "$other/mine" 2>/dev/null; then echo "SAW $other"; fi; done'
)


def isolation(root: str, count: int, control: bool = False) -> list[str]:
    """count sessions in parallel, each with its own workspace holding a secret; each must
    print its own secret and reach no other workspace. control: session 0 also gets session
    1's workspace bound read-only, which the probe must catch (it can fail)."""
    user = SESSION_USER if os.geteuid() == 0 else None
    spaces = [os.path.join(root, f"ws{i:02d}") for i in range(count)]
    secrets = [f"secret {i} {os.urandom(8).hex()}\n" for i in range(count)]
    owner = None
    if user is not None:  # the session's account owns its workspace
        import pwd

        entry = pwd.getpwnam(user)
        owner = (entry.pw_uid, entry.pw_gid)
    for space, secret in zip(spaces, secrets, strict=True):
        make_owned(space, None, owner)
        make_owned(space + ".run", None, owner)
        make_owned(os.path.join(space, "secret"), secret, owner)
    problems: list[str] = []
    started: list[tuple[nsconfine.Sandbox, int, int]] = []
    try:
        for i, space in enumerate(spaces):
            ro = [spaces[1]] if control and i == 0 else []
            plan = nsconfine.Session(
                workspace=space, run_dir=space + ".run", ro=ro, user=user
            ).plan()
            go_read, go_write = os.pipe2(os.O_CLOEXEC)
            out_read, out_write = os.pipe2(os.O_CLOEXEC)
            others = [s for s in spaces if s != space]
            try:
                sandbox = nsconfine.spawn(
                    plan,
                    ["/bin/sh", "-c", ISOLATION_SCRIPT, space, *others],
                    stdin=go_read,
                    stdout=out_write,
                )
            finally:
                os.close(go_read)
                os.close(out_write)
            started.append((sandbox, go_write, out_read))
        for _, go_write, _ in started:  # all are running now: let them look
            os.close(go_write)
        for i, (sandbox, _, out_read) in enumerate(started):
            seen = read_all(out_read).decode(errors="replace")
            status = sandbox.wait()
            if not seen.startswith(secrets[i]) or "SAW" in seen or status != 0:
                problems.append(f"session {i} (status {status}): {seen[:200]!r}")
    finally:
        for sandbox, go_write, out_read in started:
            with contextlib.suppress(OSError):
                os.close(go_write)
            os.close(out_read)
            sandbox.kill()
            sandbox.wait()
        for space in spaces:
            shutil.rmtree(space, ignore_errors=True)
            shutil.rmtree(space + ".run", ignore_errors=True)
    return problems


# ---------------------------------------------------------------- many alive at once


@dataclass(slots=True)
class AtOnce:
    """Sessions held alive at once under a soft limit of open files."""

    count: int
    started: int = 0
    alive: int = 0
    fds_before: int = 0
    fds_peak: int = 0
    statuses: dict[int, int] = field(default_factory=dict)  # exit status -> sessions
    problems: list[str] = field(default_factory=list)


def at_once(plan: nsconfine.Plan, count: int, w: World) -> AtOnce:
    """count sleeping sessions started one after another with the soft RLIMIT_NOFILE at
    SOFT_FILES; each must be alive (its command, sleep, running) once all have started, and
    each must end when killed."""
    held = AtOnce(count)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(SOFT_FILES, hard), hard))
    start = sleeper(plan, w.devnull)

    def counted() -> nsconfine.Sandbox:
        sandbox = start()
        held.started += 1
        return sandbox

    held.fds_before = len(os.listdir("/proc/self/fd"))
    try:
        with live(count, counted) as sandboxes:
            held.fds_peak = len(os.listdir("/proc/self/fd"))
            for index, sandbox in enumerate(sandboxes):
                if sandbox.poll() is None and _running(sandbox.command_pid, "sleep"):
                    held.alive += 1
                elif len(held.problems) < 5:
                    held.problems.append(f"session {index} is not running sleep")
        for sandbox in sandboxes:  # each reaped by now: wait() returns its status
            status = sandbox.wait()
            held.statuses[status] = held.statuses.get(status, 0) + 1
        if set(held.statuses) != {-signal.SIGKILL}:
            held.problems.append(f"killed, the sessions ended with {held.statuses}")
    except Exception as error:  # EMFILE, or any refusal: the failure this part looks for
        held.problems.append(
            f"launch {held.started + 1} of {count}: {type(error).__name__}: {error}"
        )
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return held


def _running(pid: int, name: str) -> bool:
    """Whether process pid runs the program name (neither ended nor a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            stat = file.read()
    except FileNotFoundError:
        return False
    comm, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
    return comm == name and state not in "ZXx"


# ---------------------------------------------------------------- the section


def bench_soak(results: Results, w: World, config: Config) -> None:
    """Launches held, faults survived, leaks and output lost (see the module's docstring)."""
    counts = SMOKE if config.smoke else FULL
    failures: list[str] = []
    soak_root = tempfile.mkdtemp(prefix="nsconfine-soak-")
    os.chmod(soak_root, 0o755)  # fake bwraps live here: root's, readable by the session
    cache = os.path.join(soak_root, "cache")
    os.mkdir(cache, 0o700)
    saved_cache = os.environ.get("XDG_CACHE_HOME")
    # The records of this launcher alone, so that other launchers on the host do not count.
    os.environ["XDG_CACHE_HOME"] = cache
    log_path = os.path.join(soak_root, "stderr.log")
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    set_subreaper(True)
    plan = w.session().plan()
    # (Not the proofs of bwrap beside them: one per binary, which the faults change.)
    watched = Watched([os.path.join(cache, "nsconfine", "mountpoints"), w.workspace, w.run_dir])
    began = time.monotonic()
    try:
        # Warm: a proof under the fresh records, the first Pool's thread and imports.
        for index in range(6):
            one_session(_spawner(plan), index, w.devnull, log)
        with nsconfine.Pool(plan) as warm:
            one_session(warm.launch, 2, w.devnull, log)
        start = Snapshot.take(watched)
        runs: list[Held] = []
        for name, in_flight, count in (
            ("sequential", 1, counts.sequential),
            (f"in-flight-{IN_FLIGHT}", IN_FLIGHT, counts.parallel),
        ):
            for front in ("spawn", "pool"):
                before = Snapshot.take(watched)
                _progress(f"soak {front} {name}: {count} launches")
                if front == "spawn":
                    run = run_launches(f"{front}.{name}", _spawner(plan), count, in_flight, w, log)
                else:
                    with nsconfine.Pool(plan, size=4 if in_flight > 1 else 1) as pool:
                        run = run_launches(f"{front}.{name}", pool.launch, count, in_flight, w, log)
                run.grown, leaked = leaks(before, Snapshot.take(watched).settled(before, watched))
                run.problems += leaked
                runs.append(run)
        whole, leaked_overall = leaks(start, Snapshot.take(watched).settled(start, watched))
        for run in runs:
            rate = run.launches / run.seconds
            grown = ", ".join(f"{k} {v:+.0f}" for k, v in run.grown.items())
            results.add(
                Row(
                    "soak",
                    f"soak.held.{run.name}",
                    "launches",
                    [float(run.held)],
                    note=f"of {run.launches}, statuses and output right; {rate:.0f}/s; "
                    f"grown: {grown}",
                    extra={
                        "launches": run.launches,
                        "lost_bytes": run.lost,
                        "launches_per_s": rate,
                        **run.grown,
                    },
                )
            )
            failures += [f"{run.name}: {problem}" for problem in run.problems]
        for name, value in whole.items():
            results.add(
                Row(
                    "soak",
                    f"soak.leak.{name}",
                    LEAK_UNITS[name],
                    [value],
                    note="growth over the four runs of launches (before - after)",
                    extra={run.name: run.grown[name] for run in runs},
                )
            )
        failures += [f"over the runs: {problem}" for problem in leaked_overall]

        _progress(f"soak isolation: {ISOLATED} sessions, each its own workspace")
        iso_before = Snapshot.take(watched)
        caught = any("SAW" in problem for problem in isolation(soak_root, 2, control=True))
        isolated = isolation(soak_root, ISOLATED)
        _, iso_leaked = leaks(iso_before, Snapshot.take(watched).settled(iso_before, watched))
        failures += [f"isolation: {problem}" for problem in isolated + iso_leaked]
        if not caught:
            failures.append("isolation: the control (a neighbour's workspace bound) passed")
        results.add(
            Row(
                "soak",
                "soak.isolation",
                "sessions",
                [float(ISOLATED - len(isolated))],
                note=f"of {ISOLATED} in parallel saw only their own workspace; the control "
                f"(a neighbour's bound) {'was caught' if caught else 'PASSED'}",
            )
        )

        _progress(f"soak: {AT_ONCE} sessions alive at once, RLIMIT_NOFILE {SOFT_FILES}")
        before = Snapshot.take(watched)
        held = at_once(plan, AT_ONCE, w)
        _, at_once_leaked = leaks(before, Snapshot.take(watched).settled(before, watched))
        failures += [f"{AT_ONCE} at once: {problem}" for problem in held.problems + at_once_leaked]
        opened = held.fds_peak - held.fds_before
        results.add(
            Row(
                "soak",
                f"soak.at-once.{AT_ONCE}",
                "sessions",
                [float(held.alive)],
                note=f"of {AT_ONCE} alive at once with RLIMIT_NOFILE {SOFT_FILES} (soft); the "
                f"launcher's fds {held.fds_before} -> {held.fds_peak}, "
                f"{opened / max(held.started, 1):.2f} a session; killed, ended with "
                f"{held.statuses}; {len(held.problems)} problems",
                extra={
                    "started": held.started,
                    "fds_before": held.fds_before,
                    "fds_peak": held.fds_peak,
                    "fds_per_session": opened / max(held.started, 1),
                    "soft_limit": SOFT_FILES,
                },
            )
        )

        with open(log_path, "rb") as file:
            said = file.read()
        if said:
            failures.append(f"the sessions' stderr was not empty: {said[-500:]!r}")
        os.close(log)  # faults make bwrap speak: their stderr is not checked
        log = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)

        faults = Faults(w, soak_root, counts.flood_mib, log)
        scenarios: list[tuple[str, Callable[[Fault], None]]] = [
            ("bwrap-killed.before-namespaces", faults.bwrap_killed_before_namespaces),
            ("bwrap-killed.during-setup", faults.bwrap_killed_in_setup),
            ("bwrap-killed.staged", faults.staged_bwrap_killed),
            ("bwrap-killed.running", faults.bwrap_killed_running),
            ("launcher-killed.SIGKILL", lambda f: faults.launcher_killed(f, signal.SIGKILL)),
            ("launcher-killed.SIGTERM", lambda f: faults.launcher_killed(f, signal.SIGTERM)),
            ("tree-ignoring-SIGTERM", faults.tree_ignoring_term),
            ("stdout-closed", faults.stdout_closed),
            ("stdout-flooded", faults.stdout_flooded),
            ("stdin-never-read", faults.stdin_never_read),
            ("launcher-out-of-fds", faults.out_of_fds),
            ("file-system-full", faults.file_system_full),
            ("bwrap-changed", faults.bwrap_changed),
        ]
        for name, scenario in scenarios:
            faults.run(name, scenario, watched)
        for fault in faults.results:
            verdict = "survived" if fault.survived else "FAILED: " + "; ".join(fault.problems)
            results.add(
                Row(
                    "soak",
                    f"soak.fault.{fault.name}",
                    "B lost",
                    [float(fault.lost)],
                    note=f"{verdict}; {fault.outcome}",
                )
            )
            if not fault.survived:
                failures.append(f"fault {fault.name}: {'; '.join(fault.problems)}")
        survived = sum(fault.survived for fault in faults.results)
        results.add(
            Row(
                "soak",
                "soak.faults",
                "faults",
                [float(survived)],
                note=f"survived of {len(faults.results)}",
            )
        )
        lost = sum(run.lost for run in runs) + sum(fault.lost for fault in faults.results)
        results.add(Row("soak", "soak.lost", "B", [float(lost)], note="output lost, all told"))
        results.derived["soak_launches_held"] = float(sum(run.held for run in runs))
        results.derived["soak_faults_survived"] = float(survived)
        results.derived["soak_lost_bytes"] = float(lost)
        results.derived["soak_seconds"] = time.monotonic() - began
    finally:
        os.close(log)
        set_subreaper(False)
        if saved_cache is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved_cache
        shutil.rmtree(soak_root, ignore_errors=True)
    results.derived["soak_failures"] = failures
    for failure in failures:
        _progress(f"soak FAILED: {failure}")


def _spawner(plan: nsconfine.Plan) -> Launcher:
    def launch(
        argv: Sequence[str],
        *,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
    ) -> nsconfine.Sandbox:
        return nsconfine.spawn(plan, list(argv), stdin=stdin, stdout=stdout, stderr=stderr)

    return launch
