"""`nsconfine explain PATH`: would a session see PATH, through which entry, or why not.

The first thing a user wants when an agent says "No such file": the plan entry whose
destination holds PATH (its kind, mode, source and reason), or that nothing in the plan grants
it; and, for a host path, the deny rule that keeps it out of every session, with where the rule
came from. A symlink is followed as the session would follow it (Debian's /usr links into /etc
in hundreds of places), and a path a built-in profile would show is answered with its name.
"""

from __future__ import annotations

import os
import urllib.parse

from nsconfine._plan.model import RELAY_PORT, Entry, Kind, Plan
from nsconfine._plan.network import route_base_url
from nsconfine._policy.lint import Judge, resolve
from nsconfine._text import inside, printable, within

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from collections.abc import Callable

    from nsconfine._plan.allowlist import Route

_DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_LINKS = 40  # the kernel's own limit on links followed in one lookup (ELOOP past it)


def explain(
    plan: Plan, path: str, profiles_showing: Callable[[str], list[str]] | None = None
) -> tuple[bool, list[str]]:
    """Whether a session of plan sees the host's path (or reaches the URL), and the lines that
    say why; for a path it does not see, also profiles_showing's lines (the built-in profiles
    that would show it: nsconfine._session.profiles_showing, which the CLI passes)."""
    if "://" in path:
        return explain_url(plan, path)
    path = os.path.normpath(os.path.abspath(path))
    reached, links = _follow(plan, path)
    lines = [
        f"{printable(link)}: a symlink to {printable(target)}, as the session sees it"
        for link, target in links
    ]
    entry = _covering(plan, reached)
    visible = entry is not None and _shows_the_host(entry, reached)
    shown = printable(reached)
    elsewhere = None if visible else _shown_elsewhere(plan, resolve(path))
    if elsewhere is not None:
        visible = True
        lines.append(f"{printable(path)}: {elsewhere}")
    elif entry is None:
        lines.append(f"{shown}: not visible: nothing in the plan grants it")
    else:
        lines.append(f"{shown}: {_through(entry, reached)}")
    if not visible and profiles_showing is not None:
        lines += profiles_showing(reached)
    found = Judge(plan.deny).violated(resolve(path))
    if found is not None:
        rule, relation = found
        lines.append(
            f"{printable(path)} {relation} {printable(rule.path)}, which no session may see: "
            f"{printable(rule.reason)} [from {printable(rule.origin or 'the plan')}]"
        )
    return visible and found is None, lines


