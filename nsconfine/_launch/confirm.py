"""The whole-truth check: does a sandbox's mount table hold exactly the plan's mounts?

Run on every launch, before the command may exec, against /proc/<pid>/mountinfo of the process
that will become the command. Every mount point must be one the plan sets up, or one of two
kinds the plan implies, each judged by what it is: a mount bwrap makes itself inside a new /dev
(the host's null, zero, full, random, urandom and tty, each the host's very device; a devpts of
its own at pts) or a new /proc (a read-only cover of sys, sysrq-trigger, irq or bus, from that
/proc itself); or a mount the host has below a bound directory, which a recursive bind carries
in (showing what the host's mount there shows: its device, root and type; made nosuid and
nodev, read-only below a read-only bind, or left as the host has it where the session's
account cannot reach it). Every mount the plan sets up must be there, and be the mount a path
there reaches (not hidden under a mount made later over a directory above it); each must be
read-only or writable as the plan says, nosuid, and nodev but for a devpts; and each must be
what the plan says: a new tmpfs, proc or devpts, seen from its top (a tmpfs of the size the
plan gives it; a mask's, with no size, none the host has), the session's own devpts (holding
the ptys the plan allows, and not the host's: a devpts bound in from the launcher's namespace
would show the host's terminals), a data file bwrap wrote on the sandbox's root (holding the
plan's number of bytes), or, for a bind, the very file or directory of its source: the
launcher looks at the destination through the sandbox's own root (/proc/<pid>/root) and
compares device and inode with the source's.
"""

from __future__ import annotations

import _socket as socket  # the C module socket.py wraps (see nsconfine/_launch/stage.py)
import errno
import os
import stat
import time
from collections.abc import Callable, Mapping

from nsconfine._errors import SandboxUnavailable
from nsconfine._interrupts import WAIT_TICK_SECONDS, stop_if_interrupted
from nsconfine._kernel import syscalls as _syscalls
from nsconfine._kernel.accounts import RunAs
from nsconfine._kernel.mountinfo import Mount, MountTree, read_mountinfo
from nsconfine._plan.limits import tmpfs_shape
from nsconfine._plan.model import Entry, Kind, Plan
from nsconfine._text import inside

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import Any, Final

# What a launch must see differ from the launcher's own ("net" too, for a network of its own).
CONFINING_NAMESPACES: Final = ("user", "mnt", "pid", "ipc", "uts", "cgroup", "net")
INFO_TIMEOUT_SECONDS: Final = 10.0
SETUP_TIMEOUT_SECONDS: Final = 120.0  # 10,000 copied files take bwrap seconds


class SetupEnded(Exception):
    """bwrap, or its sandbox, ended before the command could start."""


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


# ------------------------------------------------------------------ the processes


def read_info(bwrap: str, info_fd: int, shim_sock: int) -> dict[str, Any]:
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
        left = deadline - time.monotonic()
        events = dict(poller.poll(min(max(left, 0), WAIT_TICK_SECONDS) * 1000))
        if not events and left > 0:
            stop_if_interrupted()  # (a Ctrl-C held: stage's handler ends the sandbox)
            continue
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
            raise SetupEnded("could not be created: bwrap exited first")
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
            raise SandboxUnavailable(_bwrap_not_started(bwrap, info["reaper-errno"]))
        if not isinstance(info, dict) or not isinstance(info.get("child-pid"), int):
            raise SandboxUnavailable(f"{bwrap} reported no sandbox pid: it is not bubblewrap")
        return info


def _bwrap_not_started(bwrap: str, error: int) -> str:
    """Why the reaper could not start bwrap (fork, or exec, failed with error), and what to do."""
    if error in (errno.EAGAIN, errno.ENOMEM):  # no process, or no memory, for it: not bwrap's fault
        return (
            f"cannot start {bwrap}: {os.strerror(error)}: the session's account is at its "
            "process limit (RLIMIT_NPROC), or the host is short of memory; nothing was run, "
            "launch again once fewer processes run"
        )
    return (
        f"cannot run {bwrap}: {os.strerror(error)}; reinstall bubblewrap or point "
        "NSCONFINE_BWRAP at a working one"
    )


