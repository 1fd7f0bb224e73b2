"""nsconfine: confine untrusted process trees to the files they are meant to have."""

from nsconfine._errors import (
    CredentialInsecure,
    CredentialMissing,
    NsconfineError,
    PlanError,
    SandboxUnavailable,
    UsageError,
)
from nsconfine._gate import spawn
from nsconfine._kernel.accounts import RunAs
from nsconfine._launch.sandbox import Sandbox
from nsconfine._plan.model import (
    DenyRule,
    Entry,
    EnvVar,
    Kind,
    Mode,
    Origin,
    Plan,
    copy,
    data,
    dev,
    devpts,
    directory,
    proc,
    remount_ro,
    ro_bind,
    rw_bind,
    symlink,
    tmpfs,
)
from nsconfine._plan.profiles import Bind
from nsconfine._preflight.checks import PreflightReport, preflight
from nsconfine._session import Harness, Session

__version__ = "0.1.0"

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nsconfine._launch.stage import Stdio
    from nsconfine._pool import Pool
    from nsconfine._timeout import TimeoutExpired


def __getattr__(name: str) -> object:
    # Pool brings sockets and a thread along, and TimeoutExpired subprocess: only launchers
    # that use them import them.
    if name == "Pool":
        from nsconfine._pool import Pool

        return Pool
    if name == "TimeoutExpired":
        from nsconfine._timeout import TimeoutExpired

        return TimeoutExpired
    if name == "Stdio":  # what spawn's stdin, stdout and stderr take (typing: on demand)
        from typing import IO, Any

        return int | IO[Any] | None
    raise AttributeError(f"module 'nsconfine' has no attribute {name!r}")


__all__ = [
    "Bind",
    "CredentialInsecure",
    "CredentialMissing",
    "DenyRule",
    "Entry",
    "EnvVar",
    "Harness",
    "Kind",
    "Mode",
    "NsconfineError",
    "Origin",
    "Plan",
    "PlanError",
    "Pool",
    "PreflightReport",
    "RunAs",
    "Sandbox",
    "SandboxUnavailable",
    "Session",
    "Stdio",
    "TimeoutExpired",
    "UsageError",
    "__version__",
    "copy",
    "data",
    "dev",
    "devpts",
    "directory",
    "preflight",
    "proc",
    "remount_ro",
    "ro_bind",
    "rw_bind",
    "spawn",
    "symlink",
    "tmpfs",
]
