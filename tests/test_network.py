"""The "proxy" network end to end, on real sessions: the relay inside, the launcher's proxy
outside, the plan's destinations the whole truth of what is reached. Each refusal has a twin
that lists the destination (or shares the host's network) and is reached: the check can fail.

The upstreams are local stand-ins on the host's loopback (HTTP, and HTTPS with a certificate of
a CA made for the test), reached through the proxy by a name pinned to 127.0.0.1
(`name=127.0.0.1`, as curl's --resolve): listed by address, as a test or an internal mirror
must be.
"""

from __future__ import annotations

import errno
import http.server
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    CONNECT_ABSTRACT,
    IS_ROOT,
    LocalCA,
    abstract_listener,
    cli,
    give_to_session_user,
    make_local_ca,
    outcome_without_hanging,
    run,
    serving,
    session,
    session_options,
)

import nsconfine
import nsconfine._launch.egress
from nsconfine._plan.model import RELAY_DIRECTORY, RELAY_SOCKET_NAME
from nsconfine._selftest.probes import SECRET_SEARCH
from nsconfine._selftest.report import abstract_socket_served
from nsconfine._selftest.world import World
from nsconfine._session import build_plan

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


class _Upstream(http.server.BaseHTTPRequestHandler):
    """Answers every request with what it was asked and the credential headers it got."""

    seen: list[dict[str, str]]

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append(
            {
                "path": self.path,
                "x-api-key": self.headers.get("x-api-key", ""),
                "authorization": self.headers.get("authorization", ""),
                "body": body.decode(errors="replace"),
            }
        )
        answer = f"upstream saw {self.command} {self.path}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def _upstream(tls: LocalCA | None) -> Iterator[tuple[int, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    with serving(type("Handler", (_Upstream,), {"seen": seen}), tls) as port:
        yield port, seen


@pytest.fixture
def upstream() -> Iterator[tuple[int, list[dict[str, str]]]]:
    """A local HTTP server on the host's loopback: its port, and the requests it saw."""
    yield from _upstream(None)


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    """The test's CA and a certificate it signed for secure.test."""
    return make_local_ca(tmp_path_factory.mktemp("ca"), ["secure.test"])


@pytest.fixture
def tls_upstream(local_ca: LocalCA) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """The same server over HTTPS, with local_ca's certificate for secure.test."""
    yield from _upstream(local_ca)


# A client as a tool is one: urllib through HTTP_PROXY (it honours the variable), printing the
# status and the body, or the refusal the proxy answered with.
_FETCH = """
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=20) as answer:
        print(answer.status, answer.read().decode())
except urllib.error.HTTPError as refused:
    print(refused.code, refused.read().decode())
except OSError as error:
    print("failed", error)
"""

# CONNECT as an HTTPS client opens its tunnel, then bytes through it.
_CONNECT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(f"CONNECT {sys.argv[1]} HTTP/1.1\\r\\nHost: {sys.argv[1]}\\r\\n\\r\\n".encode())
head = s.recv(4096).decode(errors="replace")
print(head.split("\\r\\n")[0])
if " 200 " in head:
    s.sendall(b"GET / HTTP/1.0\\r\\nHost: tunnel.test\\r\\n\\r\\n")
    print(s.recv(4096).decode(errors="replace").split("\\r\\n")[0])
