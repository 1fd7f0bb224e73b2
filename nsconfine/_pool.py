"""Pre-staged sandboxes: a thin front over the executor's two halves.

nsconfine.spawn builds a sandbox and hands it its command at once (nsconfine._launch.stage.stage,
then hand_off). A Pool does the first half ahead of need: its sandboxes pass the same gate and
the same checks, and wait with the exec shim inside; `launch` is then only the hand-off, one
sendmsg. Harness pins are checked again at that moment, so a harness changed after staging is
refused.

The refill mode is chosen once: "background" keeps `size` sandboxes staged from a thread of
the pool's own while payloads run; "inline" stages in the caller, at creation and after each
launch. Either way a launch with nothing staged stages one on the spot. A staged sandbox unused
for idle_timeout seconds ends (its shim exits), is reaped, and is replaced only at the next
launch. The launcher's death ends them all (their reapers watch its lifeline).

A staged sandbox protects the repositories its workspace held when it was built: at launch it is
looked at again (nsconfine._plan.protect.refreshed, a stat of what its scan read), and one staged
before a repository appeared is torn down and replaced by one staged on the spot; so is one
whose mount table is no longer the one checked (Staged.mounts_unchanged: a file the host
replaced, whose bind the kernel then detached), one whose binds' paths no longer name what it
binds (Staged.binds_unchanged: a workspace, or a read-only directory, moved away and another
put at its path), and one whose read-only binds in the workspace were changed on the host
(Staged.read_only_unchanged: a protected file moved aside, which its bind follows, or given a
second name).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence

from nsconfine._errors import SandboxUnavailable, UsageError, checked_timeout
from nsconfine._gate import (
    checked_stage,
    gate,
    lint,
    refuse_if_statuses_discarded,
    refusing_os_errors,
    writable_roots,
)
from nsconfine._interrupts import CtrlCHeld
from nsconfine._launch.forks import LaunchWindow
from nsconfine._launch.handoff import StagedGone, hand_off, prepare_launch
from nsconfine._launch.sandbox import Sandbox
from nsconfine._launch.stage import Staged, hold_closed_stdio, teardown
from nsconfine._plan.model import RELAY_DIRECTORY, Plan
from nsconfine._plan.protect import refreshed_and_seen
from nsconfine._policy.launcher_code import refuse_writable_launcher_code
from nsconfine._policy.pins import verify_pins

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import Literal

    from nsconfine._launch.stage import Stdio

    Refill = Literal["background", "inline"]


# The most sandboxes a Pool stages. Each holds 4 processes of the session's account, ~5 fds
# in the launcher and a session keyring counted against the account's key quota
# (kernel.keys.maxkeys: 200 for an account other than root, by default), which the account's
# every launch needs one of: a pool of thousands took the whole quota and refused the
# account's other launches, or the launcher's fds, and could never fill. 128 leaves the
# account 72 keys, and a launcher at the usual 1,024 fds room for its sessions.
MAX_SIZE = 128


def check_options(size: int, idle_timeout: float, refill: str) -> None:
    """UsageError unless a Pool's options are what it takes (nsconfine.aio's Pool checks them
    as it is made, before its Pool is). A bool is refused, though Python counts it an int."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SIZE:
        raise UsageError(
            f"size must be a number of staged sandboxes from 1 to {MAX_SIZE}, not {size!r} "
            "(each holds processes, fds and a key of the session's account)"
        )
    if (
        isinstance(idle_timeout, bool)
        or not isinstance(idle_timeout, int | float)
        or not 0.1 <= idle_timeout < 1e7
    ):
        raise UsageError(
            f"idle_timeout must be a number of seconds from 0.1 (a staged sandbox must live "
            f"long enough to be launched) to below 10,000,000, not {idle_timeout!r}"
        )
    if refill not in ("background", "inline"):
        raise UsageError('refill must be "background" or "inline"')


