"""The egress proxy on real local sockets: a session's requests arrive on its unix socket (as
its relay would pass them), upstreams are local HTTP, TLS and raw TCP servers on 127.0.0.1
reached through destinations pinned there (listed by address).

Every refusal is paired with a twin whose rule lets the same request through, so each test
can fail: it is the rule that refuses, not a broken path."""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import ipaddress
import json
import os
import resource
import socket
import ssl
import stat
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from helpers import LocalCA, make_local_ca

from nsconfine._errors import SandboxUnavailable, UsageError
from nsconfine._launch.egress import AuditLog
from nsconfine._launch.proxy import (
    MAX_INTERIM_HEADS,
    UPSTREAM_RECEIVE_BYTES,
    Proxy,
    _RequestBody,
    _ResponseHeadRewriter,
    parse_head,
)
from nsconfine._plan.allowlist import Destination, HostRefused, Route, canonical_host, judge

SECRET = b"sk-real-secret-0123456789"

# -- upstreams ------------------------------------------------------------------------------


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers with what it received (path, headers, body) as JSON, keep-alive on purpose:
    the proxy must make the client see Connection: close. /sse streams two events, the second
    only once the test has seen the first."""

    protocol_version = "HTTP/1.1"
    release: threading.Event

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        if self.path.endswith("/sse"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "keep-alive")
            self.end_headers()
            self.wfile.write(b"data: one\n\n")
            self.wfile.flush()
            self.server.release.wait(30)  # type: ignore[attr-defined]
            self.wfile.write(b"data: two\n\n")
            self.close_connection = True
            return
        payload = json.dumps(
            {"path": self.path, "headers": list(self.headers.items()), "body": body}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "keep-alive")
        self.end_headers()
        self.wfile.write(payload)
        self.close_connection = True  # as asked (send_header took keep-alive for its own)

    do_GET = do_POST = _answer


@dataclass
class Upstream:
    port: int
    release: threading.Event


def _serve_http(context: ssl.SSLContext | None) -> Iterator[Upstream]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    release = threading.Event()
    server.release = release  # type: ignore[attr-defined]
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Upstream(server.server_address[1], release)
    release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def http_upstream() -> Iterator[Upstream]:
    yield from _serve_http(None)


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    """A CA and a certificate it signed for localhost and 127.0.0.1 (openssl CLI)."""
    return make_local_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def tls_upstream(test_ca: LocalCA) -> Iterator[Upstream]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(test_ca.cert, test_ca.key)
    yield from _serve_http(context)


class _TcpServer:
    """A raw TCP server on 127.0.0.1: echo (until EOF, then close), flood (send until the
    peer's buffers are full, then set `blocked`) or record (read until EOF, then answer an
    HTTP 200 whose body is every byte it read)."""

    def __init__(self, answer: Literal["echo", "flood", "record"] = "echo") -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.answer = answer
        self.blocked = threading.Event()
        self.peers: list[socket.socket] = []
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def _accept(self) -> None:
        serve = {"echo": self._echo, "flood": self._flood, "record": self._record}[self.answer]
        while True:
            try:
                peer, _ = self.listener.accept()
            except OSError:
                return
            self.peers.append(peer)
            threading.Thread(target=serve, args=(peer,), daemon=True).start()

    @staticmethod
    def _echo(peer: socket.socket) -> None:
        try:
            while data := peer.recv(65536):
                peer.sendall(data)
            peer.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    @staticmethod
    def _record(peer: socket.socket) -> None:
        received = b""
        try:
            while data := peer.recv(65536):
                received += data
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(received)}\r\n\r\n".encode()
            peer.sendall(head + received)
            peer.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _flood(self, peer: socket.socket) -> None:
        peer.settimeout(1.0)
        try:
            while True:
                peer.sendall(b"x" * 65536)
        except TimeoutError:
            self.blocked.set()
        except OSError:
            pass

    def close(self) -> None:
        # Shut down, not just closed: a close leaves the socket listening inside the accept()
        # that is waiting on it, which would take one more connection (one the proxy made just
        # before, say) after the peers below were closed, and leave it to the collector.
        self.listener.shutdown(socket.SHUT_RDWR)
        self.accepting.join()
        self.listener.close()
        for peer in self.peers:
            peer.close()


@pytest.fixture
def echo() -> Iterator[_TcpServer]:
    server = _TcpServer()
    yield server
    server.close()


@pytest.fixture
def recorder() -> Iterator[_TcpServer]:
    server = _TcpServer("record")
    yield server
    server.close()


# -- the proxy and a session's side of it ---------------------------------------------------

FAKE_DNS = {
    "loopback.test": ["127.0.0.1"],
    "metadata.test": ["169.254.169.254"],
    "lan.test": ["10.0.0.1"],
}


def fake_resolver(host: str, port: int) -> list[str]:
    if host in FAKE_DNS:
        return FAKE_DNS[host]
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


class Audited(list[dict[str, object]]):
    def wait_for(self, decision: str, count: int = 1) -> list[dict[str, object]]:
        """The records of that decision, once there are count of them (an allowed connection is
        audited when it ends, just after its client saw the end)."""
        for _ in range(400):
            found = [r for r in self if r["decision"] == decision]
            if len(found) >= count:
                return found
            time.sleep(0.025)
        raise AssertionError(f"no {count} {decision} audit records in {list(self)}")


@pytest.fixture
def audited() -> Audited:
    return Audited()


@pytest.fixture
def proxy(audited: Audited) -> Iterator[Proxy]:
    with Proxy(
        sandboxes_only=False, audit=audited.append, resolver=fake_resolver, head_timeout=1.0
    ) as proxy:
        yield proxy


def dest(text: str) -> Destination:
    return Destination.parse(text, "the test needs it")


def connect(path: str) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    try:
        client.connect(path)
    except OSError:
        client.close()
        raise
    return client


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def ask(path: str, request: bytes) -> bytes:
    """What the proxy answers a whole request (read until it closes); for a CONNECT it
    allows, the answer head alone (the tunnel stays open)."""
    with connect(path) as client:
        client.sendall(request)
        if not request.startswith(b"CONNECT "):
            return read_all(client)
        head = read_head(client)
        return head if status(head) == 200 else head + read_all(client)


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def read_head(sock: socket.socket) -> bytes:
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        if not byte:
            break
        head += byte
    return head


def tunnel(path: str, target: str) -> tuple[socket.socket, bytes]:
    """A client socket after CONNECT target, and the proxy's answer head."""
    client = connect(path)
    try:
        client.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    except BrokenPipeError:
        pass  # refused at once: the answer, sent before the close, is still there to read
    return client, read_head(client)


def connect_status(path: str, target: str) -> int:
    client, head = tunnel(path, target)
    client.close()
    return status(head)


def get(host: str, port: int, path: str = "/hello", extra: str = "") -> bytes:
    return (
        f"GET http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\n{extra}"
        "Proxy-Authorization: Basic c2Vzc2lvbg==\r\n\r\n"
    ).encode()


def body_json(response: bytes) -> dict[str, object]:
    parsed: dict[str, object] = json.loads(response.partition(b"\r\n\r\n")[2])
    return parsed


def headers_of(response: bytes) -> list[tuple[str, str]]:
    lines = response.partition(b"\r\n\r\n")[0].decode().split("\r\n")[1:]
    return [(k.lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines)]


# -- judging, pure --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("PyPI.org", "pypi.org"),
        ("pypi.org.", "pypi.org"),
        ("[::1]", "::1"),
        ("10.0.0.5", "10.0.0.5"),
    ],
)
def test_canonical_host(text: str, canonical: str) -> None:
    assert canonical_host(text) == canonical


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("allowed.test\0.evil.com", "control"),
        ("allowed%2etest", "percent"),
        ("allowed.test@evil.com", "user information"),
        ("allowéd.test", "punycode (xn--)"),
        ("a" * 64 + ".test", "63"),
        (("a" * 60 + ".") * 5 + "test", "253"),
        ("allowed..test", "empty label"),
        ("allowed.test..", "empty label"),
        ("allowed_test.com", "letters, digits"),
        ("-allowed.test", "letters, digits"),
        ("allowed.test/x", "slash"),
        ("allowed.test\\x", "slash"),
        ("allowed test", "space"),
        ("2130706433", "non-standard"),
        ("127.1", "non-standard"),
        ("0x7f.0.0.1", "non-standard"),
        ("[::1%eth0]", "percent"),
        ("", "empty"),
    ],
)
def test_canonical_host_refuses(text: str, says: str) -> None:
    with pytest.raises(HostRefused, match=says.replace("(", r"\(").replace(")", r"\)")):
        canonical_host(text)


