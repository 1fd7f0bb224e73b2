"""The host side of a session's network: an HTTP proxy on a unix socket per session.

A session's network namespace has only a loopback; a relay inside forwards each TCP
connection to 127.0.0.1:3128 to this session's unix socket. Here each connection is one
request: CONNECT to a listed host, a plain-HTTP request to a listed host, or a request to one of
the session's routes (an API reached with a key the session never sees). Only that request goes
upstream, its body framed as its head says: what a client pipelines after it is dropped, or it
would reach the listed address unjudged. Everything else is refused with a one-line reason,
and every connection is audited.

The peer is hostile: it may send nothing, send forever, never read, or send what two HTTP
parsers read differently. So: a thread per connection with blocking sockets and timeouts (a
stuck peer holds only its own thread), caps per session and overall (with a few places each
session keeps whatever the others hold), a strict request parser, and the session's own rules
and routes only (a listener knows no other session's).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import resource
import select
import shutil
import socket
import ssl
import stat
import struct
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

from nsconfine._errors import SandboxUnavailable, UsageError
from nsconfine._kernel.accounts import make_own_directory
from nsconfine._launch import own_fds
from nsconfine._plan.allowlist import (
    Decision,
    Destination,
    HostRefused,
    Resolver,
    Route,
    canonical_host,
    host_addresses,
    judge,
    route_target_problem,
    system_resolver,
)
from nsconfine._plan.model import RELAY_SOCKET_NAME
from nsconfine._plan.network import ca_file_problem
from nsconfine._text import is_decimal, printable

Audit = Callable[[dict[str, object]], None]

MAX_HEAD = 16 * 1024
MAX_HEADER_LINES = 100
MAX_RESPONSE_HEAD = 64 * 1024
CHUNK = 64 * 1024
SPLICE_BYTES = 1024 * 1024  # a spliced connection's pipe: what it holds in flight
# An upstream socket's receive buffer, fixed (the kernel counts twice it): left to the kernel's
# tuning, one whose client stopped reading grew to tcp_rmem's maximum (6 MiB on Debian, 32 MiB
# on some hosts), host-wide TCP memory held by the launcher for a session, 32 connections each.
UPSTREAM_RECEIVE_BYTES = 1024 * 1024
# What a connection costs the launcher at most: its two sockets and its splice pipe's two ends.
FDS_PER_CONNECTION = 4
CONNECTIONS_END_SECONDS = 5.0  # how long a session's end waits for its shut connections
_CONNECT_SLICE_MS = 100  # a connect under way looks this often whether its session has ended
MAX_DRAINED = 1024 * 1024  # what a refused peer may still send before it is cut off
MAX_CHUNK_LINE = 1024  # a line of a chunked body's framing (a size and its extensions)
MAX_CONTENT_LENGTH = 2**63 - 1  # what every upstream's parser holds in its integer
# Each chunk of a body is framed again here, on the launcher's threads: a session sending
# one-byte chunks took a launcher core and stalled every other session's launches. Past
# MIN_CHUNKS_CHECKED chunks, a body whose chunks average under MIN_AVERAGE_CHUNK bytes is
# refused (clients chunk by their writes: kilobytes).
MIN_CHUNKS_CHECKED = 1024
MIN_AVERAGE_CHUNK = 128
# And a session's connections frame this many chunks a second between them (after this many at
# once); past it, each waits its share, asleep: 32 connections of 128-byte chunks still held a
# core and stalled other launches for seconds (each launch waits for the interpreter's lock at
# each of its system calls). Clients chunk by kilobytes: 20,000 a second is 160 MB/s at 8 KiB.
CHUNKS_PER_SECOND = 20_000
CHUNKS_AT_ONCE = 20_000
MAX_INTERIM_HEADS = 16  # 1xx heads of one response looked at (Connection rewritten after)
# The methods of an HTTP API a route carries its key with (not TRACE, TRACK, CONNECT).
_ROUTE_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Headers that speak to this hop (or carry credentials to it), never forwarded as sent.
_HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authorization"})
_CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "proxy-authorization"})
# The body's framing: sent upstream as the proxy read it, never as the client spelled it.
_FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding"})
# Headers by which common gateways override a request's method, path or host (and every
# X-Forwarded*): to a route's upstream they would take its key past the route's method and
# path checks.
_REROUTING_HEADERS = frozenset(
    {"x-http-method-override", "x-http-method", "x-method-override", "x-original-method",
     "x-original-url", "x-rewrite-url", "x-original-uri", "x-original-host", "x-host",
     "x-http-host-override", "forwarded", "via"}
)  # fmt: skip
_REROUTING_PREFIX = "x-forwarded"
# What never goes upstream as the client sent it: to a listed host, and to a route's.
_PLAIN_HTTP_DROPPED = _HOP_HEADERS | _FRAMING_HEADERS | {"host"}
_ROUTE_DROPPED = _PLAIN_HTTP_DROPPED | _CREDENTIAL_HEADERS | _REROUTING_HEADERS
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class _Refusal(Exception):
    """A request refused: reason as the session is told it; logged, as the audit records it
    (with what the launcher learned and the session must not: a resolved address)."""

    def __init__(self, status: int, reason: str, logged: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.logged = reason if logged is None else logged


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]  # in order, names as sent

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name]

    def head(self, target: str, dropped: Callable[[str], bool], extra: Sequence[bytes]) -> bytes:
        """The head sent upstream: the headers whose names dropped() refuses left out."""
        lines = [f"{self.method} {target} HTTP/1.1".encode()]
        lines += [f"{k}: {v}".encode() for k, v in self.headers if not dropped(k)]
        lines += [*extra, b"Connection: close"]
        return b"\r\n".join(lines) + b"\r\n\r\n"


def parse_head(head: bytes) -> _Request:
    """The request line and headers, held to the strict form (CRLF only, no folding, token
    names, no control characters): anything two parsers could read differently is a 400."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise _Refusal(400, "the request head is not ASCII") from None
    lines = text[:-4].split("\r\n") if text.endswith("\r\n\r\n") else text.split("\r\n")
    if len(lines) - 1 > MAX_HEADER_LINES:
        raise _Refusal(431, f"more than {MAX_HEADER_LINES} header lines")
    if any(c in line for line in lines for c in "\r\n\0"):
        raise _Refusal(400, "a bare CR, LF or NUL in the request head")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _TOKEN:
        raise _Refusal(400, "the request line is not 'METHOD target HTTP/1.1'")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _Refusal(400, "only HTTP/1.1 and HTTP/1.0 are spoken")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in target):
        raise _Refusal(400, "the request target holds a control character")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or not set(name) <= _TOKEN:
            raise _Refusal(400, "a header line is not 'Name: value' (or is folded)")
        if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value):
            raise _Refusal(400, "a header value holds a control character")
        headers.append((name, value.strip(" \t")))
    names_with_underscore = [name for name, _ in headers if "_" in name]
    request = _Request(method, target, version, headers)
    # CGI-style servers (PHP, some WSGI) read a name's '_' as '-': this would be framing
    # to them, and not to the proxy.
    if any(name.lower().replace("_", "-") in _FRAMING_HEADERS for name in names_with_underscore):
        raise _Refusal(400, "a header spells Content-Length or Transfer-Encoding with '_'")
    lengths = request.values("content-length")
    if len(lengths) > 1 or (lengths and request.values("transfer-encoding")):
        raise _Refusal(400, "the request's body length is stated twice")
    if lengths and not is_decimal(lengths[0]):
        raise _Refusal(400, "Content-Length is not a number")
    # (a parser that wraps reads less; past 19 digits, no int() is needed to tell)
    if lengths and (len(lengths[0]) > 19 or int(lengths[0]) > MAX_CONTENT_LENGTH):
        raise _Refusal(400, f"Content-Length is over {MAX_CONTENT_LENGTH}")
    return request


