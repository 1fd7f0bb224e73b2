"""A "proxy" session's way out, as the launcher runs it.

The plan says what the session may reach (its destinations, each with a reason) and which APIs
it reaches with a key it never holds (its routes). At each launch the launcher's proxy (one per
launcher process, `_proxy.Proxy`, shared by every spawn and Pool) gets a unix socket for the
sandbox, judged by that plan alone; the sandbox sees the socket's directory read-only at
RELAY_DIRECTORY, where the exec shim's relay joins 127.0.0.1:RELAY_PORT to it. The socket goes
when the sandbox ends.

The session's environment names the relay (HTTP_PROXY and the like) and, for each route, a base
URL on it and a placeholder key: the real key stays in the launcher's proxy.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from nsconfine._errors import CredentialMissing, UsageError
from nsconfine._plan.allowlist import Route
from nsconfine._plan.model import RELAY_DIRECTORY, RELAY_PORT, Plan, relay_entry

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from nsconfine._launch.proxy import Proxy

PROXY_URL: Final = f"http://127.0.0.1:{RELAY_PORT}"
# What a proxy session's tools read to find the proxy, and the loopback they reach directly
# (the routes' base URLs are on it).
PROXY_VARIABLES: Final = {
    "HTTP_PROXY": PROXY_URL,
    "HTTPS_PROXY": PROXY_URL,
    "http_proxy": PROXY_URL,
    "https_proxy": PROXY_URL,
    "NO_PROXY": "localhost,127.0.0.1",
    "no_proxy": "localhost,127.0.0.1",
}
# Proxy variables a launcher may have that the session must not get instead of the relay's.
LAUNCHER_PROXY_VARIABLES: Final = frozenset(
    {*PROXY_VARIABLES, "ALL_PROXY", "all_proxy", "FTP_PROXY", "ftp_proxy"}
)
# What the session holds where its key would be: a harness wants one, the proxy replaces it.
PLACEHOLDER: Final = "nsconfine-placeholder-the-proxy-holds-the-key"


@dataclass(frozen=True)
class RouteKind:
    """A built-in credential route: the API a harness reaches through base_variable, its
    upstream unless the launcher's own base_variable names one, and each variable a credential
    file may hold its key in, with the header that carries it."""

    name: str
    base_variable: str
    default_upstream: str
    keys: tuple[tuple[str, str], ...]
    reason: str


ROUTES: Final = {
    "anthropic": RouteKind(
        "anthropic",
        "ANTHROPIC_BASE_URL",
        "https://api.anthropic.com",
        (
            ("ANTHROPIC_API_KEY", "x-api-key"),
            ("ANTHROPIC_AUTH_TOKEN", "authorization"),
            ("CLAUDE_CODE_OAUTH_TOKEN", "authorization"),
        ),
        "the Anthropic API (Claude Code), its key added by the launcher's proxy",
    ),
    "openai": RouteKind(
        "openai",
        "OPENAI_BASE_URL",
        "https://api.openai.com/v1",
        (("OPENAI_API_KEY", "authorization"), ("CODEX_API_KEY", "authorization")),
        "the OpenAI API (Codex), its key added by the launcher's proxy",
    ),
}


def route_base_url(name: str) -> str:
    """The base URL a session reaches route name at: on its loopback relay."""
    return f"{PROXY_URL}/{name}"


def injected(
    names: tuple[str, ...],
    credential: Mapping[str, str],
    environ: Mapping[str, str],
    *,
    pending: bool = False,
) -> tuple[tuple[Route, ...], dict[str, str]]:
    """The routes for names, each with the key the credential file holds for it, and what
    the session's environment gets instead: the base URL on the relay and a placeholder for
    every key variable the file holds. pending: the file is not there yet (a plan to show,
    never to launch): each route with its first key's header and no key."""
    routes: list[Route] = []
    replaced: dict[str, str] = {}
    for name in dict.fromkeys(names):
        kind = ROUTES.get(name)
        if kind is None:
            raise UsageError(f"--inject-for {name!r}: it is one of {', '.join(ROUTES)}")
        upstream = (environ.get(kind.base_variable) or kind.default_upstream).rstrip("/")
        replaced[kind.base_variable] = route_base_url(name)
        if pending:
            routes.append(Route(name, upstream, kind.keys[0][1], b""))
            continue
        held = [(variable, header) for variable, header in kind.keys if credential.get(variable)]
        if not held:
            wanted = " or ".join(variable for variable, _ in kind.keys)
            raise CredentialMissing(
                f"--inject-for {name}: the credential file holds no {wanted}: add the key there"
            )
        variable, header = held[0]
        secret = credential[variable].encode("utf-8", "surrogateescape")
        routes.append(Route(name, upstream, header, secret))
        for other, _header in kind.keys:
            if other in credential:
                replaced[other] = PLACEHOLDER
    return tuple(routes), replaced


