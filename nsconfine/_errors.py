"""Refusals: every one has a stable code, says what was refused and what to do."""

from __future__ import annotations

import os

from nsconfine._text import one_line, printable


class NsconfineError(Exception):
    """Base of every refusal; `code` is stable and `exit_status` is the CLI's (sysexits.h)."""

    code = "error"
    exit_status = 70

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        # One line, whatever path or value the message quotes: a newline in it cannot forge
        # a second line of the CLI's refusal.
        return f"{self.code}: {one_line(self.message)}"


class UsageError(NsconfineError, ValueError):
    """The command line or an argument is malformed."""

    code = "usage"
    exit_status = 64


class PlanError(NsconfineError, ValueError):
    """The mount plan would expose something it must not, or cannot be built as asked."""

    code = "plan-refused"
    exit_status = 65


class SandboxUnavailable(NsconfineError, RuntimeError):
    """This host cannot confine a session: bwrap or user namespaces are missing or broken."""

    code = "sandbox-unavailable"
    exit_status = 69


class CredentialMissing(NsconfineError, FileNotFoundError):
    """The session's credential file does not exist."""

    code = "credential-missing"
    exit_status = 78


class CredentialInsecure(NsconfineError, PermissionError):
    """The credential file is readable by others, not owned by the caller, or malformed."""

    code = "credential-insecure"
    exit_status = 78


def checked_timeout(timeout: float | None) -> float | None:
    """timeout, if it is None or a number of seconds (float("inf") waits for ever); a
    UsageError for NaN, a bool or anything else (poll() would raise ValueError on NaN, and
    arithmetic TypeError on a str, from deep in the wait)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout != timeout:
        raise UsageError(f"timeout must be None or a number of seconds, not {timeout!r}")
    return timeout


class ShortOfFds(SandboxUnavailable):
    """The launcher ran out of file descriptors: its own to fix, whatever it launched (bwrap's
    proof passes this on as it is, not as bwrap's failure)."""


def refuse_if_short_of_fds(error: OSError) -> None:
    """A launcher out of file descriptors is told so, whichever step ran out first (not that
    a path changed, or that a source could not be opened)."""
    import errno

    if error.errno in (errno.EMFILE, errno.ENFILE):
        raise ShortOfFds(
            f"the launcher ran out of file descriptors ({error.strerror}); nothing was run: "
            "close some, or raise its RLIMIT_NOFILE"
        ) from None


def path_refusal(error: OSError, what: str) -> PlanError:
    """An OSError on a host path met while what was built (a path a hostile workspace swapped
    or made unreadable, one too long or too deep) as the refusal it is: one line naming the
    path. A launcher out of file descriptors is told so instead (SandboxUnavailable)."""
    refuse_if_short_of_fds(error)
    if error.filename is None and not working_directory_exists():
        raise error  # a relative path from a working directory since removed: the CLI says so
    where = f" ({printable(str(error.filename))})" if error.filename else ""
    return PlanError(f"{what} was refused: {error.strerror or error}{where}; nothing was run")


def working_directory_exists() -> bool:
    """False when the working directory was removed: every relative path (os.path.abspath)
    then fails with an ENOENT that names no file."""
    try:
        os.getcwd()
    except OSError:
        return False
    return True
