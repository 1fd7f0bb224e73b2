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
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from nsconfine._errors import NsconfineError
from nsconfine._gate import spawn
from nsconfine._kernel import layers as _layers
from nsconfine._kernel.accounts import RunAs, run_as, scratch_directory
from nsconfine._kernel.walk import walk
from nsconfine._launch.confirm import mount_table_problems
from nsconfine._launch.handoff import hand_off, prepare_launch
from nsconfine._launch.sandbox import Sandbox
from nsconfine._launch.stage import stage, stdio_fd
from nsconfine._plan import model as p
from nsconfine._plan.allowlist import Destination
from nsconfine._plan.model import Plan
from nsconfine._plan.protect import refreshed
from nsconfine._plan.system import system_entries
from nsconfine._preflight.checks import canary_account, proven_bwrap, takes_bind_fds
from nsconfine._session import Harness, Session, build_plan, session_entries

if TYPE_CHECKING:
    from nsconfine._launch.stage import Stdio

PROBE_TIMEOUT_SECONDS = 30.0
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


def unchecked_launcher(
    plan: Plan, argv: Sequence[str], *, stdout: Stdio = None, stderr: Stdio = None
) -> Sandbox:
    """Launch without the gate (no lint, no refusal of uid 0): only for weakened plans that
    must expose what the gate refuses."""
    launch = prepare_launch(argv, stdio=(None, stdout, stderr))
    bwrap = proven_bwrap()
    staged = stage(bwrap, plan, bind_fds=takes_bind_fds(bwrap), stderr=stdio_fd(stderr, "stderr"))
    return hand_off(staged, launch)


@dataclass(frozen=True)
class Outcome:
    """What a probe's session did: its exit status and output."""

    status: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Probe:
    """One thing a session tries, whether it must be allowed, how the host judges it, and the
    change that must flip it: to the plan (bind what it must not see, or drop what it needs)
    or, for what a kernel layer refuses, that layer switched off (the door in
    nsconfine._kernel.layers)."""

    name: str
    expect_allowed: bool
    script: str
    judge: Callable[[Outcome], bool]  # True when the host shows the action took effect
    weaken: Callable[[Plan], Plan]
    layers_off: tuple[str, ...] = ()
    before: str = ""  # run first, in a launch of the same plan: what a session leaves behind
    proxied: bool = False  # runs in the world's proxy session (World.plan_for)


def _serve(server: socket.socket, answer: str) -> None:
    """Answer every connection to server with answer, until it is closed."""
    while True:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        with connection:
            connection.sendall(answer.encode())