class AuditLog:
    """Where a session's proxy records go: one JSON line each, appended to a file."""

    def __init__(self, path: str) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        self.fd = os.open(path, flags, 0o600)

    def write(self, record: Mapping[str, object]) -> None:
        os.write(self.fd, (json.dumps(record, sort_keys=True) + "\n").encode())

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Proxies:
    """The launcher's one proxy, started at its first proxy launch; each record goes to the
    listeners of the session it is about."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proxy: Proxy | None = None
        self._listeners: dict[str, list[AuditLog | _Reporter]] = {}
        self._numbers = itertools.count(1)

    def proxy(self) -> Proxy:
        from nsconfine._launch.proxy import Proxy  # (ssl and its threads: for proxy launches only)

        with self._lock:
            if self._proxy is None:
                self._proxy = Proxy(audit=self._record)
            return self._proxy

    def _record(self, record: dict[str, object]) -> None:
        with self._lock:  # (sessions come and go on other threads)
            listeners = list(self._listeners.get(str(record.get("session")), ()))
        for listener in listeners:
            listener.write(record)

    def attach(self, plan: Plan, reporter: _Reporter | None) -> tuple[Plan, Egress]:
        plan.require_launchable()  # (gate refused it already: its routes hold no key)
        name = f"session-{os.getpid()}-{next(self._numbers)}"
        listeners: list[AuditLog | _Reporter] = []
        if plan.audit is not None:
            listeners.append(AuditLog(plan.audit))
        if reporter is not None:
            listeners.append(reporter)
        with self._lock:
            self._listeners[name] = listeners
        try:
            path = self.proxy().add_session(name, plan.destinations, plan.routes, uid=plan.user.uid)
        except BaseException:
            self._drop(name)
            raise
        bound = plan.replace(entries=(*plan.entries, relay_entry(os.path.dirname(path))))
        return bound, Egress(self, name)

    def _drop(self, name: str) -> None:
        with self._lock:
            dropped = self._listeners.pop(name, [])
        for listener in dropped:
            if isinstance(listener, AuditLog):
                listener.close()

    def detach(self, name: str) -> None:
        proxy = self._proxy
        if proxy is not None:
            proxy.remove_session(name)
        self._drop(name)


class _Reporter:
    """Prints each refusal on a terminal's stderr, one line each (nsconfine run)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, record: Mapping[str, object]) -> None:
        if record.get("decision") != "refused":
            return
        where = f"{record.get('host') or '?'}:{record.get('port') or '?'}"
        line = f"nsconfine: network: refused {where}: {record.get('reason')}\n"
        try:
            os.write(self.fd, line.encode(errors="replace"))
        except OSError:
            pass


class Egress:
    """A sandbox's socket on the launcher's proxy, until the sandbox ends."""

    def __init__(self, proxies: _Proxies, name: str) -> None:
        self._proxies = proxies
        self.name = name

    def close(self) -> None:
        name, self.name = self.name, ""
        if name:
            self._proxies.detach(name)


_proxies = _Proxies()
_report_to: list[_Reporter] = []


def report_refusals(fd: int) -> None:
    """Print every later proxy session's refusals on fd (the CLI's stderr)."""
    _report_to[:] = [_Reporter(fd)]


def attach(plan: Plan) -> tuple[Plan, Egress | None]:
    """plan as a launch runs it: with a proxy network, bound to a new socket on the launcher's
    proxy (closed with the returned Egress); any other plan, or one that binds a relay
    directory of its own (a proxy of the caller's, as the tests' stand-ins), as it is."""
    if plan.network != "proxy" or any(e.dest == RELAY_DIRECTORY for e in plan.entries):
        return plan, None
    return _proxies.attach(plan, _report_to[0] if _report_to else None)
