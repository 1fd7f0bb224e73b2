"""The executor: build a sandbox for a plan, check it with the launcher's own eyes, and only
then hand it its command. No lint here (nsconfine._gate's gate does that before every launch).

A launch, in order:

1. The launcher's C child (csrc/nsconfine.c) takes the session's account (as root: the one the
   plan names), drops every capability, sets no_new_privs, joins a fresh session keyring and
   execs nsconfine's reaper (csrc/reaper.c, from a sealed memfd), which takes the session's
   limits in a user namespace of its own (nsconfine._plan.limits) and runs bwrap with exactly
   these fds:
       0-1  /dev/null (bwrap binds the terminal its stdout is at the sandbox's /dev/console,
            read-write: it never gets one; the command's stdio comes through the shim)
       2    the session's stderr, for bwrap's own messages
       3    a sealed memfd with the plan's options (`--args 3`)
       4    the info pipe (`--info-fd 4`)
       5    the exec shim's socket, passed through to the sandbox
       6    a sealed memfd with the seccomp filter (`--seccomp 6`)
       7    the sealed memfd holding the exec shim, which bwrap runs as /proc/self/fd/7
       8    the reaper's end of the launcher's lifeline (the reaper keeps it from bwrap)
       9…   one fd per data or copy entry, in plan order
   The reaper ends the session once bwrap ends, once it gets SIGTERM, or once the lifeline
   reaches EOF (every copy of its write end, held by the launcher process, is closed): the
   launcher's death ends its sessions however it died, from whichever thread it launched.
2. bwrap reports the sandbox's pid on the info pipe once the namespaces exist. The launcher
   checks in /proc that this pid is bwrap's child (and bwrap the reaper's), and that its
   namespaces are new.
3. bwrap builds the mounts and runs the exec shim, which says it is ready on its socket; the
   kernel attaches its pid (SCM_CREDENTIALS). The launcher checks that the shim lives in the
   sandbox, and that the sandbox's mount table is exactly the plan (nsconfine._kernel.mountinfo).
   The sandbox is now staged: built and checked, waiting for a command.
4. hand_off sends the command, its stdio (unless it gets a terminal of its own) and (for a
   pool) its environment; the shim execs it.
   EOF on a fresh error pipe means the exec succeeded; else the shim reports the errno, the
   sandbox is torn down, and the launch raises OSError.
"""

from __future__ import annotations

# The C module socket.py wraps: all a launch needs (a socketpair, SCM_RIGHTS), without
# socket.py's start-up (its enums and selectors, ~3 ms of every CLI run).
import _socket as socket
import os
import signal
import stat
import time
from _thread import allocate_lock
from collections.abc import Callable, Mapping, Sequence

from nsconfine._errors import PlanError, SandboxUnavailable, UsageError, refuse_if_short_of_fds
from nsconfine._kernel import layers as _layers
from nsconfine._kernel import syscalls as _syscalls
from nsconfine._kernel import terminal as _terminal
from nsconfine._kernel.mountinfo import mount_table_problems, read_mountinfo
from nsconfine._launch import sources as _sources
from nsconfine._launch.programs import (
    REAPER_PATH,
    SHIM_CLOSE_MASK,
    SHIM_EXEC_STAGE,
    SHIM_EXECUTING,
    SHIM_HEADER,
    SHIM_MAGIC,
    SHIM_MAX_BODY,
    SHIM_PATH,
    SHIM_REPORT,
    SHIM_STAGES,
    SHIM_TTY,
    program_fd,
)
from nsconfine._launch.sandbox import Sandbox
from nsconfine._plan import network as _network
from nsconfine._plan.bwrap_args import (
    bwrap_command_line,
    bwrap_options,
    encode_options,
    fd_entries,
    reaper_command_line,
    shim_command,
)
from nsconfine._plan.model import Kind, Plan, has_own_network, is_env_name

TYPE_CHECKING = False  # typing costs launchers milliseconds of import; mypy reads this block
if TYPE_CHECKING:
    from typing import IO, Any, Final

    Stdio = int | IO[Any] | None
    Identity = tuple[int, int]

# What a launch must see differ from the launcher's own ("net" too, for a network of its own).
CONFINING_NAMESPACES: Final = ("user", "mnt", "pid", "ipc", "uts", "cgroup", "net")
INFO_TIMEOUT_SECONDS: Final = 10.0
SETUP_TIMEOUT_SECONDS: Final = 120.0  # 10,000 copied files take bwrap seconds
SPAWN_SHIM_TIMEOUT_MS: Final = 600_000  # a spawn hands its shim the command at once


