"""The network section: what a "proxy" session's way out costs, each row next to its baseline.

- launch: spawn to exit of /bin/true with network "proxy" (one allow_hosts entry) against the
  same session with "none".
- request: a small GET to a stand-in server on the host's loopback, from a client inside one
  long-lived proxy session (through the relay on 127.0.0.1:3128, absolute-form, Connection:
  close), against the same client on the host, straight to the server.
- download: one large download through the proxy, as plain HTTP and through a CONNECT tunnel,
  against the same download straight from the server.
- memory: the launcher's RSS and threads with N idle proxy sessions, against N idle "none"
  sessions; each per session.

The stand-in server is a process of its own: in the launcher it would share the GIL with the
proxy measured through it. Both clients are one program on one interpreter (the host's
python3, which a session sees too); each times its own requests, so the pipes that drive them
are outside the times, and the bench asks them in turn, request by request, so a busy machine
slows both alike.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final

import psutil

import nsconfine
from nsconfine._plan.model import RELAY_PORT
from nsconfine.bench._core import (
    BenchError,
    Config,
    Launchers,
    Results,
    Row,
    Task,
    Waiter,
    World,
    _ms,
    _progress,
    interleave,
    live,
    sleeper,
    until_exit,
)

# The python3 a session runs (its /usr is the host's): the clients inside and outside.
CLIENT_PYTHON: Final = "/usr/bin/python3"
STANDIN_NAME: Final = "standin.test"  # pinned to 127.0.0.1 by the session's one allow_hosts entry
SMALL_BYTES: Final = 1024
ANSWER_SECONDS: Final = 120.0  # a client silent this long is stuck: the bench stops, not hangs
MIB: Final = 1 << 20

# The stand-in upstream: answers GET .../bytes/N with N zero bytes (sendfile from a sparse
# memfd: the server is never what limits a download) and closes; runs until its stdin ends.
_STANDIN = r"""
import os, socket, sys, threading
most = int(sys.argv[1])
zeros = os.memfd_create("standin")
os.ftruncate(zeros, most)
listener = socket.create_server(("127.0.0.1", 0), backlog=128)

def serve(conn):
    with conn:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        size = int(data.split(b" ", 2)[1].rsplit(b"/", 1)[1])
        if size > most:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
        offset = 0
        while offset < size:
            offset += os.sendfile(conn.fileno(), zeros, offset, size - offset)
        conn.shutdown(socket.SHUT_WR)

def accept():
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()

threading.Thread(target=accept, daemon=True).start()
print(listener.getsockname()[1], flush=True)
sys.stdin.read()
"""

# The client, inside a session and on the host alike. Each stdin line is "HOW BYTES": HOW is
# direct (to the server), plain (absolute-form through the relay) or tunnel (CONNECT through
# the relay, then the same GET); it answers one line: the nanoseconds from connect() to the
# response's end, or "error ..." when the answer was not 200 with every byte.
_CLIENT = r"""
import socket, sys, time
server_port, relay_port, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
authority = f"{name}:{server_port}"
buffer = memoryview(bytearray(1 << 20))