def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """host and port of "host:port" / "[v6]:port" (port optional if default_port)."""
    if authority.startswith("["):
        host, bracket, rest = authority.partition("]")
        host += bracket
        port_text = rest[1:] if rest.startswith(":") else None
        if rest and port_text is None:
            raise _Refusal(400, "the authority is not [address]:port")
    else:
        host, colon, port_text_or_empty = authority.rpartition(":")
        if not colon or ":" in host:
            host, port_text = authority, None
        else:
            port_text = port_text_or_empty
    if port_text is None:
        if default_port is None:
            raise _Refusal(400, "CONNECT needs host:port")
        return host, default_port
    if not is_decimal(port_text) or len(port_text) > 5 or not 0 < int(port_text) < 65536:
        raise _Refusal(400, "the port is not a number from 1 to 65535")
    return host, int(port_text)


def _response(status: int, reason: str) -> bytes:
    body = f"nsconfine: {printable(reason)}\n".encode("ascii", "backslashreplace")
    return (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


def _header_name(line: bytes) -> str:
    return line.split(b":")[0].strip().lower().decode("latin-1")


class _ResponseHeadRewriter:
    """Bytes from the upstream with the response head's Connection header replaced by
    `Connection: close` (interim 1xx heads pass as they are); the body passes untouched, as it
    comes: a stream of server-sent events is not held back."""

    def __init__(self) -> None:
        self.pending = b""
        self.done = False
        self.interim_heads = 0

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return data
        self.pending += data
        out = b""
        while not self.done:
            end = self.pending.find(b"\r\n\r\n")
            if end < 0:
                if len(self.pending) > MAX_RESPONSE_HEAD:  # not HTTP as we know it: pass it on
                    self.done = True
                    out, self.pending = out + self.pending, b""
                return out
            head, self.pending = self.pending[: end + 4], self.pending[end + 4 :]
            lines = head[:-4].split(b"\r\n")
            interim = lines[0][9:12].startswith(b"1") and lines[0][9:12] != b"101"
            if not interim:
                kept = [ln for ln in lines if _header_name(ln) not in _HOP_HEADERS]
                head = b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n"
                self.done = True
            else:
                self.interim_heads += 1
                # Past a few, the rest passes as it comes: an upstream sending endless ones
                # would have the launcher parse each, at the CPU of hundreds of body bytes.
                # (The final head then keeps its own Connection header: the proxy forwards
                # one request per connection whatever the client was told.)
                self.done = self.interim_heads >= MAX_INTERIM_HEADS
            out += head
        out, self.pending = out + self.pending, b""
        return out

    def flush(self) -> bytes:
        out, self.pending = self.pending, b""
        return out


class _RequestBody:
    """One request's body out of the bytes a client sends: Content-Length bytes, or chunked
    framing read and re-sent plainly (sizes in bare hex, extensions dropped: no framing for an
    upstream to read otherwise than this). What follows the body is never returned."""

    def __init__(self, request: _Request, pace: _Pace | None = None) -> None:
        self.pace = pace  # the session's, which each chunk framed is taken from
        codings = request.values("transfer-encoding")
        if len(codings) > 1:
            raise _Refusal(400, "Transfer-Encoding is stated twice")
        if codings and codings[0].lower() != "chunked":
            raise _Refusal(501, f"the transfer coding {codings[0]!r} is not forwarded")
        lengths = request.values("content-length")  # (parse_head checked it is one number)
        self.chunked = bool(codings)
        self.left = int(lengths[0]) if lengths else 0  # of the body, or of the current chunk
        # The framing as read, for the head sent upstream.
        self.header_lines = (
            [b"Transfer-Encoding: chunked"] if self.chunked
            else [b"Content-Length: %d" % self.left] if lengths else []
        )  # fmt: skip
        self.state: Literal["size", "data", "data-end", "trailer", "done"] = (
            "size" if self.chunked else "data" if self.left else "done"
        )
        self.partial_line = b""
        self.chunks = 0  # and the bytes they held: see MIN_AVERAGE_CHUNK
        self.chunked_bytes = 0

    def feed(self, data: bytes) -> bytes:
        """What of data goes upstream (raises _Refusal on framing it cannot read). Read by
        offset, in one pass over data: a copy of the rest at each framing line cost the square
        of a read of many small chunks."""
        if self.partial_line:
            data, self.partial_line = self.partial_line + data, b""
        chunks = self.chunks
        try:
            return self._frame(data)
        finally:
            if self.pace is not None and self.chunks > chunks:
                self.pace.take(self.chunks - chunks)

    def _frame(self, data: bytes) -> bytes:
        out: list[bytes] = []
        at = 0
        while at < len(data) and self.state != "done":
            if self.state == "data":
                taken = data[at : at + self.left]
                out.append(taken)
                at += len(taken)
                self.left -= len(taken)
                if not self.left:
                    self.state = "data-end" if self.chunked else "done"
                continue
            end = data.find(b"\r\n", at, at + MAX_CHUNK_LINE + 2)
            if end < 0:
                if len(data) - at > MAX_CHUNK_LINE:
                    raise _Refusal(
                        400, f"a line of the chunked framing is over {MAX_CHUNK_LINE} bytes"
                    )
                self.partial_line = data[at:]  # until the line is whole
                break
            line, at = data[at:end], end + 2
            if b"\r" in line or b"\n" in line:
                raise _Refusal(400, "a bare CR or LF in the chunked framing")
            if self.state == "size":
                out.append(self._chunk_size(line))
            elif line:  # after a chunk's data, or after the last chunk (a trailer)
                what = "a trailer" if self.state == "trailer" else "a chunk longer than its size"
                raise _Refusal(400, f"the chunked body holds {what}")
            else:  # the CRLF that ends a chunk's data, or the whole body
                out.append(b"\r\n")
                self.state = "size" if self.state == "data-end" else "done"
        return b"".join(out)

    def _chunk_size(self, line: bytes) -> bytes:
        size = line.partition(b";")[0].rstrip(b" \t")  # (the extensions are dropped)
        if not 0 < len(size) <= 16 or not set(size) <= set(b"0123456789abcdefABCDEF"):
            raise _Refusal(400, "a chunk's size is not a hexadecimal number")
        self.left = int(size, 16)
        if self.left > MAX_CONTENT_LENGTH:  # (as a Content-Length past it: parse_head)
            raise _Refusal(400, f"a chunk's size is over {MAX_CONTENT_LENGTH}")
        self.state = "data" if self.left else "trailer"
        self.chunks += 1
        self.chunked_bytes += self.left
        if (
            self.chunks >= MIN_CHUNKS_CHECKED
            and self.chunked_bytes < self.chunks * MIN_AVERAGE_CHUNK
        ):
            raise _Refusal(
                400,
                f"the chunked body's chunks average under {MIN_AVERAGE_CHUNK} bytes: its "
                "framing would cost the launcher more than its data",
            )
        return b"%x\r\n" % self.left


class _Pace:
    """One session's chunk framing, CHUNKS_PER_SECOND a second (CHUNKS_AT_ONCE at once) between
    its connections: a token bucket each takes what it framed from, a connection that leaves it
    owing sleeping until its share is paid (off the interpreter's lock)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(CHUNKS_AT_ONCE)
        self._last = clock()

    def take(self, count: int) -> None:
        with self._lock:
            now = self._clock()
            refill = (now - self._last) * CHUNKS_PER_SECOND
            self._tokens = min(float(CHUNKS_AT_ONCE), self._tokens + refill) - count
            self._last = now
            owed = -self._tokens / CHUNKS_PER_SECOND
        if owed > 0:
            self._sleep(owed)


@dataclass(eq=False)  # held in a set, by identity
class _Connection:
    session: str
    client: socket.socket
    upstream: socket.socket | None = None
    record: dict[str, object] = field(default_factory=dict)
    ended: threading.Event = field(default_factory=threading.Event)  # shut: its session ended

    def shut(self) -> None:
        self.ended.set()  # a connect under way gives up (a shutdown does not stop it)
        for sock in (self.client, self.upstream):
            if sock is not None:
                _shut(sock)


def _close_held(sock: socket.socket) -> None:
    """Close a socket own_fds holds (forgotten there first: its inode may be reused)."""
    with contextlib.suppress(OSError):  # (closed already: fileno() is -1)
        info = os.fstat(sock.fileno())
        own_fds.release((info.st_dev, info.st_ino))
    sock.close()


def _shut(sock: socket.socket) -> None:
    """Shut sock both ways from another thread: a TLS socket's own shutdown() would also drop
    its TLS state under the thread using it (an AttributeError there, not an OSError)."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


@dataclass(eq=False)
class _Session:
    name: str
    directory: Path
    path: Path
    listener: socket.socket
    destinations: tuple[Destination, ...]
    routes: dict[str, Route]
    held: tuple[int, int]  # the listener's identity in own_fds
    connections: set[_Connection] = field(default_factory=set)
    stopping: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    network: int | None = None  # its sandbox's network namespace (inode), once built
    pace: _Pace = field(init=False)  # of its connections' chunked bodies

    def __post_init__(self) -> None:
        # A connection asleep for the pace wakes when the session ends, whose end waits for it.
        self.pace = _Pace(sleep=self.stopping.wait)


_SO_PASSRIGHTS = 83  # <asm-generic/socket.h> (Python 3.11's socket has no name for it)


def _sockets_parent() -> str:
    """The directory the launchers' directories of socket directories are made in: the
    account's own, 0711 (a session's account passes through it to its socket, and lists
    nothing: the names are random). /run/nsconfine for root, else the launcher's runtime
    directory, else /tmp's."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.geteuid() == 0:
        parent = "/run/nsconfine"
    elif _own_runtime_directory(runtime):
        parent = os.path.join(runtime, "nsconfine")
    else:
        parent = f"/tmp/nsconfine-{os.geteuid()}-proxy"
    if not make_own_directory(parent, 0o711, 0o066):
        # (in /tmp, another account may have made it first, and this one cannot remove it)
        raise SandboxUnavailable(
            f"{printable(parent)} must be a directory of this account's that no one else can "
            "read or write (it holds the sessions' proxy sockets): remove it, or set "
            "XDG_RUNTIME_DIR to a directory of this account's (mode 0700) for the sockets"
        )
    return parent


def _own_runtime_directory(path: str) -> bool:
    """Is path a runtime directory of this account's, as systemd makes it (absolute, a
    directory it owns that no one else may write)? One left by su or sudo -u (/run/user/0),
    missing, or another's is passed over, not refused."""
    try:
        info = os.stat(path) if path.startswith("/") else None
    except OSError:
        return False
    return (
        info is not None
        and stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & 0o022
    )