def _serve_api(server: socket.socket, key: str, answer: str) -> None:
    """A stand-in for an agent's API on the host's loopback: every request is answered with
    answer and whether it carried key in x-api-key, as the launcher's proxy adds it (the
    judgement is the host's, made here, not the session's)."""
    while True:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        with connection, contextlib.suppress(OSError):
            connection.settimeout(PROBE_TIMEOUT_SECONDS)
            received = b""
            while b"\r\n\r\n" not in received and len(received) < 65536:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                received += chunk
            head, _, body = received.partition(b"\r\n\r\n")
            headers = {}
            for line in head.decode("latin-1").split("\r\n")[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            while len(body) < length and (chunk := connection.recv(4096)):
                body += chunk  # read whole: a reply to a request half read may be reset
            verdict = "key-ok" if headers.get("x-api-key") == key else "key-wrong"
            text = f"{answer} {verdict}".encode()
            connection.sendall(
                b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                % (len(text), text)
            )


# Searches everything a session can read for a secret, given reversed (so that the search's own
# argv holds no copy): its environment, every process's environ, cmdline and memory (but its
# own, which holds the needle once reversed back), and its files. Prints "found: [...]".
SECRET_SEARCH = r"""
import os, sys
secret = sys.argv[1][::-1].encode()
found, searched = [], 0
for name, value in os.environ.items():
    if secret in value.encode():
        found.append("environment " + name)
for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    for part in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{part}", "rb") as f:
                if secret in f.read():
                    found.append(f"/proc/{pid}/{part}")
        except OSError:
            pass
    if int(pid) == os.getpid():
        continue
    try:
        with open(f"/proc/{pid}/maps") as f:
            regions = [line.split()[:2] for line in f]
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        continue
    searched += 1
    for span, perms in regions:
        start, end = (int(x, 16) for x in span.split("-"))
        if perms[0] != "r" or end - start > 256 << 20:
            continue
        try:
            if secret in os.pread(mem, end - start, start):
                found.append(f"/proc/{pid}/mem")
                break
        except OSError:
            pass
    os.close(mem)
for top in ("/tmp", os.environ.get("HOME", "/"), os.getcwd(), "/run", "/etc"):
    for root, dirs, files in os.walk(top):
        for name in files:
            try:
                with open(os.path.join(root, name), "rb") as f:
                    if secret in f.read(1 << 20):
                        found.append(os.path.join(root, name))
            except OSError:
                pass
print("memory of", searched, "processes searched", file=sys.stderr)
print("found:", sorted(set(found)))
"""


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


def _host_network(plan: Plan) -> Plan:
    return plan.replace(network="host", network_reason="weakened: the launcher's network")


def _drop(dest: str, chdir: str | None = None) -> Callable[[Plan], Plan]:
    def weaken(plan: Plan) -> Plan:
        weaker = plan.without(dest)
        return weaker.replace(chdir=chdir) if chdir else weaker

    return weaken


class World:
    """A stand-in host: secrets, a data root, a checkout, a harness, a tool socket, two
    sessions; `coder` is the session under test. A root launcher's sessions run as user (an
    unprivileged account), who then owns the whole world, as a real stack's account would."""

    def __init__(self, root: str, user: RunAs | None = None) -> None:
        self.root = root
        self.user = user if user is not None else run_as(None)
        self.token = os.urandom(8).hex()
        self.abstract_name = f"nsconfine-selftest-{self.token}"  # a host abstract socket
        # Host files outside root that a weakened twin may write; removed when the world ends.
        self.outside_marks: list[str] = []
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
        self.loopback_port = 0  # the host loopback service's, once running
        self.api_port = 0  # the stand-in API's (on the host's loopback), once running
        self.api_key = f"sk-stand-in-{self.token}"  # the credential file's key for it
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
        # The workspace is a repository, and so is vendor/lib inside it: their .git/config is
        # a file the host trusts.
        self.git_config = os.path.join(self.workspace, ".git", "config")
        self.nested_git = os.path.join(self.workspace, "vendor", "lib", ".git")
        for git_dir in (os.path.dirname(self.git_config), self.nested_git):
            os.makedirs(os.path.join(git_dir, "objects"))
            os.makedirs(os.path.join(git_dir, "refs", "heads"))
            with open(os.path.join(git_dir, "HEAD"), "w") as file:
                file.write("ref: refs/heads/main\n")
            with open(os.path.join(git_dir, "config"), "w") as file:
                file.write("[core]\n\trepositoryformatversion = 0\n")
        os.makedirs(os.path.dirname(self.harness))
        with open(self.harness, "w") as file:
            file.write(f"#!/bin/sh\necho harness {self.token}\n")
        os.chmod(self.harness, 0o755)
        fd = os.open(self.credential, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, f"ANTHROPIC_API_KEY={self.api_key}\n".encode())
        os.close(fd)
        self.key_serial = 0  # a key in the launcher's session keyring, while running
        self.key_payload = f"broker-key-{self.token}"
        if os.geteuid() == 0:
            self._give_to(self.user)

    def _give_to(self, user: RunAs) -> None:
        os.chmod(self.root, 0o755)  # mkdtemp's 0700 would keep the session's account out
        for directory, names, files in walk(self.root):
            os.chown(directory, user.uid, user.gid)
            for name in names + files:
                path = os.path.join(directory, name)
                if path != self.credential:  # the launcher's, mode 0600
                    os.lchown(path, user.uid, user.gid)

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
            user=self.user.name if os.geteuid() == 0 else None,
        )

    def plan(self) -> Plan:
        """The coder session's checked plan, the stand-in home denied like a real one."""
        return build_plan(self.session(), homes=[self.home], environ={})

    def proxy_plan(self, inject: bool = True) -> Plan:
        """The coder session with a "proxy" network: one listed host (the host's loopback
        service, by a pinned name) and, with inject, its API (the stand-in) reached through a
        route whose key the launcher's proxy holds; without, the key in its environment."""
        session = self.session().replace(
            network="proxy",
            allow_hosts=(f"listed.test:{self.loopback_port}=127.0.0.1",),
            inject=("anthropic",) if inject else (),
        )
        environ = {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{self.api_port}"}
        return build_plan(session, homes=[self.home], environ=environ)

    def plan_for(self, probe: Probe) -> Plan:
        """The plan probe runs on."""
        return self.proxy_plan() if probe.proxied else self.plan()

    @contextlib.contextmanager
    def running(self) -> Iterator[World]:
        """The world's live parts: the tool socket's server, a host process carrying the
        token in its command line, and a secret fd the launcher leaves inheritable."""
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.tool_socket)
        server.listen(8)
        if os.geteuid() == 0:  # connecting takes write permission on the socket
            os.chown(self.tool_socket, self.user.uid, self.user.gid)
        threading.Thread(target=_serve, args=(server, f"pong {self.token}"), daemon=True).start()
        # A service on the host's loopback (a broker's API, a database): no session reaches it.
        loopback = socket.create_server(("127.0.0.1", 0))
        self.loopback_port = loopback.getsockname()[1]
        threading.Thread(
            target=_serve, args=(loopback, f"loopback {self.token}"), daemon=True
        ).start()
        api = socket.create_server(("127.0.0.1", 0))
        self.api_port = api.getsockname()[1]
        threading.Thread(
            target=_serve_api, args=(api, self.api_key, f"api {self.token}"), daemon=True
        ).start()
        self.host_process = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", f"host-{self.token}"]
        )
        self.leaked_fd = os.open(self.secrets["~/.ssh/id_ed25519"], os.O_RDONLY)
        os.set_inheritable(self.leaked_fd, True)
        self.key_serial = _add_session_key(self.key_payload)
        abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        abstract.bind("\0" + self.abstract_name)
        abstract.listen(8)
        try:
            yield self
        finally:
            abstract.close()
            api.close()
            loopback.close()
            _revoke_key(self.key_serial)
            os.close(self.leaked_fd)
            for mark in self.outside_marks:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(mark)
            self.host_process.kill()
            self.host_process.wait()
            server.close()

    def probes(self) -> list[Probe]:
        """Every check, refusals first; each one judged from the host."""
        probes = [self._read_probe(name, path) for name, path in self.secrets.items()]
        probes += self._write_refusals()
        probes += self._process_and_fd_refusals()
        probes += self._network_refusals()
        probes += self._host_power_refusals()
        probes += self._trusted_file_refusals()
        probes += self._layer_refusals()
        probes += self._needs()
        return probes

    def _layer_refusals(self) -> list[Probe]:
        """A probe per kernel layer this host has, each judged by what the session got done."""
        keyring = (
            "import ctypes; libc = ctypes.CDLL(None); "
            "print('made' if libc.syscall(250, 0, -3, 1) > 0 else 'refused')"  # keyctl
        )
        families = (
            "import socket\nfor f in ('AF_VSOCK', 'AF_ALG', 'AF_TIPC', 'AF_RDS', 'AF_CAN', "
            "'AF_PACKET', 'AF_BLUETOOTH'):\n    family = getattr(socket, f, None)\n"
            "    for kind in (socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_STREAM):\n"
            "        try:\n            socket.socket(family, kind).close(); print('opened', f)\n"
            "        except (OSError, TypeError):\n            pass"
        )
        probes = [
            Probe(
                "make keys with the keyring syscalls",
                False,
                f"python3 -c {_quote(keyring)}",
                lambda outcome: outcome.stdout.strip() == "made",
                lambda plan: plan,
                layers_off=("seccomp",),
            ),
            Probe(
                "open a socket family past UNIX, INET and NETLINK",
                False,
                f"python3 -c {_quote(families)}",
                lambda outcome: "opened" in outcome.stdout,
                lambda plan: plan,
                layers_off=("seccomp",),
            ),
            Probe(
                "make a nested user namespace",
                False,
                "unshare -U true && echo made",
                lambda outcome: outcome.stdout.strip() == "made",
                lambda plan: plan,
                layers_off=("no-nested-userns",),
            ),
        ]
        if os.uname().machine == "x86_64":
            read_ldt = (  # modify_ldt(0, buffer, 16): reads this process's LDT
                "import ctypes; libc = ctypes.CDLL(None); ldt = ctypes.create_string_buffer(16)\n"
                "print('read' if libc.syscall(154, 0, ldt, 16) >= 0 else 'refused')"
            )
            probes.append(
                Probe(
                    "reach the LDT (modify_ldt)",
                    False,
                    f"python3 -c {_quote(read_ldt)}",
                    lambda outcome: outcome.stdout.strip() == "read",
                    lambda plan: plan,
                    layers_off=("seccomp",),
                )
            )
        scopes = _layers.landlock_abi() >= _layers.LANDLOCK_SCOPES_ABI
        connect = (
            "import socket, sys; s = socket.socket(socket.AF_UNIX)\ntry:\n"
            "    s.connect('\\0' + sys.argv[1]); print('connected')\n"
            "except OSError:\n    print('refused')"
        )
        # Both the session's own network namespace and Landlock's scope keep it out.
        probes.append(
            Probe(
                "connect to a host abstract socket",
                False,
                f"python3 -c {_quote(connect)} {self.abstract_name}",
                lambda outcome: outcome.stdout.strip() == "connected",
                _host_network,
                layers_off=("landlock",) if scopes else (),
            )
        )
        if scopes:
            pid_1 = (
                "import ctypes, os; libc = ctypes.CDLL(None)\n"
                "try:\n    os.close(os.open('/proc/1/mem', os.O_RDWR)); print('reached')\n"
                "except OSError:\n    print('refused')"
            )
            probes += [
                Probe(
                    "write the memory of the sandbox's pid 1",
                    False,
                    f"python3 -c {_quote(pid_1)}",
                    lambda outcome: outcome.stdout.strip() == "reached",
                    lambda plan: plan,
                    layers_off=("landlock",),
                ),
            ]
        return probes

    def _trusted_file_refusals(self) -> list[Probe]:
        envrc = os.path.join(self.workspace, ".envrc")
        git_dir = os.path.dirname(self.git_config)

        def unprotected(*dests: str) -> Callable[[Plan], Plan]:
            return lambda plan: plan.replace(
                entries=tuple(e for e in plan.entries if e.dest not in dests)
            )

        nested = os.path.dirname(self.nested_git)
        made = os.path.join(self.workspace, "made-later")
        plant = "printf '\\tfsmonitor = touch /tmp/pwned\\n' >> {}; true"

        def writes_fsmonitor(path: str) -> Callable[[Outcome], bool]:
            return lambda outcome: "fsmonitor" in (_read(path) or "")

        return [
            Probe(
                "hide a repository's HEAD, then write its config at the next launch",
                False,
                f"{plant.format(_quote(self.nested_git + '/config'))}; "
                f"mv {_quote(nested)}/HEAD.away {_quote(self.nested_git)}/HEAD",
                writes_fsmonitor(self.nested_git + "/config"),
                unprotected(self.nested_git + "/config", self.nested_git),
                before=f"mv {_quote(self.nested_git)}/HEAD {_quote(nested)}/HEAD.away",
            ),
            Probe(
                "make a repository, then write its config at the next launch of one plan",
                False,
                plant.format(_quote(made + "/.git/config")),
                writes_fsmonitor(made + "/.git/config"),
                lambda plan: plan.replace(protection=None),  # not looked at again: stale
                before=f"mkdir -p {_quote(made)}/.git/objects {_quote(made)}/.git/refs && "
                f"echo 'ref: refs/heads/main' > {_quote(made)}/.git/HEAD && "
                f": > {_quote(made)}/.git/config",
            ),
            Probe(
                "rewrite .git/config, whose commands the host runs",
                False,
                f"cd {_quote(self.workspace)}; "
                "printf '\tfsmonitor = touch /tmp/pwned\n' >> .git/config; "
                "mv .git .git.old && mkdir .git && echo '[core] fsmonitor = x' > .git/config; "
                "true",
                lambda outcome: "fsmonitor" in (_read(self.git_config) or ""),
                unprotected(self.git_config, git_dir),
            ),
            Probe(
                "create an .envrc, which the host's shell runs",
                False,
                f"echo 'echo pwned' > {_quote(envrc)}",
                lambda outcome: "pwned" in (_read(envrc) or ""),
                unprotected(envrc),
            ),
        ]

    def planted_symlink_leaks(self, launcher: Launcher = spawn, check: bool = True) -> str | None:
        """The attack of a session that plants `next -> …/checkout` in its workspace, where
        the broker will put the next session's workspace: None if the next launch is refused or
        sees nothing of the checkout beyond its runner file; else what it read. check=False
        builds the second plan past the lint (the twin that must leak)."""
        planted = os.path.join(self.workspace, "next")
        checkout = os.path.dirname(self.runner_file)
        plant = run_script(self.plan(), f"ln -sfn {_quote(checkout)} {_quote(planted)}")
        if plant.status != 0:
            return f"could not plant: {plant.stderr.strip()}"
        try:
            if check:
                next_plan = build_plan(
                    self.session().replace(workspace=planted, ro=(self.runner_file,)),
                    homes=[self.home],
                    environ={},
                )
            else:  # past the lint (and without protected paths, each of which refuses too)
                from nsconfine._plan.protect import PROTECTED

                session = self.session().replace(
                    workspace=planted,
                    ro=(self.runner_file,),
                    unprotect=tuple(name for name, _, _ in PROTECTED),
                )
                system = system_entries(self.user, session.home)
                next_plan = Plan.of(
                    [*system, *session_entries(session, reserved=system)],
                    chdir=planted,
                    user=self.user,
                )
        except NsconfineError:
            return None
        finally:
            if check:
                os.unlink(planted)
        secret = self.secrets["the checkout outside the runner's files"]
        outcome = run_script(
            next_plan, f"cat {_quote(planted)}/{os.path.basename(secret)}", launcher
        )
        if not check:
            os.unlink(planted)
        truth = _read(secret)
        return outcome.stdout if truth and outcome.stdout == truth else None

    def process_limit_leaks(self, weakened: bool = False, launcher: Launcher = spawn) -> str | None:
        """A session allowed PROBED_PROCESSES forks until fork fails (at most FORK_BOUND
        times) and holds what it got, while the launcher starts another session that forks
        8 more: None if the first stopped short of its limit and the second forked; else what
        happened. weakened: the first session's limit raised past the bound (the twin that
        must report it)."""
        plan = self.plan()
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
            second = run_script(plan, f"python3 -c {_quote(FORK_UNTIL_REFUSED)} 8", launcher)
        finally:
            holder.kill()
            holder.wait()
            os.close(read_end)
        if not held.isdigit() or int(held) >= PROBED_PROCESSES:
            return f"the first session forked {held or 'nothing'} (its limit: {PROBED_PROCESSES})"
        if second.stdout.strip() != "8":
            return f"the second session could not fork: {second.stderr.strip()[-200:]}"
        return None

    def terminal_read_leaks(self, through_cli: bool = True) -> str | None:
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
            os.chown(os.ttyname(terminal), self.user.uid, self.user.gid)
        secret = f"typed-{self.token}"
        errors_read, errors_write = os.pipe2(os.O_CLOEXEC)
        try:
            argv = ["python3", "-c", _READS_THE_TERMINAL]
            if through_cli:
                session = self.session()
                user = ["--user", self.user.name] if os.geteuid() == 0 else []
                child: subprocess.Popen[bytes] | Sandbox = subprocess.Popen(
                    [sys.executable, "-m", "nsconfine", "run", *user,
                     "--workspace", session.workspace, "--run-dir", session.run_dir, "--",
                     *argv],
                    stdin=subprocess.DEVNULL, stdout=terminal, stderr=errors_write, cwd="/",
                )  # fmt: skip
            else:
                child = spawn(self.plan(), argv, stdout=terminal, stderr=errors_write)
            os.close(errors_write)
            errors_write = -1
            seen = b""
            deadline = time.monotonic() + PROBE_TIMEOUT_SECONDS
            while b"ready" not in seen and time.monotonic() < deadline:
                if select.select([controller], [], [], 1)[0]:
                    seen += os.read(controller, 4096)
            os.write(controller, secret.encode() + b"\n")
            told = b""
            while chunk := os.read(errors_read, 65536):
                told += chunk
            child.wait(PROBE_TIMEOUT_SECONDS)
        finally:
            for fd in (controller, terminal, errors_read, errors_write):
                if fd >= 0:
                    os.close(fd)
        return secret if secret.encode() in told else None

    def _host_power_refusals(self) -> list[Probe]:
        planted = os.path.join(self.workspace, f"setuid-{self.token}")
        plant = (
            f"cp /bin/sh {_quote(planted)}-chmod; chmod 4755 {_quote(planted)}-chmod; "
            "python3 -c 'import os, sys; os.umask(0); "
            "os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o6755))' "
            f"{_quote(planted)}-open; true"
        )

        def kept_a_setid_bit(outcome: Outcome) -> bool:
            import stat

            for suffix in ("-chmod", "-open"):
                try:
                    if os.lstat(planted + suffix).st_mode & (stat.S_ISUID | stat.S_ISGID):
                        return True
                except OSError:
                    continue
            return False

        reader = (
            "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
            "buf = ctypes.create_string_buffer(256); "
            "n = libc.syscall(250, 11, int(sys.argv[1]), buf, 256); "  # keyctl(KEYCTL_READ)
            "sys.stdout.write(buf.raw[:n].decode() if n > 0 else '')"
        )
        return [
            Probe(
                "open a sysctl for write",
                False,
                f"python3 -c {_quote(_OPEN_SYSCTLS)}",
                lambda outcome: outcome.stdout.strip() not in ("", "0"),
                _drop("/proc/sys"),
            ),
            Probe(
                "read a key from the launcher's session keyring",
                False,
                f"python3 -c {_quote(reader)} {self.key_serial}",
                lambda outcome: outcome.stdout == self.key_payload,
                lambda plan: plan,
                layers_off=("session-keyring", "seccomp"),  # the filter refuses keyctl too
            ),
            Probe(
                "plant a setuid file on the host",
                False,
                plant,
                kept_a_setid_bit,
                lambda plan: plan,
                layers_off=("seccomp",),
            ),
        ]

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
        self.outside_marks += [etc_file, usr_file, host_tmp]
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

    def _network_refusals(self) -> list[Probe]:
        client = (
            "import socket, sys\ntry:\n"
            "    s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)\n"
            "    print(s.recv(100).decode(), end='')\nexcept OSError as e:\n    print(e)"
        )
        unlisted = f"unlisted.test:{self.loopback_port}"
        return [
            Probe(
                "reach a service on the host's loopback (the default network is none)",
                False,
                f"python3 -c {_quote(client)} {self.loopback_port}",
                lambda outcome: outcome.stdout == f"loopback {self.token}",
                _host_network,
            ),
            Probe(
                "reach a host its allowlist does not name, through its proxy",
                False,
                f"python3 -c {_quote(_TUNNEL)} {unlisted}",
                lambda outcome: f"loopback {self.token}" in outcome.stdout,
                lambda plan: plan.replace(
                    destinations=(
                        *plan.destinations,
                        Destination.parse(f"{unlisted}=127.0.0.1", "weakened: listed"),
                    )
                ),
                proxied=True,
            ),
            Probe(
                "find its API key in its environment, memory, files or /proc",
                False,
                f"python3 -c {_quote(SECRET_SEARCH)} {_quote(self.api_key[::-1])}",
                lambda outcome: "found: [" in outcome.stdout and "found: []" not in outcome.stdout,
                lambda plan: self.proxy_plan(inject=False),
                proxied=True,
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
                lambda outcome: outcome.stdout == self.api_key,
                lambda plan: plan.replace(
                    env=tuple(v for v in plan.env if v.name != "ANTHROPIC_API_KEY")
                ),
            ),
            Probe(
                "call its API through its proxy, which adds the key it never holds",
                True,
                f"python3 -c {_quote(_CALL_API)}",
                lambda outcome: outcome.stdout == f"api {self.token} key-ok",
                lambda plan: plan.replace(routes=()),
                proxied=True,
            ),
            Probe(
                "exit with its command's status",
                True,
                "exit 42",
                lambda outcome: outcome.status == 42,
                lambda plan: plan.replace(chdir="/nonexistent"),
            ),
        ]


