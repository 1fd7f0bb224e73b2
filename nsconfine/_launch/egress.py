"""A "proxy" session's way out, as the launcher runs it.

At each launch the launcher's proxy (one per launcher process, nsconfine._launch.proxy.Proxy,
shared by every spawn and Pool) gets a unix socket for the sandbox, judged by that plan alone;
the sandbox sees the socket's directory read-only at RELAY_DIRECTORY, where the exec shim's
relay joins 127.0.0.1:RELAY_PORT to it. The socket goes when the sandbox ends.
"""

from __future__ import annotations

import atexit
import errno
import itertools
import os
import stat
from _thread import allocate_lock
from collections.abc import Mapping

from nsconfine._errors import SandboxUnavailable
from nsconfine._launch import own_fds
from nsconfine._plan.model import RELAY_DIRECTORY, Plan, relay_entry
from nsconfine._text import printable

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from nsconfine._launch.proxy import Proxy


class AuditLog:
    """Where a session's proxy records go: one JSON line each, appended to a file."""

    def __init__(self, path: str) -> None:
        # Non-blocking: a FIFO there (no reader) is refused at once, never waited on.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        not_a_file = (
            f"the audit file {printable(path)} is not a regular file (a FIFO, a device or a "
            "socket): nothing was run; remove it"
        )
        try:
            self.fd = os.open(path, flags | os.O_NONBLOCK, 0o600)
        except OSError as error:
            if error.errno == errno.ENXIO:  # a FIFO without a reader
                raise SandboxUnavailable(not_a_file) from error
            raise SandboxUnavailable(
                f"the audit file {printable(path)} cannot be opened ({error.strerror}): "
                "nothing was run"
            ) from error
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            raise SandboxUnavailable(not_a_file)
        os.set_blocking(self.fd, True)
        self.held = own_fds.hold(self.fd)  # the proxy's word: no session's stdio while open

    def write(self, record: Mapping[str, object]) -> None:
        import json  # here: a launch without an audit log never needs it

        os.write(self.fd, (json.dumps(record, sort_keys=True) + "\n").encode())

    def close(self) -> None:
        if self.fd >= 0:
            own_fds.release(self.held)
            os.close(self.fd)
            self.fd = -1


