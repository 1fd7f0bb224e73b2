"""Staging: build a sandbox for a plan and check it with the launcher's own eyes; only then
does it get its command (nsconfine._launch.handoff). No lint here (nsconfine._gate's gate
does that before every launch).

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
       9…   one fd per data, copy or bind entry, in plan order
       then the holds on the session's mount points in its workspace (nsconfine._launch.sources:
            a shared lock each), which the reaper keeps from bwrap and holds until it exits:
            the launcher keeps no fd per mount point
   The reaper ends the session once bwrap ends, once it gets SIGTERM, or once the lifeline
   reaches EOF (every copy of its write end, held by the launcher process, is closed): the
   launcher's death ends its sessions however it died, from whichever thread it launched.
2. bwrap reports the sandbox's pid on the info pipe once the namespaces exist. The launcher
   checks in /proc that this pid is bwrap's child (and bwrap the reaper's), and that its
   namespaces are new.
3. bwrap builds the mounts and runs the exec shim, which says it is ready on its socket; the
   kernel attaches its pid (SCM_CREDENTIALS). The launcher checks that the shim lives in the
   sandbox, and that the sandbox's mount table is exactly the plan (steps 2 and 3's checks are
   nsconfine._launch.confirm's). The sandbox is now staged: built and checked, waiting for a
   command.
4. nsconfine._launch.handoff gives it its command; the shim execs it.
"""

from __future__ import annotations

# The C module socket.py wraps: all a launch needs (a socketpair, SCM_RIGHTS), without
# socket.py's start-up (its enums and selectors, ~3 ms of every CLI run).
import _socket as socket
import fcntl
import os
import select
import stat
import time

# signal's own C module: importing signal imports enum (~1-2 ms of every command line's start)
from _signal import SIGKILL, SIGTERM, pidfd_send_signal  # type: ignore[import-not-found]
from _thread import allocate_lock
from collections.abc import Callable, Mapping

from nsconfine._errors import PlanError, SandboxUnavailable, UsageError, refuse_if_short_of_fds
from nsconfine._kernel import layers as _layers
from nsconfine._kernel import syscalls as _syscalls
from nsconfine._kernel.mountinfo import watched_mountinfo
from nsconfine._launch import egress as _egress
from nsconfine._launch import own_fds
from nsconfine._launch import sources as _sources
from nsconfine._launch.confirm import (
    SetupEnded,
    await_shim,
    check_init,
    check_shim,
    mount_table_problems,
    read_info,
)
from nsconfine._launch.programs import REAPER_PATH, SHIM_PATH, program_fd
from nsconfine._plan.bwrap_args import (
    bwrap_command_line,
    bwrap_options,
    encode_options,
    fd_entries,
    reaper_command_line,
    shim_command,
    sized_tmpfs,
)
from nsconfine._plan.limits import tmpfs_shape
from nsconfine._plan.model import Kind, Mode, Plan, has_own_network
from nsconfine._text import inside, printable

TYPE_CHECKING = False  # typing costs launchers milliseconds of import; mypy reads this block
if TYPE_CHECKING:
    from typing import IO, Any, Final

    from nsconfine._plan.protect import Seen

    Stdio = int | IO[Any] | None
    Identity = tuple[int, int]

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
    """The fd of a stdio argument: -1 for None (inherit), else the fd or the file's fileno(),
    which must be open. UsageError for anything else, before anything is staged."""
    if value is None:
        return -1
    if isinstance(value, bool) or not (isinstance(value, int) or hasattr(value, "fileno")):
        raise UsageError(f"{name} must be None, a file descriptor or a file object")
    if isinstance(value, int):
        fd = value
        if fd < 0:
            raise UsageError(f"{name} must be None, a file descriptor or a file object")
    else:
        try:
            fd = value.fileno()
        except (ValueError, OSError, AttributeError) as error:  # closed, or no fd at all
            raise UsageError(f"{name}: the file object is closed or has no fd ({error})") from None
        if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
            raise UsageError(f"{name}: the file object has no fd (its fileno() gave {fd!r})")
    try:
        info = os.fstat(fd)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except (OSError, OverflowError):
        raise UsageError(f"{name} is {fd}, which is not an open file descriptor") from None
    problem = _not_a_stream(info, flags)
    if problem:
        raise UsageError(f"{name} is fd {fd}, {problem}: give a file, a pipe, a socket or a device")
    return fd


