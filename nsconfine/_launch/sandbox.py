"""The handle of a running session, shaped like subprocess.Popen.

    pid          the launcher's child: nsconfine's reaper, which runs bwrap (what wait() reaps)
    child_pid    the sandbox's init, bwrap's child, in the launcher's pid namespace
    command_pid  the command, in the launcher's pid namespace
    returncode   None while it runs; then the command's exit status, 128+N if the command was
                 killed by signal N, or -N if the sandbox itself was (kill())
    sentinel     an fd that becomes readable once the session has ended, for a launcher's own
                 poll or event loop (as multiprocessing.Process.sentinel); wait() then reaps
    tty          for a launch with tty=True: the controller of the command's terminal (a pty of
                 the sandbox's own, its controlling terminal), which the caller reads and
                 writes; -1 otherwise. Closed once the handle has reaped the session.
    timings      seconds from the launch's start to each stage: "started" (bwrap's reaper
                 running), "linted" (the plan's checks passed, while bwrap builds),
                 "namespaces" (checked), "built" (bwrap done, the shim waiting), "confirmed"
                 (mounts checked), "exec"
    plan         the plan the launch ran: its protected paths as found at that launch
    untrusted_config
                 once the session has ended: the host paths the host runs or trusts (a
                 repository's .git/config and hooks, an .envrc, …) that the session could write
                 and that were not read-only during it (a repository it made, say), for a
                 broker to refuse to run git there before a person has looked; None while the
                 session runs

Signals go to the command (send_signal, terminate); kill() ends the whole sandbox at once, and
leaving a `with` block kills it and waits. Every wait polls pidfds, never select(): a launcher
with thousands of fds is fine. Only nsconfine makes these handles, and only the process that
launched a session can wait for it.
"""

from __future__ import annotations

import os
import signal
import time
from _thread import allocate_lock

from nsconfine._errors import TimeoutExpired
from nsconfine._kernel import terminal as _terminal
from nsconfine._kernel.syscalls import wait_fd
from nsconfine._launch import sources as _sources
from nsconfine._plan.protect import written_config

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from _thread import LockType

    from nsconfine._kernel.terminal import Saved
    from nsconfine._launch.egress import Egress
    from nsconfine._launch.sources import Stub
    from nsconfine._launch.stage import Staged
    from nsconfine._plan.model import Plan


class Sandbox:
    """A running confined session (made by spawn and Pool.launch, never by hand)."""

    __slots__ = (
        "_bound",
        "_command_pidfd",
        "_egress",
        "_init_pidfd",
        "_lock",
        "_owner",
        "_reaper_pidfd",
        "_since",
        "_stubs",
        "_terminals",
        "_untrusted",
        "child_pid",
        "command_pid",
        "pid",
        "plan",
        "returncode",
        "timings",
        "tty",
    )
    pid: int
    plan: Plan
    child_pid: int
    command_pid: int
    returncode: int | None
    timings: dict[str, float]
    tty: int
    _reaper_pidfd: int
    _init_pidfd: int
    _command_pidfd: int
    _terminals: list[Saved]
    _stubs: list[Stub]
    _egress: Egress | None
    _lock: LockType
    _owner: int
    _untrusted: list[str] | None
    _bound: dict[str, tuple[int, int, int]]
    _since: float

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        raise TypeError("Sandbox handles come from nsconfine.spawn or Pool.launch")

    @classmethod
    def _launched(cls, staged: Staged, terminals: list[Saved], tty: int = -1) -> Sandbox:
        self = object.__new__(cls)
        self.plan = staged.plan
        self._untrusted = None
        self._bound = staged.bound
        # What the session could write is looked for in files changed since it began (a
        # second early: file times are the kernel's coarse clock).
        self._since = time.time() - 1.0
        self.pid = staged.reaper
        self.child_pid = staged.init_pid
        self.command_pid = staged.command_pid
        self.returncode = None
        self.timings = dict(staged.timings)
        self.tty = tty
        self._reaper_pidfd = staged.reaper_pidfd
        self._init_pidfd = staged.init_pidfd
        self._command_pidfd = staged.command_pidfd
        self._terminals = terminals
        self._stubs, staged.stubs = staged.stubs, []
        self._egress, staged.egress = staged.egress, None
        self._lock = allocate_lock()
        self._owner = os.getpid()
        return self

    def __repr__(self) -> str:
        return f"<Sandbox pid={self.pid} returncode={self.returncode}>"

    @property
    def sentinel(self) -> int:
        """An fd readable once the session has ended (the reaper's pidfd). The handle owns it
        and closes it once it has reaped the session (returncode set)."""
        return self._reaper_pidfd

    @property
    def untrusted_config(self) -> list[str] | None:
        """What the host runs or trusts that the session could write while it was not
        protected (see the module's docstring), looked for once the session has ended; None
        while it runs."""
        if self.returncode is None and self.poll() is None:
            return None
        if self._untrusted is None:
            self._untrusted = written_config(self.plan, self._bound, self._since)
        return list(self._untrusted)

    def poll(self) -> int | None:
        """The exit status if the session has ended, else None. RuntimeError in another
        process than the one that launched it (a fork), which cannot wait for its reaper."""
        if os.getpid() != self._owner:
            raise RuntimeError(
                f"this session was launched by process {self._owner}: only it can wait for "
                "the session (a forked child may still kill() it)"
            )
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): status lost
                    pid, status = self.pid, 0
                if pid:
                    self._ended(os.waitstatus_to_exitcode(status))
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the session to end and return its status (see the module's docstring).
        Raises TimeoutExpired (a TimeoutError) if it still runs after timeout seconds."""
        ended = self.returncode is not None or wait_fd(self._reaper_pidfd, timeout)
        if not ended and self.poll() is None:
            assert timeout is not None  # an unbounded wait returns only once it has ended
            raise TimeoutExpired(self.pid, timeout)
        status = self.poll()  # the reaper has exited: this reaps it (or another thread did)
        assert status is not None
        return status

    def send_signal(self, number: int) -> None:
        """Send signal number to the command (nothing once the session has ended)."""
        with self._lock:
            if self.returncode is None:
                _send(self._command_pidfd, number)

    def terminate(self) -> None:
        """SIGTERM to the command."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """End the whole sandbox now: SIGKILL to its init (so to every process inside), and
        the reaper tears down bwrap and anything it left."""
        with self._lock:
            if self.returncode is None:
                _send(self._init_pidfd, signal.SIGKILL)
                _send(self._reaper_pidfd, signal.SIGTERM)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Kill the session and wait for it."""
        self.kill()
        self.wait()

    def _ended(self, status: int) -> None:
        # Called with the lock held, once: the pidfds go, the caller's terminal comes back, and
        # the empty mount points made for the launch are removed.
        self.returncode = status
        for fd in (self._reaper_pidfd, self._init_pidfd, self._command_pidfd):
            os.close(fd)
        if self.tty >= 0:
            os.close(self.tty)
            self.tty = -1
        _terminal.restore(self._terminals)
        self._terminals = []
        _sources.remove(self._stubs)
        if self._egress is not None:
            self._egress.close()
            self._egress = None


def _send(pidfd: int, number: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, number)
    except ProcessLookupError:
        pass
