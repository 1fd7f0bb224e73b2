"""`nsconfine selftest`: prove confinement on this host with real sessions in the stand-in world
(nsconfine._selftest.world), each probe (nsconfine._selftest.probes) in a fresh session, and the
checks that take more than one session: a launch killed at once, a session forking past its
limit, a session reading the terminal its output goes to, a symlink planted for the next launch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from nsconfine._errors import NsconfineError
from nsconfine._gate import spawn
from nsconfine._kernel.accounts import run_as, scratch_directory
from nsconfine._launch.confirm import mount_table_problems
from nsconfine._launch.sandbox import Sandbox
from nsconfine._plan.model import Plan
from nsconfine._plan.protect import refreshed
from nsconfine._preflight.checks import canary_account
from nsconfine._selftest.probes import Outcome, Probe, host_text, plan_for, probes, shell_quoted
from nsconfine._selftest.world import PROBE_TIMEOUT_SECONDS, World
from nsconfine._session import build_plan
from nsconfine._text import printable

if TYPE_CHECKING:
    from nsconfine._launch.stage import Stdio

KILLED_LAUNCHES = 10  # launches killed at once, each of which must leave nothing behind
PROBED_PROCESSES = 64  # the process limit of the session that forks until fork fails
FORK_BOUND = 256  # how often it tries: a weakened twin takes this many of its account's

# Spawn `sleep` until it fails (at most argv[1] times); print how many; with "hold", keep them.
FORK_UNTIL_REFUSED = r"""
import os, sys, time
children = []
while len(children) < int(sys.argv[1]):
    try:
        children.append(os.posix_spawn("/bin/sleep", ["sleep", "600"], {}))
    except OSError:
        break
print(len(children), flush=True)
if sys.argv[2:] == ["hold"]:
    time.sleep(600)
"""


class Launcher(Protocol):
    """spawn's signature: how a probe's session is started."""

    def __call__(
        self, plan: Plan, argv: Sequence[str], *, stdout: Stdio = ..., stderr: Stdio = ...
    ) -> Sandbox: ...


def run_probe(plan: Plan, probe: Probe, launcher: Launcher = spawn) -> tuple[bool, Outcome]:
    """Run probe in a fresh session on plan (after its `before`, in a session of its own);
    whether the host shows it took effect."""
    if probe.before:
        run_script(plan, probe.before, launcher)
    outcome = run_script(plan, probe.script, launcher)
    return probe.judge(outcome), outcome


def run_script(plan: Plan, script: str, launcher: Launcher = spawn) -> Outcome:
    """Run a shell snippet in a fresh session on plan and collect what it did. A launch that
    is refused (a sandbox that cannot be built, a shell that cannot start) did nothing: its
    outcome has status -1 and the refusal as its stderr."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            sandbox = launcher(plan, ["/bin/sh", "-c", script], stdout=out, stderr=err)
        except (NsconfineError, OSError) as refused:
            err.seek(0)
            return Outcome(-1, "", f"{err.read().decode(errors='replace')}{refused}")
        try:
            status = sandbox.wait(PROBE_TIMEOUT_SECONDS)
        except TimeoutError:
            sandbox.kill()
            status = sandbox.wait()
        out.seek(0)
        err.seek(0)
        return Outcome(
            status, out.read().decode(errors="replace"), err.read().decode(errors="replace")
        )


def next_session_plan(world: World, workspace: str) -> Plan:
    """The plan a broker builds for the next session, put at workspace."""
    session = world.session().replace(workspace=workspace, ro=(world.runner_file,))
    return build_plan(session, homes=[world.home], environ={})