def _still_at(fd: int, path: str) -> bool:
    """Is the file open at fd still the one at path (not unlinked, nor replaced)?"""
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


class _LauncherDirectory:
    """This launcher's directory in the sockets' parent, holding its sessions' socket
    directories, with a lock file beside it (NAME.lock) that the launcher holds flocked while it
    lives (CLOEXEC: no session inherits it). A launcher killed before it could clean up leaves
    both, and its lock free: the next launcher of the account takes it and removes them. The
    lock is made before the directory and removed after it, so whatever point a launcher (or a
    sweep) dies at leaves a free lock for the next sweep."""

    def __init__(self, parent: str) -> None:
        while True:
            fd, lock = tempfile.mkstemp(prefix="launcher-", suffix=".lock", dir=parent)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _still_at(fd, lock):
                    break
            except BlockingIOError:
                pass  # a sweep took this new lock for a dead launcher's: it removes it
            os.close(fd)
        self.lock_fd = fd
        self.path = lock.removesuffix(".lock")
        os.mkdir(self.path, 0o700)
        os.chmod(self.path, 0o711)  # a session's account passes through it to its socket

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path + ".lock")
        os.close(self.lock_fd)

    @staticmethod
    def sweep(parent: str) -> None:
        """Removes the directory of every launcher in parent whose lock is free (it is dead)."""
        for name in os.listdir(parent):
            if not (name.startswith("launcher-") and name.endswith(".lock")):
                continue
            lock = os.path.join(parent, name)
            try:
                fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: it lives
                if _still_at(fd, lock):  # (not swept already by another launcher's sweep)
                    shutil.rmtree(lock.removesuffix(".lock"), ignore_errors=True)
                    os.unlink(lock)
            except OSError:
                pass
            finally:
                os.close(fd)