def head_of(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("the connection ended inside a response head")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode("latin-1"), len(rest)

def fetch(how, size):
    path = f"/bytes/{size}"
    began = time.perf_counter_ns()
    sock = socket.create_connection(("127.0.0.1", server_port if how == "direct" else relay_port))
    with sock:
        if how == "tunnel":
            sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
            status, _ = head_of(sock)
            if not status.startswith("HTTP/1.1 200"):
                raise OSError(f"CONNECT answered {status!r}")
        target = f"http://{authority}{path}" if how == "plain" else path
        request = f"GET {target} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
        sock.sendall(request.encode())
        status, received = head_of(sock)
        while n := sock.recv_into(buffer):
            received += n
    ended = time.perf_counter_ns()
    if not status.startswith("HTTP/1.1 200") or received != size:
        raise OSError(f"answered {status!r} with {received} of {size} bytes")
    return ended - began

for line in sys.stdin:
    how, size = line.split()
    try:
        print(fetch(how, int(size)), flush=True)
    except OSError as error:
        print("error", how, error, flush=True)
"""


# How a client is started: argv with stdin and stdout on the given fds; "wait for its status".
Launch = Callable[[Sequence[str], int, int], Waiter]


class _Client:
    """One client (a host process, or a session's command) and the pipes that drive it."""

    def __init__(self, name: str, launch: Launch, argv: Sequence[str]) -> None:
        self.name = name
        commands_read, self._to_client = os.pipe2(os.O_CLOEXEC)
        self._from_client, answers_write = os.pipe2(os.O_CLOEXEC)
        try:
            self._wait = launch(argv, commands_read, answers_write)
        except BaseException:
            os.close(self._to_client)
            os.close(self._from_client)
            raise
        finally:  # the client's ends are the client's now
            os.close(commands_read)
            os.close(answers_write)
        self._poller = select.poll()
        self._poller.register(self._from_client, select.POLLIN)

    def ask(self, how: str, size: int) -> int:
        """One request, timed by the client: its nanoseconds."""
        os.write(self._to_client, f"{how} {size}\n".encode())
        line = b""
        while not line.endswith(b"\n"):
            if not self._poller.poll(ANSWER_SECONDS * 1000):
                raise BenchError(f"the {self.name} client did not answer in {ANSWER_SECONDS:g} s")
            chunk = os.read(self._from_client, 4096)
            if not chunk:
                raise BenchError(f"the {self.name} client ended")
            line += chunk
        answer = line.decode().strip()
        if not answer.isdigit():
            raise BenchError(f"the {self.name} client: {answer}")
        return int(answer)

    def close(self) -> None:
        """End the client (its stdin ends) and wait for it; it must exit 0."""
        os.close(self._to_client)
        os.close(self._from_client)
        status = self._wait()
        if status != 0:
            raise BenchError(f"the {self.name} client exited with status {status}")


def _on_host(argv: Sequence[str], stdin: int, stdout: int) -> Waiter:
    return subprocess.Popen(argv, stdin=stdin, stdout=stdout).wait


def _in_session(plan: nsconfine.Plan) -> Launch:
    def launch(argv: Sequence[str], stdin: int, stdout: int) -> Waiter:
        return nsconfine.spawn(plan, list(argv), stdin=stdin, stdout=stdout).wait

    return launch


@contextmanager
def _standin(most: int) -> Iterator[int]:
    """The stand-in server, serving up to most bytes, for the block: its port."""
    server = subprocess.Popen(
        [sys.executable, "-I", "-c", _STANDIN, str(most)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdin is not None
    assert server.stdout is not None
    try:
        line = server.stdout.readline()
        if not line.strip().isdigit():
            raise BenchError(f"the stand-in server did not start (it said {line!r})")
        yield int(line)
    finally:
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stdout.close()


def bench_network(results: Results, w: World, config: Config) -> None:
    """A proxy session against the same without it: launch, request, download, memory."""
    if not os.access(CLIENT_PYTHON, os.X_OK):
        reason = f"no {CLIENT_PYTHON}, the clients' interpreter, on this host"
        results.skipped.append({"name": "network", "reason": reason})
        return
    large = config.download_mib * MIB
    with _standin(large) as port:
        listed = f"{STANDIN_NAME}:{port}=127.0.0.1"
        plans = {
            "proxy": w.session(network="proxy", allow_hosts=[listed]).plan(),
            "none": w.session(network="none").plan(),
        }
        _launches(results, w, config, plans)
        _traffic(results, config, plans["proxy"], port, large)
        _idle_memory(results, w, config, plans)


def _add_rows(
    results: Results,
    kind: str,
    unit: str,
    samples: dict[str, list[float]],
    notes: dict[str, str],
    baseline: str | None,
) -> None:
    """A row network.KIND.NAME for each of notes' names, compared with network.KIND.BASELINE."""
    for name, note in notes.items():
        compared = None if baseline in (None, name) else f"network.{kind}.{baseline}"
        results.add(Row("network", f"network.{kind}.{name}", unit, samples[name], compared, note))


def _launches(results: Results, w: World, config: Config, plans: dict[str, nsconfine.Plan]) -> None:
    tasks = [
        Task(name, until_exit(Launchers(w.bwrap, plan).nsconfine, w.devnull), config.launches)
        for name, plan in plans.items()
    ]
    _progress(f"network: launches, proxy and none x {config.launches} rounds")
    samples = {name: _ms(values) for name, values in interleave(tasks).items()}
    notes = {
        "proxy": 'nsconfine.spawn to exit, network "proxy" (one allow_hosts entry)',
        "none": 'nsconfine.spawn to exit, network "none", the same session otherwise',
    }
    _add_rows(results, "launch", "ms", samples, notes, "none")


def _traffic(
    results: Results, config: Config, proxy_plan: nsconfine.Plan, port: int, large: int
) -> None:
    """Small requests, then large downloads, by a client inside a proxy session and by the
    same client on the host, asked in turn."""
    argv = [CLIENT_PYTHON, "-I", "-c", _CLIENT, str(port), str(RELAY_PORT), STANDIN_NAME]
    with contextlib.ExitStack() as stack:
        host = _Client("host", _on_host, argv)
        stack.callback(host.close)
        session = _Client("session", _in_session(proxy_plan), argv)
        stack.callback(session.close)

        def ask(client: _Client, how: str, size: int, rounds: int, name: str) -> Task:
            return Task(name, lambda: client.ask(how, size), rounds, warmup=1)

        _progress(f"network: small requests, proxy and direct x {config.requests} rounds")
        requests = interleave(
            [
                ask(session, "plain", SMALL_BYTES, config.requests, "proxy"),
                ask(host, "direct", SMALL_BYTES, config.requests, "direct"),
            ]
        )
        rounds = config.download_rounds
        _progress(f"network: {config.download_mib} MiB downloads x {rounds} rounds")
        downloads = interleave(
            [
                ask(session, "plain", large, rounds, "plain"),
                ask(session, "tunnel", large, rounds, "tunnel"),
                ask(host, "direct", large, rounds, "direct"),
            ]
        )
    timed = "; connect to the response's last byte"
    notes = {
        "proxy": f"GET of {SMALL_BYTES} B in a proxy session (relay, proxy, server){timed}",
        "direct": f"the same GET on the host, straight to the server{timed}",
    }
    samples = {name: _ms(values) for name, values in requests.items()}
    _add_rows(results, "request", "ms", samples, notes, "direct")
    for key in ("p50", "p99"):
        proxy = results.p("network.request.proxy", key)
        direct = results.p("network.request.direct", key)
        assert proxy is not None
        assert direct is not None
        results.derived[f"network_request_added_{key}_ms"] = proxy - direct
    got = f"one {config.download_mib} MiB GET"
    notes = {
        "plain": f"{got} through the proxy, plain HTTP (absolute-form)",
        "tunnel": f"{got} through the proxy, in a CONNECT tunnel",
        "direct": f"{got} on the host, straight from the server",
    }
    rates = {
        name: [large / MIB / (ns / 1e9) for ns in ns_each] for name, ns_each in downloads.items()
    }
    _add_rows(results, "download", "MiB/s", rates, notes, "direct")


def _idle_memory(
    results: Results, w: World, config: Config, plans: dict[str, nsconfine.Plan]
) -> None:
    """The launcher's RSS and threads with N idle sessions of each kind, per session."""
    count = config.live_sessions
    me = psutil.Process()
    rss: dict[str, list[float]] = {name: [] for name in plans}
    threads: dict[str, list[float]] = {name: [] for name in plans}
    _progress(f"network: the launcher with {count} idle sessions x {config.memory_rounds} rounds")
    for round_number in range(config.memory_rounds):
        order = list(plans) if round_number % 2 == 0 else list(plans)[::-1]
        for name in order:
            gc.collect()
            rss_before, threads_before = me.memory_info().rss, me.num_threads()
            with live(count, sleeper(plans[name], w.devnull)):
                gc.collect()
                rss[name].append((me.memory_info().rss - rss_before) / 1024 / count)
                threads[name].append((me.num_threads() - threads_before) / count)
    for what, unit, samples in (("rss", "KiB", rss), ("threads", "threads", threads)):
        notes = {
            name: f"the launcher's {what} with {count} idle {name} sessions less before, each"
            for name in plans
        }
        _add_rows(results, f"memory.{what}", unit, samples, notes, None)