# A CONNECT through the session's proxy (the relay on its loopback) to argv[1]; prints what
# the tunnel brings back (the host's loopback service says who it is), or the proxy's refusal.
_TUNNEL = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(f"CONNECT {sys.argv[1]} HTTP/1.1\r\nHost: {sys.argv[1]}\r\n\r\n".encode())
got = b""
while b"loopback" not in got and (chunk := s.recv(4096)):
    got += chunk
print(got.decode(errors="replace"))
"""

# A call to the API as a harness makes it: to its base URL, with the key it holds (a placeholder).
_CALL_API = """
import os, urllib.request, urllib.error
request = urllib.request.Request(
    os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages",
    data=b"{}",
    headers={"x-api-key": os.environ.get("ANTHROPIC_API_KEY", "")},
)
try:
    print(urllib.request.urlopen(request, timeout=20).read().decode(), end="")
except OSError as error:
    print(error)
"""


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
print("ready", flush=True)
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

_OPEN_SYSCTLS = r"""
import os
opened = 0
for root, dirs, files in os.walk("/proc/sys"):
    for name in files:
        try:
            os.close(os.open(os.path.join(root, name), os.O_WRONLY))  # opened, never written
            opened += 1
        except OSError:
            pass
print(opened)
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
        eof = bool(poller.poll(5000)) and os.read(read_end, 1) == b""
        os.close(read_end)
        deadline = time.monotonic() + 5
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


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


