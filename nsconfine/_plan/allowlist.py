"""A session's network allowlist and the judge of each destination it asks for.

Pure functions over plain values: a host name as the session wrote it, the rules the launcher
listed, a resolver and the host's own addresses. The proxy (`_proxy`) only asks `judge` and
connects to the address it returns, never re-resolving: what was judged is what is reached.

Host names are held to the strict form (ASCII letters, digits, hyphens, dots) because every
parser between the session and the network reads a name its own way: a `%2e`, an `@`, a NUL,
a backslash or a non-ASCII letter is a name one of them sees differently from us.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence

from nsconfine._errors import UsageError
from nsconfine._record import Record
from nsconfine._text import is_decimal, says_nothing

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    import ipaddress
    from typing import TypeAlias

    IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

Resolver = Callable[[str, int], list[str]]

DEFAULT_PORTS = (443, 80)
_LABEL_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


class HostRefused(ValueError):
    """A host name (or literal) the session wrote is not one the proxy will judge."""


def canonical_host(text: str) -> str:
    """The one spelling of a host: lowercase, no trailing dot, an IPv6 literal without brackets
    in its compressed form. HostRefused (with a reason a person can act on) for anything else."""
    if not text.isascii():
        raise HostRefused("the host name is not ASCII: use the punycode (xn--) form")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in text):
        raise HostRefused("the host name holds a space or a control character")
    for character, what in (("%", "a percent escape"), ("@", "user information (@)")):
        if character in text:
            raise HostRefused(f"the host name holds {what}")
    if "/" in text or "\\" in text:
        raise HostRefused("the host name holds a slash")
    import ipaddress  # here, as below: only a session with a network allowlist needs it

    if text.startswith("[") or ":" in text:
        inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        try:
            return ipaddress.IPv6Address(inner).compressed
        except ValueError:
            raise HostRefused("the host is not a valid IPv6 literal") from None
    name = text.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name:
        raise HostRefused("the host name is empty")
    if len(name) > 253:
        raise HostRefused("the host name is longer than 253 characters")
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        pass
    labels = name.split(".")
    if is_decimal(labels[-1]) or labels[-1].startswith("0x"):
        # inet_aton reads "2130706433", "127.1" and "0x7f.1" as 127.0.0.1: a resolver would too.
        raise HostRefused("the host looks like an IP address in a non-standard form")
    for label in labels:
        if not label:
            raise HostRefused("the host name has an empty label (two dots in a row)")
        if len(label) > 63:
            raise HostRefused("a label of the host name is longer than 63 characters")
        if not set(label) <= _LABEL_CHARACTERS or label[0] == "-" or label[-1] == "-":
            raise HostRefused(
                "the host name holds a character other than letters, digits, '-' and '.' "
                "(or a label starts or ends with '-')"
            )
    return name


def _refuse_special(address: IPAddress, what: str) -> None:
    """An address no listed destination may be: the unspecified one (0.0.0.0 and :: reach the
    host's own services, as loopback does, under a name that does not say so), a broadcast or
    a multicast one (no proxy connection goes there)."""
    mapped = getattr(address, "ipv4_mapped", None)
    address = mapped if mapped is not None else address
    kind = (
        "unspecified (it reaches the host's own services: list 127.0.0.1 if that is meant)"
        if address.is_unspecified
        else "broadcast"
        if str(address) == "255.255.255.255"
        else "multicast"
        if address.is_multicast
        else None
    )
    if kind is not None:
        raise UsageError(f"destination {what!r}: the address {address} is {kind}")


def ip_literal(host: str) -> IPAddress | None:
    """The address a canonical host spells, if it is an IP literal."""
    import ipaddress

    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _port(text: str, whole: str) -> int:
    if not is_decimal(text) or len(text) > 5 or not 0 < int(text) < 65536:
        raise UsageError(f"destination {whole!r}: the port must be a number from 1 to 65535")
    return int(text)


def _split_host_port(text: str, whole: str) -> tuple[str, int | None]:
    if text.startswith("["):
        host, bracket, rest = text.partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise UsageError(
                f"destination {whole!r}: write an IPv6 literal as [addr] or [addr]:port"
            )
        return host + "]", _port(rest[1:], whole) if rest else None
    if text.count(":") > 1:  # a bare IPv6 literal, no port
        return text, None
    host, colon, port = text.partition(":")
    return host, _port(port, whole) if colon else None


class Destination(Record):
    """One allowlist entry. pattern: a canonical host name, `*.suffix` (any subdomain of the
    suffix, not the suffix itself) or an IP literal. port: None allows 443 and 80 only.
    address: a pinned address (as curl --resolve): the proxy connects there and asks no resolver;
    a destination listed by address may be private or loopback."""

    FIELDS = ("pattern", "port", "address", "reason")
    __slots__ = FIELDS
    pattern: str
    port: int | None
    address: str | None
    reason: str

    def __init__(self, pattern: str, port: int | None, address: str | None, reason: str) -> None:
        self._set(pattern=pattern, port=port, address=address, reason=reason)
        if says_nothing(self.reason):
            raise UsageError(f"destination {self.pattern!r} has no reason: say why it is needed")
        name = self.pattern[2:] if self.pattern.startswith("*.") else self.pattern
        try:
            canonical = canonical_host(name)
        except HostRefused as refused:
            raise UsageError(f"destination {self.pattern!r}: {refused}") from None
        if canonical != name:
            raise UsageError(f"destination {self.pattern!r}: write it as {canonical!r}")
        if self.pattern.startswith("*."):
            if ip_literal(name) is not None:
                raise UsageError(f"destination {self.pattern!r}: a wildcard of an IP address")
            if "." not in name:
                raise UsageError(f"destination {self.pattern!r} is too broad: name a domain")
        if self.port is not None and not 0 < self.port < 65536:
            raise UsageError(f"destination {self.pattern!r}: the port must be from 1 to 65535")
        literal = ip_literal(name)
        if literal is not None:
            _refuse_special(literal, self.pattern)
        if self.address is not None:
            if ip_literal(self.pattern) is not None:
                raise UsageError(f"destination {self.pattern!r} is an address: it pins nothing")
            if ip_literal(self.address) is None or canonical_or_none(self.address) != self.address:
                raise UsageError(
                    f"destination {self.pattern!r}: the pinned address {self.address!r} is not "
                    "an IP address in canonical form"
                )
            _refuse_special(ip_literal(self.address), self.pattern)  # type: ignore[arg-type]

    @classmethod
    def parse(cls, text: str, reason: str) -> Destination:
        """A manifest line: "host", "host:port", "*.x.org", "host=ADDR", "host:port=ADDR",
        "10.0.0.5", "[::1]:8443"."""
        spec, equals, pinned = text.partition("=")
        host, port = _split_host_port(spec.strip(), text)
        wildcard = host.startswith("*.")
        try:
            name = canonical_host(host[2:] if wildcard else host)
            address = canonical_host(pinned.strip()) if equals else None
        except HostRefused as refused:
            raise UsageError(f"destination {text!r}: {refused}") from None
        if address is not None and ip_literal(address) is None:
            raise UsageError(f"destination {text!r}: pin an IP address after '=', not a name")
        return cls(("*." if wildcard else "") + name, port, address, reason)

    def matches_name(self, host: str) -> bool:
        """Whether this rule names the canonical host (the port aside)."""
        if self.pattern.startswith("*."):
            return host.endswith(self.pattern[1:])  # ".suffix": a whole label, not the bare suffix
        return host == self.pattern

    def allows_port(self, port: int) -> bool:
        return port in DEFAULT_PORTS if self.port is None else port == self.port

    def __str__(self) -> str:
        pinned = f"={self.address}" if self.address else ""
        return f"{self.told()}{pinned}"

    def told(self) -> str:
        """host:ports, as a session is told it: without the address it is pinned to (the
        launcher's knowledge, as its resolver's answers are)."""
        host = f"[{self.pattern}]" if ":" in self.pattern else self.pattern
        ports = "443/80" if self.port is None else str(self.port)
        return f"{host}:{ports}"


def canonical_or_none(text: str) -> str | None:
    try:
        return canonical_host(text)
    except HostRefused:
        return None


class Decision(Record):
    """The judge's answer. allowed: connect to `addresses` (in order) on port; reason: the
    rule's reason, or why the destination was refused; told: that reason as the session is
    told it (without what the launcher's resolver answered: the address of an internal name)."""

    FIELDS = ("allowed", "reason", "host", "port", "addresses", "told")
    __slots__ = FIELDS
    allowed: bool
    reason: str
    host: str
    port: int
    addresses: tuple[str, ...]
    told: str

    def __init__(
        self,
        allowed: bool,
        reason: str,
        host: str,
        port: int,
        addresses: tuple[str, ...] = (),
        told: str | None = None,
    ) -> None:
        self._set(
            allowed=allowed,
            reason=reason,
            host=host,
            port=port,
            addresses=addresses,
            told=reason if told is None else told,
        )

    @property
    def address(self) -> str | None:
        return self.addresses[0] if self.addresses else None


def is_public(address: IPAddress) -> bool:
    """Whether an address is some public host's, not this host's, its LAN's or a metadata
    service's (loopback, link-local, private, CGNAT, unspecified, multicast, reserved)."""
    import ipaddress

    if isinstance(address, ipaddress.IPv6Address):
        if address.is_site_local:  # fec0::/10, deprecated, still routed on some LANs
            return False
        # An IPv4 address inside (mapped, 6to4, Teredo's client) is judged as that address.
        inner = address.ipv4_mapped or address.sixtofour or (address.teredo or (None, None))[1]
        if inner is not None:
            address = inner
    return not (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_unspecified
        or address.is_multicast
        or address.is_reserved
        or address in _shared_space()
        or not address.is_global
    )


@functools.cache
def _shared_space() -> ipaddress.IPv4Network:
    """Carrier-grade NAT space: Python's is_private does not count it, yet it is nobody's public
    host."""
    import ipaddress

    return ipaddress.IPv4Network("100.64.0.0/10")


def host_addresses() -> frozenset[IPAddress]:
    """This host's own interface addresses (a public one reaches the host's own services)."""
    import ipaddress
    import itertools

    found: set[IPAddress] = set()
    try:
        with open("/proc/net/fib_trie") as file:
            lines = file.read().splitlines()
    except OSError:
        lines = []
    for previous, line in itertools.pairwise(lines):
        if line.strip() == "/32 host LOCAL":
            found.add(ipaddress.ip_address(previous.split()[-1]))
    try:
        with open("/proc/net/if_inet6") as file:
            inet6 = file.read().splitlines()
        for line in inet6:
            found.add(ipaddress.IPv6Address(int(line.split()[0], 16)))
    except (OSError, ValueError, IndexError):
        pass
    return frozenset(found)


def system_resolver(host: str, port: int) -> list[str]:
    """The host's resolver, TCP addresses in its order."""
    import socket

    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def judge(
    host_text: str,
    port: int,
    destinations: Sequence[Destination],
    resolver: Resolver = system_resolver,
    own_addresses: Callable[[], Collection[IPAddress]] = frozenset,
) -> Decision:
    """Whether a session may reach host_text:port, and at which addresses. own_addresses gives
    this host's addresses, asked only for a name a resolver answers (a pinned name or a literal
    never needs them: reading them costs a request 0.1 ms)."""
    import ipaddress

    try:
        host = canonical_host(host_text)
    except HostRefused as problem:
        return Decision(False, str(problem), host_text, port)

    def refused(reason: str, told: str | None = None) -> Decision:
        return Decision(False, reason, host, port, told=told)

    literal = ip_literal(host)
    named = [rule for rule in destinations if rule.matches_name(host)]
    if not named:
        if literal is not None:
            return refused(f"the IP address {host} is not listed: list it by address or use a name")
        return refused(f"{host} is not on this session's allowlist")
    rules = [rule for rule in named if rule.allows_port(port)]
    if not rules:
        listed = ", ".join(rule.told() for rule in named)
        return refused(f"port {port} of {host} is not allowed (listed: {listed})")
    # An exact name is more specific than a wildcard: its pin (or its lack of one) applies.
    rule = min(rules, key=lambda r: r.pattern.startswith("*."))
    if literal is not None:
        return Decision(True, rule.reason, host, port, (host,))
    if rule.address is not None:
        return Decision(True, rule.reason, host, port, (rule.address,))
    try:
        resolved = resolver(host, port)
    except (OSError, UnicodeError) as error:
        return refused(f"{host} does not resolve ({error})")
    if not resolved:
        return refused(f"{host} does not resolve")
    own = own_addresses()
    for text in resolved:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            return refused(f"{host} resolves to something that is not an address")
        if not is_public(address) or address in own:
            return refused(
                f"{host} resolves to {address}, a private, local or reserved address: "
                f"pin it ({host}={address}) if that is meant",
                f"{host} resolves to a private, local or reserved address: the launcher may "
                f"pin it ({host}=ADDRESS) if that is meant",
            )
    return Decision(True, rule.reason, host, port, tuple(resolved))


def _without_secrets(url: str) -> str:
    """url as a refusal may name it (a refusal is logged): without what precedes its last @
    (credentials, whatever characters they hold), nor its query or fragment."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    if "@" in rest:
        rest = "…@" + rest.rpartition("@")[2]
    rest = rest.split("?", 1)[0].split("#", 1)[0]
    return f"{scheme}{separator}{rest}"


def _is_loopback(host: str) -> bool:
    """Is host this machine's loopback: localhost, or an address in 127/8 or ::1?"""
    if host == "localhost":
        return True
    import ipaddress  # only a session with a route needs it

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Route(Record):
    """A credential-injecting route: a session's `/<name>/rest` goes to upstream + `/rest` with
    the real key in `header` (for "authorization", as "Bearer <secret>")."""

    FIELDS = ("name", "upstream", "header", "secret")
    HIDDEN = frozenset({"secret"})
    __slots__ = FIELDS
    name: str
    upstream: str
    header: str
    secret: bytes

    def __init__(self, name: str, upstream: str, header: str, secret: bytes) -> None:
        import urllib.parse  # only a session with a route needs it

        self._set(name=name, upstream=upstream, header=header, secret=secret)
        if not self.name or not set(self.name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-_"):
            raise UsageError(f"route name {self.name!r}: use lowercase letters, digits, - and _")
        shown = repr(_without_secrets(self.upstream))
        try:
            parts = urllib.parse.urlsplit(self.upstream)
            parts.port  # noqa: B018 (a port that is no number raises here)
        except ValueError:
            raise UsageError(f"route {self.name}: upstream {shown} is not a URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"route {self.name}: upstream {shown} is not an http(s) URL")
        # An @ anywhere: a password with a / # or ? in it ends the host part early, and hides
        # from urlsplit what it is.
        if parts.query or parts.fragment or "@" in self.upstream:
            raise UsageError(
                f"route {self.name}: upstream {shown} has more than a path (credentials, a "
                "query or a fragment)"
            )
        if parts.scheme == "http" and not _is_loopback(parts.hostname):
            raise UsageError(
                f"route {self.name}: upstream {shown} is plain http to another host: the key "
                "the proxy adds would cross the network readable; use https (plain http is "
                "for a stand-in on this host's loopback)"
            )
        if parts.scheme == "http" and parts.hostname == "localhost":
            # Whoever listens on the port gets the key: a stand-in on 127.0.0.1 alone leaves
            # ::1, which localhost may name first, to any local account.
            raise UsageError(
                f"route {self.name}: upstream {shown} names localhost: over plain http the key "
                "goes to whoever listens there, and localhost may be ::1 first, where any "
                "local account may listen; name the address the stand-in listens on "
                "(http://127.0.0.1:PORT)"
            )
        if self.header.lower() not in ("authorization", "x-api-key"):
            raise UsageError(f"route {self.name}: header must be authorization or x-api-key")
        # An empty key: the plan's credential file was not there (Plan.credential_needed),
        # a plan to show that no launch takes.
        if any(byte < 0x20 or byte == 0x7F for byte in self.secret):
            # Said without the secret: a refusal message is logged, the key must not be.
            raise UsageError(f"route {self.name}: the key holds a control character")

    @property
    def header_line(self) -> bytes:
        value = b"Bearer " + self.secret if self.header.lower() == "authorization" else self.secret
        return self.header.lower().encode() + b": " + value


# In a route's path (lowered): what an upstream may read as another path (see
# route_target_problem).
_ROUTE_PATH_REFUSED = (
    *("%2f", "%5c", "\\", "//", ";", "%3b", "%25", "%u"),
    # an encoded byte of 0x80 or more, or a control character (NUL, CR, LF: %00 to %1f)
    *(f"%{high_nibble}" for high_nibble in "0189abcdef"),
)


def route_target_problem(suffix: str) -> str | None:
    """Why the relay refuses a route's target (suffix: what follows /NAME), or None."""
    if "#" in suffix:  # no client sends a fragment; a gateway ends the path there (`..#`)
        return "the route's target holds a '#'"
    path = suffix.split("?")[0]
    if "%2e" in path.lower() or any(seg in (".", "..") for seg in path.split("/")):
        return "the route's path holds a '.' or '..' segment"
    # An upstream (or a gateway before it) may read these as a separator, collapse them, or
    # (a ';', Java servlets' path parameter) drop what follows in a segment, `..;` becoming
    # `..`: another path of the API than the one the route's prefix names. So may one that
    # decodes twice (`%252e`), reads overlong UTF-8 (`%c0%ae`, `%e0%80%ae`: any encoded byte
    # past ASCII is refused, an API's path needs none) or IIS's `%u002e`.
    lowered = path.lower()
    if any(bad in lowered for bad in _ROUTE_PATH_REFUSED):
        return (
            "the route's path holds an encoded slash, '%', control character, byte past ASCII "
            "or %u, a backslash, '//' or ';'"
        )
    return None