class Pool:
    """Sandboxes of one plan, staged ahead of need; `launch` hands one its command.

    `Pool(plan, size=1, idle_timeout=300.0, refill="background")`."""

    def __init__(
        self,
        plan: Plan,
        *,
        size: int = 1,
        idle_timeout: float = 300.0,
        refill: Refill = "background",
    ) -> None:
        if not isinstance(plan, Plan):
            raise UsageError(f"Pool takes a Plan (Session(...).plan()), not {type(plan).__name__}")
        check_options(size, idle_timeout, refill)
        hold_closed_stdio()  # before its stager opens anything
        with refusing_os_errors():
            lint(plan)  # refused here exactly as spawn would refuse it
            gate(plan)
            self._writable = writable_roots(plan)  # (a launch checks their identity)
        self.plan = plan
        self._owner = os.getpid()  # whose children its sandboxes are
        self.size = size
        self.idle_timeout = float(idle_timeout)
        self.refill: Refill = refill
        self._staged: deque[Staged] = deque()
        self._cond = threading.Condition()
        self._closed = False
        # What a refill aims at: `size` staged while _fill; an expiry clears it (an idle pool
        # empties) and the next launch sets it again; _error is a failed refill's, for waiters.
        self._fill = True
        self._error: Exception | None = None
        # Launches under way. The background refill stages only when there are none: staging is
        # a whole bwrap build, and on a busy machine it took the CPU the hand-offs of a burst
        # of launches needed (32 at once: p50 13-18 ms with the refill waiting, 23-26 without).
        self._launching = 0
        # Set once the pool was dropped unclosed (the refill thread holds it only weakly), or
        # left so at the interpreter's exit: its staged ones go, as close() would end them, and
        # the thread stages no more.
        self._dropped = threading.Event()
        self._refiller = _Background(self) if refill == "background" else _Inline(self)
        thread = self._refiller.thread if isinstance(self._refiller, _Background) else None
        weakref.finalize(
            self, _dropped, self._owner, self._dropped, self._cond, self._staged, thread
        )
        with CtrlCHeld() as held:  # (an inline refill stages here)
            held.undo(self.close)
            try:
                self._refiller.start()
            except BaseException:
                self.close()
                raise

    def __repr__(self) -> str:
        return f"<Pool size={self.size} staged={len(self._staged)} closed={self._closed}>"

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def staged(self) -> int:
        """How many sandboxes are staged right now."""
        return len(self._staged)

    def wait_staged(self, timeout: float | None = None) -> bool:
        """Wait until `size` sandboxes are staged; False on timeout, a staging failure or close."""
        timeout = checked_timeout(timeout)
        self._refuse_in_a_fork("wait for it to stage (its refill thread is the parent's)")
        if timeout is not None and timeout > threading.TIMEOUT_MAX:
            timeout = None  # float("inf"): as long as it takes (a Condition would overflow)
        return self._refiller.wait_staged(timeout)

    def launch(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: Stdio = None,
        stdout: Stdio = None,
        stderr: Stdio = None,
        tty: bool = False,
    ) -> Sandbox:
        """Run argv in a staged sandbox; return once it has exec'd.

        argv[0] is resolved inside the sandbox as execvp does: a name with a slash is a path
        (relative to the plan's chdir), else it is searched in the PATH of the payload's
        environment. That environment is the plan's (exactly what spawn gives), with env's
        variables added or replacing the plan's. Each stdio is None (the launcher's own fd at
        this call), an fd, a file object, subprocess.PIPE or subprocess.DEVNULL, and stderr
        may be subprocess.STDOUT, as spawn takes them. OSError if argv[0] cannot be
        executed; RuntimeError in a process forked from the pool's, which could not wait for
        its sandboxes (their reapers are the pool's process's children)."""
        self._refuse_in_a_fork("launch from it (it could not wait for the session)")
        with CtrlCHeld() as held:  # a Ctrl-C ends the launch once it is whole
            with self._cond:
                self._launching += 1
            try:
                with LaunchWindow():  # no fork meanwhile: it would hold the launch's fds
                    sandbox = self._launch(argv, env, (stdin, stdout, stderr), tty)
            finally:
                with self._cond:
                    self._launching -= 1
                    if not self._launching:
                        self._cond.notify_all()
            held.undo(sandbox.__exit__)  # (kill, wait, close its pipes)
            self._refiller.launched()
        return sandbox

    def _refuse_in_a_fork(self, what: str) -> None:
        if os.getpid() != self._owner:
            raise RuntimeError(
                f"this pool was made by process {self._owner}: a forked child cannot {what}; "
                "make a Pool in the child"
            )

    def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        stdio: tuple[Stdio, Stdio, Stdio],
        tty: bool,
    ) -> Sandbox:
        # Checked before a sandbox is taken; a failed launch closes its pipes.
        with prepare_launch(argv, env, stdio, tty) as launch:
            refuse_if_statuses_discarded()  # SIGCHLD may have come to be ignored since staging
            # The launcher may have imported from a writable bind since (the gate's check,
            # cached per state of the launcher's modules: microseconds when unchanged).
            refuse_writable_launcher_code(self._writable)
            for _attempt in range(3):
                staged = self._take()
                try:
                    verify_pins(self.plan)  # pins hold at the moment of launch
                except BaseException:
                    self._give_back(staged)
                    raise
                staged = self._current(staged)
                try:
                    return hand_off(staged, launch)
                except StagedGone:
                    continue  # it expired or was killed as we took it: take another
        raise SandboxUnavailable(
            "staged sandboxes kept ending before their launch: something kills them"
        )

    def close(self) -> None:
        """Tear down every staged sandbox (launched ones keep running). Idempotent."""
        with CtrlCHeld():  # (a Ctrl-C as they go would leave the rest, until their timeout)
            with self._cond:
                self._closed = True
                staged = list(self._staged)
                self._staged.clear()
                self._cond.notify_all()
            for one in staged:
                teardown(one)
            self._refiller.stop()

    # ------------------------------------------------------------ taking and refilling

    def _stage_one(self) -> Staged:
        idle_timeout_ms = int(self.idle_timeout * 1000)
        staged = checked_stage(self.plan, idle_timeout_ms=idle_timeout_ms, kept=True)
        # Later launches compare with what this one found (its protected paths), each with a
        # proxy socket of its own: not this sandbox's, which goes when its session ends.
        found = staged.plan
        self.plan = found if staged.egress is None else found.without(RELAY_DIRECTORY)
        return staged

    def _current(self, staged: Staged) -> Staged:
        """staged, if its protected paths are still those its workspace needs, its mounts those
        checked, its binds' paths still what it binds and its read-only binds in the writable
        ones, with all they hold, as checked; else (a repository made since it was staged, by a
        payload of this pool or anyone; a file the host replaced; a workspace or a read-only
        directory moved away and a fresh one put at its path; a protected file another session
        moved aside or linked, a hook it put in) a sandbox staged now for what the workspace
        holds, checked as spawn checks it."""
        try:
            with refusing_os_errors():
                fresh, seen = refreshed_and_seen(staged.plan)
        except BaseException:  # the workspace is refused now: what was staged goes too
            teardown(staged)
            raise
        if (
            fresh is staged.plan
            and staged.mounts_unchanged()
            and staged.binds_unchanged()
            and staged.read_only_unchanged()
        ):
            staged.seen = seen  # what this launch looked at, for its report
            return staged
        teardown(staged)
        return self._stage_one()

    def _take(self) -> Staged:
        """A live staged sandbox, or one staged now. Only the one taken is asked whether it
        still lives (each ask polls three pidfds; the refill asks the others between launches),
        and the next is taken while the one taken has ended."""
        with self._cond:
            if self._closed:
                raise UsageError("the pool is closed")
            expired = self._expired_locked(ended_too=False)
            self._fill = True  # a launch refills an idle pool, and retries a failed refill
            self._error = None
            staged = self._staged.popleft() if self._staged else None
            while staged is not None and staged.ended():
                expired.append(staged)
                staged = self._staged.popleft() if self._staged else None
        for one in expired:
            teardown(one)
        return staged if staged is not None else self._stage_one()

    def _give_back(self, staged: Staged) -> None:
        with self._cond:
            if not self._closed:
                self._staged.appendleft(staged)
                return
        teardown(staged)

    def _expired_locked(self, ended_too: bool = True) -> list[Staged]:
        # Near its idle timeout a shim may be exiting: never race it; a reaper that has
        # exited means the sandbox is gone (expired, or killed). ended_too=False: by time only.
        now = time.monotonic()
        expired = [s for s in self._staged if now >= s.usable_until or (ended_too and s.ended())]
        for one in expired:
            self._staged.remove(one)
            self._fill = False  # an idle pool empties; the next launch refills it
        return expired

    def _fill_to_size(self) -> None:
        """Stage in this thread until `size` are staged (or the pool is closed)."""
        while True:
            with self._cond:
                expired = self._expired_locked()
                short = not self._closed and len(self._staged) < self.size
            for one in expired:
                teardown(one)
            if not short:
                return
            self._give_back(self._stage_one())


