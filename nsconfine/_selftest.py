"""`nsconfine selftest`: prove confinement on this host with real sessions in a stand-in world.

The world is a temp directory laid out like an agent stack's host: a home with stand-in secrets,
a data root, a canonical checkout, and two role sessions. The coder session's plan is built the
way every plan is (with the stand-in home's stores denied like the real home's), and each probe
runs in a fresh confined session and is judged by the host's own truth: a read is allowed only
if the session printed the file's real content, a write only if the host file changed.

The test suite runs the same probes, and also on weakened plans (each probe says how to weaken
the plan so that it must flip), which shows that no probe can pass on an unconfined session.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from nsconfine import _plan as p
from nsconfine._executor import Sandbox, launch
from nsconfine._plan import Kind, Plan
from nsconfine._preflight import proven_bwrap
from nsconfine._session import Harness, Session, build_plan
from nsconfine._spawn import spawn

if TYPE_CHECKING:
    from nsconfine._executor import Stdio

PROBE_TIMEOUT_SECONDS = 30.0


class Launcher(Protocol):
    """spawn's signature: how a probe's session is started."""

    def __call__(
        self, plan: Plan, argv: Sequence[str], *, stdout: Stdio = ..., stderr: Stdio = ...
    ) -> Sandbox: ...


def unchecked_launcher(
    plan: Plan, argv: Sequence[str], *, stdout: Stdio = None, stderr: Stdio = None
) -> Sandbox:
    """Launch without the lint: only for weakened plans that must expose what the lint refuses."""
    return launch(proven_bwrap(), plan, argv, stdout=stdout, stderr=stderr)


@dataclass(frozen=True)
class Outcome:
    """What a probe's session did: its exit status and output."""

    status: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Probe:
    """One thing a session tries, whether it must be allowed, how the host judges it, and the
    plan change that must flip it (bind what it must not see, or drop what it needs)."""

    name: str
    expect_allowed: bool
    script: str
    judge: Callable[[Outcome], bool]  # True when the host shows the action took effect
    weaken: Callable[[Plan], Plan]


def _read(path: str) -> str | None:
    try:
        with open(path, errors="replace") as file:
            return file.read()
    except OSError:
        return None


def _quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"


def _add(*entries: p.Entry) -> Callable[[Plan], Plan]:
    def weaken(plan: Plan) -> Plan:
        replaced = {entry.dest for entry in entries}
        kept = [entry for entry in plan.entries if entry.dest not in replaced]
        return plan.replace(entries=(*kept, *entries))  # the plan puts them in order

    return weaken


def _drop(dest: str, chdir: str | None = None) -> Callable[[Plan], Plan]:
    def weaken(plan: Plan) -> Plan:
        weaker = plan.without(dest)
        return weaker.replace(chdir=chdir) if chdir else weaker

    return weaken


