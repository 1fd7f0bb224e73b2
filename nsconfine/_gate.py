"""Where a launch is refused: the one gate every session passes before its sandbox is built.

spawn and Pool both come through gate(). There is no path from here to an unconfined command:
a session that would hold host uid 0 (or, from a root launcher, gid 0), a plan that fails the
lint, a pinned file that changed, a bwrap that is missing, broken or does not confine, or a
program of the launch that a session could have written, refuses the launch.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from nsconfine._errors import (
    NsconfineError,
    PlanError,
    SandboxUnavailable,
    UsageError,
    refuse_if_short_of_fds,
)
from nsconfine._interrupts import CtrlCHeld
from nsconfine._kernel.accounts import SEARCH, access_problem, refuse_records_in
from nsconfine._kernel.syscalls import child_statuses_discarded, realpath
from nsconfine._launch.forks import LaunchWindow
from nsconfine._launch.handoff import StagedGone, hand_off, prepare_launch
from nsconfine._launch.programs import REAPER_PATH, SHIM_PATH
from nsconfine._launch.sandbox import Sandbox
from nsconfine._launch.stage import SPAWN_SHIM_TIMEOUT_MS, hold_closed_stdio, stage
from nsconfine._plan.model import Kind, Mode, Plan
from nsconfine._plan.protect import refreshed_and_seen
from nsconfine._policy.launcher_code import refuse_writable_launcher_code
from nsconfine._policy.lint import check_plan, launch_rules
from nsconfine._policy.pins import verify_pins
from nsconfine._preflight.checks import (
    located_bwrap,
    proven_bwrap,
    refuse_untrusted,
    refuse_unusable_bwrap,
    takes_bind_fds,
)
from nsconfine._text import printable, within

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from nsconfine._launch.stage import Identity, Staged, Stdio


class Cleared:
    """What the gate hands the launch: the proven bwrap, and whether it binds sources by fd
    (the identities the lint judged come from lint(), checked against the sources opened)."""

    __slots__ = ("bind_fds", "bwrap")

    def __init__(self, bwrap: str, bind_fds: bool) -> None:
        self.bwrap = bwrap
        self.bind_fds = bind_fds


def lint(plan: Plan) -> dict[str, Identity | None]:
    """The plan's own checks: the policy lint and the harness pins; what the lint judged (each
    bind source's identity). A launch runs it while bwrap builds the sandbox (see stage), and
    hands the command over only once it has passed."""
    judged = check_plan(plan, launch_rules(plan))
    verify_pins(plan)
    return judged


def refuse_if_statuses_discarded() -> None:
    """Refuse a launch (spawn's, or a Pool's at each launch) while SIGCHLD is ignored."""
    if child_statuses_discarded():
        raise SandboxUnavailable(
            "this launcher ignores SIGCHLD (SIG_IGN, or SA_NOCLDWAIT): the kernel would reap "
            "its sessions itself and lose every exit status; restore the default first "
            "(signal.signal(SIGCHLD, SIG_DFL))"
        )


def gate(plan: Plan) -> Cleared:
    """Refuse plan unless every check due before bwrap runs passes (who the session runs as,
    which bwrap, proven); what the launch then needs. The plan's own checks are lint()."""
    euid = os.geteuid()
    plan.require_launchable()
    refuse_if_statuses_discarded()
    if euid != 0 and os.getuid() == 0:  # (an exec keeps the real uid; it resets the saved one)
        raise SandboxUnavailable(
            f"this launcher's real uid is 0 while its effective uid is {euid} (os.seteuid "
            "changes only the latter): its sessions would keep uid 0 as their real uid; run "
            "the launcher as root, or give up root for good first (os.setresuid(uid, uid, "
            "uid), runuser, a service's User=)"
        )
    if plan.user.uid == 0:
        raise SandboxUnavailable(
            "this launcher runs as root and the session names no other account: it would hold "
            "host uid 0; name an unprivileged account to run it as (--user NAME, "
            "Session(user=...))"
        )
    if euid == 0 and plan.user.gid == 0:
        # run_as refuses such an account, but a plan is data: its user can be replaced by hand.
        raise SandboxUnavailable(
            f"the plan runs as {plan.user}: its group is gid 0, root's, and the session would "
            "read and write what root's group may; name an account of an unprivileged group "
            "(--user NAME, Session(user=...))"
        )
    if euid != 0 and plan.user.uid != euid:
        raise UsageError(
            f"the plan runs as {plan.user}, but only a root launcher can run a session as "
            f"another account (this one is uid {euid})"
        )
    if not any(e.dest == "/proc" and e.kind is Kind.PROC for e in plan.entries):
        raise PlanError(
            "the plan has no /proc: the sandbox's first command (nsconfine's exec shim) runs "
            "from it; keep the proc entry Session.plan() makes"
        )
    bwrap = located_bwrap()
    # Before bwrap is first run (its proof runs it): a planted one must never run at all.
    programs = {"bwrap": bwrap, "reaper": REAPER_PATH, "shim": SHIM_PATH}
    writable = writable_roots(plan)
    refuse_records_in(writable)  # (the proof is recorded there)
    _refuse_writable_programs(writable, programs)
    refuse_writable_launcher_code(writable)
    refuse_unusable_bwrap(bwrap)
    refuse_untrusted(REAPER_PATH, "reaper")
    refuse_untrusted(SHIM_PATH, "shim")
    problem = access_problem(os.path.realpath(bwrap), plan.user, SEARCH)
    if problem is not None:
        raise SandboxUnavailable(
            f"bwrap {bwrap} cannot be run by {plan.user.name}, who runs the session ({problem}): "
            "install bubblewrap where that account can run it (Debian's /usr/bin/bwrap)"
        )
    proven_bwrap(bwrap)
    return Cleared(bwrap, takes_bind_fds(bwrap))