# Which of fds 0-2 the launcher lacked (closed) when a launch began: each was given /dev/null
# then, so that no fd nsconfine opens for itself (the lifeline, a staged sandbox's pidfds, the
# memfd of a plan's options, which holds its credential's values) can take that number and
# reach a command as its stdio; a command launched with the launcher's own fd there gets it
# closed, as the launcher had it.
_filled_stdio: set[int] = set()
_filled_lock = allocate_lock()


def hold_closed_stdio() -> None:
    """Give each of fds 0-2 that is closed /dev/null, remembering that the launcher lacks it
    (called as every launch and every Pool begins, before nsconfine opens anything)."""
    for number in (0, 1, 2):
        try:
            os.fstat(number)
        except OSError:
            with _filled_lock:
                null = os.open(os.devnull, os.O_RDWR)
                if null != number:  # a lower one was closed too, or another thread came first
                    os.dup2(null, number, inheritable=True)
                    os.close(null)
                _filled_stdio.add(number)


def launcher_lacks(number: int) -> bool:
    """Did the launcher start a launch without its fd number (0-2): closed now, or the
    /dev/null hold_closed_stdio put there (and nothing the caller put there since)?"""
    try:
        info = os.fstat(number)
    except OSError:
        return True
    return number in _filled_stdio and stat.S_ISCHR(info.st_mode) and info.st_rdev == _NULL_DEVICE


_NULL_DEVICE = os.stat(os.devnull).st_rdev


def stdio_fd(value: Stdio, name: str) -> int:
    """The fd of a stdio argument: -1 for None (inherit), else the fd or the file's fileno()."""
    if value is None:
        return -1
    if isinstance(value, int):
        if value < 0:
            raise UsageError(f"{name} must be None, a file descriptor or a file object")
        return value
    return value.fileno()


_own_namespaces: dict[str, int] | None = None


def own_namespaces() -> dict[str, int]:
    """The launcher's namespace ids, read once (a launcher does not change namespaces)."""
    global _own_namespaces
    if _own_namespaces is None:
        found = {}
        for name in CONFINING_NAMESPACES:
            try:
                found[name] = os.stat(f"/proc/self/ns/{name}").st_ino
            except FileNotFoundError:  # a kernel without this kind of namespace
                continue
        _own_namespaces = found
    return _own_namespaces


# ------------------------------------------------------------------ the lifeline

_lifeline: tuple[int, int] | None = None  # this process's (read end, write end)


def _lifeline_read_end() -> int:
    global _lifeline
    if _lifeline is None:
        _lifeline = os.pipe2(os.O_CLOEXEC)
    return _lifeline[0]


def _forget_lifeline_in_child() -> None:
    # A forked child must not keep its parent's sessions alive after the parent dies; it
    # makes a lifeline of its own if it launches.
    global _lifeline
    if _lifeline is not None:
        for fd in _lifeline:
            os.close(fd)
        _lifeline = None


os.register_at_fork(after_in_child=_forget_lifeline_in_child)


# ------------------------------------------------------------------ staging

_compiled: dict[int, tuple[Plan, tuple[bool, bool, bool], bytes]] = {}


def compiled_options(plan: Plan, seccomp: bool, bind_fds: bool) -> bytes:
    """The plan's options, encoded once per plan object (plans are immutable)."""
    switches = (seccomp, bind_fds, _layers.disables_userns(plan))
    hit = _compiled.get(id(plan))
    if hit is not None and hit[0] is plan and hit[1] == switches:
        return hit[2]
    encoded = encode_options(
        bwrap_options(plan, seccomp=seccomp, bind_fds=bind_fds, disable_userns=switches[2])
    )
    if len(_compiled) >= 64:
        _compiled.clear()
    _compiled[id(plan)] = (plan, switches, encoded)  # kept: its id stays its own
    return encoded