def _refusal_of_peer(client: socket.socket, network: int | None) -> str | None:
    """None if the peer is in the session's sandbox's network namespace (its relay), else why
    it is refused. Not merely one other than the launcher's: any account may make one of its
    own (unshare -Urn). The peer is the process that connected (SO_PEERCRED): one that has
    exited since cannot be judged, and is not said to be outside (a session's child that
    connects and exits at once would have the audit report a host process at the proxy)."""
    if network is None:  # not built yet: nothing of the session runs before it is
        return "a connection before its sandbox was built"
    try:
        credentials = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        pid = struct.unpack("3i", credentials)[0]
        peers = os.stat(f"/proc/{pid}/ns/net").st_ino
    except (FileNotFoundError, ProcessLookupError):
        return "a connection whose process ended before it could be checked"
    except (OSError, struct.error):
        return "a connection that could not be checked"
    if peers != network:
        # (a host process of its account; or, --allow-nested-userns, one the session made)
        return "a connection from outside the sandbox's network"
    return None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


class Proxy:
    """One per launcher: serves each session's unix socket on daemon threads of its own."""

    def __init__(
        self,
        *,
        audit: Audit | None = None,
        resolver: Resolver | None = None,
        head_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        idle_timeout: float = 300.0,
        max_connections_per_session: int = 32,
        max_connections: int | None = None,
        guaranteed_per_session: int = 4,
        sandboxes_only: bool = True,
    ) -> None:
        self._audit = audit
        self._resolver = resolver or system_resolver
        self.head_timeout = head_timeout
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.max_connections_per_session = max_connections_per_session
        # None: a quarter of the launcher's fds (its soft RLIMIT_NOFILE, read at each accept),
        # FDS_PER_CONNECTION each: connections cost fds, and sessions must not take the
        # launcher's room to launch others (a launch holds ~80 at its peak).
        self.max_connections = max_connections
        # A session's first few connections are admitted whatever the others hold (sessions
        # that fill max_connections cannot starve another), while the proxy holds less than
        # half the launcher's fds: threads and fds stay bounded however many sessions ask.
        self.guaranteed_per_session = guaranteed_per_session
        # Only peers in a network namespace other than the launcher's (off for tests that
        # speak to the proxy from the host).
        self.sandboxes_only = sandboxes_only
        self._lock = threading.Lock()
        # Notified as each connection ends: a session's end waits for its connections' records.
        self._connection_ended = threading.Condition(self._lock)
        self._sessions: dict[str, _Session] = {}
        # Connections served now, every session's, removed ones' too: a thread stuck in a name
        # lookup outlives its session's end, holding its thread and fds (counted to the cap).
        self._serving = 0
        # By session and decision: which records are written, and what the others add up to.
        self._budgets: dict[tuple[str, bool], _RecordBudget] = {}
        self._closed = False
        self._directory: _LauncherDirectory | None = None  # made at the first session

    # -- sessions -------------------------------------------------------------------------

    def add_session(
        self,
        name: str,
        destinations: Sequence[Destination],
        routes: Sequence[Route],
        *,
        uid: int | None = None,
    ) -> str:
        """A new unix socket, in a fresh private directory, for the session's relay; what
        arrives on it is judged by these destinations and routes only. With uid (a root
        launcher's session account) the socket is that account's to connect to."""
        by_name = {route.name: route for route in routes}
        if len(by_name) != len(routes):
            raise UsageError(f"session {name}: two routes share a name")
        with self._lock:
            if self._closed:
                raise UsageError("the proxy is closed")
            if name in self._sessions:
                raise UsageError(f"session {name!r} already has a proxy socket")
        directory = Path(tempfile.mkdtemp(prefix="proxy-", dir=self.launcher_directory()))
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.chmod(directory, 0o711)
            path = directory / RELAY_SOCKET_NAME
            listener.bind(str(path))
            if uid is not None and uid != os.geteuid():
                try:
                    os.chown(path, uid, -1)
                except PermissionError:
                    raise UsageError(
                        f"session {name}: the proxy socket cannot be given to uid {uid} "
                        "(only a root launcher runs sessions as another account)"
                    ) from None
            os.chmod(path, 0o600)
            # No fds pass to the proxy (its connections inherit it): a session's own stdout
            # held in the proxy's receive queue would reach EOF only once the proxy lets the
            # connection go, at the session's reaping (Linux 6.16; before, it is unrefused).
            with contextlib.suppress(OSError):
                listener.setsockopt(socket.SOL_SOCKET, _SO_PASSRIGHTS, 0)
            listener.listen(128)
            held = own_fds.hold(listener.fileno())  # no session's stdio while open
        except BaseException:
            listener.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        session = _Session(name, directory, path, listener, tuple(destinations), by_name, held)
        session.thread = threading.Thread(
            target=self._accept_loop, args=(session,), name=f"nsconfine-proxy-{name}", daemon=True
        )
        with self._lock:
            self._sessions[name] = session
        try:
            session.thread.start()
        except RuntimeError:  # the launcher at its process or thread limit
            with self._lock:
                self._sessions.pop(name, None)
            own_fds.release(held)
            listener.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise SandboxUnavailable(
                f"session {name}: the launcher cannot start its proxy's thread (it is at its "
                "process or thread limit, which its sessions may share): nothing was run; "
                "raise the limit, or launch again once fewer processes run"
            ) from None
        return str(path)

    def launcher_directory(self) -> str:
        """Where this proxy makes its sessions' socket directories: its own, made at the first
        call, when every dead launcher's of the account is removed."""
        with self._lock:
            if self._closed:
                raise UsageError("the proxy is closed")
            if self._directory is None:
                parent = _sockets_parent()
                self._directory = _LauncherDirectory(parent)
                _LauncherDirectory.sweep(parent)
            return self._directory.path

    def admit_only(self, name: str, network: int) -> None:
        """Serve session name's socket to peers in this network namespace (inode) alone: its
        sandbox's, built and checked (until then, to none)."""
        with self._lock:
            session = self._sessions.get(name)
            if session is not None:
                session.network = network

    def remove_session(self, name_or_path: str | os.PathLike[str]) -> None:
        """Closes the session's listener, ends its connections, removes its socket."""
        with self._lock:
            session = self._sessions.pop(str(name_or_path), None)
            if session is None:
                for key, candidate in self._sessions.items():
                    if str(candidate.path) == os.fspath(name_or_path):
                        session = self._sessions.pop(key)
                        break
        if session is None:
            return
        session.stopping.set()
        # Shutting a listening socket down wakes its accept() at once (EINVAL): a session's end
        # waits for no timeout.
        with contextlib.suppress(OSError):
            session.listener.shutdown(socket.SHUT_RDWR)
        if session.thread is not None and session.thread is not threading.current_thread():
            session.thread.join()
        own_fds.release(session.held)
        session.listener.close()
        with self._lock:
            connections = list(session.connections)
        for connection in connections:
            connection.shut()
        # Each connection's thread, its sockets shut, ends at once: its audit record is written
        # before the session's end is (a record written after would find no listener).
        with self._connection_ended:
            self._connection_ended.wait_for(
                lambda: not session.connections, CONNECTIONS_END_SECONDS
            )
            budgets = [(self._budgets.pop((session.name, allowed), None), allowed)
                       for allowed in (False, True)]  # fmt: skip
        for budget, allowed in budgets:
            summary = None if budget is None else budget.summary(session.name, allowed)
            if summary is not None:
                self._write(summary)
        shutil.rmtree(session.directory, ignore_errors=True)

    def close(self) -> None:
        """Ends every session; closing twice is closing once."""
        with self._lock:
            self._closed = True
            names = list(self._sessions)
        for name in names:
            self.remove_session(name)
        with self._lock:
            directory, self._directory = self._directory, None
        if directory is not None:
            directory.remove()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- connections ----------------------------------------------------------------------

    def _accept_loop(self, session: _Session) -> None:
        while not session.stopping.is_set():
            try:
                client, _ = session.listener.accept()
            except OSError:
                if session.stopping.is_set():
                    return
                time.sleep(0.05)  # EMFILE and the like: the next accept may succeed
                continue
            own_fds.hold(client.fileno())  # no other session's stdio while open
            unjudged = _refusal_of_peer(client, session.network) if self.sandboxes_only else None
            if unjudged is not None:
                # The socket is the session account's to connect to, and a host process of
                # that account (a daemon sharing `nobody`) is no sandbox: it gets nothing here.
                _close_held(client)
                self._emit({"time": _now(), "session": session.name}, False, unjudged)
                continue
            connection = _Connection(session.name, client)
            cap, bound = self._connection_caps()
            with self._lock:
                total = self._serving
                held = len(session.connections)
                if held >= self.max_connections_per_session:
                    refusal = f"this session has {held} connections open"
                elif total >= cap and (held >= self.guaranteed_per_session or total >= bound):
                    refusal = f"the proxy has {total} connections open"
                else:
                    refusal = ""
                    session.connections.add(connection)
                    self._serving += 1
            if refusal:
                self._refuse_at_once(connection, refusal)
                continue
            serving = threading.Thread(
                target=self._serve,
                args=(session, connection),
                name=f"nsconfine-proxy-{session.name}-conn",
                daemon=True,
            )
            try:
                serving.start()
            except RuntimeError:  # at the process limit, which a session may have reached
                self._served(session, connection)
                self._refuse_at_once(connection, "the launcher cannot start a thread now")

    def _connection_caps(self) -> tuple[int, int]:
        """(the connections the proxy admits, past which a session gets only its guaranteed
        few; the connections it never goes past), from the fds the launcher may open now."""
        fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if fds == resource.RLIM_INFINITY:
            fds = 1 << 20
        cap = (
            fds // 4 // FDS_PER_CONNECTION if self.max_connections is None else self.max_connections
        )
        return cap, max(cap, fds // 2 // FDS_PER_CONNECTION)

    def _refuse_at_once(self, connection: _Connection, reason: str) -> None:
        """Over a cap: answered from the accept loop without reading (a send into an empty
        buffer does not block), so a flood costs no thread."""
        connection.record = {"time": _now(), "session": connection.session}
        try:
            connection.client.setblocking(False)
            connection.client.send(_response(503, reason))
        except OSError:
            pass
        _close_held(connection.client)
        self._emit(connection.record, False, reason)

    def _emit(self, record: dict[str, object], allowed: bool, reason: str) -> None:
        session = record.get("session")
        with self._lock:
            budget = self._budgets.get((str(session), allowed))
            if budget is None and str(session) in self._sessions:
                budget = self._budgets[(str(session), allowed)] = _RecordBudget()
            # A session removed has no budget left to keep (its last connections' records,
            # each written: the session admits no more).
            written = budget is None or budget.take(record)
            summary = None if budget is None or not written else budget.summary(session, allowed)
        if not written:
            return  # counted: the sum is recorded with the next record written, or at the end
        if summary is not None:
            self._write(summary)
        self._write(_full_record(record, allowed, reason))

    def _write(self, full: dict[str, object]) -> None:
        if self._audit is None:
            return
        try:
            self._audit(full)
        except Exception as error:  # an audit sink that fails must not end the proxy
            print(f"nsconfine proxy: the audit sink failed: {error!r}", file=sys.stderr)

    def _serve(self, session: _Session, connection: _Connection) -> None:
        record = connection.record = {"time": _now(), "session": session.name}
        allowed_reason: str | None = None
        try:
            head, rest = self._read_head(connection.client)
            if head is None:
                return  # closed before a request: nothing was asked
            request = parse_head(head)
            record["method"] = request.method
            allowed_reason = self._dispatch(session, connection, request, rest)
        except _Refusal as refusal:
            self._send_quietly(connection.client, _response(refusal.status, refusal.reason))
            self._emit(record, False, refusal.logged)
        except Exception as error:  # never a traceback for what a session sent
            reason = f"the proxy failed on this request ({type(error).__name__})"
            self._send_quietly(connection.client, _response(502, reason))
            self._emit(record, False, reason)
        finally:
            for sock in (connection.client, connection.upstream):
                if sock is not None:
                    _close_held(sock)
            if allowed_reason is not None:
                self._emit(record, True, allowed_reason)
            self._served(session, connection)

    def _served(self, session: _Session, connection: _Connection) -> None:
        """connection is no longer served (its thread ends, or never started)."""
        with self._connection_ended:
            session.connections.discard(connection)
            self._serving -= 1
            self._connection_ended.notify_all()

    @staticmethod
    def _send_quietly(sock: socket.socket, data: bytes) -> None:
        """Send a refusal and half-close; then read (and drop) what the peer still sends, for
        a moment and a bounded amount: closing with input unread would reset the connection,
        and the peer would lose the answer that says why."""
        try:
            sock.settimeout(1.0)
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            dropped = 0
            deadline = time.monotonic() + 1.0  # one second for the whole drain: a trickle
            while dropped < MAX_DRAINED and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)  # cannot keep a refused connection (and its thread)
                chunk = sock.recv(CHUNK)
                if not chunk:
                    break
                dropped += len(chunk)
        except OSError:
            pass

    def _read_head(self, client: socket.socket) -> tuple[bytes | None, bytes]:
        """The request head (through its blank line) and what came after it. 408 when it takes
        longer than head_timeout in all (a trickle of bytes does not reset it)."""
        buffer = b""
        deadline = time.monotonic() + self.head_timeout
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                return buffer[: end + 4], buffer[end + 4 :]
            if len(buffer) > MAX_HEAD:
                raise _Refusal(431, f"the request head is longer than {MAX_HEAD} bytes")
            if buffer.count(b"\n") > MAX_HEADER_LINES + 1:
                raise _Refusal(431, f"more than {MAX_HEADER_LINES} header lines")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Refusal(408, f"the request head took longer than {self.head_timeout:g} s")
            client.settimeout(remaining)
            try:
                data = client.recv(MAX_HEAD + 4 - len(buffer))
            except TimeoutError:
                continue
            if not data:
                if buffer:
                    raise _Refusal(400, "the connection closed inside the request head")
                return None, b""
            buffer += data

    def _dispatch(
        self, session: _Session, connection: _Connection, request: _Request, rest: bytes
    ) -> str:
        """Serves one request; returns the reason it was allowed (raises _Refusal if not)."""
        record = connection.record
        if request.method == "CONNECT":
            host, port = split_authority(request.target, None)
            decision = self._judge(session, record, host, port)
            connection.upstream = self._connect(connection, decision)
            established = b"HTTP/1.1 200 Connection established\r\n\r\n"
            self._relay(connection, rest, rewriter=None, reply=established)
            return decision.reason
        if request.target[:7].lower() == "http://":
            return self._plain_http(session, connection, request, rest)
        if request.target[:8].lower() == "https://":
            raise _Refusal(400, "for https, CONNECT host:443 and speak TLS through the tunnel")
        for route in session.routes.values():
            if request.target.startswith(f"/{route.name}/"):
                return self._route(session, connection, route, request, rest)
        raise _Refusal(403, self._what_is_allowed(session))

    @staticmethod
    def _what_is_allowed(session: _Session) -> str:
        routes = ", ".join(f"/{name}/..." for name in session.routes) or "none"
        hosts = ", ".join(d.told() for d in session.destinations) or "none"
        return (
            f"not a proxy request: CONNECT host:port or GET http://host/... to a listed "
            f"destination ({hosts}), or a route ({routes})"
        )

    def _judge(
        self, session: _Session, record: dict[str, object], host: str, port: int
    ) -> Decision:
        record["host"], record["port"] = printable(host[:300]), port
        decision = judge(host, port, session.destinations, self._resolver, host_addresses)
        record["host"] = printable(decision.host[:300])
        if not decision.allowed:
            raise _Refusal(403, decision.told, decision.reason)
        return decision

    def _connect(self, connection: _Connection, decision: Decision) -> socket.socket:
        """A TCP connection to the first judged address that answers (never re-resolved)."""
        failure, address, status = "no address", "", 502
        for address in decision.addresses:
            try:
                return self._open(connection, address, decision.port)
            except TimeoutError:
                failure = f"no answer within {self.connect_timeout:g} s"
                status = 504
            except OSError as error:
                failure, status = str(error.strerror or error), 502
        told = f"cannot reach {decision.host}: {failure}"  # (the address is the launcher's)
        logged = f"cannot reach {decision.host}: {address}: {failure}" if address else told
        raise _Refusal(status if decision.addresses else 502, told, logged)

    def _open(self, connection: _Connection, address: str, port: int) -> socket.socket:
        """A TCP connection to address (an IP literal), given up on after connect_timeout or
        as soon as the connection is shut (its session ended): a connect never outlives it."""
        if connection.ended.is_set():  # (the last address failed as the session ended)
            raise _Refusal(502, "the session ended")
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        own_fds.hold(sock.fileno())  # the way out: no session's stdio while open
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UPSTREAM_RECEIVE_BYTES)
            sock.setblocking(False)
            error = sock.connect_ex((address, port))
            deadline = time.monotonic() + self.connect_timeout
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            while error == errno.EINPROGRESS and not poller.poll(_CONNECT_SLICE_MS):
                if connection.ended.is_set():
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError
            if connection.ended.is_set():  # (connected or not: nothing more is sent for it)
                raise _Refusal(502, "the session ended")
            if error == errno.EINPROGRESS:
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                raise OSError(error, os.strerror(error))
            sock.settimeout(self.connect_timeout)  # as socket.create_connection leaves it
            return sock
        except BaseException:
            _close_held(sock)
            raise

    def _open_by_name(self, connection: _Connection, host: str, port: int) -> socket.socket:
        """A TCP connection to host (the launcher's own upstream: a route's), by each address
        the launcher's resolver gives, as socket.create_connection tries them."""
        failure: OSError = OSError(errno.EHOSTUNREACH, f"{host} has no address")
        for *_, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            try:
                return self._open(connection, str(address[0]), port)
            except OSError as error:  # (TimeoutError too: the next address may answer)
                failure = error
        raise failure

    def _plain_http(
        self, session: _Session, connection: _Connection, request: _Request, rest: bytes
    ) -> str:
        remainder = request.target[7:]
        slash = min((i for i in (remainder.find("/"), remainder.find("?")) if i >= 0), default=-1)
        authority, path = (remainder, "/") if slash < 0 else (remainder[:slash], remainder[slash:])
        if not path.startswith("/"):
            path = "/" + path
        if "#" in path:
            raise _Refusal(400, "the request target holds a fragment (#)")
        host, port = split_authority(authority, 80)
        decision = self._judge(session, connection.record, host, port)
        hosts = request.values("host")
        if len(hosts) > 1:
            raise _Refusal(400, "more than one Host header")
        if hosts:
            try:
                header_host, header_port = split_authority(hosts[0], 80)
                agrees = (canonical_host(header_host), header_port) == (decision.host, port)
            except (HostRefused, _Refusal):
                agrees = False
            if not agrees:
                raise _Refusal(400, "the Host header does not agree with the URL's host")
        host_line = decision.host if ":" not in decision.host else f"[{decision.host}]"
        if port != 80:
            host_line += f":{port}"
        body = _RequestBody(request, session.pace)
        extra = [f"Host: {host_line}".encode(), *body.header_lines]
        head = request.head(path, lambda name: name.lower() in _PLAIN_HTTP_DROPPED, extra)
        first = head + body.feed(rest)
        connection.upstream = self._connect(connection, decision)
        self._relay(connection, first, rewriter=_ResponseHeadRewriter(), body=body)
        return decision.reason

    def _route(
        self,
        session: _Session,
        connection: _Connection,
        route: Route,
        request: _Request,
        rest: bytes,
    ) -> str:
        if request.method not in _ROUTE_METHODS:
            # TRACE: an upstream that answers it echoes the request, the key among its
            # headers, back to the session; no API needs it, nor any method not listed.
            raise _Refusal(405, f"a route takes {', '.join(sorted(_ROUTE_METHODS))}")
        suffix = request.target[len(route.name) + 1 :]
        problem = route_target_problem(suffix)
        if problem is not None:
            raise _Refusal(400, problem)
        upstream = urllib.parse.urlsplit(route.upstream)
        assert upstream.hostname is not None  # Route checked it
        port = upstream.port or (443 if upstream.scheme == "https" else 80)
        record = connection.record
        record.update(route=route.name, host=upstream.hostname, port=port)

        # (the route's own header is one of _CREDENTIAL_HEADERS: Route allows no other)
        def dropped(name: str) -> bool:
            name = name.lower().replace("_", "-")  # as CGI-style servers read it
            return name in _ROUTE_DROPPED or name.startswith(_REROUTING_PREFIX)

        body = _RequestBody(request, session.pace)
        extra = [f"Host: {upstream.netloc}".encode(), route.header_line, *body.header_lines]
        head = request.head(upstream.path.rstrip("/") + suffix, dropped, extra)
        first = head + body.feed(rest)
        try:
            raw = self._open_by_name(connection, upstream.hostname, port)
        except TimeoutError:
            raise _Refusal(504, f"route {route.name}: {upstream.netloc} did not answer") from None
        except OSError as error:
            reason = f"route {route.name}: cannot reach {upstream.netloc}: {error.strerror}"
            raise _Refusal(502, reason) from error
        connection.upstream = raw  # (closed by _serve, whatever fails from here on)
        record["address"] = raw.getpeername()[0]
        if upstream.scheme == "https":
            problem = ca_file_problem(os.environ)  # a FIFO made there since: never waited on
            if problem is not None:
                raise _Refusal(502, f"route {route.name}: the launcher's {problem}")
            try:
                # Made here, not once: the launcher's SSL_CERT_FILE applies as it is now.
                context = ssl.create_default_context()
                # The TLS socket takes raw's fd: it is what the session's end shuts, from
                # before the handshake (an upstream may take the connection, and never answer).
                tls = context.wrap_socket(
                    raw, server_hostname=upstream.hostname, do_handshake_on_connect=False
                )
                connection.upstream = tls
                if connection.ended.is_set():  # shut as the fd changed hands: shut it again
                    _shut(tls)
                tls.do_handshake()
            except (ssl.SSLError, OSError) as error:
                reason = f"route {route.name}: TLS with {upstream.netloc} failed: {error}"
                raise _Refusal(502, reason) from None
        self._relay(connection, first, rewriter=_ResponseHeadRewriter(), body=body)
        return f"route {route.name}"

    def _relay(
        self,
        connection: _Connection,
        first: bytes,
        rewriter: _ResponseHeadRewriter | None,
        reply: bytes = b"",
        body: _RequestBody | None = None,
    ) -> None:
        """Bytes both ways until both sides have closed (a half-close is passed on) or neither
        has sent anything for idle_timeout. first: what goes upstream before the client's next
        bytes; reply: what the client is told first; body: what of the client's bytes goes
        upstream (all of them without it: a tunnel). One thread: a peer that never reads
        blocks its own sendall (until idle_timeout), nobody else's."""
        client, upstream = connection.client, connection.upstream
        assert upstream is not None
        record = connection.record
        record["address"] = record.get("address") or upstream.getpeername()[0]
        sent = {client: 0, upstream: 0}  # bytes sent to each
        splicer: _Splicer | None = None  # one pipe for both directions: each move empties it
        try:
            for sock in (client, upstream):
                sock.settimeout(self.idle_timeout)
            client.sendall(reply)
            upstream.sendall(first)
            sent[upstream] += len(first)
            open_from = {client: upstream, upstream: client}
            by_fd = {sock.fileno(): sock for sock in open_from}
            # poll, not select: select cannot watch an fd numbered past 1024, and a launcher
            # may hold that many.
            poller = select.poll()
            for sock in open_from:
                poller.register(sock, select.POLLIN)
            while open_from:
                readable: list[socket.socket] = [
                    s for s in open_from if isinstance(s, ssl.SSLSocket) and s.pending()
                ]
                if not readable:
                    ready = poller.poll(self.idle_timeout * 1000)
                    if not ready:
                        return  # idle: _serve closes both ends
                    readable = [by_fd[fd] for fd, _events in ready]
                for source in readable:
                    destination = open_from[source]
                    passed_as_is = (
                        body is None if source is client else rewriter is None or rewriter.done
                    )
                    if passed_as_is and _Splicer.can_splice(source, destination):
                        splicer = splicer or _Splicer(self.idle_timeout)
                        moved = splicer.move(source, destination)
                        if moved is None:
                            continue  # woken for nothing
                        sent[destination] += moved
                        ended = moved == 0
                    else:
                        try:
                            data = source.recv(CHUNK)
                        except (ConnectionError, ssl.SSLError):
                            data = b""
                        ended = not data
                        if source is upstream and rewriter is not None:
                            data = rewriter.flush() if ended else rewriter.feed(data)
                        elif source is client and body is not None:
                            data = body.feed(data)
                        if data:
                            destination.sendall(data)
                            sent[destination] += len(data)
                    if not ended:
                        continue
                    del open_from[source]
                    poller.unregister(source)
                    # An SSL socket cannot half-close without ending TLS: the upstream was told
                    # `Connection: close` and ends the exchange itself.
                    if not isinstance(destination, ssl.SSLSocket):
                        destination.shutdown(socket.SHUT_WR)
        except OSError:
            return  # a reset, a peer that stopped reading for idle_timeout: the connection ends
        finally:
            if splicer is not None:
                splicer.close()
            record["bytes_up"], record["bytes_down"] = sent[upstream], sent[client]