def _not_a_stream(info: os.stat_result, flags: int) -> str:
    """What makes an fd with this fstat and these status flags no stdio for a session ("" if
    nothing): one that reaches past the sandbox from inside it, or is the launcher's own."""
    if flags & os.O_PATH:
        return "opened with O_PATH: a session could open the file or tree it names through it"
    if stat.S_ISDIR(info.st_mode):
        return "a directory: a session could open what lies around it on the host through it"
    if stat.S_IFMT(info.st_mode) not in _STREAM_KINDS:  # (anonymous inodes have no kind)
        return "no file, pipe, socket or device (a pidfd, an eventfd, an epoll instance ...)"
    if info.st_dev == _PROC_DEVICE:
        return "a file of /proc, which acts on the process that opened it (its memory, its limits)"
    if own_fds.is_held(info):
        return (
            "a file the launcher holds for another session (its shim's socket, its traffic on "
            "the proxy, its audit file): an fd number the caller closed, reused"
        )
    return ""


def _proc_device() -> int:
    try:
        return os.stat("/proc/self").st_dev
    except OSError:  # (no /proc: no launch gets far, and says so)
        return -1


_PROC_DEVICE = _proc_device()
_STREAM_KINDS = frozenset({stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK})


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

_compiled: dict[int, tuple[Plan, tuple[bool, bool, bool, bool], bytes]] = {}


def compiled_options(plan: Plan, seccomp: bool, bind_fds: bool, limits_by_reaper: bool) -> bytes:
    """The plan's options, encoded once per plan object (plans are immutable)."""
    userns_off = _layers.disables_userns(plan.nested_userns is not None)
    switches = (seccomp, bind_fds, userns_off, limits_by_reaper)
    hit = _compiled.get(id(plan))
    if hit is not None and hit[0] is plan and hit[1] == switches:
        return hit[2]
    encoded = encode_options(
        bwrap_options(
            plan,
            seccomp=seccomp,
            bind_fds=bind_fds,
            disable_userns=userns_off,
            limits_by_reaper=limits_by_reaper,
        )
    )
    if len(_compiled) >= 64:
        _compiled.clear()
    _compiled[id(plan)] = (plan, switches, encoded)  # kept: its id stays its own
    return encoded


