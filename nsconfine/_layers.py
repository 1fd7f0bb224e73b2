"""The kernel layers every session gets past its mount namespace, and how they are asked for.

They are not options: no plan, flag or variable turns one off. DISABLED_FOR_TESTS is the one
door, for the test suite's mutation twins (each layer's test must fail without it); nothing in
the package sets it, and a launch with it set says so on every manifest it prints.
"""

from __future__ import annotations

import os

from nsconfine import _syscalls

TYPE_CHECKING = False  # see nsconfine/_executor.py
if TYPE_CHECKING:
    from typing import Final

    from nsconfine._plan import RunAs

# What each layer does, for the manifest.
LAYERS: Final = {
    "seccomp": (
        "a seccomp filter: no set-user-ID or set-group-ID bit by chmod, open, creat or mknod "
        "(a file left setuid in a workspace would run as the session's user for anyone); no "
        "io_uring, no openat2"
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
        "no user namespace inside (bwrap's --disable-userns): no overlay, mqueue or cgroup "
        "file system of the session's own, and none of the kernel's user-namespace surface"
    ),
    "landlock": (
        "a Landlock scope (ABI 6 and later): no connecting to an abstract unix socket outside "
        "the sandbox, no signal to a process outside it"
    ),
}

DISABLED_FOR_TESTS: frozenset[str] = frozenset()

LANDLOCK_SCOPES_ABI: Final = 6

_filter: bytes | None = None
_ruleset: int | None = None
_abi: int | None = None


def active() -> list[str]:
    """The layers a launch applies now (on this kernel: Landlock scopes need ABI 6)."""
    return [name for name in LAYERS if name not in DISABLED_FOR_TESTS and _available(name)]


def _available(name: str) -> bool:
    return name != "landlock" or landlock_abi() >= LANDLOCK_SCOPES_ABI


def landlock_abi() -> int:
    """This kernel's Landlock ABI (0: none), asked once."""
    global _abi
    if _abi is None:
        _abi = _syscalls.landlock_abi()
    return _abi


def disables_userns() -> bool:
    """Does bwrap get --disable-userns?"""
    return "no-nested-userns" not in DISABLED_FOR_TESTS


def landlock_ruleset() -> int:
    """The scope-only Landlock ruleset the launcher's child restricts itself with before it
    execs the reaper (made once; its fd is close-on-exec), or -1 where this kernel has no
    scopes or a test switched the layer off."""
    global _ruleset
    if "landlock" in DISABLED_FOR_TESTS or not _available("landlock"):
        return -1
    if _ruleset is None:
        _ruleset = _syscalls.landlock_scopes()
    return _ruleset


def seccomp_program() -> bytes | None:
    """The seccomp filter bwrap loads for every session (built once), or None in a test that
    switched it off."""
    global _filter
    if "seccomp" in DISABLED_FOR_TESTS:
        return None
    if _filter is None:
        _filter = _syscalls.seccomp_filter(_syscalls.SECCOMP_SETID)
    return _filter


def spawn_flags(user: RunAs) -> tuple[int, int, int]:
    """nsc_spawn's flags, uid and gid for the launcher's child that runs bwrap as user."""
    flags = _syscalls.SPAWN_NEW_PGRP | _syscalls.SPAWN_DROP_CAPS | _syscalls.SPAWN_NO_NEW_PRIVS
    if "session-keyring" not in DISABLED_FOR_TESTS:
        flags |= _syscalls.SPAWN_NEW_KEYRING
    if os.geteuid() == 0:  # the gate refused uid 0 itself; anyone else keeps their own ids
        flags |= _syscalls.SPAWN_SET_IDS
    return flags, user.uid, user.gid