"""


def _proxy_session(ws_run: tuple[Path, Path], *allowed: str, **options: Any) -> nsconfine.Plan:
    return session(*ws_run, allow_hosts=list(allowed), **options).plan()


_HOLDS_A_PROXY_CONNECTION = """
import socket, sys, time
held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
held.connect(sys.argv[1])
print("connected", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("held", ["listener", "connection", "audit file"])
def test_what_the_launcher_holds_for_a_proxy_session_is_no_stdio(
    ws_run: tuple[Path, Path], tmp_path: Path, held: str
) -> None:
    """The listening socket a proxy session's connections come to, a connection it accepted
    there, and the session's audit file, all held by the launcher, given as another session's
    stdio (a caller's stale fd number) are refused: that session could take the other's
    connections, answer or read its traffic, or forge the proxy's records (attackers' pass and
    its review, stop 43)."""
    audit = tmp_path / "audit.jsonl"
    plan = _proxy_session(ws_run, "mirror.test:80=127.0.0.1", audit=str(audit))
    relay = f"{RELAY_DIRECTORY}/{RELAY_SOCKET_NAME}"
    argv = ["python3", "-c", _HOLDS_A_PROXY_CONNECTION, relay]
    with nsconfine.spawn(plan, argv, stdout=subprocess.PIPE) as sandbox:
        assert sandbox.stdout is not None
        assert sandbox.stdout.readline() == b"connected\n"
        sessions = nsconfine._launch.egress._proxies.proxy()._sessions  # (a test's reach)
        (session_,) = sessions.values()
        deadline = time.monotonic() + 30
        while not session_.connections and time.monotonic() < deadline:
            time.sleep(0.01)
        if held == "listener":
            fd = os.dup(session_.listener.fileno())
        elif held == "connection":
            fd = os.dup(next(iter(session_.connections)).client.fileno())
        else:
            fd = os.open(audit, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            with pytest.raises(nsconfine.UsageError, match="holds for another session"):
                nsconfine.spawn(plan, ["/bin/true"], stdout=fd)
        finally:
            os.close(fd)
        sandbox.kill()


_HANDS_THE_PROXY_ITS_STDOUT = """
import array, socket, sys
proxy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
proxy.connect(sys.argv[1])
try:
    proxy.sendmsg([b"C"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [1, 2]))])
except OSError as error:
    print("refused", error.errno, flush=True)
else:
    print("handed", flush=True)
"""


def test_a_session_cannot_hand_the_launchers_proxy_its_stdout(ws_run: tuple[Path, Path]) -> None:
    """A session sends fds 1 and 2 to the launcher's proxy over its socket (SCM_RIGHTS): the
    kernel refuses it (SO_PASSRIGHTS off on the proxy's sockets). Held in the proxy's receive
    queue they kept the session's stdout from reaching EOF after its end until the caller
    reaped it, or the proxy's idle timeout (300 s) passed: a caller reading to EOF before
    wait() waited for itself (attackers' pass, stop 43)."""
    if tuple(int(part) for part in os.uname().release.split(".")[:2]) < (6, 16):
        pytest.skip("SO_PASSRIGHTS needs Linux 6.16")
    plan = _proxy_session(ws_run, "mirror.test:80=127.0.0.1")
    relay = f"{RELAY_DIRECTORY}/{RELAY_SOCKET_NAME}"
    status, output = run(plan, ["python3", "-c", _HANDS_THE_PROXY_ITS_STDOUT, relay])
    assert (status, output) == (0, f"refused {errno.EPERM}\n")


def test_a_listed_name_is_fetched_and_an_unlisted_one_refused(
    ws_run: tuple[Path, Path], upstream: tuple[int, list[dict[str, str]]], tmp_path: Path
) -> None:
    """allow_hosts opens exactly what it names: the listed (pinned) name answers through the
    proxy; the same upstream under another name is refused with the reason, and the audit file
    has a line for each."""
    port, seen = upstream
    audit = tmp_path / "audit.jsonl"
    plan = _proxy_session(ws_run, f"mirror.test:{port}=127.0.0.1", audit=str(audit))
    assert plan.network == "proxy"
    assert f"mirror.test:{port}=127.0.0.1" in plan.manifest()
    _status, listed = run(plan, ["python3", "-c", _FETCH, f"http://mirror.test:{port}/simple"])
    assert listed.strip() == "200 upstream saw GET /simple", listed
    _status, other = run(plan, ["python3", "-c", _FETCH, f"http://other.test:{port}/simple"])
    assert other.startswith("403"), other
    assert "not on this session's allowlist" in other
    assert [request["path"] for request in seen] == ["/simple"]
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(r["host"], r["decision"]) for r in records] == [
        ("mirror.test", "allowed"),
        ("other.test", "refused"),
    ]


def test_a_listed_name_is_fetched_over_https_and_an_unlisted_one_refused(
    ws_run: tuple[Path, Path],
    tls_upstream: tuple[int, list[dict[str, str]]],
    local_ca: LocalCA,
    tmp_path: Path,
) -> None:
    """HTTPS through the relay and the proxy's CONNECT: the listed (pinned) name answers, the
    session verifying the upstream's own certificate with the test's CA (the proxy passes TLS
    through); the same upstream under another name is refused, and the audit says why."""
    port, seen = tls_upstream
    audit = tmp_path / "audit.jsonl"
    plan = _proxy_session(
        ws_run, f"secure.test:{port}=127.0.0.1", audit=str(audit), ro=[str(local_ca.ca)],
        setenv={"SSL_CERT_FILE": str(local_ca.ca)},
    )  # fmt: skip
    _status, listed = run(plan, ["python3", "-c", _FETCH, f"https://secure.test:{port}/simple"])
    assert listed.strip() == "200 upstream saw GET /simple", listed
    _status, other = run(plan, ["python3", "-c", _FETCH, f"https://other.test:{port}/simple"])
    assert "Tunnel connection failed: 403" in other, other
    assert [request["path"] for request in seen] == ["/simple"]
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(r["host"], r["method"], r["decision"], r["reason"]) for r in records] == [
        ("secure.test", "CONNECT", "allowed", "named by the launcher (--allow-host)"),
        ("other.test", "CONNECT", "refused", "other.test is not on this session's allowlist"),
    ]


