"""nsconfine: confine untrusted process trees to the files they are meant to have."""

from nsconfine._errors import (
    CredentialInsecure,
    CredentialMissing,
    NsconfineError,
    PlanError,
    SandboxUnavailable,
    UsageError,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nsconfine._gate import spawn
    from nsconfine._kernel.accounts import RunAs
    from nsconfine._launch.sandbox import Sandbox
    from nsconfine._launch.stage import Stdio
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
    from nsconfine._pool import Pool
    from nsconfine._preflight.checks import PreflightReport, preflight
    from nsconfine._session import Harness, Session
    from nsconfine._timeout import TimeoutExpired

__version__ = "0.1.0"

# Where each name is defined, imported on first use: a program imports only what it uses (the
# CLI's `plan` never loads the launch machinery, nor `check` the session layer), and
# `import nsconfine` costs a launcher nothing it does not need.
_DEFINED_IN = {
    **dict.fromkeys(
        (
            "DenyRule",
            "Entry",
            "EnvVar",
            "Kind",
            "Mode",
            "Origin",
            "Plan",
            "copy",
            "data",
            "dev",
            "devpts",
            "directory",
            "proc",
            "remount_ro",
            "ro_bind",
            "rw_bind",
            "symlink",
            "tmpfs",
        ),
        "nsconfine._plan.model",
    ),
    "Bind": "nsconfine._plan.profiles",
    "Harness": "nsconfine._session",
    "Pool": "nsconfine._pool",
    "PreflightReport": "nsconfine._preflight.checks",
    "RunAs": "nsconfine._kernel.accounts",
    "Sandbox": "nsconfine._launch.sandbox",
    "Session": "nsconfine._session",
    "TimeoutExpired": "nsconfine._timeout",
    "preflight": "nsconfine._preflight.checks",
    "spawn": "nsconfine._gate",
}


def __getattr__(name: str) -> object:
    module = _DEFINED_IN.get(name)
    if module is not None:
        value = getattr(__import__(module, fromlist=[name]), name)
    elif name == "Stdio":  # what spawn's stdin, stdout and stderr take (typing: on demand)
        from typing import IO, Any

        value = int | IO[Any] | None
    else:
        raise AttributeError(f"module 'nsconfine' has no attribute {name!r}")
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