class _Splicer:
    """A connection whose bytes pass as they are (a tunnel; a response's body once its head is
    rewritten), moved with splice(2) through a pipe of its own: the bytes stay in the kernel,
    which makes a large download through the proxy several times cheaper than recv and
    sendall. The pipe holds at most SPLICE_BYTES, what the connection has in flight; both
    directions share it (its thread moves one at a time, and each move empties it), so that a
    connection costs the launcher 4 fds, not 6."""

    def __init__(self, idle_timeout: float) -> None:
        self.idle_timeout = idle_timeout
        self.read_end, self.write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.held = own_fds.hold(self.read_end)  # (both ends: one pipe)
        with contextlib.suppress(OSError):  # past the system's pipe-max-size: the default
            fcntl.fcntl(self.write_end, fcntl.F_SETPIPE_SZ, SPLICE_BYTES)

    @staticmethod
    def can_splice(source: socket.socket, destination: socket.socket) -> bool:
        """TLS sockets hold their bytes in user space: only plain sockets splice."""
        return not isinstance(source, ssl.SSLSocket) and not isinstance(destination, ssl.SSLSocket)

    def move(self, source: socket.socket, destination: socket.socket) -> int | None:
        """Move what source has to destination, waiting for it to take all of it (for
        idle_timeout at the most: TimeoutError); the bytes moved, 0 at source's EOF, or None
        when it had nothing after all."""
        flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
        try:
            moved = os.splice(source.fileno(), self.write_end, SPLICE_BYTES, flags=flags)
        except BlockingIOError:
            return self._read_instead(source, destination)
        except ConnectionError:
            return 0
        left = moved
        while left:
            try:
                left -= os.splice(self.read_end, destination.fileno(), left, flags=flags)
            except BlockingIOError:
                if not _writable(destination, self.idle_timeout):
                    raise TimeoutError("the peer took nothing for idle_timeout") from None
        return moved

    @staticmethod
    def _read_instead(source: socket.socket, destination: socket.socket) -> int | None:
        """What a read finds when splice found nothing (the pipe is empty: nothing is
        reordered). splice(2) never reads past TCP urgent data (a peer's MSG_OOB) while poll()
        says the socket is readable: polled again, the thread would spin at a full core for as
        long as the connection lasts. A read passes the mark (it drops the urgent byte, as any
        reader without SO_OOBINLINE does); after it, splice goes on."""
        try:
            data = os.read(source.fileno(), CHUNK)
        except BlockingIOError:
            return None
        except ConnectionError:
            return 0
        destination.sendall(data)
        return len(data)

    def close(self) -> None:
        own_fds.release(self.held)
        os.close(self.read_end)
        os.close(self.write_end)


