"""A "proxy" session's way out, as its plan states it.

The plan says what the session may reach (its destinations, each with a reason) and which APIs
it reaches with a key it never holds (its routes). The session's environment names the relay
(HTTP_PROXY and the like) and, for each route, a base URL on it and a placeholder key: the real
key stays in the launcher's proxy (nsconfine._launch.egress attaches a launch to it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from nsconfine._errors import CredentialMissing, UsageError
from nsconfine._plan.allowlist import Route
from nsconfine._plan.model import RELAY_PORT

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