@pytest.mark.parametrize(
    ("text", "pattern", "port", "address"),
    [
        ("pypi.org", "pypi.org", None, None),
        ("PyPI.org.:8443", "pypi.org", 8443, None),
        ("*.githubusercontent.com", "*.githubusercontent.com", None, None),
        ("api.test=127.0.0.1", "api.test", None, "127.0.0.1"),
        ("api.test:8080=[::1]", "api.test", 8080, "::1"),
        ("[::1]:8443", "::1", 8443, None),
        ("10.0.0.5", "10.0.0.5", None, None),
    ],
)
def test_destination_parse(text: str, pattern: str, port: int | None, address: str | None) -> None:
    assert dest(text) == Destination(pattern, port, address, "the test needs it")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("*.com", "too broad"),
        ("pypi.org:0", "port"),
        ("pypi.org:http", "port"),
        ("pypi.org=pypi.org", "pin an IP address"),
        ("10.0.0.5=10.0.0.6", "pins nothing"),
        ("[::1", "IPv6"),
        ("*.10.0.0.5", "wildcard of an IP"),
        ("pypi.org/simple", "slash"),
        ("pypi.org:\u00b2", "port"),  # (a superscript two: str.isdigit's, a traceback)
        ("pypi.org:\u0668\u0660", "port"),  # (Arabic-Indic 80: taken as port 80)
        ("0.0.0.0", "unspecified"),
        ("mirror.test:8088=0.0.0.0", "unspecified"),
        ("[::]:443", "unspecified"),
        ("mirror.test=[::ffff:0.0.0.0]", "unspecified"),
        ("255.255.255.255", "broadcast"),
        ("224.0.0.1", "multicast"),
        ("mirror.test=[ff02::1]", "multicast"),
    ],
)
def test_destination_parse_refuses(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        dest(text)


def test_destination_needs_a_reason_and_a_canonical_pattern() -> None:
    for blank in (" ", "\u2800", "\u200b"):
        with pytest.raises(UsageError, match="no reason"):
            Destination.parse("pypi.org", blank)
    with pytest.raises(UsageError, match=r"write it as 'pypi\.org'"):
        Destination("PyPI.org", None, None, "why")


def public(host: str, port: int) -> list[str]:
    return ["93.184.216.34"]


@pytest.mark.parametrize(
    ("host", "rule", "allowed"),
    [
        ("pypi.org", "pypi.org", True),
        ("files.pypi.org", "pypi.org", False),
        ("pypi.org.evil.com", "pypi.org", False),
        ("raw.githubusercontent.com", "*.githubusercontent.com", True),
        ("a.b.githubusercontent.com", "*.githubusercontent.com", True),
        ("githubusercontent.com", "*.githubusercontent.com", False),
        ("evil-githubusercontent.com", "*.githubusercontent.com", False),
        ("githubusercontent.com.evil.com", "*.githubusercontent.com", False),
    ],
)
def test_judge_matches_on_label_boundaries(host: str, rule: str, allowed: bool) -> None:
    assert judge(host, 443, [dest(rule)], public).allowed is allowed


@pytest.mark.parametrize(
    ("port", "rule", "allowed"),
    [(443, "pypi.org", True), (80, "pypi.org", True), (22, "pypi.org", False),
     (22, "pypi.org:22", True), (443, "pypi.org:22", False)],
)  # fmt: skip
def test_judge_ports(port: int, rule: str, allowed: bool) -> None:
    decision = judge("pypi.org", port, [dest(rule)], public)
    assert decision.allowed is allowed
    assert allowed or f"port {port}" in decision.reason


PRIVATE = ["127.0.0.1", "169.254.169.254", "10.0.0.1", "172.16.0.1", "192.168.1.1",
           "100.64.0.1", "0.0.0.0", "224.0.0.1", "240.0.0.1", "::1", "fe80::1", "fc00::1",
           "::ffff:10.0.0.1", "::", "ff02::1"]  # fmt: skip
UNPINNABLE = ("0.0.0.0", "224.0.0.1", "::", "ff02::1")


@pytest.mark.parametrize("address", PRIVATE)
def test_judge_refuses_a_name_resolving_to_a_private_address(address: str) -> None:
    decision = judge("api.test", 443, [dest("api.test")], lambda h, p: ["93.184.216.34", address])
    assert not decision.allowed
    assert "pin it" in decision.reason
    if address in UNPINNABLE:  # no destination may be pinned there (test_destination_parse)
        with pytest.raises(UsageError, match=r"unspecified|multicast"):
            dest(f"api.test={address}")
        return
    # The twin: listed by that address, the same destination is reached there.
    pinned = judge("api.test", 443, [dest(f"api.test={address}")], fake_resolver)
    assert pinned.allowed
    assert pinned.address == str(ipaddress.ip_address(address))


def test_judge_refuses_the_hosts_own_address() -> None:
    own = {ipaddress.ip_address("93.184.216.34")}
    assert not judge("api.test", 443, [dest("api.test")], public, lambda: own).allowed
    assert judge("api.test", 443, [dest("api.test")], public).allowed


def test_judge_asks_for_the_hosts_addresses_only_for_a_resolved_name() -> None:
    """A pinned name and a listed literal are judged without reading this host's addresses
    (0.1 ms a request); a name the resolver answers is checked against them."""
    asked: list[str] = []

    def own() -> frozenset[ipaddress.IPv4Address]:
        asked.append("asked")
        return frozenset()

    assert judge("api.test", 443, [dest("api.test=10.0.0.5")], public, own).allowed
    assert judge("93.184.216.34", 443, [dest("93.184.216.34")], public, own).allowed
    assert asked == []
    assert judge("api.test", 443, [dest("api.test")], public, own).allowed
    assert asked == ["asked"]


def test_judge_refuses_an_unlisted_ip_literal() -> None:
    assert not judge("93.184.216.34", 443, [dest("api.test")], public).allowed
    assert not judge("[::1]", 443, [dest("api.test")], public).allowed
    assert judge("93.184.216.34", 443, [dest("93.184.216.34")], public).allowed
    assert judge("[::1]", 8443, [dest("[::1]:8443")], public).addresses == ("::1",)


def test_judge_refuses_what_does_not_resolve() -> None:
    decision = judge("nowhere.test", 443, [dest("nowhere.test")], fake_resolver)
    assert not decision.allowed
    assert "does not resolve" in decision.reason


def test_judge_prefers_an_exact_rule_to_a_wildcard() -> None:
    rules = [dest("*.api.test"), dest("x.api.test=127.0.0.1")]
    assert judge("x.api.test", 443, rules, public).address == "127.0.0.1"
    assert judge("y.api.test", 443, rules, public).address == "93.184.216.34"


# -- CONNECT and plain HTTP on real sockets -------------------------------------------------


def test_connect_tunnels_tls_end_to_end(proxy: Proxy, tls_upstream: Upstream, test_ca: LocalCA,
                                        audited: Audited) -> None:  # fmt: skip
    path = proxy.add_session("s", [dest(f"secure.test:{tls_upstream.port}=127.0.0.1")], [])
    client, head = tunnel(path, f"secure.test:{tls_upstream.port}")
    assert head == b"HTTP/1.1 200 Connection established\r\n\r\n"
    context = ssl.create_default_context(cafile=test_ca.ca)
    with context.wrap_socket(client, server_hostname="localhost") as tls:
        tls.sendall(b"GET /through HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        response = read_all(tls)
    assert status(response) == 200
    assert body_json(response)["path"] == "/through"
    [record] = audited.wait_for("allowed")
    assert record["host"] == "secure.test"
    assert record["address"] == "127.0.0.1"
    assert int(str(record["bytes_up"])) > 0
    assert int(str(record["bytes_down"])) > len(response)


def test_connect_passes_a_half_close(proxy: Proxy, echo: _TcpServer) -> None:
    path = proxy.add_session("s", [dest(f"echo.test:{echo.port}=127.0.0.1")], [])
    client, head = tunnel(path, f"echo.test:{echo.port}")
    with client:
        assert status(head) == 200
        client.sendall(b"early and late")
        client.shutdown(socket.SHUT_WR)
        assert read_all(client) == b"early and late"


def test_urgent_data_from_the_upstream_neither_stalls_nor_spins_a_tunnel(proxy: Proxy) -> None:
    """A tunnel's upstream that sends TCP urgent data (MSG_OOB) and more after it: the bytes
    after the mark reach the client, and the proxy's thread does not spin. splice(2) never
    reads past the urgent mark while poll() says the socket is readable: before the fix the
    connection's thread spun at a full core until the connection ended (idle_timeout never
    came) and the client got nothing more."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    path = proxy.add_session("s", [dest(f"urgent.test:{port}=127.0.0.1")], [])
    client, head = tunnel(path, f"urgent.test:{port}")
    upstream, _ = listener.accept()
    with client, upstream, listener:
        assert status(head) == 200
        upstream.sendall(b"before ")
        upstream.send(b"!", socket.MSG_OOB)
        time.sleep(0.2)  # the mark reaches the proxy before what follows it
        upstream.sendall(b"after")
        received = b""
        deadline = time.monotonic() + 10
        while not received.endswith(b"after") and time.monotonic() < deadline:
            client.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                received += client.recv(100)
            except TimeoutError:
                break
        assert received.startswith(b"before "), received
        assert received.endswith(b"after"), received
        start = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(1.0)  # the tunnel is idle: the proxy's threads wait
        end = resource.getrusage(resource.RUSAGE_SELF)
        spent = end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime
        assert spent < 0.3, f"the proxy spent {spent:.2f} s of CPU in an idle second"


def test_plain_http_is_forwarded_in_origin_form(proxy: Proxy, http_upstream: Upstream) -> None:
    port = http_upstream.port
    path = proxy.add_session("s", [dest(f"web.test:{port}=127.0.0.1")], [])
    response = ask(path, get("web.test", port, "/hello?x=1"))
    assert status(response) == 200
    echoed = body_json(response)
    assert echoed["path"] == "/hello?x=1"
    sent = {k.lower(): v for k, v in echoed["headers"]}  # type: ignore[attr-defined]
    assert sent["host"] == f"web.test:{port}"
    assert sent["connection"] == "close"
    assert "proxy-authorization" not in sent
    assert ("connection", "close") in headers_of(response)
    assert ("connection", "keep-alive") not in headers_of(response)


PIPELINED = b"GET /second HTTP/1.1\r\nHost: another-vhost.test\r\n\r\n"


def _first_request(proxy: Proxy, via: str, port: int, framing: str) -> tuple[str, bytes]:
    """A session whose one destination is the upstream at port, reached by a plain-HTTP
    request or through a route (via): its socket, and a POST head there with framing."""
    if via == "route":
        route = Route("anthropic", f"http://127.0.0.1:{port}", "x-api-key", SECRET)
        path = proxy.add_session("s", [], [route])
        head = f"POST /anthropic/v1/messages HTTP/1.1\r\nHost: 127.0.0.1:3128\r\n{framing}\r\n"
    else:
        path = proxy.add_session("s", [dest(f"web.test:{port}=127.0.0.1")], [])
        head = (
            f"POST http://web.test:{port}/first HTTP/1.1\r\nHost: web.test:{port}\r\n{framing}\r\n"
        )
    return path, head.encode()


def _through(path: str, request: bytes) -> bytes:
    """The proxy's answer to request, sent whole and half-closed (the recorder answers at EOF)."""
    with connect(path) as client:
        client.sendall(request)
        client.shutdown(socket.SHUT_WR)
        return read_all(client)


@pytest.mark.parametrize(
    ("framing", "body", "forwarded"),
    [
        ("", b"", b""),
        ("Content-Length: 5\r\n", b"hello", b"hello"),
        ("Transfer-Encoding: chunked\r\n", b"5;x=y\r\nhello\r\n1\r\n!\r\n0\r\n\r\n",
         b"5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n"),
    ],
    ids=["no body", "content-length", "chunked"],
)  # fmt: skip
@pytest.mark.parametrize("via", ["plain http", "route"])
def test_one_request_goes_upstream_and_nothing_after_it(
    proxy: Proxy, recorder: _TcpServer, via: str, framing: str, body: bytes, forwarded: bytes
) -> None:
    """The upstream gets the connection's first request and its body, framed as its head says
    (chunks re-sent plainly), and nothing after it: a request pipelined behind it would reach
    the listed host's address under any Host header, or another path of a route's API host
    unchecked. Found by an attacker's pass: the bytes after the first request went on raw."""
    path, head = _first_request(proxy, via, recorder.port, framing)
    response = _through(path, head + body + PIPELINED)
    assert status(response) == 200, response
    received = response.partition(b"\r\n\r\n")[2]
    assert received.startswith(b"POST /")
    assert received.partition(b"\r\n\r\n")[2] == forwarded


@pytest.mark.parametrize(
    ("framing", "body", "upstream_framing"),
    [
        ("Content-Length: 0005\r\n", b"hello", b"Content-Length: 5"),
        ("Transfer-Encoding: CHUNKED\r\n", b"5\r\nhello\r\n0\r\n\r\n",
         b"Transfer-Encoding: chunked"),
    ],
    ids=["content-length", "chunked"],
)  # fmt: skip
@pytest.mark.parametrize("via", ["plain http", "route"])
def test_the_upstream_is_told_the_framing_the_proxy_read(
    proxy: Proxy, recorder: _TcpServer, via: str, framing: str, body: bytes,
    upstream_framing: bytes,
) -> None:  # fmt: skip
    """The body's length goes upstream as the proxy read it, in one canonical spelling: the
    client's own (leading zeros, a coding's case) is for an upstream to read otherwise, and
    take what follows the body for a request of its own. Found by an attacker's pass."""
    path, head = _first_request(proxy, via, recorder.port, framing)
    response = _through(path, head + body)
    assert status(response) == 200, response
    upstream_head = response.partition(b"\r\n\r\n")[2].partition(b"\r\n\r\n")[0]
    framing_lines = [
        line
        for line in upstream_head.split(b"\r\n")[1:]
        if line.split(b":")[0].lower() in (b"content-length", b"transfer-encoding")
    ]
    assert framing_lines == [upstream_framing]


@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: 18446744073709551621\r\n",  # 2**64 + 5: 5 to a parser that wraps
        "Content-Length: 40\r\nTransfer_Encoding: chunked\r\n",  # CGI reads TRANSFER_ENCODING
        "Content_Length: 40\r\n",
        "Content-Length: " + "9" * 5000 + "\r\n",  # (past the digits int() reads)
    ],
    ids=["a length past 2**63", "Transfer_Encoding", "Content_Length", "5,000 digits"],
)
@pytest.mark.parametrize("via", ["plain http", "route"])
def test_a_body_length_an_upstream_could_read_otherwise_is_refused(
    proxy: Proxy, recorder: _TcpServer, via: str, framing: str
) -> None:
    """A length no 64-bit parser holds, or a framing header spelled with '_' (which CGI-style
    servers read as its '-' spelling), would have an upstream find a second request in the
    body, one the proxy never judged: refused before anything goes upstream. Found by an
    attacker's pass: both went on as sent."""
    path, head = _first_request(proxy, via, recorder.port, framing)
    response = _through(path, head + b"0\r\n\r\n" + PIPELINED)
    assert status(response) == 400, response
    assert not recorder.peers