class Staged:
    """A sandbox built and checked, whose shim waits for its command."""

    __slots__ = (
        "bind_paths",
        "bound",
        "bwrap_pidfd",
        "command_pid",
        "command_pidfd",
        "egress",
        "host_watch",
        "info_fd",
        "init_pid",
        "init_pidfd",
        "mount_watch",
        "mounts_changed",
        "plan",
        "read_only",
        "reaper",
        "reaper_pidfd",
        "seen",
        "sock",
        "sock_identity",
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
        # What the launch's look at the writable trees saw (protect.refreshed_and_seen), which
        # the report after the session judges "moved into view" by.
        self.seen: Seen = ()
        # Each read-only bind inside a writable one, and all it holds, as checked at staging
        # (None: too many to keep; a launch then stages afresh, checking them as spawn does).
        self.read_only: _syscalls.PathIdentities | None = None
        # Each bind's source (but those read_only has) and the file bound there, which a
        # launch looks at again (None: not kept staged, never asked).
        self.bind_paths: _syscalls.PathIdentities | None = None
        self.reaper = reaper
        self.reaper_pidfd = reaper_pidfd
        self.sock = sock
        self.sock_identity = own_fds.hold(sock.fileno())  # no session's stdio while open
        self.init_pid = self.init_pidfd = self.command_pid = self.command_pidfd = -1
        self.bwrap_pidfd = -1  # bwrap's own process, outside the sandbox; only until hand-off
        self.started = time.perf_counter()
        self.timings: dict[str, float] = {}
        self.usable_until = 0.0
        self.stderr = -1  # bwrap's fd 2 (-1: the launcher's)
        self.info_fd = -1
        self.mount_watch = -1  # the sandbox's mountinfo, as read to be checked; until hand-off
        self.host_watch = -1  # the launcher's, opened before the reaper copied it; as long
        self.mounts_changed = False  # what a poll of the two reported once: it stays so
        self.stubs: list[_sources.Stub] = []
        self.egress: _egress.Egress | None = None  # its socket on the launcher's proxy

    def close_socket(self) -> None:
        """Close the launcher's end of the shim's socket (after the hand-off, or to end it)."""
        own_fds.release(self.sock_identity)
        self.sock.close()

    def mark(self, stage: str) -> None:
        """Record when stage was reached, in seconds since the launch began."""
        self.timings[stage] = time.perf_counter() - self.started

    def pidfds(self) -> list[int]:
        """The pidfds this staged sandbox holds."""
        held = (self.reaper_pidfd, self.bwrap_pidfd, self.init_pidfd, self.command_pidfd)
        return [fd for fd in held if fd >= 0]

    def mounts_unchanged(self) -> bool:
        """Is the sandbox's mount table still the one checked when it was staged, and the
        launcher's the one it was copied from? The kernel detaches a mount whose file the host
        replaces or removes (`git config` renames config.lock over .git/config; a checkout
        removes .vscode and makes it again; an editor rewrites a masked .env), and the new file
        at its path is then the session's to read and write. (No file's identity tells that
        apart: once its mount is gone nothing holds the old file, and a new one may get its
        inode number back at once.) And the sandbox's mounts are private copies of the host's,
        taken as it was staged: a volume the host unmounted or covered since is still there.
        Each mountinfo fd marks any change since it was opened: one poll, which clears the
        marks it reports, so its answer is kept."""
        if self.mount_watch < 0 or self.host_watch < 0 or self.mounts_changed:
            return False
        watcher = select.poll()
        watcher.register(self.mount_watch, select.POLLPRI)
        watcher.register(self.host_watch, select.POLLPRI)
        self.mounts_changed = bool(watcher.poll(0))
        return not self.mounts_changed

    def binds_unchanged(self) -> bool:
        """Does each bind's path still name the file or directory this sandbox binds there? A
        broker may move a task's workspace (or run directory, or a read-only directory it
        shows) away and put a fresh one at its path: the sandbox would show the one moved
        away, and its mount table would not change."""
        return self.bind_paths is not None and not self.bind_paths.any_changed()

    def read_only_unchanged(self) -> bool:
        """Is each read-only bind inside a writable one, and all it holds, as it was checked?
        Another session of the workspace (one that does not protect a repository made during
        it) may move a protected file aside and put its own at its path, give it a second
        name, or put a hook leading out into a protected directory: the sandbox's bind follows
        the file moved, and the mount table does not change."""
        return self.read_only is not None and not self.read_only.any_changed()

    def stop_watching_mounts(self) -> None:
        """Close the mountinfo fds (at the hand-off: a live session holds none)."""
        for fd in (self.mount_watch, self.host_watch):
            if fd >= 0:
                os.close(fd)
        self.mount_watch = self.host_watch = -1

    def ended(self) -> bool:
        """Has the reaper, bwrap or the sandbox's init exited (the sandbox expired, failed or
        was killed)? A sandbox whose bwrap is gone may live on, but no status would come back
        from it: it is never handed a command."""
        watcher = select.poll()
        for fd in (self.reaper_pidfd, self.bwrap_pidfd, self.init_pidfd):
            if fd >= 0:
                watcher.register(fd, select.POLLIN)
        return bool(watcher.poll(0))


def open_entry_fds(
    plan: Plan, fds: list[int], opened: dict[str, int] | None = None, bind_fds: bool = False
) -> None:
    """Append to fds, in fd order, a sealed memfd per data entry, a sealed snapshot of each
    copy's opened source, and (bind_fds: bwrap takes --bind-fd) each bind's opened source. The
    sources the launch opened (opened: dest -> fd, see sources.open_for_launch) are taken out
    of it, so that a launch holds each fd once; a copy not among them is opened here (the
    bench's floor). On failure the caller closes what was appended."""
    entries = fd_entries(plan, bind_fds=bind_fds)
    copied = 0
    for entry in entries:
        if entry.kind is Kind.DATA:
            assert entry.content is not None
            fds.append(_syscalls.memfd_sealed("nsconfine-data", entry.content))
        elif entry.kind is Kind.BIND:
            assert opened is not None
            fds.append(opened.pop(entry.dest))
        else:
            assert entry.source is not None
            if opened is not None and entry.dest in opened:
                source = opened.pop(entry.dest)
            else:
                source = _sources.open_copy_source(entry.source)
            try:
                size = os.fstat(source).st_size
                copied += size
                if copied > MAX_COPIED_BYTES:
                    raise PlanError(
                        f"the runner files to copy hold more than {MAX_COPIED_BYTES >> 20} MiB "
                        f"with {printable(entry.source)} ({size} bytes): bind the directory "
                        "that holds the large ones instead (--ro DIR)"
                    )
                fds.append(_sealed_copy(source, size))
            finally:
                os.close(source)


# What a launch copies of its runner files, in all (a copy is held in memory): past it, the
# launch is refused. A file a writer grew (sparse, terabytes cost it nothing) would be copied.
MAX_COPIED_BYTES = 256 << 20


def _sealed_copy(source: int, size: int) -> int:
    """A memfd holding source's first size bytes (fewer, if it shrank), sealed, read from its
    start: what bwrap copies into the sandbox is what the launch opened and measured, however a
    writer of the file goes on (bwrap reads a file to its end)."""
    copy = os.memfd_create("nsconfine-copy", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        offset = 0
        while offset < size and (sent := os.sendfile(copy, source, offset, size - offset)):
            offset += sent
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(copy, fcntl.F_ADD_SEALS, seals)
        os.lseek(copy, 0, os.SEEK_SET)
    except BaseException:
        os.close(copy)
        raise
    return copy


def _make_room_for(count: int) -> None:
    """Room for a launch that hands bwrap count fds, called before any is opened: the launcher
    holds each, and the spawn's child a second copy of each as it places them, so a plan that
    copies a thousand runner files holds two thousand fds at once, past the usual soft limit of
    1,024. From 64 on the soft limit is raised to the hard one (the user's real bound) where
    the launch and what the launcher holds now would not fit; a plan that could not fit even in
    a launcher holding nothing else is refused. (One that fits alone but not beside other
    launches in flight is refused as any launch short of fds is: sandbox-unavailable.)"""
    if count < 64:
        return
    import resource

    alone = 2 * count + 128  # and the pipes, memfds and programs a launch opens besides
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and alone > hard:
        raise PlanError(
            f"the plan hands bwrap {count} fds (its runner files' copies and binds), and a "
            f"launch takes about {alone} (two of each), but only {hard} may be open: raise "
            "`ulimit -Hn`, or bind the directory that holds the runner files instead"
        )
    if soft != resource.RLIM_INFINITY and alone + len(os.listdir("/proc/self/fd")) > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def stage(
    bwrap: str,
    plan: Plan,
    *,
    lint: Callable[[], Mapping[str, Identity | None]] | None = None,
    bind_fds: bool = True,
    stderr: int = -1,
    idle_timeout_ms: int = SPAWN_SHIM_TIMEOUT_MS,
    kept: bool = False,
) -> Staged:
    """Build plan's sandbox under bwrap with the exec shim waiting inside; return once the
    sandbox is checked (namespaces, shim, mount table). lint: the plan's own checks (the
    gate's lint()), run while bwrap builds the sandbox, which no command enters unless they
    pass; what it judged is checked against the sources opened. bind_fds: bwrap takes
    --bind-fd; stderr: bwrap's fd 2, for its own messages (-1: the launcher's); kept: the
    sandbox waits to be asked whether it is still current (Staged.read_only_unchanged)."""
    plan, egress = _egress.attach(plan)  # a proxy network's socket, for this sandbox
    try:
        _make_room_for(len(fd_entries(plan, bind_fds=bind_fds)))  # before any is opened
        # A sandbox handed its command at once (spawn's) is never asked again (~60 us)
        read_only_seen = _sources.ReadOnlySeen() if kept else None
        stubs, sources = _sources.open_for_launch(plan, read_only_seen)
    except BaseException:
        if egress is not None:
            egress.close()
        _lint_first(lint)  # a refusal of the plan explains more than what it led to
        raise
    # Until a Staged watches the reaper, its pid is in spawned: whatever interrupts the launch
    # (a KeyboardInterrupt on any line) ends it from there, or by teardown once there is one.
    spawned = _syscalls.spawn_result()
    staged: Staged | None = None
    try:
        try:
            # What the lint judged is checked against every source opened; the mount table
            # against the binds' alone (a copy is a file of its own in the sandbox).
            identities = {dest: _fd_identity(fd) for dest, fd in sources.items()}
            binds = {e.dest for e in plan.entries if e.kind is Kind.BIND}
            bound = {dest: _bound_identity(fd) for dest, fd in sources.items() if dest in binds}
            staged = _start(
                bwrap,
                plan,
                sources,
                bind_fds,
                _sources.holds(stubs),
                stderr,
                idle_timeout_ms,
                spawned,
            )
        finally:
            for fd in sources.values():
                os.close(fd)
        staged.stubs = stubs
        staged.egress = egress
        staged.bound = bound
        if kept:
            staged.bind_paths = _bind_paths(plan, bound)
        if read_only_seen is not None and read_only_seen.complete:
            staged.read_only = _syscalls.PathIdentities(read_only_seen.seen)
        _sources.hand_over(stubs)  # the reaper holds them now
        if lint is not None:  # bwrap is building the sandbox meanwhile
            _sources.check_judged(plan, identities, lint())
            staged.mark("linted")
        if egress is not None:
            egress.open_audit(plan.audit)  # once the lint has judged its path
        _confirm(bwrap, plan, staged, {d: i for d, i in identities.items() if d in binds})
        if egress is not None:  # its relay's network, and no other, may use its socket
            egress.admit_only(_network_of(staged.command_pid, staged.command_pidfd))
        staged.mark("confirmed")
        staged.usable_until = time.monotonic() + idle_timeout_ms / 1000 * 0.9
    except SetupEnded as ended:
        assert staged is not None  # (raised only once there is one)
        status = teardown(staged)
        raise SandboxUnavailable(
            f"the sandbox {ended} (bwrap's status {status}); bwrap's message is on the "
            "session's stderr: \"Can't fork\" there means the session's account (or the "
            "launcher's service, by its TasksMax) is at its process limit, and a launch once "
            "fewer run succeeds; for anything else `nsconfine check --fresh` explains what to fix"
        ) from None
    except BaseException:
        if staged is not None:
            staged.stubs, staged.egress = stubs, egress  # (however far it got)
            teardown(staged)
        else:
            _end_unwatched(spawned)
            _sources.remove(stubs)
            if egress is not None:
                egress.close()
            _lint_first(lint)
        raise
    finally:
        if staged is not None:
            os.close(staged.info_fd)
    return staged


def _network_of(pid: int, pidfd: int) -> int:
    """The network namespace (inode) of the process pid, which pidfd holds: read while it
    lives, so that its number is no other's."""
    try:
        network = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        network = -1
    if network < 0 or _syscalls.wait_fd(pidfd, 0):
        raise SetupEnded("ended before its network could be checked")
    return network


def _lint_first(lint: Callable[[], object] | None) -> None:
    """Run lint, if given, so that its refusal is the one raised."""
    if lint is not None:
        lint()


def _seccomp_program(plan: Plan) -> bytes | None:
    return _layers.seccomp_program(plan.nested_userns is not None, has_own_network(plan.network))


def _fd_identity(fd: int) -> Identity:
    info = os.fstat(fd)
    return (info.st_dev, info.st_ino)


def _bound_identity(fd: int) -> tuple[int, int, int]:
    info = os.fstat(fd)
    return (info.st_dev, info.st_ino, info.st_ctime_ns)


def _bind_paths(plan: Plan, bound: Mapping[str, tuple[int, int, int]]) -> _syscalls.PathIdentities:
    """Each bind's source and the file bound there (Staged.binds_unchanged), but for the
    binds inside a writable one (Staged.read_only: each, with all it holds) and those of /proc
    and /sys (the kernel's own files, which no one moves or replaces; a third of a default
    plan's binds, at a microsecond or two each on every launch)."""
    writable = [e.dest for e in plan.entries if e.kind is Kind.BIND and e.mode is Mode.RW]
    return _syscalls.PathIdentities(
        [
            (entry.source, (*bound[entry.dest][:2], 0, 0))
            for entry in plan.entries
            if entry.kind is Kind.BIND
            and entry.dest in bound
            and not entry.source.startswith(("/proc/", "/sys/"))
            and not any(inside(entry.dest, top) is not None for top in writable)
        ],
        same_file=True,
    )


def _close_opened(*fds: int) -> None:
    """Close each of fds that was opened (-1: not yet)."""
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def _start(
    bwrap: str,
    plan: Plan,
    sources: dict[str, int],
    bind_fds: bool,
    holds: list[int],
    stderr: int,
    idle_timeout_ms: int,
    spawned: Any,
) -> Staged:
    """Spawn the reaper with bwrap's fds in place (see the module's docstring): the sources
    the launch opened (each copy's, and with bind_fds each bind's, taken out of sources), and
    after them the holds on the session's mount points, which the reaper keeps for the
    session's life (the caller still owns the launcher's copies). The reaper's pid lands in
    spawned (a spawn_result()): a launch interrupted before it has the Staged returned ends
    the reaper from there (_end_unwatched)."""
    seccomp = _seccomp_program(plan)
    limits = _session_limits(plan)
    options = compiled_options(plan, seccomp is not None, bind_fds, limits is not None)
    flags, uid, gid = _layers.spawn_flags(plan.user)
    shim = shim_command(
        idle_timeout_ms,
        _layers.shim_guards_pid_1(),
        plan.limits.open_files,
        relay=plan.network == "proxy",
    )
    reaper_fd, shim_fd = program_fd(REAPER_PATH), program_fd(SHIM_PATH)
    bwrap_argv = bwrap_command_line(bwrap, shim)
    launcher_end, shim_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # The kernel then attaches the sender's pid to what the shim sends: its own, translated.
    launcher_end.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    child_side: list[int] = []  # given to the reaper, closed here once it has them
    info_read = devnull = host_watch = -1
    try:
        # Opened before the reaper copies the launcher's mounts: any change since is marked
        host_watch = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        devnull = _devnull_above_stdio()
        child_side.append(_syscalls.memfd_sealed("nsconfine-args", options))
        info_read, info_write = os.pipe2(os.O_CLOEXEC)
        child_side.append(info_write)
        child_side.append(shim_end.fileno())
        child_side.append(_syscalls.memfd_sealed("nsconfine-seccomp", seccomp or b""))
        child_side.append(shim_fd)
        child_side.append(_lifeline_read_end())
        open_entry_fds(plan, child_side, sources, bind_fds)
        holds_fd = 3 + len(child_side) if holds else None  # pass_fds land at 3, 4, …
        command = reaper_command_line(REAPER_PATH, bwrap_argv, limits, holds_fd)
        started = time.perf_counter()
        reaper = _syscalls.spawn(
            os.fsencode(REAPER_PATH),
            [os.fsencode(a) for a in command],
            (),  # bwrap gets an empty environment; the session's is in the options
            stdin=devnull,
            stdout=devnull,
            stderr=stderr,
            pass_fds=[*child_side, *holds],
            flags=flags,
            uid=uid,
            gid=gid,
            exec_fd=reaper_fd,
            landlock_fd=_layers.landlock_ruleset(),
            result=spawned,
        )
    except _syscalls.SyscallError as error:
        _close_opened(info_read, host_watch)
        launcher_end.close()
        refuse_if_short_of_fds(error)
        raise SandboxUnavailable(
            f"cannot start bwrap as {plan.user.name}: {error.strerror} ({error.syscall})"
        ) from None
    except BaseException:
        _close_opened(info_read, host_watch)
        launcher_end.close()
        raise
    finally:
        shim_end.close()
        if devnull >= 0:
            os.close(devnull)
        # Not the socket's (closed above), nor the shim's program or the lifeline (kept).
        for fd in child_side[:2] + child_side[3:4] + child_side[6:]:
            os.close(fd)
    # The reaper, just exec'd, waits on this CPU while the launcher runs on (the lint, ~1.3
    # ms): the kernel seldom moves it to an idle CPU that soon. Yielding lets it start bwrap
    # first, which then builds the sandbox alongside the lint: a cold launch took 1.0-1.4 ms
    # less on a 2-CPU VM. Free when nothing waits; after the fds above are closed, so that
    # launches from other threads never find them all still open.
    try:
        os.sched_yield()
        reaper_pidfd = os.pidfd_open(reaper)
        staged = Staged(plan, reaper, reaper_pidfd, launcher_end)
    except BaseException as error:  # (a KeyboardInterrupt too: the reaper must not be left)
        _end_unwatched(spawned)
        _close_opened(info_read, host_watch)
        launcher_end.close()
        if isinstance(error, OSError):
            raise SandboxUnavailable(
                f"cannot watch the sandbox: pidfd_open: {error.strerror}; nothing was run "
                "(nsconfine needs pidfds: Linux 5.3 or later, with no seccomp filter refusing "
                "them)"
            ) from error
        raise
    staged.started = started
    staged.stderr = stderr
    staged.info_fd = info_read
    staged.host_watch = host_watch
    staged.mark("started")
    return staged


def _end_unwatched(spawned: Any) -> None:
    """End the reaper a launch started and does not watch yet (its pid in spawned; -1: none):
    it is this launcher's child, not yet waited for, so its pid is still its own; SIGTERM has
    it kill bwrap and all below. Reaped here, and forgotten."""
    reaper, spawned[0] = spawned[0], -1
    if reaper > 0:
        os.kill(reaper, SIGTERM)
        os.waitpid(reaper, 0)


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


def _session_limits(plan: Plan) -> list[str] | None:
    """The limits the reaper takes for plan (nsconfine._kernel.layers.session_limits)."""
    ptys = next((e.capacity or 0 for e in plan.entries if e.kind is Kind.DEVPTS), 0)
    limits = plan.limits
    return _layers.session_limits(
        limits.processes,
        ptys,
        limits.inotify_instances,
        limits.inotify_watches,
        limits.sysv_shm_pages(),
        [tmpfs_shape(capacity) for capacity in sized_tmpfs(plan)],
    )


def _confirm(bwrap: str, plan: Plan, staged: Staged, sources: Mapping[str, Identity]) -> None:
    info = read_info(bwrap, staged.info_fd, staged.sock.fileno())
    child: int = info["child-pid"]
    try:
        staged.init_pidfd = os.pidfd_open(child)
    except ProcessLookupError:
        raise SetupEnded("ended before it could be checked") from None
    staged.init_pid = child
    bwrap_pid = check_init(bwrap, staged.reaper, child, info, has_own_network(plan.network))
    try:
        staged.bwrap_pidfd = os.pidfd_open(bwrap_pid)
    except ProcessLookupError:
        raise SetupEnded("ended during set-up") from None
    staged.mark("namespaces")
    shim, filter_answered = await_shim(staged.sock, staged.reaper_pidfd)
    try:
        staged.command_pidfd = os.pidfd_open(shim)
    except ProcessLookupError:
        raise SetupEnded("ended before its command could start") from None
    staged.command_pid = shim
    staged.mark("built")  # bwrap has made every mount, and the shim is waiting
    # (the filter bwrap was given, as _start asked for it: cached, the very decision)
    filtered = _seccomp_program(plan) is not None
    check_shim(bwrap, child, shim, filtered, filter_answered)
    try:
        staged.mount_watch, mountinfo = watched_mountinfo(shim)
    except OSError:
        raise SetupEnded("ended before its mounts could be checked") from None
    problems = mount_table_problems(
        mountinfo,
        plan,
        root=f"/proc/{shim}/root",
        sources=sources,
        limits_taken=_layers.session_limits_taken(),
    )
    if problems:
        raise SandboxUnavailable(
            f"{bwrap} built a sandbox whose mounts differ from the plan ({'; '.join(problems)}): "
            "nothing was run. A session changing a bound place while the sandbox was built does "
            "this (launch again); if every launch is refused so, this bwrap cannot be trusted: "
            "reinstall it"
        )


def teardown(staged: Staged) -> int:
    """Kill a staged or failed sandbox and everything in it; reap the reaper; its status.
    The reaper is told first, as Sandbox.kill() tells it: with its init killed first, bwrap
    could exit 137 on its own, and the status reported be that rather than the kill's."""
    _signal(staged.reaper_pidfd, SIGTERM)
    if staged.init_pidfd >= 0:
        _signal(staged.init_pidfd, SIGKILL)
    staged.close_socket()
    try:
        _, status = os.waitpid(staged.reaper, 0)
    except ChildProcessError:  # reaped by the kernel: SIGCHLD came to be ignored since
        status = 0
    for fd in staged.pidfds():
        os.close(fd)
    staged.stop_watching_mounts()
    staged.reaper_pidfd = staged.bwrap_pidfd = staged.init_pidfd = staged.command_pidfd = -1
    _sources.remove(staged.stubs)
    if staged.egress is not None:
        staged.egress.close()
    return os.waitstatus_to_exitcode(status)


def _signal(pidfd: int, number: int) -> None:
    try:
        pidfd_send_signal(pidfd, number)
    except ProcessLookupError:
        pass