class Staged:
    """A sandbox built and checked, whose shim waits for its command."""

    __slots__ = (
        "bound",
        "bwrap_pidfd",
        "command_pid",
        "command_pidfd",
        "egress",
        "info_fd",
        "init_pid",
        "init_pidfd",
        "plan",
        "reaper",
        "reaper_pidfd",
        "sock",
        "started",
        "stderr",
        "stubs",
        "timings",
        "usable_until",
    )

    def __init__(self, plan: Plan, reaper: int, reaper_pidfd: int, sock: socket.socket) -> None:
        self.plan = plan  # the plan it was built from, protected paths as that launch found them
        # Each bind's dest -> the source file it shows: device, inode and change time (an inode
        # number is reused at once once its file is gone).
        self.bound: dict[str, tuple[int, int, int]] = {}
        self.reaper = reaper
        self.reaper_pidfd = reaper_pidfd
        self.sock = sock
        self.init_pid = self.init_pidfd = self.command_pid = self.command_pidfd = -1
        self.bwrap_pidfd = -1  # bwrap's own process, outside the sandbox; only until hand-off
        self.started = time.perf_counter()
        self.timings: dict[str, float] = {}
        self.usable_until = 0.0
        self.stderr = -1  # bwrap's fd 2 (-1: the launcher's)
        self.info_fd = -1
        self.stubs: list[_sources.Stub] = []
        self.egress: _network.Egress | None = None  # its socket on the launcher's proxy

    def mark(self, stage: str) -> None:
        """Record when stage was reached, in seconds since the launch began."""
        self.timings[stage] = time.perf_counter() - self.started

    def pidfds(self) -> list[int]:
        """The pidfds this staged sandbox holds."""
        held = (self.reaper_pidfd, self.bwrap_pidfd, self.init_pidfd, self.command_pidfd)
        return [fd for fd in held if fd >= 0]

    def ended(self) -> bool:
        """Has the reaper, bwrap or the sandbox's init exited (the sandbox expired, failed or
        was killed)? A sandbox whose bwrap is gone may live on, but no status would come back
        from it: it is never handed a command."""
        watched = (self.reaper_pidfd, self.bwrap_pidfd, self.init_pidfd)
        return any(_syscalls.wait_fd(fd, 0) for fd in watched if fd >= 0)


def open_entry_fds(plan: Plan, fds: list[int], bind_sources: dict[str, int] | None = None) -> None:
    """Append to fds, in fd order, a sealed memfd per data entry, the opened source per copy,
    and (bind_sources given) each bind's opened source, moved out of bind_sources (so that a
    launch holds each fd once); on failure the caller closes what was appended."""
    entries = fd_entries(plan, bind_fds=bind_sources is not None)
    _make_room_for(len(entries))
    for entry in entries:
        if entry.kind is Kind.DATA:
            assert entry.content is not None
            fds.append(_syscalls.memfd_sealed("nsconfine-data", entry.content))
        elif entry.kind is Kind.BIND:
            assert bind_sources is not None
            fds.append(bind_sources.pop(entry.dest))
        else:
            fds.append(_open_copy_source(entry.source))


def _open_copy_source(path: str) -> int:
    # Not through a symlink, and never blocking: a FIFO or device swapped in for a runner file
    # would otherwise hang the launch (or read a device); only a regular file is copied.
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError as error:
        raise PlanError(f"{path} cannot be copied: {error.strerror}") from None
    import stat

    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PlanError(f"{path} is no longer a regular file: refusing to copy it")
    return fd