def _dropped(
    owner: int,
    dropped: threading.Event,
    cond: threading.Condition,
    staged: deque[Staged],
    thread: threading.Thread | None,
) -> None:
    """A pool was collected unclosed, or left so at the interpreter's exit: tear down what it
    staged, and wake its refill thread, which then ends; wait for it (a while), which tears
    down a sandbox it was staging (at the exit, the interpreter would stop it midway, leaving
    that sandbox's mount points in the workspace). Not in a forked child (exiting, it runs
    this too): the sandboxes are its parent's."""
    if os.getpid() != owner:
        return
    dropped.set()
    with cond:
        left = list(staged)
        staged.clear()
        cond.notify_all()
    for one in left:
        teardown(one)
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout=30)


class _Inline:
    """refill="inline": the caller stages, when the pool is made and after each launch."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def start(self) -> None:
        self.pool._fill_to_size()

    def wait_staged(self, timeout: float | None) -> bool:
        try:
            with CtrlCHeld():  # (a launch window is opened only with a Ctrl-C held: forks.py)
                self.pool._fill_to_size()
        except Exception:
            return False
        return not self.pool._closed

    def launched(self) -> None:
        try:
            self.pool._fill_to_size()
        except Exception:
            pass  # the payload runs: the next launch stages afresh and raises this

    def stop(self) -> None:
        pass


class _Background:
    """refill="background": a thread of the pool's own keeps `size` staged while payloads run,
    and reaps those that expire."""

    def __init__(self, pool: Pool) -> None:
        self._pool = weakref.ref(pool)  # (held strongly, it would never be collected)
        self.thread = threading.Thread(
            target=_refill,
            args=(self._pool, pool._cond, pool._dropped),
            name="nsconfine-pool",
            daemon=True,
        )

    def start(self) -> None:
        try:
            self.thread.start()
        except RuntimeError:  # the launcher at its process or thread limit
            raise SandboxUnavailable(
                "the pool cannot start its refill thread (the launcher is at its process or "
                "thread limit, which its sessions may share): raise the limit, or use "
                'refill="inline"'
            ) from None

    def wait_staged(self, timeout: float | None) -> bool:
        pool = self._pool()
        assert pool is not None  # (its own method calls this)
        with pool._cond:
            pool._fill = True
            pool._error = None
            pool._cond.notify_all()
            pool._cond.wait_for(
                lambda: len(pool._staged) >= pool.size or pool._error or pool._closed, timeout
            )
            return len(pool._staged) >= pool.size and not pool._closed

    def launched(self) -> None:
        pass  # the refill is woken when the last launch under way ends (Pool.launch)

    def stop(self) -> None:
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()


def _refill(
    pool_ref: weakref.ref[Pool], cond: threading.Condition, dropped: threading.Event
) -> None:
    """The refill thread of a background pool: it holds the pool only while it works on it,
    and ends once the pool is closed or collected."""
    while True:
        with cond:
            while True:
                pool = pool_ref()
                if pool is None or dropped.is_set():
                    return  # dropped unclosed (_dropped tore its staged ones down)
                expired = pool._expired_locked()
                if expired or pool._closed:
                    break
                if (
                    pool._fill
                    and pool._error is None
                    and len(pool._staged) < pool.size
                    and not pool._launching
                ):
                    break
                next_expiry = min((s.usable_until for s in pool._staged), default=None)
                wait = None if next_expiry is None else max(next_expiry - time.monotonic(), 0)
                del pool  # (not held while waiting: it may be dropped meanwhile)
                if dropped.is_set():
                    return  # dropped as this thread let go: its finalizer ran here, just now
                cond.wait(wait)
            closed = pool._closed
        for one in expired:
            teardown(one)
        if closed:
            return
        if expired:
            continue
        try:
            staged = pool._stage_one()
        except Exception as error:
            with cond:
                pool._error = error
                pool._fill = False
                cond.notify_all()
            continue
        with cond:
            if pool._closed or dropped.is_set():
                closed = True
            else:
                pool._staged.append(staged)
                cond.notify_all()
        del pool
        if closed:
            teardown(staged)
            return