def test_a_chunked_body_is_framed_the_same_whatever_its_pieces() -> None:
    """Chunked framing read a byte at a time (each line split anywhere) gives the same bytes
    upstream as read whole, and nothing of what follows it."""
    request = parse_head(b"POST http://web.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    sent = b"3;a=b\r\nabc\r\n10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n" + PIPELINED
    whole = _RequestBody(request).feed(sent)
    assert whole == b"3\r\nabc\r\n10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n"
    body = _RequestBody(request)
    assert b"".join(body.feed(sent[n : n + 1]) for n in range(len(sent))) == whole


@pytest.mark.parametrize("size", [b"8000000000000000", b"ffffffffffffffff"])
def test_a_chunk_size_no_64_bit_parser_holds_is_refused(size: bytes) -> None:
    """A chunk's size past 2**63 - 1, which an upstream's signed 64-bit parser would wrap (and
    find a second request in the chunk's data), is refused as a Content-Length past it is
    (attacker's pass, stop 38: 2**63 and 2**64 - 1 went upstream as written)."""
    from nsconfine._launch import proxy as _proxy

    request = parse_head(b"POST http://web.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    with pytest.raises(_proxy._Refusal, match="chunk"):
        _RequestBody(request).feed(size + b"\r\n" + PIPELINED)
    largest = b"7fffffffffffffff\r\nabc"
    assert _RequestBody(request).feed(largest) == largest


def test_a_connection_whose_process_is_gone_is_not_called_one_from_outside(
    tmp_path: Path,
) -> None:
    """A connection is judged by the network of the process that connected (SO_PEERCRED): one
    that has exited by then is refused, and its audit says so, not that it came from outside
    the sandbox: a session's forked child that connects and exits at once had the audit, and
    run's stderr, report a host process at the proxy (attacker's pass, stop 38)."""
    from nsconfine._launch.proxy import _refusal_of_peer

    path = str(tmp_path / "socket")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen()
    client = socket.socket(socket.AF_UNIX)
    child = os.fork()
    if child == 0:
        client.connect(path)
        os._exit(0)
    os.waitpid(child, 0)
    accepted, _ = listener.accept()
    own = os.stat("/proc/self/ns/net").st_ino
    try:
        reason = _refusal_of_peer(accepted, own)
        assert reason is not None
        assert "outside" not in reason, reason
        assert "ended" in reason, reason
        with socket.socket(socket.AF_UNIX) as ours:  # the twin: this very process connects
            ours.connect(path)
            mine, _ = listener.accept()
            with mine:
                assert _refusal_of_peer(mine, own) is None
                assert "outside" in (_refusal_of_peer(mine, own + 1) or "")
    finally:
        accepted.close()
        client.close()
        listener.close()


def test_a_chunked_body_of_tiny_chunks_is_refused() -> None:
    """Each chunk is framed again in Python, on the launcher's threads: a body of one-byte
    chunks made a session's uploads take a launcher core, stalling every other session's
    launches. Past MIN_CHUNKS_CHECKED chunks, chunks averaging under MIN_AVERAGE_CHUNK bytes
    are refused; the twin, chunks of a normal size, passes whole."""
    from nsconfine._launch import proxy as _proxy

    request = parse_head(b"POST http://web.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    tiny = b"1\r\nA\r\n" * (_proxy.MIN_CHUNKS_CHECKED * 2)
    with pytest.raises(_proxy._Refusal, match="chunks"):
        _RequestBody(request).feed(tiny)
    normal = (b"400\r\n" + b"x" * 1024 + b"\r\n") * (_proxy.MIN_CHUNKS_CHECKED * 2)
    assert _RequestBody(request).feed(normal + b"0\r\n\r\n") == normal + b"0\r\n\r\n"


def test_a_sessions_chunk_framing_is_paced() -> None:
    """A session's connections frame at most CHUNKS_PER_SECOND chunks a second between them
    (after CHUNKS_AT_ONCE at once); one over it sleeps its share, off the interpreter's lock.
    Framing is Python on the launcher's threads: 32 connections sending 128-byte chunks (the
    smallest average allowed) held a core and stalled the launcher's other launches for 6-9 s
    (attacker's pass, stop 33). Here on a clock of the test's: no time passes."""
    from nsconfine._launch import proxy as _proxy

    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    pace = _proxy._Pace(clock=lambda: now[0], sleep=sleep)
    pace.take(_proxy.CHUNKS_AT_ONCE)
    assert slept == []
    pace.take(_proxy.CHUNKS_PER_SECOND * 3)
    assert slept == [pytest.approx(3.0)]
    now[0] += 1.0  # a quiet second refills that much
    pace.take(_proxy.CHUNKS_PER_SECOND)
    assert slept == [pytest.approx(3.0)]


def test_a_connection_owing_its_pace_ends_with_its_session(
    proxy: Proxy, recorder: _TcpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection asleep for its session's pace wakes when the session ends: its end waits
    for its connections (CONNECTIONS_END_SECONDS at most), which would have found this one
    still asleep, holding its fds past the session's end (hostile review, stop 33: a
    connection could owe 16 s)."""
    from nsconfine._launch import proxy as _proxy

    monkeypatch.setattr(_proxy, "CHUNKS_PER_SECOND", 1)  # each chunk past the first: 1 s owed
    monkeypatch.setattr(_proxy, "CHUNKS_AT_ONCE", 1)
    path, head = _first_request(
        proxy, "plain http", recorder.port, "Transfer-Encoding: chunked\r\n"
    )
    client = connect(path)
    client.sendall(head + b"1\r\nx\r\n" * 600)  # 10 minutes owed
    session = proxy._sessions["s"]
    for _ in range(400):  # (its thread has taken the chunks, and sleeps)
        if session.connections:
            break
        time.sleep(0.025)
    proxy.remove_session("s")
    assert not session.connections
    client.close()


def test_a_route_s_tls_handshake_under_way_ends_with_its_session(
    proxy: Proxy, recorder: _TcpServer
) -> None:
    """An https upstream that takes the connection and never answers the handshake (a stalled
    gateway): the session's end stops it, as it stops a connect under way (attacker's pass,
    stop 40: the TLS socket had taken the fd the end shut, which then shut nothing; the end
    waited CONNECTIONS_END_SECONDS, and the thread lived on, its audit record unwritten)."""
    route = Route("anthropic", f"https://127.0.0.1:{recorder.port}", "x-api-key", SECRET)
    path = proxy.add_session("s", [], [route])
    client = connect(path)
    client.sendall(b"POST /anthropic/v1/m HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    session = proxy._sessions["s"]
    for _ in range(400):  # (the proxy has connected: its handshake is under way, or about to)
        if recorder.peers:
            break
        time.sleep(0.025)
    time.sleep(0.2)
    assert session.connections
    proxy.remove_session("s")
    assert not session.connections
    client.close()


@pytest.mark.parametrize("via", ["plain http", "route"])
def test_each_chunk_a_session_sends_is_paced(
    proxy: Proxy, recorder: _TcpServer, via: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every chunk of a session's chunked body, through a destination or a route, is taken
    from its session's pace (the twin: a body of Content-Length takes none)."""
    from nsconfine._launch import proxy as _proxy

    taken: list[int] = []
    monkeypatch.setattr(_proxy._Pace, "take", lambda _pace, count: taken.append(count))
    path, head = _first_request(proxy, via, recorder.port, "Transfer-Encoding: chunked\r\n")
    chunks = b"400\r\n" + b"x" * 1024 + b"\r\n"
    assert status(_through(path, head + chunks * 3000 + b"0\r\n\r\n")) == 200
    assert sum(taken) == 3001
    taken.clear()
    proxy.remove_session("s")
    path, head = _first_request(proxy, via, recorder.port, "Content-Length: 5\r\n")
    assert status(_through(path, head + b"hello")) == 200
    assert sum(taken) == 0


@pytest.mark.parametrize(
    ("framing", "body", "expected"),
    [
        ("Transfer-Encoding: gzip\r\n", b"", 501),
        ("Transfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n", 501),
        ("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n", 400),
        ("Transfer-Encoding: chunked\r\n", b"zz\r\nhello\r\n0\r\n\r\n", 400),
        ("Transfer-Encoding: chunked\r\n", b"5\nhello\r\n0\r\n\r\n", 400),
        ("Transfer-Encoding: chunked\r\n", b"5\r\nhelloXX0\r\n\r\n", 400),
        ("Transfer-Encoding: chunked\r\n", b"0\r\nX-Api-Key: forged\r\n\r\n", 400),
        ("Transfer-Encoding: chunked\r\n", b"0\r\n\r\n", 200),
    ],
    ids=["unknown coding", "coding before chunked", "chunked twice", "size not hex",
         "bare LF", "no CRLF after data", "trailer", "twin: empty chunked body"],
)  # fmt: skip
def test_a_body_whose_framing_the_proxy_cannot_read_is_refused(
    proxy: Proxy, recorder: _TcpServer, framing: str, body: bytes, expected: int
) -> None:
    """A transfer coding other than chunked is 501, malformed chunked framing (or a trailer,
    which an upstream may take for a header) is 400: the proxy forwards only what it can frame."""
    path, head = _first_request(proxy, "plain http", recorder.port, framing)
    assert status(_through(path, head + body)) == expected


@pytest.mark.parametrize("listed", [False, True])
def test_a_name_not_listed_is_refused(proxy: Proxy, echo: _TcpServer, listed: bool) -> None:
    rules = [dest(f"echo.test:{echo.port}=127.0.0.1")]
    if listed:
        rules.append(dest(f"other.test:{echo.port}=127.0.0.1"))
    path = proxy.add_session("s", rules, [])
    assert connect_status(path, f"other.test:{echo.port}") == (200 if listed else 403)


@pytest.mark.parametrize("listed", [False, True])
@pytest.mark.parametrize("literal", ["127.0.0.1", "[::1]"])
def test_an_ip_literal_is_refused_unless_listed(proxy: Proxy, echo: _TcpServer, listed: bool,
                                                literal: str) -> None:  # fmt: skip
    rules = [dest(f"echo.test:{echo.port}=127.0.0.1")]
    if listed:
        rules.append(dest(f"{literal}:{echo.port}"))
    path = proxy.add_session("s", rules, [])
    expected = 200 if listed and literal == "127.0.0.1" else 502 if listed else 403
    assert connect_status(path, f"{literal}:{echo.port}") == expected  # ::1 listens nowhere


@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("name", ["loopback.test", "metadata.test", "lan.test"])
def test_a_name_resolving_to_a_private_address_is_refused(
    proxy: Proxy, echo: _TcpServer, audited: Audited, pinned: bool, name: str
) -> None:
    rule = f"{name}:{echo.port}" + ("=127.0.0.1" if pinned else "")
    path = proxy.add_session("s", [dest(rule)], [])
    response = ask(path, f"CONNECT {name}:{echo.port} HTTP/1.1\r\n\r\n".encode())
    if pinned:  # listed by address: reached (at the pin, whatever the resolver says)
        assert status(response) == 200
        return
    assert status(response) == 403
    assert b"pin it" in response
    address = FAKE_DNS[name][0].encode()
    assert address not in response  # (the launcher's answer: for its log, not the session)
    [record] = audited.wait_for("refused")
    assert record["host"] == name
    assert "resolves to" in str(record["reason"])
    assert FAKE_DNS[name][0] in str(record["reason"])


def test_an_unreachable_destination_is_told_without_its_address(
    proxy: Proxy, audited: Audited
) -> None:
    """A listed name the proxy cannot reach is refused without the address the launcher's
    resolver gave (attacker's pass, stop 32: a wildcard listing let a session learn the
    private addresses of internal names from the refusals); the audit record keeps it."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    path = proxy.add_session("s", [dest(f"far.test:{port}=127.0.0.1")], [])
    response = ask(path, f"CONNECT far.test:{port} HTTP/1.1\r\n\r\n".encode())
    assert status(response) == 502, response
    assert b"far.test" in response
    assert b"127.0.0.1" not in response
    [record] = audited.wait_for("refused")
    assert "127.0.0.1" in str(record["reason"])


@pytest.mark.parametrize("rule_port", ["", ":{port}"])
def test_an_unlisted_port_is_refused(proxy: Proxy, echo: _TcpServer, rule_port: str) -> None:
    path = proxy.add_session("s", [dest("echo.test" + rule_port.format(port=echo.port) +
                                        "=127.0.0.1")], [])  # fmt: skip
    assert connect_status(path, f"echo.test:{echo.port}") == (403 if not rule_port else 200)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("allowed.test", 200),
        ("ALLOWED.Test", 200),
        ("allowed.test.", 200),
        ("allowed.test\0.evil.test", 400),
        ("allowed%2etest", 403),
        ("allowed.test%00", 403),
        ("allowed.test@evil.test", 403),
        ("evil.test@allowed.test", 403),
        ("allowed.test.evil.test", 403),
        ("evil-allowed.test", 403),
        ("allowéd.test", 400),
        ("a" * 64 + ".allowed.test", 403),
        ("allowed.test\\.evil.test", 403),
    ],
)
def test_parser_differentials(proxy: Proxy, http_upstream: Upstream, audited: Audited,
                              target: str, expected: int) -> None:  # fmt: skip
    port = http_upstream.port
    rules = [dest(f"allowed.test:{port}=127.0.0.1"), dest(f"*.allowed.test:{port}=127.0.0.1")]
    path = proxy.add_session("s", rules, [])
    for request in (
        f"CONNECT {target}:{port} HTTP/1.1\r\n\r\n",
        f"GET http://{target}:{port}/ HTTP/1.1\r\n\r\n",
    ):
        response = ask(path, request.encode())
        assert status(response) == expected, response
    if expected == 200:
        assert {r["host"] for r in audited.wait_for("allowed", 2)} == {"allowed.test"}
    else:
        assert response.endswith(b"\n")
        assert response.partition(b"\r\n\r\n")[2].startswith(b"nsconfine: ")


@pytest.mark.parametrize(
    ("host_header", "expected"),
    [("web.test:{port}", 200), ("WEB.test.:{port}", 200), ("evil.test:{port}", 400),
     ("web.test", 400), ("web.test:{port}\r\nHost: evil.test", 400), ("web.test:{port}@evil", 400)],
)  # fmt: skip
def test_the_host_header_must_agree(proxy: Proxy, http_upstream: Upstream, host_header: str,
                                    expected: int) -> None:  # fmt: skip
    port = http_upstream.port
    path = proxy.add_session("s", [dest(f"web.test:{port}=127.0.0.1")], [])
    request = f"GET http://web.test:{port}/ HTTP/1.1\r\nHost: {host_header.format(port=port)}"
    assert status(ask(path, (request + "\r\n\r\n").encode())) == expected


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n",
        b"GET https://web.test/ HTTP/1.1\r\n\r\n",
        b"CONNECT web.test HTTP/1.1\r\n\r\n",
        b"CONNECT web.test:99999 HTTP/1.1\r\n\r\n",
        b"GET http://web.test/ HTTP/2.0\r\n\r\n",
        b"GET  http://web.test/ HTTP/1.1\r\n\r\n",
        b"GET http://web.test/ HTTP/1.1\r\nX-Folded: a\r\n b\r\n\r\n",
        b"GET http://web.test/ HTTP/1.1\r\nHost : web.test\r\n\r\n",
        b"GET http://web.test/ HTTP/1.1\r\nX: a\nHost: evil.test\r\n\r\n",
        b"POST http://web.test/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"POST http://web.test/ HTTP/1.1\r\nContent-Length: 1\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",
        b"\r\n\r\n",
    ],
)
def test_malformed_or_unproxied_requests_are_refused(proxy: Proxy, audited: Audited,
                                                     request_head: bytes) -> None:  # fmt: skip
    path = proxy.add_session("s", [dest("web.test=127.0.0.1")], [])
    response = ask(path, request_head)
    assert status(response) in (400, 403)
    assert b"nsconfine: " in response
    audited.wait_for("refused")


def test_the_403_says_what_is_allowed(proxy: Proxy) -> None:
    route = Route("anthropic", "https://api.anthropic.com", "x-api-key", SECRET)
    path = proxy.add_session("s", [dest("pypi.org")], [route])
    response = ask(path, b"GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status(response) == 403
    assert b"pypi.org:443/80" in response
    assert b"/anthropic/" in response
    assert SECRET not in response


def test_a_refusal_does_not_tell_a_destination_s_pinned_address(proxy: Proxy) -> None:
    """A pin is the launcher's knowledge, as the resolver's answer is (which a refusal never
    tells): the session is told the listed names and ports, not where they lead. Found by an
    attacker's pass: the 403s listed `web.test:8080=10.1.2.3`."""
    path = proxy.add_session("s", [dest("web.test:8080=10.1.2.3")], [])
    for request in (b"GET /elsewhere HTTP/1.1\r\n\r\n", b"CONNECT web.test:80 HTTP/1.1\r\n\r\n"):
        response = ask(path, request)
        assert status(response) == 403
        assert b"web.test:8080" in response
        assert b"10.1.2.3" not in response, response


# -- limits ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "expected"),
    [(["X-A: b"] * 150, 431), (["X-A: " + "b" * 20000], 431), (["X-A: b"] * 50, 403)],
)
def test_header_floods_are_refused(proxy: Proxy, lines: list[str], expected: int) -> None:
    path = proxy.add_session("s", [], [])
    head = "\r\n".join(["GET http://web.test/ HTTP/1.1", *lines]) + "\r\n\r\n"
    with connect(path) as client:
        try:
            client.sendall(head.encode())
        except BrokenPipeError:  # refused before all of it was read
            pass
        assert status(read_all(client)) == expected  # 403: web.test is not listed


@pytest.mark.parametrize("finish", [False, True])
def test_a_slow_request_head_is_refused(proxy: Proxy, finish: bool) -> None:
    path = proxy.add_session("s", [], [])
    with connect(path) as client:
        client.sendall(b"GET http://web.test/ HTTP/1.1\r\n")
        if finish:
            client.sendall(b"\r\n")
        assert status(read_all(client)) == (403 if finish else 408)


def test_the_session_cap_refuses_at_once(audited: Audited, echo: _TcpServer) -> None:
    with Proxy(sandboxes_only=False, audit=audited.append, max_connections_per_session=2) as proxy:
        rules = [dest(f"echo.test:{echo.port}=127.0.0.1")]
        path = proxy.add_session("capped", rules, [])
        other = proxy.add_session("other", rules, [])
        held = [tunnel(path, f"echo.test:{echo.port}") for _ in range(2)]
        assert [status(head) for _, head in held] == [200, 200]
        assert connect_status(path, f"echo.test:{echo.port}") == 503
        assert connect_status(other, f"echo.test:{echo.port}") == 200  # its own cap
        assert "2 connections open" in str(audited.wait_for("refused")[0]["reason"])
        held[0][0].close()
        for _ in range(400):  # the freed place is taken once the proxy saw the close
            if connect_status(path, f"echo.test:{echo.port}") == 200:
                break
            time.sleep(0.025)
        else:
            raise AssertionError("a closed connection did not free its place")
        held[1][0].close()


class _ThreadsRefused:
    """threading.Thread.start failing, as it does when the launcher is at its process limit (a
    session of its own account can put it there), for threads whose name holds marker."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, marker: str) -> None:
        self.refusing = True
        start = threading.Thread.start

        def refused_start(thread: threading.Thread) -> None:
            if self.refusing and marker in thread.name:
                raise RuntimeError("can't start new thread")
            start(thread)

        monkeypatch.setattr(threading.Thread, "start", refused_start)


def test_a_connection_whose_thread_cannot_start_is_refused_and_the_next_is_served(
    proxy: Proxy, echo: _TcpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection the proxy has no thread for is answered 503 at once, and the session's
    proxy serves the next (attacker's pass: the failed start ended the session's accept loop
    for good, every later connection hung in its backlog, and the session's end waited 5 s
    for the connection it had counted)."""
    target = f"echo.test:{echo.port}"
    path = proxy.add_session("s", [dest(f"{target}=127.0.0.1")], [])
    threads = _ThreadsRefused(monkeypatch, "-conn")
    assert connect_status(path, target) == 503
    threads.refusing = False
    assert connect_status(path, target) == 200
    from nsconfine._launch import proxy as proxy_module

    # The end waits as long as it takes for a connection still counted: never, here.
    monkeypatch.setattr(proxy_module, "CONNECTIONS_END_SECONDS", 3600.0)
    ending = threading.Thread(target=proxy.remove_session, args=("s",), daemon=True)
    ending.start()
    ending.join(timeout=120)
    assert not ending.is_alive(), "the session's end waits for the connection it never served"


def test_a_session_whose_proxy_thread_cannot_start_is_refused_cleanly(
    proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session whose accept thread cannot start is refused (SandboxUnavailable, saying what
    to do) and leaves nothing behind: no session, no socket directory, and close() works
    (attacker's pass: a bare RuntimeError, a session left registered, and close() failing on
    its unstarted thread, leaving every other session's socket)."""
    threads = _ThreadsRefused(monkeypatch, "nsconfine-proxy-")
    with pytest.raises(SandboxUnavailable, match="thread"):
        proxy.add_session("refused", [], [])
    threads.refusing = False
    other = proxy.add_session("other", [], [])
    assert os.listdir(os.path.dirname(os.path.dirname(other))) == [
        os.path.basename(os.path.dirname(other))
    ]
    proxy.close()
    assert not os.path.exists(other)


def test_sessions_that_fill_the_proxy_leave_a_quiet_session_its_share(
    audited: Audited, echo: _TcpServer
) -> None:
    """Hostile sessions holding every place under the launcher-wide cap leave a quiet session
    a few connections of its own; past those it is refused at once like them (the cap still
    bounds the whole). Found by an attacker's pass: eight sessions at the per-session cap held
    all 512 places and a ninth got only 503s."""
    target = f"echo.test:{echo.port}"
    rules = [dest(f"{target}=127.0.0.1")]
    held: list[socket.socket] = []
    with Proxy(sandboxes_only=False, audit=audited.append, max_connections_per_session=16,
               max_connections=32) as proxy:  # fmt: skip
        try:
            for hostile in (proxy.add_session(f"hostile-{n}", rules, []) for n in range(2)):
                for _ in range(16):
                    client, head = tunnel(hostile, target)
                    held.append(client)
                    assert status(head) == 200
            quiet = proxy.add_session("quiet", rules, [])
            answers: list[int] = []
            for _ in range(17):  # until refused, and never past its own cap
                client, head = tunnel(quiet, target)
                held.append(client)
                answers.append(status(head))
                if answers[-1] != 200:
                    break
            assert answers[0] == 200, "a session got no connection while others held the proxy"
            assert answers[-1] == 503, "the quiet session went past the launcher-wide cap"
            assert len(answers) - 1 == proxy.guaranteed_per_session
            full = f"the proxy has {32 + proxy.guaranteed_per_session} connections open"
            assert audited.wait_for("refused")[-1]["reason"] == full
        finally:
            for client in held:
                client.close()


def test_connections_that_outlive_their_session_still_count_against_the_cap(
    audited: Audited, echo: _TcpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection whose thread is stuck in a name lookup (a DNS server that does not
    answer) outlives its session's end, which waits a while and lets go: its thread and fds
    stay all the same. They were counted for no session, so sessions that each left some
    behind took the launcher past its cap (leaks' pass, stop 44: 880 threads, and other
    launches refused for want of fds). They count until their thread ends: a fresh session
    then gets only its guaranteed place."""
    from nsconfine._launch import proxy as proxy_module

    monkeypatch.setattr(proxy_module, "CONNECTIONS_END_SECONDS", 0.1)
    looking_up = threading.Semaphore(0)
    answer = threading.Event()

    def stuck(host: str, port: int) -> list[str]:
        looking_up.release()
        answer.wait(60)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    target = f"echo.test:{echo.port}"
    held: list[socket.socket] = []
    with Proxy(sandboxes_only=False, audit=audited.append, resolver=stuck, max_connections=8,
               max_connections_per_session=8, guaranteed_per_session=1) as proxy:  # fmt: skip
        try:
            left = proxy.add_session("left", [dest("*.example.org")], [])
            for number in range(8):
                client = connect(left)
                client.sendall(f"CONNECT h{number}.example.org:443 HTTP/1.1\r\n\r\n".encode())
                held.append(client)
            for _ in range(8):
                assert looking_up.acquire(timeout=30), "a connection never reached its lookup"
            proxy.remove_session("left")
            fresh = proxy.add_session("fresh", [dest(f"{target}=127.0.0.1")], [])
            answers = [connect_status(fresh, target) for _ in range(2)]
        finally:
            answer.set()
            for client in held:
                client.close()
    assert answers == [200, 503]


# Holds CONNECT tunnels through a session's socket until refused (or tries run out), each with
# a byte passed both ways (so that the proxy moves both directions); prints how many it holds.
_TUNNEL_HOLDER = r"""
import socket, sys
path, target, tries = sys.argv[1], sys.argv[2], int(sys.argv[3])
held = []
for _ in range(tries):
    client = socket.socket(socket.AF_UNIX)
    try:
        client.connect(path)
        client.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head and (data := client.recv(4096)):
            head += data
        if b" 200 " not in head.split(b"\r\n")[0]:
            raise ConnectionRefusedError(head)
        client.sendall(b"x")
        if client.recv(1) != b"x":
            raise ConnectionResetError
    except OSError:
        client.close()
        break
    held.append(client)
print(len(held), flush=True)
sys.stdin.read()
"""


def test_sessions_holding_tunnels_leave_the_launcher_its_fds(echo: _TcpServer) -> None:
    """Three sessions each holding as many tunnels as the proxy gives them, in a launcher at
    the usual soft limit of 1,024 fds: the proxy's share stays within half of it, so other
    sessions still launch. Found by an attacker's pass: each tunnel took 6 fds (its sockets and
    a pipe each way) under caps that counted connections (64 a session, 512 in all), and three
    sessions took every fd the launcher had: its next launch was refused (EMFILE)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    target = f"echo.test:{echo.port}"
    holders: list[subprocess.Popen[str]] = []
    try:
        with Proxy(sandboxes_only=False) as proxy:
            before = len(os.listdir("/proc/self/fd"))
            for n in range(3):
                path = proxy.add_session(f"hostile-{n}", [dest(f"{target}=127.0.0.1")], [])
                holders.append(subprocess.Popen(
                    [sys.executable, "-c", _TUNNEL_HOLDER, path, target, "80"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                ))  # fmt: skip
            held = [int(holder.stdout.readline()) for holder in holders if holder.stdout]
            echoed = sum(peer.fileno() >= 0 for peer in echo.peers)
            taken = len(os.listdir("/proc/self/fd")) - before - echoed - 2 * len(holders)
            assert held[0] > 0
            assert max(held) <= proxy.max_connections_per_session
            assert taken <= 1024 // 2, (taken, held)
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
            for stream in (holder.stdin, holder.stdout):
                if stream is not None:
                    stream.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_flood_of_refusals_is_recorded_in_part_and_counted(
    proxy: Proxy, audited: Audited, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session asking for unlisted hosts as fast as it can: the audit (a file root appends
    to, `run`'s stderr) records its first 100 refusals, then 20 a second (here none, so that
    the count does not hang on the machine's speed), and counts the rest in one record, where
    every refusal was a line (an attacker's pass grew the audit file 450 KB a second)."""
    import nsconfine._launch.proxy as proxy_module

    monkeypatch.setattr(proxy_module, "RECORDS_PER_SECOND", 0)
    path = proxy.add_session("flood", [], [])
    for _ in range(300):
        assert connect_status(path, "unlisted.test:443") == 403
    proxy.remove_session(path)
    mine = [r for r in audited if r["session"] == "flood"]
    assert len(mine) == 101
    assert str(mine[-1]["reason"]).startswith("200 more refusals were not recorded")


def test_a_sessions_refusals_are_recorded_up_to_a_total(
    proxy: Proxy, audited: Audited, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past RECORDS_IN_ALL of a session's refusals (here 150, with the rate's cap out
    of the way), the rest are only counted: however long it runs, a session's records stay
    bounded."""
    import nsconfine._launch.proxy as proxy_module

    monkeypatch.setattr(proxy_module, "RECORDS_AT_ONCE", 10_000)
    monkeypatch.setattr(proxy_module, "RECORDS_IN_ALL", 150)
    path = proxy.add_session("long-lived", [], [])
    for _ in range(300):
        assert connect_status(path, "unlisted.test:443") == 403
    proxy.remove_session(path)
    mine = [r for r in audited if r["session"] == "long-lived"]
    assert len(mine) == 151
    assert str(mine[-1]["reason"]).startswith("150 more refusals were not recorded")


def test_a_flood_of_allowed_connections_is_recorded_in_part_and_counted(
    proxy: Proxy, audited: Audited, http_upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session fetching an allowed page in a loop: its allowed connections are recorded as
    its refusals are (100 at once, then 20 a second: here none), and the rest counted in one
    record with the bytes they moved. Each was a line before, so a session looping on an
    allowed host grew the audit file (root's) without end."""
    import nsconfine._launch.proxy as proxy_module

    monkeypatch.setattr(proxy_module, "RECORDS_PER_SECOND", 0)
    path = proxy.add_session("loop", [dest(f"web.test:{http_upstream.port}=127.0.0.1")], [])
    for _ in range(300):
        assert status(ask(path, get("web.test", http_upstream.port))) == 200
    proxy.remove_session(path)
    mine = [r for r in audited if r["session"] == "loop"]
    assert len(mine) == 101, len(mine)
    assert all(r["decision"] == "allowed" for r in mine)
    summary = mine[-1]
    assert str(summary["reason"]).startswith("200 more allowed connections were not recorded")
    each = int(str(mine[0]["bytes_down"]))
    assert each > 0
    assert int(str(summary["bytes_down"])) == 200 * each


def test_a_connection_still_connecting_ends_with_its_session(audited: Audited) -> None:
    """A session that asks for an allowed upstream that does not answer yet (its backlog
    full: SYNs dropped), then ends: its connections end with it, and none reaches that
    upstream afterwards. An attacker's pass: the connects went on past the session's end,
    uncounted, and reached the upstream seconds later; their records, made after the session
    was gone, kept a budget of it for good."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(8):  # past the backlog: the kernel drops the next SYNs
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.2)
    clients: list[socket.socket] = []
    try:
        with Proxy(sandboxes_only=False, audit=audited.append, connect_timeout=30) as proxy:
            path = proxy.add_session("late", [dest(f"late.test:{port}=127.0.0.1")], [])
            for _ in range(3):
                client = connect(path)
                client.sendall(get("late.test", port))
                clients.append(client)
            for _ in range(200):
                if len(proxy._sessions["late"].connections) == 3:
                    break
                time.sleep(0.025)
            proxy.remove_session(path)
            assert ("late", True) not in proxy._budgets
            assert ("late", False) not in proxy._budgets
        for filler in fillers:  # (a filler's own SYN, dropped, would be sent again)
            filler.close()
        listener.settimeout(0.2)
        with contextlib.suppress(OSError):
            while True:  # the backlog drained: room for any connect still going on
                listener.accept()[0].close()
        listener.settimeout(3)
        with pytest.raises(TimeoutError):
            listener.accept()[0].close()
    finally:
        for sock in (*fillers, *clients, listener):
            sock.close()


def test_no_connect_starts_once_a_connection_is_shut() -> None:
    """A connection shut (its session ended) while the proxy tried one address starts none to
    the next: an attacker's pass had a route's second address reached after the session's end
    (the first, its backlog full, gave up as the session ended, and the loop went on)."""
    from nsconfine._launch.proxy import _Connection, _Refusal

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(1)
    client, peer = socket.socketpair()
    shut = _Connection("ended", client)
    shut.shut()
    try:
        with Proxy(sandboxes_only=False) as proxy, pytest.raises(_Refusal, match="ended"):
            proxy._open(shut, "127.0.0.1", listener.getsockname()[1])
        with pytest.raises(TimeoutError):
            listener.accept()[0].close()
    finally:
        listener.close()
        client.close()
        peer.close()


def test_a_refusal_record_is_short_whatever_the_request(proxy: Proxy, audited: Audited) -> None:
    """A request whose method and host fill the 16 KiB head: its refusal's record holds at most
    256 characters of each (a record was the request's size, so that the rate cap on records
    still let a session write 300 KiB a second to the audit)."""
    path = proxy.add_session("long", [], [])
    head = f"{'M' * 8000} http://{'h' * 7000}.test/ HTTP/1.1\r\nHost: x\r\n\r\n"
    ask(path, head.encode())
    record = audited.wait_for("refused")[0]
    assert len(json.dumps(record)) < 1024, len(json.dumps(record))


def test_a_client_that_never_reads_blocks_nobody(proxy: Proxy, http_upstream: Upstream) -> None:
    flood = _TcpServer("flood")
    rules = [dest(f"flood.test:{flood.port}=127.0.0.1"),
             dest(f"web.test:{http_upstream.port}=127.0.0.1")]  # fmt: skip
    path = proxy.add_session("s", rules, [])
    stuck, head = tunnel(path, f"flood.test:{flood.port}")
    with stuck:
        assert status(head) == 200
        # Every buffer between the flood and the stuck client is full: the proxy's relay of it
        # is blocked in a send.
        assert flood.blocked.wait(30)
        assert status(ask(path, get("web.test", http_upstream.port))) == 200
    flood.close()


def _sockets_to(port: int) -> list[socket.socket]:
    """This process's TCP sockets connected to 127.0.0.1:port (the proxy's upstream ones: it
    is a thread of the test's), each a copy of its own."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if sock.family == socket.AF_INET and sock.getpeername() == ("127.0.0.1", port):
                found.append(sock)
                continue
        except OSError:
            pass
        sock.close()
    return found


def test_a_client_that_never_reads_pins_little_of_the_host_s_tcp_memory(proxy: Proxy) -> None:
    """A download whose client stopped reading: the proxy's upstream socket holds at most
    UPSTREAM_RECEIVE_BYTES (the kernel counts twice that) however large the host lets TCP
    grow a receive buffer. Left to grow (tcp_rmem's maximum: 32 MiB here, 6 MiB Debian's),
    each of a session's 32 connections pinned ~16 MiB of the host's TCP memory in the
    launcher's sockets: four sessions took the host past its TCP memory pressure mark
    (attacker's pass, stop 33)."""
    flood = _TcpServer("flood")
    path = proxy.add_session("s", [dest(f"flood.test:{flood.port}=127.0.0.1")], [])
    stuck, head = tunnel(path, f"flood.test:{flood.port}")
    with stuck:
        assert status(head) == 200
        read = 0
        while read < 256 * 1024 * 1024:  # fast, at first: the kernel grows its buffers
            read += len(stuck.recv(1024 * 1024))
        assert flood.blocked.wait(30)  # then not at all
        (upstream,) = _sockets_to(flood.port)
        with upstream:
            kept = upstream.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            queued = struct.unpack("i", fcntl.ioctl(upstream, termios.FIONREAD, b"\0" * 4))[0]
    flood.close()
    assert kept <= 2 * UPSTREAM_RECEIVE_BYTES, kept
    assert queued <= 2 * UPSTREAM_RECEIVE_BYTES, queued


def test_a_tunnel_relays_when_the_launchers_fds_pass_1024(proxy: Proxy, echo: _TcpServer) -> None:
    """A launcher holding more than 1024 descriptors (select's limit) still relays: the
    connection's sockets are numbered past it. Found by an attacker's pass: select() raised
    ValueError and every connection failed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1100
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard limit on open files ({hard}) is under {wanted}")
    path = proxy.add_session("s", [dest(f"echo.test:{echo.port}=127.0.0.1")], [])
    fillers: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        while not fillers or fillers[-1] < 1030:  # every lower number taken: new ones are above
            fillers.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        client, head = tunnel(path, f"echo.test:{echo.port}")
        with client:
            assert client.fileno() > 1024
            assert status(head) == 200
            client.sendall(b"past select's limit")
            client.shutdown(socket.SHUT_WR)
            assert read_all(client) == b"past select's limit"
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- routes ---------------------------------------------------------------------------------


def route_request(name: str, rest: str, body: bytes = b"{}") -> bytes:
    return (
        f"POST /{name}{rest} HTTP/1.1\r\nHost: 127.0.0.1:3128\r\nx-api-key: session-fake\r\n"
        "Authorization: Bearer session-fake\r\nProxy-Authorization: Basic eA==\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_a_route_injects_the_real_key(
    proxy: Proxy, http_upstream: Upstream, tmp_path: Path
) -> None:
    upstream = f"http://127.0.0.1:{http_upstream.port}/prefix/"
    records = tmp_path / "audit.jsonl"
    with (
        contextlib.closing(AuditLog(str(records))) as audit,
        Proxy(sandboxes_only=False, audit=audit.write) as proxy,
    ):
        path = proxy.add_session("s", [], [Route("anthropic", upstream, "x-api-key", SECRET)])
        response = ask(path, route_request("anthropic", "/v1/messages?beta=true", b'{"a": 1}'))
    assert status(response) == 200
    echoed = body_json(response)
    assert echoed["path"] == "/prefix/v1/messages?beta=true"
    assert echoed["body"] == '{"a": 1}'
    sent = [(k.lower(), v) for k, v in echoed["headers"]]  # type: ignore[attr-defined]
    assert [v for k, v in sent if k == "x-api-key"] == [SECRET.decode()]
    assert not [k for k, _ in sent if k in ("authorization", "proxy-authorization")]
    assert ("host", f"127.0.0.1:{http_upstream.port}") in sent
    assert ("connection", "close") in sent
    assert [v for k, v in headers_of(response) if k == "connection"] == ["close"]
    [line] = records.read_text().splitlines()
    record = json.loads(line)
    assert record["decision"] == "allowed"
    assert record["route"] == "anthropic"
    assert SECRET.decode() not in line


def test_a_route_forwards_no_header_that_reroutes_a_request(
    proxy: Proxy, http_upstream: Upstream
) -> None:
    """Headers by which common gateways override a request's method, path or host
    (X-HTTP-Method-Override, X-Original-URL, X-Forwarded-Host, Forwarded, …) would take the
    route's key past its method and path checks: a route drops them (X-Original-URI, which
    nginx-fronted gateways read, added by the mutation pass, stop 35: dropped from the proxy's
    list it reached the upstream and no test failed). The twin: another header the session
    sends passes."""
    upstream = f"http://127.0.0.1:{http_upstream.port}/prefix/"
    path = proxy.add_session("s", [], [Route("anthropic", upstream, "x-api-key", SECRET)])
    rerouting = (
        "X-HTTP-Method-Override: TRACE\r\nX-HTTP-Method: TRACE\r\nX-Method-Override: TRACE\r\n"
        "X-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\nX-Forwarded-Host: evil.test\r\n"
        "X-Original-URI: /admin\r\n"
        "X-Forwarded-Prefix: /admin\r\nForwarded: host=evil.test\r\nVia: 1.1 evil\r\n"
        "X-Kept: yes\r\n"
    )
    request = route_request("anthropic", "/v1/messages").replace(
        b"Content-Type:", rerouting.encode() + b"Content-Type:", 1
    )
    response = ask(path, request)
    assert status(response) == 200
    sent = {k.lower() for k, _ in body_json(response)["headers"]}  # type: ignore[attr-defined]
    assert "x-kept" in sent
    dropped = {line.split(":")[0].lower() for line in rerouting.split("\r\n") if line}
    assert sent & (dropped - {"x-kept"}) == set(), sent


def test_a_route_forwards_no_header_a_gateway_reads_as_a_rerouting_one(
    proxy: Proxy, recorder: _TcpServer
) -> None:
    """The other spellings of the headers above: any X-Forwarded-*, the host overrides
    gateways read (X-Original-Host, X-Host, X-HTTP-Host-Override, X-Original-Method), and each
    of them, or of the key's own header, with an '_', which CGI-style servers (PHP, some WSGI)
    read as its '-' spelling. Found by an attacker's pass: all of these reached the route's
    upstream, beside the key. The twin: a header of an '_' that is none of them (Codex sends
    session_id) passes."""
    route = Route("anthropic", f"http://127.0.0.1:{recorder.port}", "x-api-key", SECRET)
    path = proxy.add_session("s", [], [route])
    rerouting = [
        "X-Forwarded-Path: /admin", "X-Forwarded-Scheme: http", "X-Forwarded-Url: http://e/",
        "X_Forwarded_Host: evil.test", "X_Original_URL: /admin", "x_http_method_override: PUT",
        "X-Original-Host: evil.test", "X-Host: evil.test", "X-HTTP-Host-Override: evil.test",
        "X-Original-Method: TRACE", "X_Api_Key: session-fake", "Proxy_Authorization: x",
        "X_Original_URI: /admin",  # (mutation pass, stop 35: no test sent it)
    ]  # fmt: skip
    head = "GET /anthropic/v1/models HTTP/1.1\r\n" + "".join(f"{h}\r\n" for h in rerouting)
    response = _through(path, (head + "X-Kept: yes\r\nsession_id: s1\r\n\r\n").encode())
    assert status(response) == 200, response
    upstream_head = response.partition(b"\r\n\r\n")[2].partition(b"\r\n\r\n")[0].decode()
    names = {line.split(":")[0] for line in upstream_head.split("\r\n")[1:]}
    assert {"X-Kept", "session_id"} <= names
    assert "x-api-key" in {name.lower() for name in names}
    assert b"session-fake" not in response
    assert names & {h.split(":")[0] for h in rerouting} == set(), names


@pytest.mark.parametrize("trusted", [True, False])
def test_a_tls_route_verifies_with_the_launchers_ca(
    proxy: Proxy, tls_upstream: Upstream, test_ca: LocalCA, monkeypatch: pytest.MonkeyPatch,
    trusted: bool,
) -> None:  # fmt: skip
    if trusted:
        monkeypatch.setenv("SSL_CERT_FILE", str(test_ca.ca))
    else:
        monkeypatch.setenv("SSL_CERT_FILE", os.devnull)
        monkeypatch.setenv("SSL_CERT_DIR", os.devnull)
    upstream = f"https://localhost:{tls_upstream.port}"
    path = proxy.add_session("s", [], [Route("openai", upstream, "authorization", SECRET)])
    response = ask(path, route_request("openai", "/v1/chat"))
    if not trusted:
        assert status(response) == 502
        assert b"TLS" in response
        return
    assert status(response) == 200
    sent = [(k.lower(), v) for k, v in body_json(response)["headers"]]  # type: ignore[attr-defined]
    assert [v for k, v in sent if k == "authorization"] == [f"Bearer {SECRET.decode()}"]
    assert not [k for k, _ in sent if k == "x-api-key"]


def test_a_route_streams_events_as_they_come(proxy: Proxy, http_upstream: Upstream) -> None:
    route = Route("anthropic", f"http://127.0.0.1:{http_upstream.port}", "x-api-key", SECRET)
    path = proxy.add_session("s", [], [route])
    with connect(path) as client:
        client.sendall(route_request("anthropic", "/v1/sse"))
        received = b""
        while b"data: one" not in received:  # the upstream sends two only once one is seen
            received += client.recv(65536)
        assert b"data: two" not in received
        assert b"connection: close" in received.lower()
        http_upstream.release.set()
        received += read_all(client)
    assert received.endswith(b"data: two\n\n")


@pytest.mark.parametrize(
    ("rest", "expected"),
    [("/../other", 400), ("/v1/%2e%2e/x", 400), ("/./v1", 400), ("/v1%2fx", 400),
     ("/v1%2Fx", 400), ("/v1%5cx", 400), ("/v1%5Cx", 400), ("/v1\\x", 400), ("//admin", 400),
     ("/v1//x", 400), ("/v1/..;/x", 400), ("/v1;x", 400), ("/v1%3Bx", 400), ("/..#", 400),
     ("/x/..#/admin", 400), ("/v1/%252e%252e/x", 400), ("/v1/%c0%ae%c0%ae/x", 400),
     ("/v1/%C1%9C/x", 400),
     ("/v1/%e0%80%ae%e0%80%ae/x", 400), ("/v1/%F0%80%80%AE/x", 400), ("/v1/%u002e%u002e/x", 400),
     ("/v1/%C3%A9t%C3%A9", 400), ("/v1/a%0d%0aX-Injected:%20y", 400),
     ("/v1/%00", 400), ("/v1/messages?to=a%2fb//c;d", 502)],  # (nothing listens on 9)
)  # fmt: skip
def test_a_route_path_cannot_climb(proxy: Proxy, rest: str, expected: int) -> None:
    """A route's path with a '.' or '..' segment, an encoded slash or backslash, a backslash,
    an empty segment, a ';' (`..;/`: Java servlet gateways drop path parameters, then climb)
    a '#' (`..#`: a gateway that parses URLs ends the path there), an encoded '%' (decoded
    twice, `%252e` is '.'), an encoded byte past ASCII (overlong UTF-8, `%c0%ae` or
    `%e0%80%ae`, is '.' to an old decoder; an API's path needs none) or IIS's `%u` is
    refused: an upstream may read any of them as another path of the API (found by attackers'
    passes). The twin:
    a plain path, whatever its query holds, passes the check and is sent on."""
    route = Route("anthropic", "http://127.0.0.1:9/prefix", "x-api-key", SECRET)
    path = proxy.add_session("s", [], [route])
    assert status(ask(path, route_request("anthropic", rest))) == expected


@pytest.mark.parametrize(
    ("method", "expected"),
    [("TRACE", 405), ("TRACK", 405), ("DEBUG", 405), ("GET", 502), ("POST", 502)],
)
def test_a_route_sends_its_key_only_with_methods_of_an_api(
    proxy: Proxy, method: str, expected: int
) -> None:
    """TRACE (and TRACK, or any method an API does not take) to a route is refused before
    anything is sent: an upstream that answers TRACE echoes the request it got, the key the
    route added among its headers, back to the session (attackers' pass). The twins: GET and
    POST go on to the upstream (nothing listens on port 9: 502)."""
    route = Route("anthropic", "http://127.0.0.1:9/prefix", "x-api-key", SECRET)
    path = proxy.add_session("s", [], [route])
    request = f"{method} /anthropic/v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    assert status(ask(path, request.encode())) == expected


def test_a_response_s_interim_heads_are_parsed_only_up_to_a_cap() -> None:
    """An upstream's endless `100 Continue` heads are looked at one by one only up to
    MAX_INTERIM_HEADS; past them the bytes pass as they come (attackers' pass: a listed host
    sending them made the launcher parse every head, 250 times the CPU of a body's byte, and
    slowed every other session's requests 90 times). The twin: a few interim heads, then the
    final head, which gets its `Connection: close`."""
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    final = b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n\r\nbody"
    few = _ResponseHeadRewriter()
    assert few.feed(interim * 3 + final) == interim * 3 + (
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nbody"
    )
    many = _ResponseHeadRewriter()
    flood = interim * (MAX_INTERIM_HEADS + 1000)
    assert many.feed(flood) == flood
    assert many.done
    assert many.feed(final) == final


def test_sessions_do_not_share_routes(proxy: Proxy, http_upstream: Upstream) -> None:
    route = Route("anthropic", f"http://127.0.0.1:{http_upstream.port}", "x-api-key", SECRET)
    with_route = proxy.add_session("a", [], [route])
    without = proxy.add_session("b", [], [])
    assert status(ask(with_route, route_request("anthropic", "/v1/messages"))) == 200
    response = ask(without, route_request("anthropic", "/v1/messages"))
    assert status(response) == 403
    assert SECRET not in response


def test_a_route_never_shows_its_secret() -> None:
    route = Route("anthropic", "https://api.anthropic.com", "x-api-key", SECRET)
    assert SECRET.decode() not in repr(route)
    with pytest.raises(UsageError) as refused:
        Route("anthropic", "https://api.anthropic.com", "x-api-key", SECRET + b"\r\nX: y")
    assert SECRET.decode() not in str(refused.value)


@pytest.mark.parametrize(
    ("name", "upstream", "header"),
    [("Anthropic", "https://a.test", "x-api-key"), ("a", "ftp://a.test", "x-api-key"),
     ("a", "https://u:p@a.test", "x-api-key"), ("a", "https://a.test", "cookie")],
)  # fmt: skip
def test_route_refuses_bad_input(name: str, upstream: str, header: str) -> None:
    with pytest.raises(UsageError):
        Route(name, upstream, header, SECRET)


# -- audit and session lifecycle ------------------------------------------------------------


def test_audit_lines_for_allowed_and_refused(http_upstream: Upstream, tmp_path: Path) -> None:
    records = tmp_path / "audit.jsonl"
    port = http_upstream.port
    with (
        contextlib.closing(AuditLog(str(records))) as audit,
        Proxy(sandboxes_only=False, audit=audit.write) as proxy,
    ):
        path = proxy.add_session("s", [dest(f"web.test:{port}=127.0.0.1")], [])
        assert status(ask(path, get("web.test", port))) == 200
        assert status(ask(path, get("evil.test", port))) == 403
        for _ in range(400):
            if len(records.read_text().splitlines()) == 2:
                break
            time.sleep(0.025)
    assert stat.S_IMODE(records.stat().st_mode) == 0o600
    by_decision = {r["decision"]: r for r in map(json.loads, records.read_text().splitlines())}
    allowed, refused = by_decision["allowed"], by_decision["refused"]
    assert set(allowed) >= {"time", "session", "method", "host", "port", "address", "decision",
                            "reason", "bytes_up", "bytes_down"}  # fmt: skip
    assert (allowed["session"], allowed["method"], allowed["host"]) == ("s", "GET", "web.test")
    assert (allowed["port"], allowed["address"]) == (port, "127.0.0.1")
    assert allowed["reason"] == "the test needs it"
    assert allowed["bytes_up"] > 0
    assert allowed["bytes_down"] > 0
    assert (refused["host"], refused["address"]) == ("evil.test", None)
    assert "not on this session's allowlist" in refused["reason"]


def test_an_audit_sink_that_fails_does_not_stop_the_proxy(
    http_upstream: Upstream, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(record: dict[str, object]) -> None:
        raise OSError("disk full")

    with Proxy(sandboxes_only=False, audit=broken) as proxy:
        path = proxy.add_session("s", [], [])
        assert status(ask(path, get("web.test", http_upstream.port))) == 403
        assert status(ask(path, get("web.test", http_upstream.port))) == 403


def test_remove_session_ends_connections_and_removes_the_socket(
    proxy: Proxy, echo: _TcpServer
) -> None:
    path = proxy.add_session("s", [dest(f"echo.test:{echo.port}=127.0.0.1")], [])
    directory = Path(path).parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o711
    assert stat.S_ISSOCK(Path(path).stat().st_mode)
    client, head = tunnel(path, f"echo.test:{echo.port}")
    with client:
        assert status(head) == 200
        proxy.remove_session(path)
        assert client.recv(1) == b""
    assert not directory.exists()
    with pytest.raises(FileNotFoundError):
        connect(path)
    proxy.remove_session("s")  # gone already: nothing to do


@pytest.mark.skipif(os.geteuid() != 0, reason="a socket is given to another account by root")
def test_a_root_launcher_gives_the_socket_to_the_sessions_account(proxy: Proxy) -> None:
    path = proxy.add_session("s", [], [], uid=65534)
    info = Path(path).stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (65534, 0o600)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may give the socket to any account")
def test_an_unprivileged_launcher_cannot_give_the_socket_away(proxy: Proxy) -> None:
    with pytest.raises(UsageError, match="uid 0"):
        proxy.add_session("s", [], [], uid=0)


def test_sessions_are_named_once_and_close_is_idempotent(audited: Audited) -> None:
    proxy = Proxy(sandboxes_only=False, audit=audited.append)
    path = proxy.add_session("s", [], [])
    with pytest.raises(UsageError, match="already"):
        proxy.add_session("s", [], [])
    proxy.close()
    proxy.close()
    assert not Path(path).exists()
    with pytest.raises(UsageError, match="closed"):
        proxy.add_session("t", [], [])


# A launcher with one proxy session: it prints the session's socket and runs until its
# stdin closes (then closes its proxy).
_LAUNCHER = """
import sys
from nsconfine._launch.proxy import Proxy
with Proxy(sandboxes_only=False) as proxy:
    print(proxy.add_session("s", [], []), flush=True)
    sys.stdin.read()
"""


def _launcher() -> tuple[subprocess.Popen[str], Path]:
    """Another launcher process with a session on its proxy, and that session's socket."""
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert launcher.stdout is not None
    return launcher, Path(launcher.stdout.readline().strip())


def test_a_killed_launchers_socket_directories_go_with_the_next_proxy() -> None:
    """A launcher SIGKILLed with a session open leaves its socket directory behind; the next
    proxy of the account removes it, and leaves a live launcher's alone (the twin). Found by an
    attacker's pass: a killed launcher's directories stayed forever."""
    killed, killed_socket = _launcher()
    alive, alive_socket = _launcher()
    try:
        killed.kill()
        killed.wait()
        assert killed_socket.exists()
        with Proxy(sandboxes_only=False) as proxy:
            proxy.add_session("s", [], [])
            assert not killed_socket.parent.exists(), "the killed launcher's directory stayed"
            launcher_directory = killed_socket.parent.parent  # and its own, and its lock
            assert not launcher_directory.exists()
            assert not Path(f"{launcher_directory}.lock").exists()
            assert alive_socket.exists()
            assert connect_status(str(alive_socket), "web.test:80") == 403  # it still serves
    finally:
        for launcher in (killed, alive):
            launcher.communicate()  # (closes its stdin: a live one ends)
    assert not alive_socket.parent.exists()  # its own close removed it


def _refused_then_trickle(path: str, most: int) -> int:
    """Sends a bad head, reads the 400, then one byte every 0.25 s: how many bytes the proxy
    took before it ended the connection (most if it never did)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(10)
        client.connect(path)
        client.sendall(b"NOT HTTP\r\n\r\n")
        assert client.recv(100).startswith(b"HTTP/1.1 400")
        for sent in range(most):
            try:
                client.send(b"x")
            except OSError:
                return sent
            time.sleep(0.25)
        return most


def test_a_refused_connection_is_not_held_open_by_a_trickle() -> None:
    """A refused connection is drained for one second in all, not a second per byte: a byte
    every 0.25 s does not keep it (its thread, its fds, its place under both caps). Found by an
    attacker's pass: 40 bytes (10 s) were all taken."""
    with Proxy(sandboxes_only=False, head_timeout=1.0) as proxy:
        path = proxy.add_session("hostile", [], [])
        taken = _refused_then_trickle(path, most=40)
    assert taken < 40, "the proxy kept draining a refused connection as long as bytes trickled"


@pytest.mark.parametrize(
    "address",
    ["fec0::1", "2002:7f00:1::1", "2002:a9fe:a9fe::1", "2002:a00:1::1"],
    ids=["site-local", "6to4 of loopback", "6to4 of metadata", "6to4 of a LAN"],
)
def test_a_listed_name_resolving_to_a_disguised_local_address_is_refused(address: str) -> None:
    """fec0::/10 (deprecated site-local) and the 6to4 (2002::/16) spellings of 127.0.0.1,
    169.254.169.254 and 10/8 are not public: a listed wildcard whose DNS the session's author
    steers gets none of them. Found by an attacker's pass (they were counted public)."""
    rules = [Destination.parse("*.cdn.example", "the test needs it")]
    decision = judge("x.cdn.example", 443, rules, lambda _host, _port: [address])
    assert not decision.allowed, decision


@pytest.mark.parametrize(
    "upstream",
    ["http://gw.example/v1", "http://10.0.0.7:8080", "http://[2001:db8::1]/v1", "http://0.0.0.0"],
)
def test_a_route_refuses_plain_http_beyond_the_host_s_loopback(upstream: str) -> None:
    """The route puts the real key in a header: over plain http to another host it crosses the
    network readable (attacker's pass, stop 39: ANTHROPIC_BASE_URL=http://… in the launcher's
    environment sent `x-api-key` in the clear; network.md says the proxy forwards over TLS).
    Refused, saying to use https; a stand-in API on the loopback may stay plain."""
    with pytest.raises(UsageError, match="https"):
        Route("anthropic", upstream, "x-api-key", SECRET)
    for loopback in (
        "http://127.0.0.1:9/v1",
        "http://127.8.0.1",
        "http://[::1]:9",
    ):
        assert Route("anthropic", loopback, "x-api-key", SECRET).upstream == loopback


def test_a_plain_http_route_names_its_loopback_address() -> None:
    """Whoever listens on the upstream's port gets the key. `localhost` may resolve to ::1
    first, where another local account (or a session on the host's network) listens while the
    stand-in listens on 127.0.0.1 only: it took the key, and answered (attacker's pass, stop
    40). A plain http upstream is given as the address the stand-in listens on."""
    with pytest.raises(UsageError, match=r"127\.0\.0\.1"):
        Route("anthropic", "http://localhost:9/v1", "x-api-key", SECRET)
    assert Route("anthropic", "https://localhost:9/v1", "x-api-key", SECRET)  # TLS names it


@pytest.mark.parametrize(
    "upstream",
    [
        "https://svc:GATEWAY-PASSWORD@gw.example/v1",
        "https://svc:GATEWAY-PASSWORD@gw.example/v1?x=1",
        "ftp://svc:GATEWAY-PASSWORD@gw.example/v1",
        "https://GATEWAY-PASSWORD@gw.example",
        # (its review: a password with / # or ? unencoded ended the host part early)
        "https://svc:to/GATEWAY-PASSWORD+=@gw.example/v1",
        "https://svc:GATEWAY-PASSWORD#x@gw.example/v1",
        "https://svc:GATEWAY-PASSWORD?x@gw.example/v1",
        "https://gw.example/v1?token=GATEWAY-PASSWORD",
        "https://svc:GATEWAY-PASSWORD@gw.example:abc/v1",
    ],
)
def test_a_refused_route_does_not_print_the_upstream_s_password(upstream: str) -> None:
    """An upstream URL with credentials in it is refused; the refusal, which goes to stderr and
    the journal, names the URL without them (attacker's pass, stop 39: the message quoted the
    launcher's ANTHROPIC_BASE_URL whole, its gateway password with it)."""
    with pytest.raises(UsageError) as refused:
        Route("anthropic", upstream, "x-api-key", SECRET)
    assert "GATEWAY-PASSWORD" not in str(refused.value)
    assert "gw.example" in str(refused.value)


def test_a_route_refuses_a_ca_file_that_is_a_fifo(tmp_path: Path) -> None:
    """The proxy's TLS to a route's upstream reads the launcher's SSL_CERT_FILE as it is: a
    FIFO there held each request until the session gave up, and the session's end until the
    proxy's grace ran out (stop 39). Refused when the plan is made, saying what to fix; and at
    a request, should it become one later, refused at once (502) rather than waited on."""
    from nsconfine._plan.network import injected

    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    credential = {"ANTHROPIC_API_KEY": "sk-x"}
    with pytest.raises(UsageError, match="SSL_CERT_FILE"):
        injected(("anthropic",), credential, {"SSL_CERT_FILE": str(fifo)})
    routes = injected(("anthropic",), credential, {}).routes  # a regular one, or none: taken
    assert routes


@pytest.mark.parametrize(
    "upstream", ["https://gw.example:abc/v1", "http://[::1", "https://[::1]:99999"]
)
def test_a_route_refuses_an_upstream_it_cannot_parse(upstream: str) -> None:
    """An upstream whose port is no number, or whose address is cut short, is refused when the
    route is made (its review, stop 39: one was taken and failed in the proxy, one raised a
    traceback)."""
    with pytest.raises(UsageError, match="route anthropic"):
        Route("anthropic", upstream, "x-api-key", SECRET)