def _make_room_for(count: int) -> None:
    # A plan that copies a thousand files hands bwrap a thousand fds at once: raise the soft
    # limit to the hard one when it would not fit (the hard limit is the user's real bound).
    if count < 64:
        return
    import resource

    needed = count + 64  # and the launcher's own
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise PlanError(
            f"the plan copies {count} files but only {hard} fds may be open: raise "
            "`ulimit -Hn`, or bind the directory that holds them instead"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def stage(
    bwrap: str,
    plan: Plan,
    *,
    lint: Callable[[], Mapping[str, Identity | None]] | None = None,
    bind_fds: bool = True,
    stderr: int = -1,
    idle_timeout_ms: int = SPAWN_SHIM_TIMEOUT_MS,
) -> Staged:
    """Build plan's sandbox under bwrap with the exec shim waiting inside; return once the
    sandbox is checked (namespaces, shim, mount table). lint: the plan's own checks (the
    gate's lint()), run while bwrap builds the sandbox, which no command enters unless they
    pass; what it judged is checked against the sources opened. bind_fds: bwrap takes
    --bind-fd; stderr: bwrap's fd 2, for its own messages (-1: the launcher's)."""
    plan, egress = _network.attach(plan)  # a proxy network's socket, for this sandbox
    try:
        stubs, sources = _sources.open_for_launch(plan)
    except BaseException:
        if egress is not None:
            egress.close()
        _lint_first(lint)  # a refusal of the plan explains more than what it led to
        raise
    try:
        identities = {dest: _fd_identity(fd) for dest, fd in sources.items()}
        bound = {dest: _bound_identity(fd) for dest, fd in sources.items()}
        staged = _start(bwrap, plan, sources if bind_fds else None, stderr, idle_timeout_ms)
    except BaseException:
        _sources.remove(stubs)
        if egress is not None:
            egress.close()
        _lint_first(lint)
        raise
    finally:
        for fd in sources.values():
            os.close(fd)
    staged.stubs = stubs
    staged.egress = egress
    staged.bound = bound
    try:
        if lint is not None:  # bwrap is building the sandbox meanwhile
            _sources.check_judged(plan, identities, lint())
            staged.mark("linted")
        _confirm(bwrap, plan, staged, identities)
    except _SetupEnded as ended:
        status = teardown(staged)
        raise SandboxUnavailable(
            f"the sandbox {ended} (bwrap's status {status}); bwrap's message is on the "
            "session's stderr, and `nsconfine check` explains what to fix"
        ) from None
    except BaseException:
        teardown(staged)
        raise
    finally:
        os.close(staged.info_fd)
    staged.mark("confirmed")
    staged.usable_until = time.monotonic() + idle_timeout_ms / 1000 * 0.9
    return staged


def _lint_first(lint: Callable[[], object] | None) -> None:
    """Run lint, if given, so that its refusal is the one raised."""
    if lint is not None:
        lint()


def _fd_identity(fd: int) -> Identity:
    info = os.fstat(fd)
    return (info.st_dev, info.st_ino)


def _bound_identity(fd: int) -> tuple[int, int, int]:
    info = os.fstat(fd)
    return (info.st_dev, info.st_ino, info.st_ctime_ns)


def _start(
    bwrap: str,
    plan: Plan,
    bind_sources: dict[str, int] | None,
    stderr: int,
    idle_timeout_ms: int,
) -> Staged:
    """Spawn the reaper with bwrap's fds in place (see the module's docstring)."""
    seccomp = _layers.seccomp_program(plan)
    options = compiled_options(plan, seccomp is not None, bind_sources is not None)
    flags, uid, gid = _layers.spawn_flags(plan.user)
    shim = shim_command(
        idle_timeout_ms,
        _layers.shim_guards_pid_1(),
        plan.limits.open_files,
        relay=plan.network == "proxy",
    )
    reaper_fd, shim_fd = program_fd(REAPER_PATH), program_fd(SHIM_PATH)
    bwrap_argv = bwrap_command_line(bwrap, shim)
    argv = [
        os.fsencode(a)
        for a in reaper_command_line(REAPER_PATH, bwrap_argv, _layers.session_limits(plan))
    ]
    launcher_end, shim_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # The kernel then attaches the sender's pid to what the shim sends: its own, translated.
    launcher_end.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    child_side: list[int] = []  # given to the reaper, closed here once it has them
    info_read = devnull = -1
    try:
        devnull = _devnull_above_stdio()
        child_side.append(_syscalls.memfd_sealed("nsconfine-args", options))
        info_read, info_write = os.pipe2(os.O_CLOEXEC)
        child_side.append(info_write)
        child_side.append(shim_end.fileno())
        child_side.append(_syscalls.memfd_sealed("nsconfine-seccomp", seccomp or b""))
        child_side.append(shim_fd)
        child_side.append(_lifeline_read_end())
        open_entry_fds(plan, child_side, bind_sources)
        started = time.perf_counter()
        reaper = _syscalls.spawn(
            os.fsencode(REAPER_PATH),
            argv,
            (),  # bwrap gets an empty environment; the session's is in the options
            stdin=devnull,
            stdout=devnull,
            stderr=stderr,
            pass_fds=child_side,
            flags=flags,
            uid=uid,
            gid=gid,
            exec_fd=reaper_fd,
            landlock_fd=_layers.landlock_ruleset(),
        )
    except _syscalls.SyscallError as error:
        if info_read >= 0:
            os.close(info_read)
        launcher_end.close()
        raise SandboxUnavailable(
            f"cannot start bwrap as {plan.user.name}: {error.strerror} ({error.syscall})"
        ) from None
    except BaseException:
        if info_read >= 0:
            os.close(info_read)
        launcher_end.close()
        raise
    finally:
        shim_end.close()
        if devnull >= 0:
            os.close(devnull)
        # Not the socket's (closed above), nor the shim's program or the lifeline (kept).
        for fd in child_side[:2] + child_side[3:4] + child_side[6:]:
            os.close(fd)
    try:
        reaper_pidfd = os.pidfd_open(reaper)
    except OSError as error:
        # Unwatched, the session must not go on: the reaper is this launcher's child, not yet
        # waited for, so its pid is still its own; SIGTERM has it kill bwrap and all below.
        os.kill(reaper, signal.SIGTERM)
        os.waitpid(reaper, 0)
        os.close(info_read)
        launcher_end.close()
        raise SandboxUnavailable(
            f"cannot watch the sandbox: pidfd_open: {error.strerror}; nothing was run "
            "(nsconfine needs pidfds: Linux 5.3 or later, with no seccomp filter refusing them)"
        ) from None
    staged = Staged(plan, reaper, reaper_pidfd, launcher_end)
    staged.started = started
    staged.stderr = stderr
    staged.info_fd = info_read
    staged.mark("started")
    return staged


def _devnull_above_stdio() -> int:
    # Never at 0-2: in a launcher without one of them, another thread's launch would take it
    # for that stdio fd (prepare_launch) and hand it to its command.
    import fcntl

    opened = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    if opened > 2:
        return opened
    try:
        return fcntl.fcntl(opened, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(opened)


class _SetupEnded(Exception):
    """bwrap, or its sandbox, ended before the command could start."""


def _confirm(bwrap: str, plan: Plan, staged: Staged, sources: Mapping[str, Identity]) -> None:
    info = _read_info(bwrap, staged.info_fd, staged.sock.fileno())
    child: int = info["child-pid"]
    try:
        staged.init_pidfd = os.pidfd_open(child)
    except ProcessLookupError:
        raise _SetupEnded("ended before it could be checked") from None
    staged.init_pid = child
    bwrap_pid = _check_init(bwrap, staged.reaper, child, info, has_own_network(plan.network))
    try:
        staged.bwrap_pidfd = os.pidfd_open(bwrap_pid)
    except ProcessLookupError:
        raise _SetupEnded("ended during set-up") from None
    staged.mark("namespaces")
    shim = _await_shim(staged)
    try:
        staged.command_pidfd = os.pidfd_open(shim)
    except ProcessLookupError:
        raise _SetupEnded("ended before its command could start") from None
    staged.command_pid = shim
    staged.mark("built")  # bwrap has made every mount, and the shim is waiting
    _check_shim(bwrap, child, shim)
    try:
        mountinfo = read_mountinfo(shim)
    except OSError:
        raise _SetupEnded("ended before its mounts could be checked") from None
    problems = mount_table_problems(mountinfo, plan, root=f"/proc/{shim}/root", sources=sources)
    if problems:
        raise SandboxUnavailable(
            f"{bwrap} built a sandbox whose mounts differ from the plan ({'; '.join(problems)}): "
            "nothing was run; this bwrap cannot be trusted, reinstall it"
        )


def _read_info(bwrap: str, info_fd: int, shim_sock: int) -> dict[str, Any]:
    """bwrap's info object, or a refusal if bwrap exits or stays silent first, or if the shim
    speaks first (bubblewrap reports the sandbox before anything runs in it)."""
    import json  # on the first launch: not on the import path of every launcher
    import select

    poller = select.poll()
    poller.register(info_fd, select.POLLIN)
    poller.register(shim_sock, select.POLLIN)
    received = b""
    deadline = time.monotonic() + INFO_TIMEOUT_SECONDS
    while True:
        events = dict(poller.poll(max(deadline - time.monotonic(), 0) * 1000))
        if info_fd not in events:
            if events:
                raise SandboxUnavailable(
                    f"{bwrap} ran the command without reporting a sandbox first: it is not a "
                    "bubblewrap nsconfine can trust"
                )
            raise SandboxUnavailable(
                f"{bwrap} did not report a sandbox within {INFO_TIMEOUT_SECONDS:g} s: it is not "
                "a working bubblewrap; reinstall it or point NSCONFINE_BWRAP at one"
            )
        chunk = os.read(info_fd, 4096)
        if not chunk:
            raise _SetupEnded("could not be created: bwrap exited first")
        received += chunk
        try:
            info = json.loads(received)
        except ValueError:
            continue  # bwrap writes the object in one go, but a pipe may split it
        if isinstance(info, dict) and isinstance(info.get("reaper-stage"), int):
            step = _syscalls.stage_syscall(info["reaper-stage"])
            raise SandboxUnavailable(
                f"cannot give the session its limits: {step}: "
                f"{os.strerror(info.get('reaper-errno', 0))}; `nsconfine check` says which "
                "limits this host enforces"
            )
        if isinstance(info, dict) and isinstance(info.get("reaper-errno"), int):
            raise SandboxUnavailable(
                f"cannot run {bwrap}: {os.strerror(info['reaper-errno'])}; reinstall "
                "bubblewrap or point NSCONFINE_BWRAP at a working one"
            )
        if not isinstance(info, dict) or not isinstance(info.get("child-pid"), int):
            raise SandboxUnavailable(f"{bwrap} reported no sandbox pid: it is not bubblewrap")
        return info


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as stat_file:
        return int(stat_file.read().rsplit(b")", 1)[1].split()[1])


def _namespaces(pid: int) -> dict[str, int]:
    return {name: os.stat(f"/proc/{pid}/ns/{name}").st_ino for name in own_namespaces()}


def _check_init(
    bwrap: str, reaper: int, child: int, info: dict[str, Any], own_network: bool
) -> int:
    """The sandbox's init is bwrap's child, bwrap is the reaper's, and its namespaces are new
    (the network's only when the plan gives it one of its own); bwrap's pid."""
    try:
        bwrap_pid = _parent(child)
        grandparent = _parent(bwrap_pid)
        theirs = _namespaces(child)
    except (OSError, ValueError, IndexError):
        raise _SetupEnded("ended during set-up") from None
    if grandparent != reaper:
        raise SandboxUnavailable(
            f"{bwrap} named pid {child} as its sandbox, but that is not its child: it is not "
            "a bubblewrap nsconfine can trust"
        )
    for name, own in own_namespaces().items():
        if name == "net" and not own_network:
            continue
        claimed = info.get(f"{name}-namespace", theirs[name])
        if theirs[name] == own or claimed != theirs[name]:
            raise SandboxUnavailable(
                f"{bwrap} left the sandbox in the launcher's {name} namespace (or misreported "
                "it): it does not confine; install Debian's bubblewrap or point "
                "NSCONFINE_BWRAP at a real one"
            )
    return bwrap_pid


def _await_shim(staged: Staged) -> int:
    """The shim's pid, from the kernel, once it says it is ready (the mounts are done)."""
    import select
    import struct

    poller = select.poll()
    poller.register(staged.sock.fileno(), select.POLLIN)
    poller.register(staged.reaper_pidfd, select.POLLIN)
    deadline = time.monotonic() + SETUP_TIMEOUT_SECONDS
    while True:
        left = deadline - time.monotonic()
        events = dict(poller.poll(max(left, 0) * 1000))
        if staged.sock.fileno() in events:
            break
        if events:
            raise _SetupEnded("failed to set up")
        if left <= 0:
            raise SandboxUnavailable(
                f"bwrap did not finish building the sandbox within {SETUP_TIMEOUT_SECONDS:g} s"
            )
    data, ancillary, _flags, _address = staged.sock.recvmsg(1, socket.CMSG_SPACE(12))
    if data == b"L":
        raise SandboxUnavailable(
            "the exec shim could not take the Landlock domain that keeps the command away from "
            "the sandbox's pid 1: nothing was run; `nsconfine check` shows this kernel's layers"
        )
    if data != b"R":
        raise _SetupEnded("failed to set up")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid, _uid, _gid = struct.unpack("iII", payload[:12])
            return int(pid)
    raise SandboxUnavailable("the exec shim's message carried no sender: cannot check it")


def _check_shim(bwrap: str, init: int, shim: int) -> None:
    """The process that will become the command is the sandbox init's child, in its
    namespaces (read now: bwrap enters a second user namespace after it reports the first)."""
    try:
        parent = _parent(shim)
        same = _namespaces(shim) == _namespaces(init)
    except (OSError, ValueError, IndexError):
        raise _SetupEnded("ended before its command could start") from None
    if parent != init or not same:
        raise SandboxUnavailable(
            f"the process that would run the command (pid {shim}) is not inside the sandbox "
            f"{bwrap} built: nothing was run; this bwrap cannot be trusted"
        )


def teardown(staged: Staged) -> int:
    """Kill a staged or failed sandbox and everything in it; reap the reaper; its status."""
    if staged.init_pidfd >= 0:
        _signal(staged.init_pidfd, signal.SIGKILL)
    _signal(staged.reaper_pidfd, signal.SIGTERM)
    staged.sock.close()
    try:
        _, status = os.waitpid(staged.reaper, 0)
    except ChildProcessError:  # reaped by the kernel: SIGCHLD came to be ignored since
        status = 0
    for fd in staged.pidfds():
        os.close(fd)
    staged.reaper_pidfd = staged.bwrap_pidfd = staged.init_pidfd = staged.command_pidfd = -1
    _sources.remove(staged.stubs)
    if staged.egress is not None:
        staged.egress.close()
    return os.waitstatus_to_exitcode(status)


def _signal(pidfd: int, number: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, number)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------ the hand-off


class StagedGone(Exception):
    """The staged sandbox ended before it took its command (expired or killed)."""


def _receive_terminal(staged: Staged, report_read: int) -> int:
    """The controller of the command's new terminal, sent by the shim ('T' and the fd), sized
    as the launcher's own terminal (else 24x80), after which the shim is told to go on ('G').
    -1 if the shim reported a failure (or ended) first."""
    import array
    import fcntl
    import select
    import struct
    import termios

    poller = select.poll()
    for fd in (staged.sock.fileno(), report_read, staged.command_pidfd):
        poller.register(fd, select.POLLIN)
    if staged.sock.fileno() not in dict(poller.poll()):
        return -1
    fds = array.array("i")
    # SO_PASSCRED is on: the credentials come along with the fd.
    space = socket.CMSG_SPACE(4) + socket.CMSG_SPACE(12)
    data, ancillary, _flags, _address = staged.sock.recvmsg(1, space)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if data != b"T" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise SandboxUnavailable("the exec shim did not send the command's terminal")
    controller = fds[0]
    size = struct.pack("HHHH", 24, 80, 0, 0)
    try:
        size = fcntl.ioctl(0, termios.TIOCGWINSZ, size)
    except OSError:
        pass  # the launcher has no terminal: the default
    try:
        os.set_inheritable(controller, False)
        fcntl.ioctl(controller, termios.TIOCSWINSZ, size)
        staged.sock.sendall(b"G", socket.MSG_NOSIGNAL)
    except BaseException as error:
        os.close(controller)
        if isinstance(error, (BrokenPipeError, ConnectionResetError)):
            raise StagedGone from None  # the shim died between 'T' and 'G'
        raise
    return controller


def _unread_by_peer(sock: socket.socket) -> int:
    """Bytes sent on sock that its peer has not read yet (SIOCOUTQ)."""
    import fcntl
    import struct
    import termios

    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])