def _stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, session, tty_nr, …):
    split after its last ")", as the name may hold spaces and parentheses."""
    with open(f"/proc/{pid}/stat", "rb") as stat_file:
        return stat_file.read().rsplit(b")", 1)[1].split()


def _parent(pid: int) -> int:
    return int(_stat_fields(pid)[1])


def _namespaces(pid: int) -> dict[str, int]:
    return {name: os.stat(f"/proc/{pid}/ns/{name}").st_ino for name in own_namespaces()}


def check_init(bwrap: str, reaper: int, child: int, info: dict[str, Any], own_network: bool) -> int:
    """The sandbox's init is bwrap's child, bwrap is the reaper's, and its namespaces are new
    (the network's only when the plan gives it one of its own); bwrap's pid."""
    try:
        bwrap_pid = _parent(child)
        grandparent = _parent(bwrap_pid)
        theirs = _namespaces(child)
    except (OSError, ValueError, IndexError):
        raise SetupEnded("ended during set-up") from None
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


def await_shim(sock: socket.socket, reaper_pidfd: int) -> tuple[int, bool]:
    """The shim's pid, from the kernel, once it says it is ready (the mounts are done); and
    whether nsconfine's seccomp filter answered it (its 'R', not 'U': csrc/shim.c)."""
    import select
    import struct

    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(reaper_pidfd, select.POLLIN)
    deadline = time.monotonic() + SETUP_TIMEOUT_SECONDS
    while True:
        left = deadline - time.monotonic()
        events = dict(poller.poll(min(max(left, 0), WAIT_TICK_SECONDS) * 1000))
        if sock.fileno() in events:
            break
        if events:
            raise SetupEnded("failed to set up")
        stop_if_interrupted()  # (a Ctrl-C held: stage's handler ends the sandbox)
        if left <= 0:
            raise SandboxUnavailable(
                f"bwrap did not finish building the sandbox within {SETUP_TIMEOUT_SECONDS:g} s"
            )
    data, ancillary, _flags, _address = sock.recvmsg(1, socket.CMSG_SPACE(12))
    if data == b"L":
        raise SandboxUnavailable(
            "the exec shim could not take the Landlock domain that keeps the command away from "
            "the sandbox's pid 1: nothing was run; `nsconfine check` shows this kernel's layers"
        )
    if data not in (b"R", b"U"):
        raise SetupEnded("failed to set up")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid, _uid, _gid = struct.unpack("iII", payload[:12])
            return int(pid), data == b"R"
    raise SandboxUnavailable("the exec shim's message carried no sender: cannot check it")


def _own_seccomp_filters() -> int:
    """How many seccomp filters the launching thread runs under (a container's, a service's):
    every process it starts runs under them too. Read at each launch, from the thread's own
    status (filters are a thread's, and a launcher may take one more at any time)."""
    with open("/proc/thread-self/status", "rb") as status_file:
        for line in status_file:
            if line.startswith(b"Seccomp_filters:"):
                return int(line.split(b":", 1)[1])
    return 0


# Each capability set /proc/<pid>/status shows: bwrap's --cap-drop ALL empties every one (the
# bounding and ambient sets too, so that no exec can gain any).
_CAPABILITY_SETS: Final = (b"CapInh", b"CapPrm", b"CapEff", b"CapBnd", b"CapAmb")


def check_shim(bwrap: str, init: int, shim: int, filtered: bool, filter_answered: bool) -> None:
    """The process that will become the command is the sandbox init's child, in its
    namespaces (read now: bwrap enters a second user namespace after it reports the first),
    in the session the init leads (--new-session), with no terminal, no capability
    (--cap-drop ALL), no_new_privs set, and, if filtered, under a seccomp filter (--seccomp)
    that answered the shim as nsconfine's does (filter_answered)."""
    try:
        fields = _stat_fields(shim)
        parent, session, terminal = int(fields[1]), int(fields[3]), int(fields[4])
        same = _namespaces(shim) == _namespaces(init)
        with open(f"/proc/{shim}/status", "rb") as status_file:
            status = dict(
                line.split(b":", 1) for line in status_file.read().splitlines() if b":" in line
            )
        no_new_privs = status[b"NoNewPrivs"].strip() == b"1"
        # SECCOMP_MODE_FILTER, with a filter more than the launcher runs under: bwrap's (a
        # kernel before 5.9 does not count them)
        filters = status.get(b"Seccomp_filters")
        seccomp = status.get(b"Seccomp", b"").strip() == b"2" and (
            filters is None or int(filters) > _own_seccomp_filters()
        )
        capable = any(int(status[name], 16) for name in _CAPABILITY_SETS)
    except (OSError, ValueError, IndexError, KeyError):
        raise SetupEnded("ended before its command could start") from None
    if parent != init or not same:
        raise SandboxUnavailable(
            f"the process that would run the command (pid {shim}) is not inside the sandbox "
            f"{bwrap} built: nothing was run; this bwrap cannot be trusted"
        )
    if session != init or terminal != 0:
        raise SandboxUnavailable(
            f"{bwrap} left the sandbox without a session of its own (--new-session): its "
            "command could type into the caller's terminal; nothing was run, this bwrap cannot "
            "be trusted"
        )
    if capable:
        raise SandboxUnavailable(
            f"{bwrap} left the sandbox's command with capabilities (--cap-drop ALL): nothing "
            "was run, this bwrap cannot be trusted"
        )
    if not no_new_privs or (filtered and not seccomp):
        raise SandboxUnavailable(
            f"{bwrap} left the sandbox with no seccomp filter (--seccomp) or without "
            "no_new_privs: nothing was run, this bwrap cannot be trusted"
        )
    if filtered and not filter_answered:
        raise SandboxUnavailable(
            f"{bwrap} put the sandbox under a seccomp filter that is not nsconfine's (it did "
            "not answer the exec shim's probe as nsconfine's does): nothing was run, this "
            "bwrap cannot be trusted"
        )


# ------------------------------------------------------------------ the mount table


def _capacity_options(entry: Entry, tmpfs_files: bool) -> tuple[str, ...]:
    """The super options that show entry's capacity: a tmpfs's size (in KiB, whole pages, as
    the kernel rounds it) and, where tmpfs_files, its number of files; a devpts's max."""
    if entry.capacity is None:
        return ()
    if entry.kind is Kind.DEVPTS:
        return (f"max={entry.capacity}",)
    kib, files = tmpfs_shape(entry.capacity)
    return (f"size={kib}k", f"nr_inodes={files}") if tmpfs_files else (f"size={kib}k",)


def _expected(plan: Plan, tmpfs_files: bool) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """Mount point -> (mode, what, options): what is a file system type, or "bind" for a bind;
    options the super options it must show (its size and files, or its ptys)."""
    expected: dict[str, tuple[str, str, tuple[str, ...]]] = {"/": ("rw", "tmpfs", ())}
    for entry in plan.entries:
        if entry.kind is Kind.BIND:
            expected[entry.dest] = (str(entry.mode), "bind", ())
        elif entry.kind in (Kind.TMPFS, Kind.DEV, Kind.DATA):  # a data file sits on a tmpfs
            mode = "ro" if entry.kind is Kind.DATA else "rw"
            expected[entry.dest] = (mode, "tmpfs", _capacity_options(entry, tmpfs_files))
        elif entry.kind is Kind.DEVPTS:
            expected[entry.dest] = ("rw", "devpts", _capacity_options(entry, tmpfs_files))
        elif entry.kind is Kind.PROC:
            expected[entry.dest] = ("rw", "proc", ())
        elif entry.kind is Kind.REMOUNT_RO:
            _, what, options = expected.get(entry.dest, ("ro", "?", ()))
            expected[entry.dest] = ("ro", what, options)
    return expected


def mount_table_problems(
    mountinfo: str,
    plan: Plan,
    root: str | None = None,
    sources: Mapping[str, tuple[int, int] | None] | None = None,
    host_mountinfo: str | None = None,
    limits_taken: bool = True,
) -> list[str]:
    """What in the sandbox's mountinfo differs from the plan (empty when they agree).

    root is the sandbox's root as the launcher reaches it (/proc/<pid>/root): each bind's
    destination is looked at through it and compared with sources (dest -> the (device, inode)
    of the source the launcher opened; each bind's source as it is now if None). root None (a
    session reading its own table) skips that part.
    host_mountinfo is the launcher's own table, consulted only for mounts below a bound
    directory; None reads /proc/self/mountinfo when one is found.
    limits_taken: the reaper took the session's limits, so each writable tmpfs must show its
    number of files, and each mount must be private, taking in no mount made outside (not in a
    test that switched that step off, nsconfine._kernel.layers.session_limits_taken)."""
    expected = _expected(plan, limits_taken)
    tree = MountTree(mountinfo)
    observed = tree.points
    made_by_bwrap = {e.dest: e.kind for e in plan.entries if e.kind in (Kind.PROC, Kind.DEV)}
    binds = {e.dest: e.source for e in plan.entries if e.kind is Kind.BIND}
    devices: dict[str, str] = {}  # bwrap's binds of the host's devices: point -> host path
    ptys = [e.dest for e in plan.entries if e.kind is Kind.DEVPTS]  # each: not the host's
    # The entries that make a file system of their own (seen from its top)
    new_file_systems = {
        e.dest: e for e in plan.entries if e.kind in (Kind.TMPFS, Kind.DEV, Kind.PROC, Kind.DEVPTS)
    }
    data = {e.dest: len(e.content or b"") for e in plan.entries if e.kind is Kind.DATA}
    data_root = tree.mounted_at("/")  # where bwrap writes each data file
    host = _HostTable(host_mountinfo)
    problems = []
    for point, mount in observed.items():
        if mount.propagation and limits_taken:
            problems.append(
                f"{point} takes in mounts made outside the sandbox ({' '.join(mount.propagation)})"
            )
        want = expected.get(point)
        if tree.mount_seen_at(point) != mount.mount_id:
            # Hidden under a mount made later over a directory above it (or stacked under
            # another at its point): no path reaches it, and what a path there reaches is not
            # what the plan set up.
            if want is not None:
                problems.append(f"{point} is hidden under another mount")
        elif want is not None:
            problems += _planned_problems(point, mount, want, new_file_systems.get(point), host)
            if point in data and not _is_bwrap_data(mount, data_root):
                problems.append(f"{point} is not the file the plan gives there")
        elif _is_bwrap_own(point, mount, made_by_bwrap, observed, devices, ptys):
            devices_allowed = point in devices or point in ptys  # (not a /proc cover)
            problems += _flag_problems(point, mount, devices_allowed)
        else:
            problems += _carried_problems(point, mount, binds, expected, host, plan.user)
    problems += [
        f"{point} is not mounted, though the plan sets it up"
        for point in expected
        if point not in observed
    ]
    if root is not None:
        problems += _shown_problems(root, binds, sources, devices, ptys, data)
    return problems


class _HostTable:
    """The launcher's own mount table (text, or read from /proc/self/mountinfo), parsed at
    the first need: most launches have none."""

    def __init__(self, text: str | None) -> None:
        self._text = text
        self._tree: MountTree | None = None
        self._devices: set[str] | None = None

    def _read(self) -> MountTree:
        if self._tree is None:
            self._tree = MountTree(read_mountinfo("self") if self._text is None else self._text)
        return self._tree

    def at(self, point: str) -> Mount | None:
        """The host's mount at point, the one its paths reach there; None if none is."""
        return self._read().mounted_at(point)

    def devices(self) -> set[str]:
        """The device of every mount the host has."""
        if self._devices is None:
            self._devices = {mount.device for mount in self._read().by_id.values()}
        return self._devices


def _is_bwrap_data(mount: Mount, root: Mount | None) -> bool:
    """Whether mount shows a file bwrap wrote (--ro-bind-data): one of its root file system,
    named bindfile… there (and deleted once bound)."""
    return root is not None and mount.device == root.device and mount.root.startswith("/bindfile")


def _planned_problems(
    point: str,
    mount: Mount,
    want: tuple[str, str, tuple[str, ...]],
    new: Entry | None,
    host: _HostTable,
) -> list[str]:
    """What the mount at point, one the plan sets up (want: its mode, type and options; new:
    its entry, if it makes a file system of its own), shows otherwise."""
    mode, what, options = want
    problems = []
    if mount.mode != mode:
        problems.append(f"{point} is mounted {mount.mode}, the plan says {mode}")
    if what != "bind" and mount.fstype != what:
        problems.append(f"{point} is a {mount.fstype} mount, the plan's is a {what}")
    elif not mount.options.issuperset(options):
        problems.append(f"{point} is not mounted with {', '.join(options)}, as the plan says")
    elif new is not None and mount.root != "/":  # a new one is seen from its top
        problems.append(f"{point} shows {mount.root} of a {what}, not a new {what}")
    elif (
        new is not None
        and new.kind is Kind.TMPFS
        and new.capacity is None  # a mask's cover: no size tells a new one from the host's
        and mount.device in host.devices()
    ):
        problems.append(f"{point} is a tmpfs the host has, not a new one")
    return problems + _flag_problems(point, mount, devices_allowed=what == "devpts")


def _carried_problems(
    point: str,
    mount: Mount,
    binds: Mapping[str, str],
    expected: Mapping[str, tuple[str, str, tuple[str, ...]]],
    host: _HostTable,
    user: RunAs,
) -> list[str]:
    """What the mount at point, which no plan entry sets up, shows otherwise than a host mount
    a bind carries in (empty if it is one, as _is_carried tells; user: the session's account,
    for what it can reach)."""
    carried = _host_path_below_bind(point, binds)
    if carried is not None:
        host_path, bound = carried
        theirs = host.at(host_path)
        if theirs is not None:
            read_only = expected[bound][0] == "ro"
            if _is_carried(
                mount, theirs, read_only, lambda: _out_of_reach(host_path, binds[bound], user)
            ):
                return []
            return [
                f"{point} is not the host's mount there, which the bind of {bound} carries "
                f"in: a {mount.fstype} mount ({mount.mode}) of {mount.root}"
            ]
    return [f"{point} is mounted, and no plan entry accounts for it"]


# What bwrap mounts inside a new /dev (--dev) of its own accord: each of these host devices,
# bound from the host's /dev, and a devpts of its own at pts (under the plan's devpts, where the
# plan has one). A new /proc (--proc) gets read-only covers of its parts a process could write,
# each bound onto itself, where the sandbox's account could write them.
_BWRAP_DEVICES: Final = frozenset({"null", "zero", "full", "random", "urandom", "tty"})
_BWRAP_PROC_COVERS: Final = frozenset({"sys", "sysrq-trigger", "irq", "bus"})


def _is_bwrap_own(
    point: str,
    mount: Mount,
    made_by_bwrap: Mapping[str, Kind],
    observed: Mapping[str, Mount],
    devices: dict[str, str],
    ptys: list[str],
) -> bool:
    """Whether mount, at point, is one bwrap makes of its own accord inside a new /dev or
    /proc (made_by_bwrap: where, and which); a device is added to devices, a devpts to ptys,
    to be looked at through the sandbox's root."""
    for made, kind in made_by_bwrap.items():
        name = inside(point, made)
        if name is None:
            continue
        if kind is Kind.DEV and name in _BWRAP_DEVICES:
            devices[point] = f"/dev/{name}"  # the host's, as bwrap binds it
            return True
        if kind is Kind.DEV and name == "pts" and mount.fstype == "devpts":
            ptys.append(point)
            return True
        if kind is Kind.PROC and _is_proc_cover(name, mount, observed.get(made)):
            return True
    return False


def _is_proc_cover(name: str, mount: Mount, proc: Mount | None) -> bool:
    """Whether mount, at name inside a new /proc mounted as proc, is a cover bwrap makes: that
    proc's own directory of that name, bound read-only onto itself."""
    return (
        name in _BWRAP_PROC_COVERS
        and mount.fstype == "proc"
        and mount.mode == "ro"
        and proc is not None
        and mount.device == proc.device
        and mount.root == f"/{name}"
    )


_NOSUID: Final = frozenset({"nosuid"})
_NOSUID_NODEV: Final = frozenset({"nosuid", "nodev"})


def _flag_problems(point: str, mount: Mount, devices_allowed: bool) -> list[str]:
    """What a mount bwrap made misses of the flags it gives every mount: nosuid, and nodev but
    where devices are its point (its device binds, a devpts)."""
    missing = (_NOSUID if devices_allowed else _NOSUID_NODEV) - mount.flags
    return [f"{point} is not mounted {flag}" for flag in sorted(missing)]


def _is_carried(
    mount: Mount, host: Mount, read_only: bool, out_of_reach: Callable[[], bool]
) -> bool:
    """Whether mount is the host's mount host (its device, root and type), as bwrap's
    recursive bind carries it in: made nosuid and nodev (and read-only below a read-only
    bind, else as the host's is), or left as the host has it where bwrap, and so the
    session's account, cannot reach it (out_of_reach, asked only then)."""
    if (mount.device, mount.root, mount.fstype) != (host.device, host.root, host.fstype):
        return False
    if mount.flags >= _NOSUID_NODEV and mount.mode == ("ro" if read_only else host.mode):
        return True
    return mount.flags == host.flags and out_of_reach()


def _out_of_reach(host_path: str, source: str, user: RunAs) -> bool:
    """Whether the session's account (user) cannot reach host_path from the bind source above
    it: a directory on the way it may not search, as the kernel judges that account (its mode
    bits, its ACLs), asked with its own ids: a root launcher's in a child that takes them.
    (bwrap, which remounts what it can reach as that account, leaves a mount there as the host
    has it.)"""
    relative = os.path.relpath(host_path, os.path.realpath(source))
    try:
        top = os.open(source, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if os.geteuid() != 0:  # the session runs as this launcher's own account
            return _denied_below(top, relative)
        child = os.fork()
        if child == 0:  # only system calls here, then _exit: the launcher may hold threads
            try:
                os.setgroups([])
                os.setgid(user.gid)
                os.setuid(user.uid)
                os._exit(1 if _denied_below(top, relative) else 0)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(child, 0)
        return os.waitstatus_to_exitcode(status) == 1
    finally:
        os.close(top)


def _denied_below(top: int, relative: str) -> bool:
    """Whether looking relative up from the directory top is refused (EACCES) to this process."""
    try:
        os.stat(relative, dir_fd=top, follow_symlinks=False)
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def _shown_problems(
    root: str,
    binds: Mapping[str, str],
    sources: Mapping[str, tuple[int, int] | None] | None,
    devices: Mapping[str, str],
    ptys: list[str],
    data: Mapping[str, int],
) -> list[str]:
    """What the sandbox's files, looked at through root, show that the plan does not: each
    bind's destination another file than its source, a device bwrap bound another than the
    host's (devices: point -> host path), a devpts at one of ptys the host's, a data file
    another size than the plan's content (data: point -> its size). Looked up from one fd of
    root (its magic link, and the access check on it, resolved once, not per file)."""
    if sources is None:
        sources = {dest: _syscalls.identity(source) for dest, source in binds.items()}
    if devices:
        sources = {**sources, **{point: _syscalls.identity(d) for point, d in devices.items()}}
        binds = {**binds, **devices}
    try:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        return [f"the sandbox's root ({root}) cannot be reached: {error.strerror}"]
    problems = []
    try:
        for dest, source in sources.items():
            seen = _syscalls.identity(dest.lstrip("/") or ".", root_fd)
            if seen is None or seen != source:
                problems.append(f"{dest} does not show {binds[dest]}")
        host_ptys = _syscalls.identity("/dev/pts")
        for point in ptys:
            seen = _syscalls.identity(point.lstrip("/") or ".", root_fd)
            if seen is None or (host_ptys is not None and seen[0] == host_ptys[0]):
                problems.append(f"{point} is not the session's own devpts")
        for point, size in data.items():
            try:
                info = os.stat(point.lstrip("/"), dir_fd=root_fd, follow_symlinks=False)
            except OSError:
                info = None
            if info is None or not stat.S_ISREG(info.st_mode) or info.st_size != size:
                problems.append(f"{point} does not hold the plan's {size} bytes")
    finally:
        os.close(root_fd)
    return problems


def _host_path_below_bind(point: str, binds: Mapping[str, str]) -> tuple[str, str] | None:
    """The host path that point shows, and the bind it lies below, if it lies below one."""
    best = ""
    for dest in binds:
        if inside(point, dest) is not None and len(dest) > len(best):
            best = dest
    if not best:
        return None
    # the source as the host's table names it: resolved (a --ro given through a symlink)
    return os.path.realpath(binds[best]).rstrip("/") + point[len(best.rstrip("/")) :], best