def writable_roots(plan: Plan) -> list[str]:
    """The real path of each writable bind's source: where what the launcher runs or loads
    must not lie."""
    return [realpath(e.source) for e in plan.entries if e.kind is Kind.BIND and e.mode is Mode.RW]


def _refuse_writable_programs(writable: Sequence[str], programs: dict[str, str]) -> None:
    # A program the session could have written (a bwrap found in a previous session's
    # workspace, nsconfine installed in a venv inside it) would run, outside the sandbox, with
    # the launcher's trust at the next launch.
    for name, path in programs.items():
        try:
            resolved = realpath(path)
        except OSError:
            continue  # missing: refused where it is used, with its own message
        for root in writable:
            if within(resolved, root):
                raise SandboxUnavailable(
                    f"the {name} {path} lies inside {root}, which the session can write (a "
                    f"session could have put it there): use a {name} outside every writable "
                    "bind"
                )


def spawn(
    plan: Plan,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: Stdio = None,
    stdout: Stdio = None,
    stderr: Stdio = None,
    tty: bool = False,
) -> Sandbox:
    """Run argv confined by plan; return once it has exec'd. env: variables added to the
    plan's environment (or replacing its own) for this command only. Each stdio is None
    (inherit), an fd, a file object, subprocess.PIPE (the handle's stdin, stdout or stderr
    is then the launcher's end) or subprocess.DEVNULL, and stderr may be subprocess.STDOUT;
    tty=True gives the command a new terminal of the sandbox's own instead (its controller is
    the handle's tty). OSError if argv[0] cannot be executed there."""
    if not isinstance(plan, Plan):
        raise UsageError(f"spawn takes a Plan (Session(...).plan()), not {type(plan).__name__}")
    # A refused command never has a sandbox built for it; a failed launch closes its pipes;
    # a Ctrl-C is held until the launch is whole, which it then ends.
    with (
        CtrlCHeld() as held,
        LaunchWindow(),  # no fork meanwhile: it would hold the pipes and fds made here
        prepare_launch(argv, env, (stdin, stdout, stderr), tty) as launch,
    ):
        staged = checked_stage(plan, stderr=launch.bwrap_stderr)
        try:
            sandbox = hand_off(staged, launch)  # OSError from here: the command could not start
        except StagedGone:
            raise SandboxUnavailable(
                "the sandbox ended before its command started (its bwrap was killed); nothing "
                "was run, launch again"
            ) from None
        held.undo(sandbox.__exit__)  # (kill, wait, close its pipes)
    return sandbox


def checked_stage(
    plan: Plan,
    *,
    stderr: int = -1,
    idle_timeout_ms: int = SPAWN_SHIM_TIMEOUT_MS,
    kept: bool = False,
) -> Staged:
    """The one checked launch up to the hand-off, for spawn and Pool alike: the plan's
    protected paths found again where its workspace changed, the gate, then a sandbox built by
    bwrap while the plan is linted, its namespaces and mount table confirmed, and the exec shim
    waiting inside for its command (idle_timeout_ms at most). The staged sandbox keeps the plan
    it runs; kept (a Pool's), what it checked of its read-only binds, to be asked again."""
    hold_closed_stdio()  # before the launch opens anything
    with LaunchWindow(), refusing_os_errors():
        plan, seen = refreshed_and_seen(plan)  # the repositories its workspace holds now
        cleared = gate(plan)
        staged = stage(
            cleared.bwrap,
            plan,
            lint=lambda: lint(plan),
            bind_fds=cleared.bind_fds,
            stderr=stderr,
            idle_timeout_ms=idle_timeout_ms,
            kept=kept,
        )
        staged.seen = seen
        return staged


@contextmanager
def refusing_os_errors() -> Iterator[None]:
    """Until the command is handed over, an OSError (a path that changed under the lint, a
    race with a hostile workspace) is a refusal of the launch, never a failure of the command."""
    try:
        yield
    except NsconfineError:  # some are OSErrors too (CredentialMissing): each says its own
        raise
    except ImportError as error:  # a module loaded late, when no fd was left to load it
        raise SandboxUnavailable(
            f"the launch was refused: a module it needs could not be loaded ({error}); "
            "nothing was run: if the launcher is out of file descriptors, raise its limit"
        ) from error
    except OSError as error:
        refuse_if_short_of_fds(error)
        # (a symlink made, or a rename: the second name is where it was made)
        named = error.filename2 or error.filename
        where = f" ({printable(named)})" if named else ""
        if error.errno in _RACES:
            raise SandboxUnavailable(
                f"the launch was refused: {error.strerror or error}{where} changed while it "
                "was checked or built; nothing was run, launch again"
            ) from error
        raise SandboxUnavailable(  # the host's (a limit, a read-only or full file system)
            f"the launch was refused: {error.strerror or error}{where}; nothing was run"
        ) from error


# What a path that changed under the launch's checks gives (a hostile workspace's race);
# another error is the host's, and launching again does not help.
_RACES = frozenset({errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ESTALE, errno.EISDIR})