class Launch:
    """A command checked and encoded for the shim, before any sandbox is taken for it."""

    __slots__ = ("argv", "fds", "message", "tty")

    def __init__(
        self, argv: Sequence[str], message: bytes, fds: list[int] | None, tty: bool = False
    ) -> None:
        self.argv = argv
        self.message = message  # the header and the NUL-separated argv and env
        self.fds = fds  # the stdio fds it carries; None: it gets a terminal of its own
        self.tty = tty  # the command gets a new terminal (and the launcher its controller)


def prepare_launch(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    stdio: Sequence[Stdio] = (None, None, None),
    tty: bool = False,
) -> Launch:
    """Check argv and env and encode them for the shim (UsageError: nothing was staged yet).
    Each of stdio is None (the launcher's own fd now), an fd or a file. tty: the command's
    stdio is a new terminal instead."""
    hold_closed_stdio()
    if (
        isinstance(argv, str | bytes)
        or not argv
        or not all(isinstance(arg, str | bytes | os.PathLike) for arg in argv)
    ):
        raise UsageError("argv must be a non-empty list of strings, the command and its args")
    items = [os.fsencode(arg) for arg in argv]
    for name, value in (env or {}).items():
        if not is_env_name(name) or not isinstance(value, str) or "\0" in value:
            raise UsageError(f"environment variable {name!r} has an invalid name or value")
        items.append(os.fsencode(f"{name}={value}"))
    body = b"\0".join(items) + b"\0"
    if body.count(0) != len(items):
        raise UsageError("an argument or environment value holds a NUL byte")
    if len(body) > SHIM_MAX_BODY:
        raise UsageError(f"argv and env take {len(body)} bytes; at most {SHIM_MAX_BODY}")
    mask = SHIM_TTY if tty else 0
    fds: list[int] = []
    if not tty:
        for number, (given, name) in enumerate(
            zip(stdio, ("stdin", "stdout", "stderr"), strict=True)
        ):
            fd = stdio_fd(given, name)
            if fd < 0:  # None: the launcher's own fd, as spawn's bwrap would inherit it
                if launcher_lacks(number):
                    mask |= SHIM_CLOSE_MASK & (0x10 << number)  # closed here: closed there too
                    continue
                fd = number
            mask |= 1 << number
            fds.append(fd)
    header = SHIM_HEADER.pack(SHIM_MAGIC, mask, len(argv), len(items) - len(argv), len(body))
    return Launch(argv, header + body, None if tty else fds, tty)