class World:
    """A stand-in host: secrets, a data root, a checkout, a harness, a tool socket, two
    sessions; `coder` is the session under test."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.token = os.urandom(8).hex()
        join = os.path.join
        self.home = join(root, "home")
        self.secrets = {
            "~/.config/app/secrets": join(self.home, ".config", "app", "secrets"),
            "~/.ssh/id_ed25519": join(self.home, ".ssh", "id_ed25519"),
            "~/.claude/.credentials.json": join(self.home, ".claude", ".credentials.json"),
            "~/.git-credentials": join(self.home, ".git-credentials"),
            "the data root's store": join(root, "data", "store", "state.db"),
            "another session's workspace": join(root, "sessions", "reviewer", "ws", "notes.md"),
            "another session's run dir": join(root, "sessions", "reviewer", "run", "state"),
            "the checkout outside the runner's files": join(root, "checkout", "internal.py"),
        }
        self.data_root = join(root, "data")
        self.runner_file = join(root, "checkout", "runner.py")
        self.workspace = join(root, "sessions", "coder", "ws")
        self.run_dir = join(root, "sessions", "coder", "run")
        self.harness = join(root, "harness", "agent")
        self.tool_socket = join(root, "sockets", "tool.sock")
        self.credential = join(root, "coder.env")
        self.leaked_fd = -1
        self.host_process: subprocess.Popen[bytes] | None = None
        self._server: socket.socket | None = None
        for path in [*self.secrets.values(), self.runner_file]:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as file:
                file.write(f"secret {os.path.basename(path)} {self.token}\n")
        with open(self.runner_file, "w") as file:
            file.write(f"print('runner {self.token}')\n")
        for path in (self.workspace, self.run_dir, os.path.dirname(self.tool_socket)):
            os.makedirs(path, exist_ok=True)
        with open(os.path.join(self.workspace, "input.txt"), "w") as file:
            file.write(f"input {self.token}\n")
        os.makedirs(os.path.dirname(self.harness))
        with open(self.harness, "w") as file:
            file.write(f"#!/bin/sh\necho harness {self.token}\n")
        os.chmod(self.harness, 0o755)
        fd = os.open(self.credential, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, f"ANTHROPIC_API_KEY=sk-stand-in-{self.token}\n".encode())
        os.close(fd)

    def session(self) -> Session:
        """The coder session, as a launcher would describe it."""
        with open(self.harness, "rb") as file:
            digest = hashlib.sha256(file.read()).hexdigest()
        return Session(
            workspace=self.workspace,
            run_dir=self.run_dir,
            ro=[self.runner_file],
            harness=[Harness(self.harness, digest)],
            tool_socket=self.tool_socket,
            credential=self.credential,
            deny=[self.data_root],
        )

    def plan(self) -> Plan:
        """The coder session's checked plan, the stand-in home denied like a real one."""
        return build_plan(self.session(), homes=[self.home], environ={})

    @contextlib.contextmanager
    def running(self) -> Iterator[World]:
        """The world's live parts: the tool socket's server, a host process carrying the
        token in its command line, and a secret fd the launcher leaves inheritable."""
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.tool_socket)
        server.listen(8)
        self._server = server
        threading.Thread(target=self._serve, daemon=True).start()
        self.host_process = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", f"host-{self.token}"]
        )
        self.leaked_fd = os.open(self.secrets["~/.ssh/id_ed25519"], os.O_RDONLY)
        os.set_inheritable(self.leaked_fd, True)
        try:
            yield self
        finally:
            os.close(self.leaked_fd)
            self.host_process.kill()
            self.host_process.wait()
            server.close()

    def _serve(self) -> None:
        assert self._server is not None
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return
            with connection:
                connection.sendall(f"pong {self.token}".encode())

    def probes(self) -> list[Probe]:
        """Every check, refusals first; each one judged from the host."""
        probes = [self._read_probe(name, path) for name, path in self.secrets.items()]
        probes += self._write_refusals()
        probes += self._process_and_fd_refusals()
        probes += self._needs()
        return probes

    def _read_probe(self, name: str, path: str) -> Probe:
        truth = _read(path)
        return Probe(
            f"read {name}",
            False,
            f"cat {_quote(path)}",
            lambda outcome: outcome.status == 0 and outcome.stdout == truth,
            _add(p.ro_bind(path, path, "weakened: exposes a secret")),
        )

    def _write_probe(
        self, name: str, path: str, weaken: Callable[[Plan], Plan], expect_allowed: bool = False
    ) -> Probe:
        mark = f"written {self.token} {len(name)}"

        def judge(outcome: Outcome) -> bool:
            return mark in (_read(path) or "")

        return Probe(
            f"write {name}",
            expect_allowed,
            f"printf '%s\\n' '{mark}' >> {_quote(path)}",
            judge,
            weaken,
        )

    def _write_refusals(self) -> list[Probe]:
        other_ws = os.path.dirname(self.secrets["another session's workspace"])
        etc_file = f"/etc/nsconfine-probe-{self.token}"
        usr_file = f"/usr/nsconfine-probe-{self.token}"
        host_tmp = f"/tmp/nsconfine-probe-{self.token}"
        in_sandbox = "weakened: the root stays writable"
        return [
            self._write_probe("/usr", usr_file, _add(p.rw_bind("/usr", "/usr", "weakened"))),
            Probe(
                "write /etc",
                False,
                f"echo x > {etc_file}",
                lambda outcome: outcome.status == 0 or os.path.exists(etc_file),
                _drop("/"),
            ),
            self._write_probe(
                "the runner's file",
                self.runner_file,
                _add(p.rw_bind(self.runner_file, self.runner_file, "weakened")),
            ),
            self._write_probe(
                "another session's workspace",
                os.path.join(other_ws, "planted"),
                _add(p.rw_bind(other_ws, other_ws, "weakened")),
            ),
            self._write_probe(
                "the home",
                os.path.join(self.home, "planted"),
                _add(p.rw_bind(self.home, self.home, "weakened")),
            ),
            self._write_probe(
                "the host's /tmp", host_tmp, _add(p.rw_bind("/tmp", "/tmp", in_sandbox))
            ),
        ]

    def _process_and_fd_refusals(self) -> list[Probe]:
        marker = f"host-{self.token}"
        fd_truth = _read(self.secrets["~/.ssh/id_ed25519"])
        return [
            Probe(
                "see host processes",
                False,
                "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
                lambda outcome: marker in outcome.stdout,
                _add(p.ro_bind("/proc", "/proc", "weakened: the host's /proc")),
            ),
            Probe(
                "use an fd the launcher leaked",
                False,
                f"cat /proc/self/fd/{self.leaked_fd}",
                lambda outcome: outcome.status == 0 and outcome.stdout == fd_truth,
                lambda plan: plan,
            ),  # the weakening is the launcher's, not the plan's
        ]

    def _needs(self) -> list[Probe]:
        input_truth = _read(os.path.join(self.workspace, "input.txt"))
        runner_truth = _read(self.runner_file)
        home = os.path.join(self.run_dir, "home")
        client = (
            "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
            "print(s.recv(100).decode(), end='')"
        )
        return [
            Probe(
                "read its workspace",
                True,
                "cat input.txt",
                lambda outcome: outcome.stdout == input_truth,
                _drop(self.workspace, chdir="/"),
            ),
            self._write_probe(
                "its workspace",
                os.path.join(self.workspace, "out.txt"),
                _drop(self.workspace, chdir="/"),
                expect_allowed=True,
            ),
            self._write_probe(
                "its run dir",
                os.path.join(self.run_dir, "state"),
                _drop(self.run_dir),
                expect_allowed=True,
            ),
            Probe(
                "write its empty HOME",
                True,
                'test -z "$(ls -A "$HOME")" && echo ok > "$HOME/made"',
                lambda outcome: _read(os.path.join(home, "made")) == "ok\n",
                _drop(self.run_dir),
            ),
            Probe(
                "read the runner's file",
                True,
                f"cat {_quote(self.runner_file)}",
                lambda outcome: outcome.stdout == runner_truth,
                _drop(self.runner_file),
            ),
            Probe(
                "run its pinned harness",
                True,
                _quote(self.harness),
                lambda outcome: outcome.stdout == f"harness {self.token}\n",
                _drop(self.harness),
            ),
            Probe(
                "reach its tool socket",
                True,
                f"python3 -c {_quote(client)} {_quote(self.tool_socket)}",
                lambda outcome: outcome.stdout == f"pong {self.token}",
                _drop(self.tool_socket),
            ),
            Probe(
                "get its credential",
                True,
                'printf %s "$ANTHROPIC_API_KEY"',
                lambda outcome: outcome.stdout == f"sk-stand-in-{self.token}",
                lambda plan: plan.replace(
                    env=tuple(v for v in plan.env if v.name != "ANTHROPIC_API_KEY")
                ),
            ),
            Probe(
                "exit with its command's status",
                True,
                "exit 42",
                lambda outcome: outcome.status == 42,
                lambda plan: plan.replace(chdir="/nonexistent"),
            ),
        ]