_SYS_ADD_KEY, _SYS_KEYCTL = 248, 250  # x86_64; the probe is skipped where keyctl differs
_KEYCTL_JOIN_SESSION_KEYRING, _KEYCTL_REVOKE = 1, 3
_KEY_SPEC_SESSION_KEYRING = -3


def _add_session_key(payload: str) -> int:
    """Put a key (as a broker's secret) in this process's session keyring, a fresh one of its
    own; its serial, or 0 where keyrings are unavailable."""
    import platform

    if platform.machine() != "x86_64":
        return 0
    libc = _libc()
    if libc.syscall(_SYS_KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        return 0
    data = payload.encode()
    serial = libc.syscall(
        _SYS_ADD_KEY, b"user", b"nsconfine-selftest", data, len(data), _KEY_SPEC_SESSION_KEYRING
    )
    return max(int(serial), 0)


def _revoke_key(serial: int) -> None:
    if serial > 0:
        _libc().syscall(_SYS_KEYCTL, _KEYCTL_REVOKE, serial)


def run_selftest(*, as_json: bool = False, user: str | None = None) -> int:
    """Build a stand-in world, run every probe confined, print the table; 0 if all hold.
    As root, the stand-in sessions run as user (default: nobody)."""
    rows: list[dict[str, Any]] = []
    account = run_as(user) if user else (canary_account() if os.geteuid() == 0 else None)
    root = scratch_directory("nsconfine-selftest-")
    try:
        world = World(root, account)
        with world.running():
            plan = world.plan()
            for probe in world.probes():
                allowed, outcome = run_probe(world.plan_for(probe), probe)
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
            left = killed_launches_leave_nothing(plan)
            rows.append(
                {
                    "check": "outlive a launch killed at once",
                    "expected": "refused",
                    "observed": "refused" if left is None else f"allowed: {left}",
                    "ok": left is None,
                }
            )
            starved = world.process_limit_leaks()
            rows.append(
                {
                    "check": "fork past the session's process limit, starving its account",
                    "expected": "refused",
                    "observed": "refused" if starved is None else f"allowed: {starved}",
                    "ok": starved is None,
                }
            )
            typed = world.terminal_read_leaks()
            rows.append(
                {
                    "check": "read what the user types at the terminal its output goes to",
                    "expected": "refused",
                    "observed": "refused" if typed is None else f"allowed: {typed}",
                    "ok": typed is None,
                }
            )
            leaked = world.planted_symlink_leaks()
            rows.append(
                {
                    "check": "redirect the next workspace by a planted symlink",
                    "expected": "refused",
                    "observed": "refused" if leaked is None else "allowed",
                    "ok": leaked is None,
                }
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
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