def hand_off(staged: Staged, launch: Launch) -> Sandbox:
    """Give a staged sandbox its command; return once the command has exec'd.

    OSError (errno, "execvp", argv[0]) if it cannot be exec'd: the sandbox is then gone.
    StagedGone if the sandbox ended before it took the command; SandboxUnavailable if the
    launcher has no fd left for the hand-off. Either way nothing is left half-launched."""
    import array

    if staged.ended():  # its shim could still take the command, and die with its sandbox
        teardown(staged)
        raise StagedGone
    message, fds = launch.message, launch.fds or []
    # What the session holds of the caller's: the command's stdio, and bwrap's stderr.
    terminals = _terminal.save([*fds, staged.stderr if staged.stderr >= 0 else 2])
    controller = -1  # the command's terminal, for a launch with tty

    def abandon() -> None:  # a half-launched sandbox is never left behind
        _terminal.restore(terminals)
        teardown(staged)
        if controller >= 0:
            os.close(controller)

    try:
        report_read, report_write = os.pipe2(os.O_CLOEXEC)
    except OSError as error:
        abandon()
        refuse_if_short_of_fds(error)
        raise SandboxUnavailable(
            f"cannot make the launch's pipe ({error.strerror}); nothing was run"
        ) from None
    try:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [report_write, *fds]))]
        try:
            sent = staged.sock.sendmsg([message], rights, socket.MSG_NOSIGNAL)
            if sent < len(message):  # a stream socket may take a large message in parts
                staged.sock.sendall(memoryview(message)[sent:], socket.MSG_NOSIGNAL)
        except (BrokenPipeError, ConnectionResetError):
            raise StagedGone from None
        finally:
            os.close(report_write)  # now only the shim holds it: EOF comes with its exec
        if launch.tty:
            controller = _receive_terminal(staged, report_read)
        report = _read_report(staged, report_read)
    except BaseException:
        abandon()
        raise
    finally:
        os.close(report_read)
    # "X" then EOF: exec'd. {errno, stage} (after "X" if exec itself failed): refused. EOF
    # alone: the shim was killed before it got that far, and its sandbox with it.
    executing = report[:1] == SHIM_EXECUTING
    failure = report[1:] if executing else report
    if executing and not failure:
        os.close(staged.bwrap_pidfd)  # the handle watches the reaper, init and command
        staged.bwrap_pidfd = -1
        staged.sock.close()
        staged.mark("exec")
        return Sandbox._launched(staged, terminals, controller)
    abandon()
    if not failure:
        raise StagedGone
    err, stage_number = SHIM_REPORT.unpack(failure.ljust(SHIM_REPORT.size, b"\0")[:8])
    syscall = SHIM_STAGES.get(stage_number, f"shim stage {stage_number}")
    filename = launch.argv[0] if stage_number == SHIM_EXEC_STAGE else None
    raise _syscalls.SyscallError(err, syscall, filename)


def _read_report(staged: Staged, report_read: int) -> bytes:
    """What the shim writes on the error pipe, up to its EOF. If the shim died with the message
    still queued on its socket, the pipe's write end would sit in that queue and EOF would
    never come: its pidfd says it is gone, and the unread bytes say it never took the message."""
    import select

    poller = select.poll()
    # No POLLIN: the pipe wakes this launcher once, at its EOF (POLLHUP, always reported), not
    # again for the bytes the shim writes before (its "X", or a report).
    poller.register(report_read, 0)
    poller.register(staged.command_pidfd, select.POLLIN)
    while True:
        events = dict(poller.poll())
        if report_read in events:
            report = b""
            while chunk := os.read(report_read, SHIM_REPORT.size + 1):
                report += chunk
            return report
        if events:
            if _unread_by_peer(staged.sock) > 0:
                raise StagedGone
            # It took the message: EOF comes (another thread's spawn child may hold a
            # copy of the write end for the instant before its exec).
            poller.unregister(staged.command_pidfd)
