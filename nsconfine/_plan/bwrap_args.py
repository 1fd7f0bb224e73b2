"""Plan → bwrap arguments: a pure function, golden-tested.

The launcher places fds at fixed numbers (see nsconfine._launch.stage), so the argument vector
depends on the plan alone and `nsconfine plan --bwrap-args` shows exactly what bwrap reads.
The options go in a sealed memfd read with `--args 3`, which keeps credential values out of
/proc/<pid>/cmdline; bwrap only takes the command on its real command line, after `--`. That
command is always nsconfine's exec shim (nsconfine._launch.programs), run from the memfd at fd 7 as
/proc/self/fd/7, which execs the session's own command once the launcher has checked the built
sandbox.
"""

from __future__ import annotations

from collections.abc import Sequence

from nsconfine._errors import PlanError
from nsconfine._plan.model import RELAY_PORT, RELAY_SOCKET, Entry, Kind, Mode, Plan, has_own_network

ARGS_FD = 3  # the memfd holding the NUL-separated options
INFO_FD = 4  # bwrap writes {"child-pid": N, …} here once the namespaces exist
SHIM_FD = 5  # the exec shim's socket to the launcher
SECCOMP_FD = 6  # the memfd holding the seccomp filter (`--seccomp 6`)
SHIM_PROGRAM_FD = 7  # the memfd holding the exec shim, which bwrap runs as /proc/self/fd/7
LIFELINE_FD = 8  # the reaper's end of the launcher's lifeline; bwrap never sees it
FIRST_DATA_FD = 9  # then one fd per data, copy or bind entry, in plan order

# Where the reaper mounts the session's sized tmpfs, in the mount namespace bwrap starts in
# (csrc/reaper.c's mount_tmpfs_shares): the i-th writable tmpfs of the plan at REAPER_TMPFS/i.
REAPER_TMPFS = "/dev/shm"

# bwrap's MAX_ARGS: the options it reads from --args and its command line, counted together.
MAX_BWRAP_ARGUMENTS = 9000

# Every namespace but the network's; cgroup where the kernel has it.
NAMESPACE_OPTIONS = (
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
)
# The UTS namespace's name: one /etc/hosts resolves, as tools expect of their host's (the JVM's
# getLocalHost fails on one it cannot), not the host's, which names the machine.
SESSION_HOSTNAME = "localhost"
PROCESS_OPTIONS = (
    "--hostname",
    SESSION_HOSTNAME,
    "--die-with-parent",  # the sandbox dies with bwrap (bwrap itself with the reaper)
    "--new-session",  # no TIOCSTI into the launcher's terminal
    "--cap-drop",
    "ALL",  # run as root, bwrap would otherwise keep the caller's capabilities
    "--clearenv",
)

# Options nsconfine's arguments use, checked against `bwrap --help` by preflight.
REQUIRED_OPTIONS = (
    "--args",
    *NAMESPACE_OPTIONS,
    "--disable-userns",
    "--hostname",
    "--unshare-net",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "--clearenv",
    "--setenv",
    "--chdir",
    "--info-fd",
    "--seccomp",
    "--bind",
    "--ro-bind",
    "--tmpfs",
    "--size",
    "--dev-bind",
    "--dir",
    "--symlink",
    "--proc",
    "--dev",
    "--ro-bind-data",
    "--perms",
    "--file",
    "--remount-ro",
)


def fd_entries(plan: Plan, *, bind_fds: bool = True) -> list[Entry]:
    """The entries the launcher hands over as fds, in fd order: a memfd per data entry, the
    opened host file per copy, and (bind_fds: when bwrap takes --bind-fd) the opened source of
    each bind."""
    kinds = (Kind.DATA, Kind.COPY, Kind.BIND) if bind_fds else (Kind.DATA, Kind.COPY)
    return [entry for entry in plan.entries if entry.kind in kinds]


def _entry_arguments(entry: Entry, data_fd: int, bind_fds: bool) -> tuple[str, ...]:
    match entry.kind:
        case Kind.BIND if bind_fds:
            option = "--ro-bind-fd" if entry.mode is Mode.RO else "--bind-fd"
            return (option, str(data_fd), entry.dest)
        case Kind.BIND:
            option = "--ro-bind" if entry.mode is Mode.RO else "--bind"
            return (option, entry.source, entry.dest)
        case Kind.TMPFS if entry.capacity is not None:
            return ("--size", str(entry.capacity), "--tmpfs", entry.dest)
        case Kind.TMPFS:
            return ("--tmpfs", entry.dest)
        case Kind.DEVPTS:
            # The launcher's child mounted the session's own devpts at /dev/pts, in the mount
            # namespace bwrap starts in: its old root's /dev/pts (the mount check makes sure).
            return ("--dev-bind", "/dev/pts", entry.dest)
        case Kind.DIR:
            return ("--dir", entry.dest)
        case Kind.SYMLINK:
            return ("--symlink", entry.source, entry.dest)
        case Kind.PROC:
            return ("--proc", entry.dest)
        case Kind.DEV:
            return ("--dev", entry.dest)
        case Kind.DATA:
            return ("--ro-bind-data", str(data_fd), entry.dest)
        case Kind.COPY:
            return ("--perms", f"{entry.perms:04o}", "--file", str(data_fd), entry.dest)
        case Kind.REMOUNT_RO:
            return ("--remount-ro", entry.dest)