@pytest.mark.parametrize("where", ["workspace", "run_dir", "home"])
def test_an_audit_file_where_the_session_writes_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path, where: str
) -> None:
    """The audit file is the launcher's, opened by it (as root, by root) at every launch: one
    inside the workspace or run directory is refused when the plan is made, since the session
    can put a symlink above it (the launcher would write through it: into /etc, as root) or a
    FIFO in its place (the next launch would wait on it for good). Twin: the audit file beside
    them (the tests above) is taken."""
    workspace, run_dir = ws_run
    audit = {
        "workspace": workspace / "logs" / "audit.jsonl",
        "run_dir": run_dir / "logs" / "audit.jsonl",
        "home": run_dir / "home" / "logs" / "audit.jsonl",
    }[where]
    with pytest.raises(nsconfine.PlanError, match=r"audit file .* the session can write"):
        _proxy_session(ws_run, "mirror.test:8080=127.0.0.1", audit=str(audit))
    # The session has already put a symlink above it, leading out: refused all the same.
    audit.parent.mkdir(parents=True, exist_ok=True)
    audit.parent.rename(audit.parent.with_name("moved"))
    audit.parent.symlink_to(tmp_path)
    with pytest.raises(nsconfine.PlanError, match=r"audit file .* the session can write"):
        _proxy_session(ws_run, "mirror.test:8080=127.0.0.1", audit=str(audit))
    twin = _proxy_session(ws_run, "mirror.test:8080=127.0.0.1", audit=str(tmp_path / "a.jsonl"))
    assert twin.audit == str(tmp_path / "a.jsonl")