# A session's records, of its refusals and of its allowed connections each: this many at once,
# then this many a second; the others are counted (with the bytes they moved), and their number
# recorded. A session asking for unlisted hosts in a loop, or fetching an allowed page in one,
# would otherwise grow the audit file (root's) and `run`'s stderr without end.
RECORDS_AT_ONCE = 100
RECORDS_PER_SECOND = 20
RECORDS_IN_ALL = 10_000  # of each kind, a session's: with RECORDED_TEXT, some 10 MB at the most


class _RecordBudget:
    """Which of one session's records of one decision are written (a token bucket), and what
    the others add up to."""

    def __init__(self) -> None:
        self.tokens = float(RECORDS_AT_ONCE)
        self.last = time.monotonic()
        self.recorded = 0
        self.skipped = 0
        self.skipped_up = 0
        self.skipped_down = 0

    def take(self, record: dict[str, object]) -> bool:
        """Whether this record is written; if not, it is counted."""
        now = time.monotonic()
        elapsed, self.last = now - self.last, now
        self.tokens = min(RECORDS_AT_ONCE, self.tokens + elapsed * RECORDS_PER_SECOND)
        if self.tokens < 1 or self.recorded >= RECORDS_IN_ALL:
            self.skipped += 1
            self.skipped_up += _count(record.get("bytes_up"))
            self.skipped_down += _count(record.get("bytes_down"))
            return False
        self.tokens -= 1
        self.recorded += 1
        return True

    def summary(self, session: object, allowed: bool) -> dict[str, object] | None:
        """The record of those counted since the last one, or None if there were none."""
        if not self.skipped:
            return None
        what = "allowed connections" if allowed else "refusals"
        reason = (
            f"{self.skipped} more {what} were not recorded one by one (over "
            f"{RECORDS_PER_SECOND} a second, or {RECORDS_IN_ALL} in all)"
        )
        counted: dict[str, object] = {
            "session": session,
            "bytes_up": self.skipped_up,
            "bytes_down": self.skipped_down,
        }
        self.skipped = self.skipped_up = self.skipped_down = 0
        return _full_record(counted, allowed, reason)


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0


# The most of a text field (a method, a host, a reason) an audit record holds: a session's
# request may fill the 16 KiB head, and each record would then be that long.
RECORDED_TEXT = 256


def _short(value: object) -> object:
    if isinstance(value, str) and len(value) > RECORDED_TEXT:
        return value[:RECORDED_TEXT] + "…"
    return value


def _full_record(record: dict[str, object], allowed: bool, reason: str) -> dict[str, object]:
    """An audit record, every field present (None where a connection never got that far), its
    text fields RECORDED_TEXT characters at most."""
    full: dict[str, object] = {
        "time": record.get("time", _now()),
        "session": record.get("session"),
        "method": _short(record.get("method")),
        "host": _short(record.get("host")),
        "port": record.get("port"),
        "address": record.get("address"),
        "decision": "allowed" if allowed else "refused",
        "reason": _short(printable(reason)),
        "bytes_up": record.get("bytes_up", 0),
        "bytes_down": record.get("bytes_down", 0),
    }
    if "route" in record:
        full["route"] = record["route"]
    return full


def _writable(sock: socket.socket, timeout: float) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    return bool(poller.poll(timeout * 1000))
