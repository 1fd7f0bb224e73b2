"""Preflight's explanations: each known failure of a host is named with what to change."""

from __future__ import annotations

import errno

import pytest

from nsconfine._kernel.syscalls import SyscallError
from nsconfine._preflight import checks as _checks


@pytest.mark.parametrize(
    ("stderr", "hint"),
    [
        ("bwrap: setting up uid map: Permission denied", "apparmor_restrict_unprivileged_userns"),
        ("bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted", "AppArmor"),
        (
            "bwrap: Creating new namespace failed: nesting depth or "
            "/proc/sys/user/max_*_namespaces exceeded",
            "user.max_user_namespaces",
        ),
        ("bwrap: No permissions to creating new namespace", "unprivileged_userns_clone"),
        ("bwrap: Creating new namespace failed: Operation not permitted", "CAP_SYS_ADMIN"),
        (
            "bwrap: No permissions to create a new namespace, likely because the kernel does not "
            "allow non-privileged user namespaces. bwrap must be installed setuid on such systems.",
            "unprivileged_userns_clone",
        ),
        ("bwrap: Can't mount proc on /newroot/proc: Operation not permitted", "/proc is masked"),
        ("bwrap: something new\n", "bwrap said: bwrap: something new"),
    ],
)
def test_bwrap_errors_are_explained(stderr: str, hint: str) -> None:
    """bwrap's known error lines map to the host setting that causes them."""
    assert hint in _checks.explain_bwrap_failure(stderr)


@pytest.mark.parametrize(
    ("syscall", "error", "sysctls", "hint"),
    [
        (
            "unshare(CLONE_NEWUSER)",
            errno.ENOSPC,
            {"user/max_user_namespaces": "0"},
            "max_user_namespaces=0",
        ),
        (
            "unshare(CLONE_NEWUSER)",
            errno.EPERM,
            {"kernel/unprivileged_userns_clone": "0"},
            "unprivileged_userns_clone=0",
        ),
        ("unshare(CLONE_NEWUSER)", errno.EINVAL, {}, "CONFIG_USER_NS"),
        (
            "write /proc/self/uid_map",
            errno.EPERM,
            {"kernel/apparmor_restrict_unprivileged_userns": "1"},
            "AppArmor",
        ),
    ],
)
def test_user_namespace_failures_are_explained(
    monkeypatch: pytest.MonkeyPatch,
    syscall: str,
    error: int,
    sysctls: dict[str, str],
    hint: str,
) -> None:
    """The user-namespace probe's failure names the sysctl or kernel feature to fix."""
    monkeypatch.setattr(_checks, "_read_sysctl", sysctls.get)
    assert hint in _checks._explain_userns(SyscallError(error, syscall))