def explain_url(plan: Plan, url: str) -> tuple[bool, list[str]]:
    """Whether a session of plan reaches url's host and port, through which destination (and
    its reason), or why not. Names are matched as the proxy matches them; the address a name
    resolves to is judged when the session connects."""
    from nsconfine._plan.allowlist import HostRefused, canonical_host, ip_literal

    shown = printable(url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = _DEFAULT_PORTS.get(parts.scheme) if parts.port is None else parts.port
        host = canonical_host(parts.hostname or "")
    except (ValueError, HostRefused) as problem:
        return False, [f"{shown}: not reachable: not a URL the proxy judges ({problem})"]
    if port == 0:
        return False, [f"{shown}: not reachable: port 0 is no port a connection reaches"]
    if port is None:
        return False, [f"{shown}: not reachable: say the port of a {parts.scheme}: URL"]
    if plan.network == "none":
        return False, [f"{shown}: not reachable: network none (a loopback of its own)"]
    if plan.network == "host":
        return True, [
            f"{shown}: reachable: network host, the launcher's network "
            f"({printable(plan.network_reason or '')})"
        ]
    if (host, port) == ("127.0.0.1", RELAY_PORT):  # the session's relay: its routes' base URLs
        answer = _on_the_relay(plan, parts)
        if answer is not None:
            reachable, why = answer
            return reachable, [f"{shown}: {why}"]
    named = [d for d in plan.destinations if d.matches_name(host)]
    allowed = [d for d in named if d.allows_port(port)]
    if allowed:
        rule = min(allowed, key=lambda d: d.pattern.startswith("*."))
        if rule.address:
            where = f"pinned to {rule.address}"
        elif ip_literal(rule.pattern) is not None:
            where = "listed by its address, which the proxy connects to as it is"
        else:
            where = (
                "the proxy resolves it when the session connects, and refuses a private, "
                "loopback or link-local address"
            )
        return True, [
            f"{shown}: reachable through the proxy: {printable(str(rule))} "
            f"({printable(rule.reason)}); {where}"
        ]
    if named:
        listed = ", ".join(printable(str(d)) for d in named)
        return False, [f"{shown}: not reachable: port {port} is not listed ({listed})"]
    for route in plan.routes:
        upstream = urllib.parse.urlsplit(route.upstream)
        if upstream.hostname == host and (upstream.port or _DEFAULT_PORTS[upstream.scheme]) == port:
            return True, [f"{shown}: reachable only {_by_the_route(route)}"]
    what = "the IP address" if ip_literal(host) is not None else "the name"
    return False, [
        f"{shown}: not reachable: {what} {host} is not on the plan's allowlist "
        "(--allow-host it, with its reason)"
    ]


def _on_the_relay(plan: Plan, parts: urllib.parse.SplitResult) -> tuple[bool, str] | None:
    """Whether a URL on the session's relay that names one of its routes reaches it, and why;
    None for any other (the relay is the proxy's way out too: judged as any destination)."""
    from nsconfine._plan.allowlist import route_target_problem

    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    for route in plan.routes:
        base = f"/{route.name}"
        if target != base and not target.startswith((f"{base}/", f"{base}?")):
            continue
        if parts.scheme != "http":
            return (
                False,
                f"not reachable: the relay speaks plain HTTP ({route_base_url(route.name)}/)",
            )
        if not target.startswith(f"{base}/"):
            return False, f"not reachable: the route's URLs begin {route_base_url(route.name)}/"
        problem = route_target_problem(target[len(base) :])
        if problem is not None:
            return False, f"not reachable: the relay refuses it: {problem}"
        return True, f"reachable {_by_the_route(route)}"
    return None


def _by_the_route(route: Route) -> str:
    return (
        f"through the route {route_base_url(route.name)}/ on the session's relay, to "
        f"{printable(route.upstream)}, where the launcher's proxy adds the key ({route.header}); "
        "not by CONNECT"
    )


def _covering(plan: Plan, path: str) -> Entry | None:
    """The entry whose destination is path or the nearest directory above it; None for the
    sandbox's own empty, read-only root. A directory entry covers only where no other entry
    does: bwrap makes it inside what is mounted there (in a bind, the host's own directory,
    as a kept HOME in the run directory is), and shows what that holds."""
    best: Entry | None = None
    made: Entry | None = None  # the nearest directory entry
    for entry in plan.entries:
        if entry.kind is Kind.REMOUNT_RO or entry.dest == "/" or not within(path, entry.dest):
            continue
        if entry.kind is Kind.DIR:
            if made is None or len(entry.dest) > len(made.dest):
                made = entry
        elif best is None or len(entry.dest) > len(best.dest):
            best = entry
    return best or made


def _link_target(plan: Plan, path: str) -> str | None:
    """What path is a symlink to inside the sandbox (a symlink entry's target, or the host's
    link a bind shows), or None when it is no symlink there."""
    entry = _covering(plan, path)
    if entry is None or any(e.kind is Kind.DIR and e.dest == path for e in plan.entries):
        return None  # (where the plan makes a directory, a symlink refuses the launch)
    if entry.kind is Kind.SYMLINK:
        return entry.source if entry.dest == path else None
    if entry.kind is not Kind.BIND or entry.dest == path:
        return None  # (bwrap binds what a bind's source leads to: never a link at its dest)
    try:
        return os.readlink(entry.source + path[len(entry.dest) :])
    except (OSError, ValueError):  # no link, or no such path on the host
        return None


def _follow(plan: Plan, path: str) -> tuple[str, list[tuple[str, str]]]:
    """The path an open of path reaches in the sandbox, each component's symlink followed as
    the sandbox shows it, and the links followed (at most MAX_LINKS, as the kernel's lookup).
    Iterative: a path of thousands of components, or links leading to links, costs no stack."""
    pending = [name for name in reversed(path.split("/")) if name]
    reached = "/"
    links: list[tuple[str, str]] = []
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            reached = os.path.dirname(reached)
            continue
        current = os.path.join(reached, name)
        target = _link_target(plan, current) if len(links) < MAX_LINKS else None
        if target is None:
            reached = current
            continue
        links.append((current, target))
        pending += [part for part in reversed(target.split("/")) if part]
        if target.startswith("/"):
            reached = "/"
    return reached, links


def _shown_elsewhere(plan: Plan, host: str) -> str | None:
    """Where a bind shows the host's file host (resolved) at another path than its own (a
    bind whose source leads elsewhere: bwrap binds what it resolves to), and through which
    entry; None if none does, or another entry covers the place it would (a mask)."""
    found = []
    for entry in plan.entries:
        if entry.kind is not Kind.BIND:
            continue
        source = resolve(entry.source)
        below = "" if host == source else inside(host, source)
        if below is not None:
            found.append((len(source), source, entry, below))
    for _length, source, entry, below in sorted(found, key=lambda f: f[0], reverse=True):
        at = os.path.join(entry.dest, below) if below else entry.dest
        if _covering(plan, at) is not entry:
            continue  # something else is there: a mask's cover, another bind
        return (
            f"the host's file is visible at {printable(at)}, through the bind entry at "
            f"{printable(entry.dest)} ({entry.mode}) of {printable(entry.source)}, which leads "
            f"to {printable(source)}: {printable(entry.reason)}"
        )
    return None


def _shows_the_host(entry: Entry, path: str) -> bool:
    """Does the session see the host's path through entry: a bind's host file, or a copy of
    it; not what the sandbox makes there itself (a tmpfs, a directory, its proc and dev, a
    generated file)."""
    return entry.kind is Kind.BIND or (entry.kind is Kind.COPY and entry.dest == path)


def _through(entry: Entry, path: str) -> str:
    where = f"the {entry.kind} entry at {printable(entry.dest)} ({entry.mode})"
    reason = f": {printable(entry.reason)}"
    if entry.kind is Kind.BIND:
        host = entry.source + path[len(entry.dest) :]
        exists = "" if os.path.lexists(host) else " (not there on the host now)"
        return f"visible through {where}, showing the host's {printable(host)}{exists}{reason}"
    if entry.kind is Kind.SYMLINK:
        return f"a symlink to {printable(entry.source)} through {where}{reason}"
    if entry.kind is Kind.COPY and entry.dest == path:
        return f"visible as a copy taken at launch, through {where}{reason}"
    if entry.kind in (Kind.DATA, Kind.COPY):
        made = "a file nsconfine makes"
    else:
        made = f"the sandbox's own {entry.kind} (no host path)"
    return f"the host's file is not visible: the session sees {made} there, {where}{reason}"