def run_probe(plan: Plan, probe: Probe, launcher: Launcher = spawn) -> tuple[bool, Outcome]:
    """Run probe in a fresh session on plan; whether the host shows it took effect."""
    outcome = run_script(plan, probe.script, launcher)
    return probe.judge(outcome), outcome


def run_script(plan: Plan, script: str, launcher: Launcher = spawn) -> Outcome:
    """Run a shell snippet in a fresh session on plan and collect what it did."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sandbox = launcher(plan, ["/bin/sh", "-c", script], stdout=out, stderr=err)
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


def unexplained_mounts(mountinfo: str, plan: Plan) -> list[str]:
    """Mount points in a sandbox's /proc/self/mountinfo that no plan entry accounts for."""
    mounted = {e.dest for e in plan.entries if e.kind not in (Kind.DIR, Kind.SYMLINK)}
    subtrees = [e.dest for e in plan.entries if e.kind in (Kind.PROC, Kind.DEV)]
    unexplained = []
    for line in mountinfo.splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point in mounted or any(point.startswith(tree + "/") for tree in subtrees):
            continue
        unexplained.append(point)
    return unexplained


def run_selftest(*, as_json: bool = False) -> int:
    """Build a stand-in world, run every probe confined, print the table; 0 if all hold."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="nsconfine-selftest-") as root:
        world = World(root)
        with world.running():
            plan = world.plan()
            for probe in world.probes():
                allowed, outcome = run_probe(plan, probe)
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
            extra = unexplained_mounts(mountinfo, plan)
            rows.append(
                {
                    "check": "every mount is a plan entry",
                    "expected": "yes",
                    "observed": "yes" if not extra else f"no: {', '.join(extra)}",
                    "ok": not extra and bool(mountinfo),
                }
            )
    failed = [row for row in rows if not row["ok"]]
    if as_json:
        print(json.dumps({"ok": not failed, "checks": rows}, indent=2))
    else:
        width = max(len(row["check"]) for row in rows)
        print(f"{'CHECK'.ljust(width)}  EXPECTED  OBSERVED  RESULT")
        for row in rows:
            verdict = "ok" if row["ok"] else f"FAIL {row.get('detail', '')}"
            print(
                f"{row['check'].ljust(width)}  {row['expected']:8}  {row['observed']:8}  {verdict}"
            )
        print(f"\n{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _word(allowed: bool) -> str:
    return "allowed" if allowed else "refused"