def planted_symlink_leaks(
    world: World,
    launcher: Launcher = spawn,
    plan_next: Callable[[World, str], Plan] = next_session_plan,
    above: bool = False,
) -> str | None:
    """The attack of a session that plants `next -> …/checkout` in its workspace, where
    the broker will put the next session's workspace; or, above, `next -> …/reviewer`, another
    session's directory, with the next workspace at next/ws, that session's workspace: None
    if the next launch is refused or sees nothing of the checkout beyond its runner file (of
    the other workspace); else what it read. plan_next builds the next session's plan (a
    test's twin builds it past the lint, and must leak)."""
    planted = os.path.join(world.workspace, "next")
    if above:
        secret = world.secrets["another session's workspace"]
        target = os.path.dirname(os.path.dirname(secret))
        workspace = os.path.join(planted, os.path.basename(os.path.dirname(secret)))
    else:
        secret = world.secrets["the checkout outside the runner's files"]
        target, workspace = os.path.dirname(world.runner_file), planted
    plant = run_script(world.plan(), f"ln -sfn {shell_quoted(target)} {shell_quoted(planted)}")
    if plant.status != 0:
        return f"could not plant: {plant.stderr.strip()}"
    try:
        try:
            next_plan = plan_next(world, workspace)
        except NsconfineError:
            return None
        read = f"cat {shell_quoted(workspace)}/{os.path.basename(secret)}"
        outcome = run_script(next_plan, read, launcher)
    finally:
        os.unlink(planted)
    truth = host_text(secret)
    return outcome.stdout if truth and outcome.stdout == truth else None


def process_limit_leaks(
    world: World, weakened: bool = False, launcher: Launcher = spawn
) -> str | None:
    """A session allowed PROBED_PROCESSES forks until fork fails (at most FORK_BOUND
    times) and holds what it got, while the launcher starts another session that forks
    8 more: None if the first stopped short of its limit and the second forked; else what
    happened. weakened: the first session's limit raised past the bound (the twin that
    must report it)."""
    plan = world.plan()
    first = plan.replace(
        limits=plan.limits.replace(processes=10 * FORK_BOUND if weakened else PROBED_PROCESSES)
    )
    argv = ["python3", "-c", FORK_UNTIL_REFUSED, str(FORK_BOUND), "hold"]
    read_end, write_end = os.pipe()
    try:
        holder = launcher(first, argv, stdout=write_end)
    finally:
        os.close(write_end)
    try:
        with os.fdopen(read_end, "rb", closefd=False) as lines:
            held = lines.readline().decode().strip()
        second = run_script(plan, f"python3 -c {shell_quoted(FORK_UNTIL_REFUSED)} 8", launcher)
    finally:
        holder.kill()
        holder.wait()
        os.close(read_end)
    if not held.isdigit() or int(held) >= PROBED_PROCESSES:
        return f"the first session forked {held or 'nothing'} (its limit: {PROBED_PROCESSES})"
    if second.stdout.strip() != "8":
        return f"the second session could not fork: {second.stderr.strip()[-200:]}"
    return None


def terminal_read_leaks(world: World, through_cli: bool = True) -> str | None:
    """A session whose output goes to the user's terminal (`nsconfine run … </dev/null` in
    a shell; the relay stands in for it) tries to read what the user types there next:
    through its stdout, its stdout re-opened, and /dev/console. None if it got none of it,
    else what it got. through_cli=False gives spawn() the terminal itself, as the API does
    when told to (the twin, which must leak)."""
    import pty
    import select
    import time

    controller, terminal = pty.openpty()
    if os.geteuid() == 0:  # the user's terminal is the session's account's own
        os.chown(os.ttyname(terminal), world.user.uid, world.user.gid)
    secret = f"typed-{world.token}"
    errors_read, errors_write = os.pipe2(os.O_CLOEXEC)
    try:
        argv = ["python3", "-c", _READS_THE_TERMINAL]
        if through_cli:
            session = world.session()
            user = ["--user", world.user.name] if os.geteuid() == 0 else []
            child: subprocess.Popen[bytes] | Sandbox = subprocess.Popen(
                [sys.executable, "-m", "nsconfine", "run", *user,
                 "--workspace", session.workspace, "--run-dir", session.run_dir, "--",
                 *argv],
                stdin=subprocess.DEVNULL, stdout=terminal, stderr=errors_write, cwd="/",
            )  # fmt: skip
        else:
            child = spawn(world.plan(), argv, stdout=terminal, stderr=errors_write)
        os.close(errors_write)
        errors_write = -1
        # It says it is ready on stderr: on stdout (a pipe to `run`'s relay, which writes to
        # the terminal) the session itself could read it back first, through its stdout
        # re-opened, and the wait for it here took the whole timeout (1 run in 7, unprivileged).
        told = b""
        deadline = time.monotonic() + PROBE_TIMEOUT_SECONDS
        while b"ready\n" not in told and time.monotonic() < deadline:
            if select.select([errors_read], [], [], 1)[0]:
                chunk = os.read(errors_read, 65536)
                if not chunk:
                    break
                told += chunk
        os.write(controller, secret.encode() + b"\n")
        while chunk := os.read(errors_read, 65536):
            told += chunk
        child.wait(PROBE_TIMEOUT_SECONDS)
    finally:
        for fd in (controller, terminal, errors_read, errors_write):
            if fd >= 0:
                os.close(fd)
    return secret if secret.encode() in told else None