def bwrap_options(
    plan: Plan,
    *,
    seccomp: bool = True,
    bind_fds: bool = True,
    disable_userns: bool = True,
    limits_by_reaper: bool = False,
) -> list[str]:
    """The options nsconfine writes to the `--args` memfd for plan, in order. bind_fds: each
    bind's source is an fd the launcher opened (`--bind-fd`), else its path (a bwrap without
    --bind-fd; the mount check after set-up then does the whole job). limits_by_reaper: the
    launch's reaper took the session's limits, which bwrap's options cannot state: it made the
    session's IPC namespace, with its System V limits (so no --unshare-ipc), and its writable
    tmpfs, each of a size and a number of files, which bwrap binds from REAPER_TMPFS/<i> (a
    launch always; off, bwrap makes them, as a printed or exported bwrap line does). seccomp
    and disable_userns are off only in the test suite's mutation twins
    (nsconfine._kernel.layers)."""
    namespaces = [o for o in NAMESPACE_OPTIONS if not limits_by_reaper or o != "--unshare-ipc"]
    arguments = [*namespaces, *PROCESS_OPTIONS]
    if has_own_network(plan.network):
        arguments.append("--unshare-net")  # a namespace of its own, loopback only
    if disable_userns:
        arguments.append("--disable-userns")
    for variable in plan.env:
        arguments += ("--setenv", variable.name, variable.value)
    arguments += ("--info-fd", str(INFO_FD))
    if seccomp:
        arguments += ("--seccomp", str(SECCOMP_FD))
    data_fd = FIRST_DATA_FD
    sized = 0  # the reaper's tmpfs taken so far
    for entry in plan.entries:
        if limits_by_reaper and _reaper_mounts(entry):
            arguments += ("--bind", f"{REAPER_TMPFS}/{sized}", entry.dest)
            sized += 1
            continue
        arguments += _entry_arguments(entry, data_fd, bind_fds)
        if entry.kind in (Kind.DATA, Kind.COPY) or (entry.kind is Kind.BIND and bind_fds):
            data_fd += 1
    arguments += ("--chdir", plan.chdir)
    return arguments


def shim_command(
    idle_timeout_ms: int, guard_pid_1: bool, open_files: int = 0, relay: bool = False
) -> list[str]:
    """The command bwrap runs: the exec shim, on its socket, waiting at most idle_timeout_ms;
    guard_pid_1: it takes a Landlock domain that keeps its command from pid 1; open_files > 0:
    the command's RLIMIT_NOFILE is at most that; relay (a "proxy" network): before the command
    runs it starts the loopback relay on 127.0.0.1:RELAY_PORT to RELAY_SOCKET."""
    command = [
        f"/proc/self/fd/{SHIM_PROGRAM_FD}",
        str(SHIM_FD),
        str(idle_timeout_ms),
        "1" if guard_pid_1 else "0",
        str(open_files),
    ]
    if relay:
        command += (str(RELAY_PORT), RELAY_SOCKET)
    return command


def bwrap_command_line(bwrap: str, argv: Sequence[str]) -> list[str]:
    """bwrap's own argv: read the options from fd 3, then `--` and the command."""
    return [bwrap, "--args", str(ARGS_FD), "--", *argv]


def sized_tmpfs(plan: Plan) -> list[int]:
    """The capacity of each writable tmpfs of plan, in plan order: those the reaper mounts,
    the i-th of which bwrap_options binds from REAPER_TMPFS/i."""
    sized = [entry for entry in plan.entries if _reaper_mounts(entry)]
    return [entry.capacity for entry in sized if entry.capacity is not None]  # (all of them)


def _reaper_mounts(entry: Entry) -> bool:
    """Is entry a writable tmpfs (one the plan sizes), which a launch's reaper mounts?"""
    return entry.kind is Kind.TMPFS and entry.capacity is not None


def reaper_command_line(
    reaper: str,
    bwrap_argv: Sequence[str],
    limits: Sequence[str] | None = None,
    holds_fd: int | None = None,
) -> list[str]:
    """The reaper's argv: its lifeline and the info fd it reports on, the session's limits it
    takes in a user and an IPC namespace of the session's own before it starts bwrap
    (nsconfine._kernel.layers.session_limits' fields; "-": none), the first of the
    fds that hold the session's mount points, which it keeps for the session's life and bwrap
    never gets ("-": none), then bwrap's argv."""
    share = "-" if limits is None else ",".join(limits)
    holds = "-" if holds_fd is None else str(holds_fd)
    return [reaper, str(LIFELINE_FD), str(INFO_FD), share, holds, *bwrap_argv]


def encode_options(options: Sequence[str]) -> bytes:
    """The NUL-terminated form bwrap's `--args` reads."""
    try:
        encoded = b"".join(option.encode("utf-8", "surrogateescape") + b"\0" for option in options)
    except UnicodeEncodeError:  # a lone surrogate: no byte string carries it
        raise PlanError(
            "an option holds a character no byte string can (a lone surrogate)"
        ) from None
    if encoded.count(0) != len(options):  # a NUL inside an option would split it in two
        raise PlanError("an option holds a NUL byte; refusing to hand bwrap a forged option")
    return encoded