def test_a_launch_the_lint_refuses_makes_no_audit_file(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """The audit file is opened once the launch's lint has passed: a refused launch leaves
    none (a lint that refuses an audit path the session could redirect would come too late
    otherwise: the launcher, as root, would already have made the file wherever a symlink
    led). Twin: the plan as made launches, and the file is there."""
    from nsconfine._plan import model as p

    audit = tmp_path / "audit.jsonl"
    plan = _proxy_session(ws_run, "mirror.test:8080=127.0.0.1", audit=str(audit))
    denied = p.ro_bind("/etc/ssh", "/mnt/ssh", "asked for: the host's SSH keys")
    with pytest.raises(nsconfine.PlanError, match="/etc/ssh"):
        run(plan.replace(entries=(*plan.entries, denied)), ["true"])
    assert not audit.exists()
    assert run(plan, ["true"])[0] == 0
    assert audit.exists()


@pytest.mark.root  # another account's directory: the launcher must be root to find one
def test_an_audit_file_where_the_session_s_account_can_change_it_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """The launcher creates and appends to the audit file, as root: in a directory the
    session's account owns (not this session's workspace: another's), the account could put a
    symlink there to a directory of root's, and the launcher made and wrote audit.jsonl there
    (attacker's pass, stop 39). Refused, as a credential file or a profile there is."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    give_to_session_user(theirs)
    audit = theirs / "audit.jsonl"
    with pytest.raises(nsconfine.PlanError, match="audit file") as refused:
        _proxy_session(ws_run, "mirror.test:8080=127.0.0.1", audit=str(audit))
    assert "someone other than root" in str(refused.value)
    assert not audit.exists()


def test_an_audit_file_in_a_directory_that_does_not_exist_is_refused_as_missing(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """An audit file whose directory is not there is refused for that, saying which directory
    to make (review of stop 44: it was refused as lying "where someone other than root or you
    can change it", No such file or directory)."""
    audit = tmp_path / "no-such-dir" / "audit.jsonl"
    with pytest.raises(nsconfine.PlanError) as refused:
        _proxy_session(ws_run, "mirror.test:8080=127.0.0.1", audit=str(audit))
    message = str(refused.value)
    assert f"{audit.parent} does not exist" in message, message
    assert "someone other than root" not in message


def test_an_audit_file_that_is_a_fifo_refuses_the_launch_at_once(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A FIFO where the audit file should be (no reader) refuses the launch with a reason and
    runs nothing; the launcher does not wait on it. Twin: a regular file there is appended to."""
    audit = tmp_path / "audit.jsonl"
    os.mkfifo(audit)
    plan = _proxy_session(ws_run, "mirror.test:8080=127.0.0.1", audit=str(audit))
    marker = ws_run[0] / "ran"
    outcome = outcome_without_hanging(
        lambda: run(plan, ["touch", str(marker)]), "a FIFO at the audit file"
    )
    assert isinstance(outcome, nsconfine.NsconfineError), outcome
    assert "not a regular file" in str(outcome), outcome
    assert not marker.exists()
    audit.unlink()
    status, _output = run(plan, ["touch", str(marker)])
    assert status == 0
    assert marker.exists()


@pytest.mark.parametrize(
    ("asked", "listed", "refusal"),
    [
        ("127.0.0.1:{port}", "mirror.test:{port}=127.0.0.1", "not listed"),
        ("localhost:{port}", "localhost:{port}", "private, local or reserved"),
        ("mirror.test:1", "mirror.test:{port}=127.0.0.1", "port 1"),
    ],
    ids=["an IP literal", "a name resolving to loopback", "a port not listed"],
)
def test_connect_is_refused_where_the_plan_does_not_say(
    ws_run: tuple[Path, Path],
    upstream: tuple[int, list[dict[str, str]]],
    asked: str,
    listed: str,
    refusal: str,
) -> None:
    """CONNECT to an IP literal, to a listed name that resolves to loopback, or to a port not
    listed: refused with the reason; its twin, CONNECT to the listed name, opens the tunnel."""
    port, _seen = upstream
    plan = _proxy_session(ws_run, listed.format(port=port), f"mirror.test:{port}=127.0.0.1")
    _status, refused = run(plan, ["python3", "-c", _CONNECT, asked.format(port=port)])
    assert refused.startswith("HTTP/1.1 403"), refused
    _status, twin = run(plan, ["python3", "-c", _CONNECT, f"mirror.test:{port}"])
    assert twin.splitlines() == ["HTTP/1.1 200 Connection established", "HTTP/1.0 200 OK"], twin


# What a proxy session must not reach outside the proxy: DNS (UDP and TCP 53), the host's
# loopback listener, ICMP, UDP. Each prints one line: "reached" or why not.
_AROUND_THE_PROXY = """
import socket, sys
port = int(sys.argv[1])
def attempt(name, make):
    try:
        make()
        print(name, "reached")
    except OSError as error:
        print(name, "refused", error.errno)
def udp(address):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(b"\\x12\\x34\\x01\\x00\\x00\\x01" + bytes(6) + b"\\x00\\x00\\x01\\x00\\x01", address)
    s.recv(512)
attempt("dns-udp", lambda: udp(("1.1.1.1", 53)))
attempt("dns-tcp", lambda: socket.create_connection(("1.1.1.1", 53), timeout=3))
attempt("host-loopback", lambda: socket.create_connection(("127.0.0.1", port), timeout=3))
attempt("icmp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
        .sendto(b"\\x08\\x00\\xf7\\xff\\x00\\x00\\x00\\x00", ("1.1.1.1", 0)))
attempt("resolver", lambda: socket.getaddrinfo("pypi.org", 443))
"""


def test_nothing_but_the_proxy_is_reached(
    ws_run: tuple[Path, Path], upstream: tuple[int, list[dict[str, str]]]
) -> None:
    """A proxy session reaches no resolver, no DNS server by UDP or TCP, not the host's
    loopback listener, and sends no ICMP; its twin on the host's network reaches the
    listener."""
    port, _seen = upstream
    plan = _proxy_session(ws_run, f"mirror.test:{port}=127.0.0.1")
    _status, output = run(plan, ["python3", "-c", _AROUND_THE_PROXY, str(port)])
    outcomes = dict(line.split(" ", 1) for line in output.splitlines())
    assert set(outcomes) == {"dns-udp", "dns-tcp", "host-loopback", "icmp", "resolver"}, output
    assert not [name for name, outcome in outcomes.items() if outcome == "reached"], output
    host = session(*ws_run, network="host", network_reason="the twin").plan()
    _status, shared = run(host, ["python3", "-c", _AROUND_THE_PROXY, str(port)])
    assert "host-loopback reached" in shared, shared


def _injected_session(
    ws_run: tuple[Path, Path], port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, Path, nsconfine.Plan]:
    """A fresh key in a credential file, the launcher's ANTHROPIC_BASE_URL on the upstream at
    port, and a session injecting the key there: the key, the file and the plan."""
    secret = "sk-ant-test-" + os.urandom(8).hex()
    credential = tmp_path / "agent.env"
    credential.write_text(f"ANTHROPIC_API_KEY={secret}\n")
    credential.chmod(0o600)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{port}")
    plan = session(*ws_run, credential=str(credential), inject=["anthropic"]).plan()
    return secret, credential, plan


def test_an_injected_key_reaches_the_upstream_and_never_the_session(
    ws_run: tuple[Path, Path],
    upstream: tuple[int, list[dict[str, str]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """inject=["anthropic"]: the session calls $ANTHROPIC_BASE_URL with the placeholder it
    holds, and the upstream (the launcher's own ANTHROPIC_BASE_URL) gets the real key in
    x-api-key and nothing the session sent; the key is nowhere in the session's environment,
    /proc or files (its twin, the credential passed as today, is found there)."""
    port, seen = upstream
    secret, credential, plan = _injected_session(ws_run, port, tmp_path, monkeypatch)
    call = (
        "import os, urllib.request\n"
        "request = urllib.request.Request(os.environ['ANTHROPIC_BASE_URL'] + '/v1/messages', "
        "data=b'{}', headers={'x-api-key': os.environ['ANTHROPIC_API_KEY']})\n"
        "print(urllib.request.urlopen(request, timeout=20).read().decode())"
    )
    _status, output = run(plan, ["python3", "-c", call])
    assert output.strip() == "upstream saw POST /v1/messages", output
    assert seen[-1]["x-api-key"] == secret
    _status, searched = run(plan, ["python3", "-c", SECRET_SEARCH, secret[::-1]])
    assert searched.splitlines()[-1] == "found: []", searched
    assert "memory of 0 processes" not in searched, searched  # the relay's, at least
    plain = session(*ws_run, credential=str(credential)).plan()
    _status, twin = run(plain, ["python3", "-c", SECRET_SEARCH, secret[::-1]])
    assert "environment ANTHROPIC_API_KEY" in twin, twin


@pytest.mark.parametrize(
    "given",
    [
        {"network": "none", "inject": ["anthropic"]},
        {"network": "host", "network_reason": "r", "inject": ["anthropic"]},
        {"network": "host", "network_reason": "r", "profile": ["claude-code"]},
        {"profile": ["claude-code", "researcher"]},
    ],
    ids=["none", "host", "host-and-profile", "profile-sets-host"],
)
def test_an_injection_without_a_proxy_network_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path, given: dict[str, Any]
) -> None:
    """An injection (--inject-for, or a profile's inject) is the proxy's: with another network
    the route is never made, and the key went into the session's environment from the
    credential file (an attacker's pass: claude-code with researcher, whose network is host,
    gave the session ANTHROPIC_API_KEY). Refused instead, saying what to do; nothing runs."""
    credential = tmp_path / "agent.env"
    credential.write_text("ANTHROPIC_API_KEY=sk-ant-test-not-for-the-session\n")
    credential.chmod(0o600)
    with pytest.raises(nsconfine.UsageError, match=r"inject.*proxy"):
        session(*ws_run, credential=str(credential), **given).plan()


def test_a_proxy_session_cannot_reach_or_serve_a_host_abstract_socket(
    ws_run: tuple[Path, Path],
) -> None:
    """With proxy (as with none), a host abstract socket is out of reach, and one the session
    serves is not the host's: a host client finds nothing there."""
    server, name = abstract_listener()
    plan = _proxy_session(ws_run, "mirror.test:1=127.0.0.1")
    try:
        _status, output = run(plan, ["python3", "-c", CONNECT_ABSTRACT, name])
    finally:
        server.close()
    assert output.startswith("refused"), output
    serve = (
        "import socket, sys, time\ns = socket.socket(socket.AF_UNIX)\n"
        "s.bind('\\0' + sys.argv[1]); s.listen(1); print('serving', flush=True); time.sleep(30)"
    )
    served = f"nsconfine-served-{os.urandom(4).hex()}"
    read_end, write_end = os.pipe()
    sandbox = nsconfine.spawn(plan, ["python3", "-c", serve, served], stdout=write_end)
    os.close(write_end)
    try:
        assert os.read(read_end, 100).startswith(b"serving")
        client = socket.socket(socket.AF_UNIX)
        with pytest.raises(ConnectionRefusedError):
            client.connect("\0" + served)
        client.close()
    finally:
        sandbox.kill()
        sandbox.wait()
        os.close(read_end)


def test_a_forked_child_s_exit_leaves_its_parent_s_proxy(
    ws_run: tuple[Path, Path], upstream: tuple[int, list[dict[str, str]]]
) -> None:
    """A child forked from a launcher with a proxy runs the exit handlers as it exits: the
    proxy's, which removes its socket directory, removed its parent's, and the parent's next
    proxy session was refused (found by a test of stop 44's). Only the launcher's own exit
    closes its proxy."""
    import atexit

    port, _seen = upstream
    plan = _proxy_session(ws_run, f"mirror.test:{port}=127.0.0.1")
    assert run(plan, ["python3", "-c", _FETCH, f"http://mirror.test:{port}/"])[0] == 0
    child = os.fork()
    if child == 0:
        atexit._run_exitfuncs()  # as the interpreter's exit runs them
        os._exit(0)
    os.waitpid(child, 0)
    status, output = run(plan, ["python3", "-c", _FETCH, f"http://mirror.test:{port}/simple"])
    assert output.strip() == "200 upstream saw GET /simple", (status, output)


def test_run_prints_each_refusal_on_stderr(
    ws_run: tuple[Path, Path], upstream: tuple[int, list[dict[str, str]]]
) -> None:
    """`nsconfine run --allow-host …`: a refused destination is one line on stderr, naming it
    and why (so a user sees why `npm install` failed); nothing for the allowed one."""
    port, _seen = upstream
    result = cli(
        "run", *session_options(*ws_run), "--allow-host", f"mirror.test:{port}=127.0.0.1",
        "--", "python3", "-c", _FETCH, f"http://registry.test:{port}/",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("403"), result.stdout
    lines = [line for line in result.stderr.splitlines() if "network" in line]
    assert lines == [
        f"nsconfine: network: refused registry.test:{port}: registry.test is not on this "
        "session's allowlist"
    ], result.stderr


def test_run_tty_prints_the_refusals_once_the_session_has_ended(
    ws_run: tuple[Path, Path], upstream: tuple[int, list[dict[str, str]]]
) -> None:
    """`nsconfine run --tty`: a refusal printed as it came landed in the middle of the agent's
    screen, over its dialog (agents' pass, stop 44). They are printed once the session has
    ended, each destination once, with how many times it was refused."""
    port, _seen = upstream
    fetch = f"python3 -c '{_FETCH}' http://registry.test:{port}/"
    done = subprocess.run(
        [sys.executable, "-m", "nsconfine", "run", "--tty", *session_options(*ws_run),
         "--allow-host", f"mirror.test:{port}=127.0.0.1", "--",
         "/bin/sh", "-c", f"{fetch}; {fetch}; sleep 0.5; echo screen-ends"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/",
        timeout=120, check=False,
    )  # fmt: skip
    output = done.stdout.decode(errors="replace")
    assert done.returncode == 0, output
    after = output.partition("screen-ends")[2]
    assert "network" not in output.partition("screen-ends")[0], output
    assert [line for line in after.splitlines() if "network" in line] == [
        f"nsconfine: network: refused registry.test:{port} 2 times: registry.test is not on "
        "this session's allowlist"
    ], output


@pytest.mark.unprivileged  # root's sockets are in /run/nsconfine
@pytest.mark.parametrize("runtime", ["/nonexistent/run/user/1", "/", "relative"])
def test_a_runtime_directory_not_the_launcher_s_own_is_passed_over(
    ws_run: tuple[Path, Path], runtime: str
) -> None:
    """A launcher's XDG_RUNTIME_DIR that is missing (left by su or sudo -u: /run/user/0), not
    its account's, or relative: its proxy sockets go where they would with none set, and the
    proxy session runs. Every one was refused, missing told as a race to retry (attacker's
    pass, stop 33)."""
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
    result = cli(
        "run", *session_options(*ws_run), "--allow-host", "pypi.org", "--", "echo", "ran",
        env=env,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr


PROXY_WITH_PASSWORD = "http://user:hunter2@proxy.example:3128"


@pytest.mark.parametrize("network", ["none", "proxy"])
def test_the_launcher_s_proxy_and_its_password_stay_out_of_a_network_of_its_own(
    ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, network: str
) -> None:
    """The launcher's proxy variables, passed by name (the tls profile passes them), name a
    proxy a session on a network of its own cannot reach: with none they are left out, with
    proxy the relay's replace them; the password in them reaches neither session nor
    manifest. On the host's network (the twin) they pass, as asked."""
    for name in ("HTTPS_PROXY", "ALL_PROXY", "http_proxy"):
        monkeypatch.setenv(name, PROXY_WITH_PASSWORD)
    _kept_out_yet_passed_on_the_host_s(ws_run, network, ["HTTPS_PROXY", "ALL_PROXY", "http_proxy"])


def _kept_out_yet_passed_on_the_host_s(
    ws_run: tuple[Path, Path], network: str, passed: list[str], secret: str = "hunter2"
) -> None:
    """The launcher's variables passed, whose values hold secret: in neither the session's
    environment nor the manifest on network, and in the session's on the host's network."""
    plan = session(*ws_run, network=network, pass_env=passed).plan()
    _status, output = run(plan, ["/bin/sh", "-c", "env"])
    assert secret not in output, output
    assert secret not in plan.manifest()
    host = session(*ws_run, network="host", network_reason="the twin", pass_env=passed).plan()
    assert secret in run(host, ["/bin/sh", "-c", "env"])[1]


@pytest.mark.parametrize("network", ["none", "proxy"])
def test_a_launcher_s_jvm_proxy_and_its_password_stay_out_of_a_network_of_its_own(
    ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, network: str
) -> None:
    """A JVM reads no proxy variable: its proxy, and the proxy's password, come in system
    properties, which the jvm profile's JAVA_TOOL_OPTIONS and MAVEN_OPTS carry from the
    launcher. On a network of its own the session gets neither (the proxy is one it cannot
    reach, and would take the JVM past the relay); on the host's (the twin) they pass, as
    asked. Attacker's pass, stop 33."""
    monkeypatch.setenv(
        "JAVA_TOOL_OPTIONS", "-Dhttps.proxyHost=proxy.corp -Dhttps.proxyPassword=hunter2"
    )
    monkeypatch.setenv("MAVEN_OPTS", "-Xmx1g -Dhttp.proxyPassword=hunter2")
    _kept_out_yet_passed_on_the_host_s(ws_run, network, ["JAVA_TOOL_OPTIONS", "MAVEN_OPTS"])


def test_a_launcher_url_holding_a_credential_stays_out_of_a_session_without_network(
    ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value the launcher passes (the python and node profiles pass its index and registry)
    that holds a URL with a user or password in it reaches no session on `none`: it names a
    place that session cannot reach, and a session holding the token could still write it
    where the host takes it from (attacker's pass, stop 32). A value without one passes, and
    on the host's network (the twin) the token passes, as asked."""
    monkeypatch.setenv("PIP_INDEX_URL", "https://u:PIPTOKEN@idx.corp.example/simple")
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", "https://NPMTOKEN@npm.corp.example/")
    monkeypatch.setenv("PIP_FIND_LINKS", "file:///srv/wheels https://idx.corp.example/links")
    # Other ways URLs are run together, and a password holding a "/" (hostile review)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://h/simple|https://u:PIPE/TOKEN@h2/simple")
    monkeypatch.setenv("NODE_OPTIONS", "--x=https://h/a;https://u:SEMITOKEN@h2")
    passed = ["PIP_INDEX_URL", "NPM_CONFIG_REGISTRY", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"]
    passed.append("NODE_OPTIONS")
    plan = session(*ws_run, pass_env=passed).plan()
    _status, output = run(plan, ["/bin/sh", "-c", "env"])
    assert "TOKEN" not in output, output
    assert "PIP_FIND_LINKS=file:///srv/wheels" in output, output
    host = session(*ws_run, network="host", network_reason="the twin", pass_env=passed).plan()
    assert "PIPTOKEN" in run(host, ["/bin/sh", "-c", "env"])[1]


def test_allow_host_without_proxy_is_a_usage_error(ws_run: tuple[Path, Path]) -> None:
    """--allow-host with --network none (or host): refused, nothing runs."""
    result = cli(
        "run", *session_options(*ws_run), "--network", "none", "--allow-host", "pypi.org",
        "--", "/bin/true",
    )  # fmt: skip
    assert result.returncode == 64, result.stderr
    assert "--network proxy" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("url", "options", "answer", "status"),
    [
        ("https://pypi.org", ["--profile", "python"], "reachable through the proxy: pypi.org", 0),
        ("https://evil.test/x", ["--profile", "python"], "evil.test is not on the plan's", 1),
        ("http://pypi.org:8080/", ["--profile", "python"], "port 8080 is not listed", 1),
        ("https://pypi.org", [], "not reachable: network none", 1),
        ("https://pypi.org", ["--network", "host", "--network-reason", "why"], "network host", 0),
        ("http://127.0.0.1:18080/", ["--network", "proxy", "--allow-host", "127.0.0.1:18080"],
         "listed by its address, which the proxy connects to as it is", 0),
        ("http://127.0.0.1:3128/anthropic/v1/messages", [
            "--network", "proxy", "--inject-for", "anthropic", "--credential", "{root}/c.env"],
         "reachable through the route http://127.0.0.1:3128/anthropic/", 0),
        *[(f"{scheme}://127.0.0.1:3128/anthropic{rest}", [
            "--network", "proxy", "--inject-for", "anthropic", "--credential", "{root}/c.env"],
          "not reachable", 1)
          for scheme, rest in [("http", "/../x"), ("http", "/%2e%2e/x"), ("http", "//v1"),
                               ("http", "/v1;x"), ("http", ""), ("http", "?x=1"),
                               ("https", "/v1/messages")]],
    ],
    ids=["listed", "not listed", "port", "none", "host", "an address", "the route's own",
         "dot-dot", "encoded dot-dot", "double slash", "semicolon", "no slash", "no path",
         "https"],
)  # fmt: skip
def test_explain_answers_for_a_url(
    ws_run: tuple[Path, Path], url: str, options: list[str], answer: str, status: int
) -> None:
    """`nsconfine explain URL SESSION` answers as for a path: through which destination (and
    its reason), or why not. A destination listed by its address is reached as it is (it was
    said to be resolved, and refused as loopback), and the URL a route gives the session, on
    its relay, is reached (it was said to be on no allowlist: attacker's pass, stop 42); but
    not a target of it the relay refuses, nor over TLS (said to be reached, by the first fix:
    a review of it)."""
    options = [option.replace("{root}", str(ws_run[1].parent)) for option in options]
    result = cli("explain", url, *session_options(*ws_run), *options)
    assert result.returncode == status, result.stderr
    assert answer in result.stdout, result.stdout


# A host process asking a session's proxy socket (argv[1]) for the route: what it was answered.
_ASK_ROUTE = """
import socket, sys
with socket.socket(socket.AF_UNIX) as client:
    client.settimeout(10)
    try:
        client.connect(sys.argv[1])
        client.sendall(b"GET /anthropic/v1/models HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        print(client.recv(4096).decode(errors="replace") or "closed")
    except OSError as error:
        print("failed", error)
"""


@pytest.mark.parametrize("network", ["the-launcher-s", "its-own"])
def test_a_host_process_of_the_session_account_gets_nothing_from_its_proxy(
    ws_run: tuple[Path, Path],
    upstream: tuple[int, list[dict[str, str]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    network: str,
) -> None:
    """The session's proxy socket serves its sandbox alone: a host process of the session's
    account (as root, `nobody`, which host daemons share) that finds the socket and asks the
    route gets nothing, and the upstream never sees the key (from inside, the same request
    reaches it: test_an_injected_key_reaches_the_upstream_and_never_the_session); so too from
    a network namespace of its own (`unshare -Urn`, which any account may make: an attacker's
    pass got the route's answer so, when the proxy asked only for a network not the
    launcher's)."""
    from nsconfine._launch.egress import _proxies

    port, seen = upstream
    secret, _credential, plan = _injected_session(ws_run, port, tmp_path, monkeypatch)
    parent = _proxies.proxy().launcher_directory()  # (each session's directory is made there)
    before = set(os.listdir(parent))
    sandbox = nsconfine.spawn(plan, ["sleep", "60"])
    try:
        (directory,) = set(os.listdir(parent)) - before
        ask = ["/usr/bin/python3", "-c", _ASK_ROUTE, os.path.join(parent, directory, "socket")]
        if network == "its-own":
            ask = ["/usr/bin/unshare", "-Urn", *ask]
        answer = subprocess.run(
            ask, capture_output=True, text=True, timeout=60, check=False,
            user=plan.user.uid if IS_ROOT else None, group=plan.user.gid if IS_ROOT else None,
            extra_groups=[] if IS_ROOT else None,
        )  # fmt: skip
    finally:
        sandbox.kill()
        sandbox.wait(timeout=30)
    assert answer.returncode == 0, answer.stderr
    assert "200" not in answer.stdout, answer.stdout
    assert answer.stdout.strip() in ("closed", "") or answer.stdout.startswith("failed"), answer
    assert not [request for request in seen if secret in request["x-api-key"]], seen


def test_selftest_shows_who_can_serve_a_host_abstract_socket(world: World) -> None:
    """selftest's check: a session on the default network serves an abstract socket no host
    client reaches; on the host network (its reason given) a host client reaches it, as the
    docs say, and the selftest shows it."""
    assert abstract_socket_served(world, world.plan()) is None
    host = world.session().replace(network="host", network_reason="the twin")
    served = abstract_socket_served(world, build_plan(host, homes=[world.home], environ={}))
    assert served == f"served nsconfine-selftest-served-{world.token}"
