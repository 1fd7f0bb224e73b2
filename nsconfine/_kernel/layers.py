"""The kernel layers every session gets past its mount namespace, and how they are asked for.

They are not options: no flag or variable turns one off. A plan may allow nested user
namespaces, with a reason the manifest shows (a harness that sandboxes its own tools with
bwrap); that lifts "no-nested-userns" alone. DISABLED_FOR_TESTS is the one other door, for the
test suite's mutation twins (each layer's test must fail without it; "session-limits" switches
off the reaper's limits step, to show the mount check refusing what bwrap then builds); nothing
in the package sets it, and the manifest lists only the layers a launch applies.

Where each layer lives:
- seccomp: the filter (csrc/seccomp.c) bwrap loads in the sandbox's pid 1 and the command;
- session-keyring and no-new-privileges: the launcher's C child, before it execs the reaper;
- no-nested-userns: bwrap's --disable-userns, and the filter's namespace rules;
- landlock: a scope-only domain in the launcher's C child (no abstract socket and no signal
  out of the sandbox), and a second one the exec shim takes before it execs the command, so
  that the command cannot reach the sandbox's pid 1 either (ptrace, /proc/1/mem, signals).
"""

from __future__ import annotations

import os

from nsconfine._kernel import syscalls as _syscalls

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Final

    from nsconfine._kernel.accounts import RunAs

# What each layer does, for the manifest.
LAYERS: Final = {
    "seccomp": (
        "a seccomp filter: no set-user-ID or set-group-ID bit by chmod, open, creat, mknod or "
        "mq_open; no io_uring; no keyrings, NUMA policy, accounting, kernel log, quotas, perf, "
        "bpf, userfaultfd, kexec or modules; no modify_ldt or port I/O, no clocks, reboot, "
        "swap or vhangup, no kcmp, pidfd_getfd, process_madvise, open_by_handle_at or "
        "fanotify; no other personality; no ptrace of pid 1; only UNIX, INET, INET6 and "
        "NETLINK sockets, of the protocols programs use (no module loaded for another); no "
        "TIOCSTI or TIOCLINUX; no other syscall entry (x32, i386)"
    ),
    "session-keyring": (
        "a fresh session keyring: the launcher's keys are not reachable, and keys a session "
        "adds die with it"
    ),
    "no-new-privileges": (
        "no_new_privs and no capabilities: no setuid binary or file capability raises the "
        "session's power"
    ),
    "no-nested-userns": (
        "no namespace of its own (bwrap's --disable-userns, and the filter refuses unshare, "
        "setns, namespace flags, the mount calls and the host name): no overlay, mqueue or "
        "cgroup file system of the session's own, and none of the kernel's user-namespace "
        "surface"
    ),
    "landlock": (
        "Landlock scopes (ABI 6 and later): no connecting to an abstract unix socket outside "
        "the sandbox, no signal to a process outside it; and the command is kept out of reach "
        "of the sandbox's pid 1 (no ptrace, no /proc/1/mem, no signal), which holds its exit "
        "status"
    ),
}

NESTED_USERNS_REOPENS: Final = (
    "this re-opens the kernel's user-namespace surface (a kernel bug there is reachable), "
    "mounts of the session's own (overlay, mqueue, cgroupfs: where the host delegates cgroups "
    "to this account, a nested cgroupfs reaches them) and the mount system calls"
)

LANDLOCK_SCOPES_ABI: Final = 6

DISABLED_FOR_TESTS: frozenset[str] = frozenset()

_filters: dict[int, bytes] = {}
_ruleset: int | None = None
_abi: int | None = None


# Each function below takes what it needs of a plan as values (the plan's model sits above this
# module): nested_userns is whether the plan allows nested user namespaces, with its reason.


def active(nested_userns: bool = False) -> list[str]:
    """The layers a launch applies on this kernel (Landlock scopes need ABI 6)."""
    return [name for name in LAYERS if _applies(name, nested_userns)]


def _applies(name: str, nested_userns: bool) -> bool:
    if name in DISABLED_FOR_TESTS:
        return False
    if name == "landlock":
        return landlock_abi() >= LANDLOCK_SCOPES_ABI
    if name == "no-nested-userns":
        return not nested_userns
    return True


def landlock_abi() -> int:
    """This kernel's Landlock ABI (0: none), asked once."""
    global _abi
    if _abi is None:
        _abi = _syscalls.landlock_abi()
    return _abi


def disables_userns(nested_userns: bool) -> bool:
    """Does bwrap get --disable-userns?"""
    return _applies("no-nested-userns", nested_userns)


def seccomp_program(nested_userns: bool, own_network: bool) -> bytes | None:
    """The seccomp filter bwrap loads for a plan's sessions (each variant built once), or None
    in a test that switched it off."""
    if "seccomp" in DISABLED_FOR_TESTS:
        return None
    rules = _syscalls.seccomp_groups(disables_userns(nested_userns), own_network)
    program = _filters.get(rules)
    if program is None:
        program = _filters[rules] = _syscalls.seccomp_filter(rules)
    return program


def landlock_ruleset() -> int:
    """The scope-only Landlock ruleset the launcher's child restricts itself with before it
    execs the reaper (made once; its fd is close-on-exec), or -1 where this kernel has no
    scopes or a test switched the layer off."""
    global _ruleset
    if not _applies("landlock", False):
        return -1
    if _ruleset is None:
        _ruleset = _syscalls.landlock_scopes()
    return _ruleset


def shim_guards_pid_1() -> bool:
    """Does the exec shim take a Landlock domain of its own before the command (so that the
    command cannot ptrace, write or signal the sandbox's pid 1)?"""
    return _applies("landlock", False)


def session_limits(
    processes: int,
    ptys: int,
    inotify_instances: int,
    inotify_watches: int,
    shm_pages: int,
    tmpfs: Sequence[tuple[int, int]],
) -> list[str] | None:
    """What the reaper takes in the session's own user and IPC namespaces
    (nsconfine._plan.limits), as its argument's fields: its processes, ptys (0 where the plan
    has no devpts to hold them), inotify instances and watches, System V shared memory in
    pages, and the KiB and files of each writable tmpfs it mounts for bwrap to bind; None in a
    test that switched the step off ("session-limits")."""
    if not session_limits_taken():
        return None
    counts = (processes, ptys, inotify_instances, inotify_watches, shm_pages)
    return [*map(str, counts), *(f"{kib}:{files}" for kib, files in tmpfs)]


def session_limits_taken() -> bool:
    """Does the reaper take the session's limits (always, but in a test that switched the
    step off: then bwrap makes the IPC namespace and the tmpfs, of the kernel's defaults)?"""
    return "session-limits" not in DISABLED_FOR_TESTS


def spawn_flags(user: RunAs) -> tuple[int, int, int]:
    """nsc_spawn's flags, uid and gid for the launcher's child that runs bwrap as user."""
    flags = (
        _syscalls.SPAWN_NEW_PGRP
        | _syscalls.SPAWN_DROP_CAPS
        | _syscalls.SPAWN_NO_NEW_PRIVS
        | _syscalls.SPAWN_FAIR_SHARE
    )
    if "session-keyring" not in DISABLED_FOR_TESTS:
        flags |= _syscalls.SPAWN_NEW_KEYRING
    if os.geteuid() == 0:  # the gate refused uid 0 itself; anyone else keeps their own ids
        flags |= _syscalls.SPAWN_SET_IDS
    return flags, user.uid, user.gid
