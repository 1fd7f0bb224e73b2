"""`nsconfine selftest`'s stand-in world: a temp directory laid out like an agent stack's host.

A home with stand-in secrets, a data root, a canonical checkout, a harness, a tool socket, a
service on the host's loopback, a stand-in for an agent's API, and two role sessions; the coder
session is the one under test. Its plan is built the way every plan is (the stand-in home's
stores denied like a real home's). nsconfine._selftest.probes says what a session tries in it,
nsconfine._selftest.report runs the probes and prints the table.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from nsconfine._kernel.accounts import RunAs, run_as
from nsconfine._kernel.walk import walk
from nsconfine._plan.model import Plan
from nsconfine._session import Harness, Session, build_plan

PROBE_TIMEOUT_SECONDS = 30.0


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
        # All of it but the root itself and the credential (the launcher's, mode 0600, which
        # must lie where no other account can put another file in its place). Deepest first,
        # and no link followed: as each is given away, every directory above it is still
        # root's, so the account cannot swap a name on its way for a link (given top-down, a
        # directory it owned already had a child swapped, and root chowned where it led).
        os.chmod(self.root, 0o755)  # mkdtemp's 0700 would keep the session's account out
        paths = [
            os.path.join(directory, name)
            for directory, names, files in walk(self.root)
            for name in names + files
        ]
        for path in reversed(paths):  # (walk lists a directory before what it holds)
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

    @contextlib.contextmanager
    def running(self) -> Iterator[World]:
        """The world's live parts: the tool socket's server, a host process carrying the
        token in its command line, and a secret fd the launcher leaves inheritable."""
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.tool_socket)
        server.listen(8)
        if os.geteuid() == 0:  # connecting takes write permission on the socket
            # (not through a link the account, whose directory this is, put in its place)
            os.lchown(self.tool_socket, self.user.uid, self.user.gid)
        # A service on the host's loopback (a broker's API, a database): no session reaches it.
        loopback = socket.create_server(("127.0.0.1", 0))
        self.loopback_port = loopback.getsockname()[1]
        api = socket.create_server(("127.0.0.1", 0))
        self.api_port = api.getsockname()[1]
        servers = [
            _served(server, _serve, f"pong {self.token}"),
            _served(loopback, _serve, f"loopback {self.token}"),
            _served(api, _serve_api, self.api_key, f"api {self.token}"),
        ]
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
            _revoke_key(self.key_serial)
            os.close(self.leaked_fd)
            for mark in self.outside_marks:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(mark)
            self.host_process.kill()
            self.host_process.wait()
            for listener, thread in servers:
                # Shut down first: closing alone wakes no accept() already waiting on it, and
                # the thread would live on, holding the port (and the keyring it runs under).
                with contextlib.suppress(OSError):
                    listener.shutdown(socket.SHUT_RDWR)
                listener.close()
                thread.join()


def _served(
    listener: socket.socket, serve: Callable[..., None], *args: str
) -> tuple[socket.socket, threading.Thread]:
    """listener, served by serve(listener, *args) on a thread of its own, started."""
    thread = threading.Thread(target=serve, args=(listener, *args), daemon=True)
    thread.start()
    return listener, thread


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