# Reads what it can of the terminal its stdout is, for a few seconds: through fd 1 (a terminal
# a shell opened read-write), fd 1 re-opened, and /dev/console; says what it got on stderr.
_READS_THE_TERMINAL = r"""
import os, select, sys, time
fds = {"stdout": 1}
for name, path in (("console", "/dev/console"), ("reopened", "/proc/self/fd/1")):
    try:
        fds[name] = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        pass
sys.stderr.write("ready\n")
sys.stderr.flush()
got = b""
deadline = time.monotonic() + 3
while fds and time.monotonic() < deadline:
    readable = select.select(list(fds.values()), [], [], max(deadline - time.monotonic(), 0))[0]
    for name, fd in list(fds.items()):
        if fd in readable:
            try:
                data = os.read(fd, 100)
            except OSError:
                data = b""
            got += data
            if not data:
                del fds[name]
sys.stderr.write("read: " + got.decode(errors="replace"))
"""


def killed_launches_leave_nothing(
    plan: Plan, launches: int = KILLED_LAUNCHES, launcher: Launcher = spawn
) -> str | None:
    """Launch `sleep` and kill the sandbox at once, launches times; None if every time its
    stdout reached EOF and no process of it was left, else what was."""
    import select
    import time

    for attempt in range(launches):
        marker = f"nsconfine-killed-{os.urandom(6).hex()}"
        read_end, write_end = os.pipe()
        try:
            sandbox = launcher(
                plan, ["/bin/sh", "-c", f"exec sleep 600 # {marker}"], stdout=write_end
            )
        finally:
            os.close(write_end)
        sandbox.kill()
        sandbox.wait()
        poller = select.poll()
        poller.register(read_end, select.POLLIN)
        eof = bool(poller.poll(PROBE_TIMEOUT_SECONDS * 1000)) and os.read(read_end, 1) == b""
        os.close(read_end)
        deadline = time.monotonic() + PROBE_TIMEOUT_SECONDS  # (returns as soon as they are gone)
        while (left := pids_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.02)
        for pid in left:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        if left or not eof:
            return f"attempt {attempt}: " + (f"pids {left} alive" if left else "no EOF")
    return None


def pids_with(marker: str) -> list[int]:
    """Host pids whose command line holds marker (a zombie's is empty, so it does not count)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as file:
                    if marker.encode() in file.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


# Serves an abstract unix socket (@argv[1]) until one client has been answered or 30 s pass.
_SERVE_ABSTRACT = r"""
import socket, sys
server = socket.socket(socket.AF_UNIX)
server.bind("\0" + sys.argv[1])
server.listen(1)
server.settimeout(30)
print("serving", flush=True)
try:
    client, _ = server.accept()
    client.sendall(b"served " + sys.argv[1].encode())
except OSError:
    pass