class _Proxies:
    """The launcher's one proxy, started at its first proxy launch; each record goes to the
    listeners of the session it is about."""

    def __init__(self) -> None:
        self._lock = allocate_lock()
        self._proxy: Proxy | None = None
        self._listeners: dict[str, list[AuditLog | _Reporter]] = {}
        self._numbers = itertools.count(1)

    def proxy(self) -> Proxy:
        from nsconfine._launch.proxy import Proxy  # (ssl and its threads: for proxy launches only)

        with self._lock:
            if self._proxy is None:
                self._proxy = Proxy(audit=self._record)
                # Its socket directories go when the launcher ends (a killed one's, with the
                # account's next proxy); not when a child forked from it exits.
                atexit.register(_close_in, os.getpid(), self._proxy)
            return self._proxy

    def _record(self, record: dict[str, object]) -> None:
        with self._lock:  # (sessions come and go on other threads)
            listeners = list(self._listeners.get(str(record.get("session")), ()))
        for listener in listeners:
            listener.write(record)

    def attach(self, plan: Plan, reporter: _Reporter | None) -> tuple[Plan, Egress]:
        plan.require_launchable()  # (gate refused it already: its routes hold no key)
        name = f"session-{os.getpid()}-{next(self._numbers)}"
        listeners: list[AuditLog | _Reporter] = [] if reporter is None else [reporter]
        with self._lock:
            self._listeners[name] = listeners
        try:
            path = self.proxy().add_session(name, plan.destinations, plan.routes, uid=plan.user.uid)
        except BaseException:
            self._drop(name)
            raise
        bound = plan.replace(entries=(*plan.entries, relay_entry(os.path.dirname(path))))
        return bound, Egress(self, name)

    def listen(self, name: str, listener: AuditLog) -> None:
        with self._lock:
            known = self._listeners.get(name)
            if known is not None:
                known.append(listener)
                return
        listener.close()  # (the session is gone already)

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
    """Prints each refusal on the CLI's stderr, one line each (nsconfine run); or, held (run
    --tty, whose session has the terminal: a line there landed in the middle of its screen),
    keeps them, each destination and reason once with a count, for held_lines() to give once
    the session has ended."""

    KEPT = 20  # destinations kept while held; the rest are counted

    def __init__(self, fd: int, held: bool) -> None:
        self.fd = fd
        self.held = held
        self._kept: dict[tuple[str, str], int] = {}
        self._others = 0
        self._lock = allocate_lock()  # (each connection's thread reports)

    def write(self, record: Mapping[str, object]) -> None:
        if record.get("decision") != "refused":
            return
        where = f"{record.get('host') or '?'}:{record.get('port') or '?'}"
        reason = str(record.get("reason"))
        if self.held:
            with self._lock:
                if (where, reason) in self._kept or len(self._kept) < self.KEPT:
                    self._kept[where, reason] = self._kept.get((where, reason), 0) + 1
                else:
                    self._others += 1
            return
        line = f"nsconfine: network: refused {where}: {reason}\n"
        try:
            os.write(self.fd, line.encode(errors="replace"))
        except OSError:
            pass

    def held_lines(self) -> list[str]:
        """What was kept, a line each, and forgotten."""
        with self._lock:
            kept, others = self._kept, self._others
            self._kept, self._others = {}, 0
        lines = []
        for (where, reason), count in kept.items():
            times = f" {count} times" if count > 1 else ""
            lines.append(f"nsconfine: network: refused {where}{times}: {reason}")
        if others:
            lines.append(f"nsconfine: network: refused {others} more requests elsewhere")
        return lines


class Egress:
    """A sandbox's socket on the launcher's proxy, until the sandbox ends."""

    def __init__(self, proxies: _Proxies, name: str) -> None:
        self._proxies = proxies
        self.name = name

    def open_audit(self, path: str | None) -> None:
        """Append the session's records to the audit file at path (None: none), opened now: once
        the launch's lint has passed, which refuses a path the session could redirect (a
        symlink it put above it would have the launcher, as root, make the file wherever it
        led), and before the command runs."""
        if path is not None:
            self._proxies.listen(self.name, AuditLog(path))

    def admit_only(self, network: int) -> None:
        """The socket serves peers in this network namespace (inode) alone: the sandbox's."""
        self._proxies.proxy().admit_only(self.name, network)

    def close(self) -> None:
        name, self.name = self.name, ""
        if name:
            self._proxies.detach(name)


def _close_in(owner: int, proxy: Proxy) -> None:
    """Close proxy, in the process that made it: a forked child that exits runs the exit
    handlers too, and would remove its parent's socket directories."""
    if os.getpid() == owner:
        proxy.close()


_proxies = _Proxies()
_report_to: list[_Reporter] = []


def report_refusals(fd: int, held: bool = False) -> _Reporter:
    """Print every later proxy session's refusals on fd (the CLI's stderr); held: keep them
    for the returned reporter's held_lines()."""
    _report_to[:] = [_Reporter(fd, held)]
    return _report_to[0]


def attach(plan: Plan) -> tuple[Plan, Egress | None]:
    """plan as a launch runs it: with a proxy network, bound to a new socket on the launcher's
    proxy (closed with the returned Egress); any other plan, or one that binds a relay
    directory of its own (a proxy of the caller's, as the tests' stand-ins), as it is."""
    if plan.network != "proxy" or any(e.dest == RELAY_DIRECTORY for e in plan.entries):
        return plan, None
    return _proxies.attach(plan, _report_to[0] if _report_to else None)