"""


def abstract_socket_served(world: World, plan: Plan) -> str | None:
    """A session of plan serves an abstract unix socket (squatting a name a host tool uses):
    what a host client that connects to that name gets from it, or None if it reaches
    nothing (the session's own network namespace holds the name)."""
    import socket

    name = f"nsconfine-selftest-served-{world.token}"
    read_end, write_end = os.pipe()
    try:
        sandbox = spawn(plan, ["python3", "-c", _SERVE_ABSTRACT, name], stdout=write_end)
    finally:
        os.close(write_end)
    try:
        with os.fdopen(read_end, "rb", closefd=False) as lines:
            if lines.readline().strip() != b"serving":
                return None
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(PROBE_TIMEOUT_SECONDS)
            try:
                client.connect("\0" + name)
                return client.recv(200).decode(errors="replace") or None
            except OSError:
                return None
    finally:
        sandbox.kill()
        sandbox.wait()
        os.close(read_end)


def _host_network_plan(world: World) -> Plan:
    session = world.session().replace(
        network="host", network_reason="selftest: what the host network opens, shown"
    )
    return build_plan(session, homes=[world.home], environ={})


# The checks that take more than one session: whether each must be allowed, and what it got
# (None: nothing).
SESSION_CHECKS: tuple[tuple[str, bool, Callable[[World], str | None]], ...] = (
    (
        "outlive a launch killed at once",
        False,
        lambda world: killed_launches_leave_nothing(world.plan()),
    ),
    ("fork past the session's process limit, starving its account", False, process_limit_leaks),
    ("read what the user types at the terminal its output goes to", False, terminal_read_leaks),
    ("redirect the next workspace by a planted symlink", False, planted_symlink_leaks),
    (
        "redirect the next workspace by a planted symlink above it",
        False,
        lambda world: planted_symlink_leaks(world, above=True),
    ),
    (
        "serve an abstract socket host programs reach (the default network is none)",
        False,
        lambda world: abstract_socket_served(world, world.plan()),
    ),
    (
        "serve an abstract socket host programs reach, on the host network (as documented)",
        True,
        lambda world: abstract_socket_served(world, _host_network_plan(world)),
    ),
)


def run_selftest(*, as_json: bool = False, user: str | None = None) -> int:
    """Build a stand-in world, run every probe confined, print the table; 0 if all hold.
    As root, the stand-in sessions run as user (default: nobody)."""
    rows: list[dict[str, Any]] = []
    account = run_as(user) if user else (canary_account() if os.geteuid() == 0 else None)
    # The stand-in world's modes are the selftest's own (a launcher's umask of 0277 made its
    # workspace one no session could write); sessions started here inherit it too.
    launchers_umask = os.umask(0o022)
    try:
        root = scratch_directory("nsconfine-selftest-")
        try:
            world = World(root, account)
            with world.running():
                plan = world.plan()
                for probe in probes(world):
                    allowed, outcome = run_probe(plan_for(world, probe), probe)
                    ok = allowed == probe.expect_allowed
                    row: dict[str, Any] = {
                        "check": probe.name,
                        "expected": _word(probe.expect_allowed),
                        "observed": _word(allowed),
                        "ok": ok,
                    }
                    if not ok:  # what the session said, for whoever has to fix the host
                        row["detail"] = f"status {outcome.status}: {outcome.stderr.strip()[-300:]}"
                    rows.append(row)
                mountinfo = run_script(plan, "cat /proc/self/mountinfo").stdout
                ran = refreshed(plan)  # as that launch found the workspace the probes changed
                problems = mount_table_problems(mountinfo, ran) if mountinfo else ["no mountinfo"]
                rows.append(
                    {
                        "check": "every mount is a plan entry",
                        "expected": "yes",
                        "observed": "yes" if not problems else f"no: {'; '.join(problems)}",
                        "ok": not problems,
                    }
                )
                for name, expect_allowed, check in SESSION_CHECKS:
                    found = check(world)
                    row = {
                        "check": name,
                        "expected": _word(expect_allowed),
                        "observed": _word(found is not None),
                        "ok": (found is not None) == expect_allowed,
                    }
                    if found is not None and not row["ok"]:
                        row["detail"] = found[:200]
                    rows.append(row)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    finally:
        os.umask(launchers_umask)
    failed = [row for row in rows if not row["ok"]]
    if as_json:
        print(json.dumps({"ok": not failed, "checks": rows}, indent=2))
    else:
        width = max(len(row["check"]) for row in rows)
        print(f"{'CHECK'.ljust(width)}  EXPECTED  OBSERVED  RESULT")
        for row in rows:
            # (a detail is what a session printed: shown escaped, as all it writes)
            verdict = "ok" if row["ok"] else f"FAIL {printable(row.get('detail', ''))}"
            print(
                f"{row['check'].ljust(width)}  {row['expected']:8}  {row['observed']:8}  {verdict}"
            )
        print(f"\n{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _word(allowed: bool) -> str:
    return "allowed" if allowed else "refused"
