"""The executor: start bwrap on a plan, check the sandbox it made, then let the command run.

bwrap is spawned by the C layer with exactly these fds (and 0, 1, 2):
    3  a sealed memfd with the plan's options (`--args 3`)
    4  the write end of the info pipe (`--info-fd 4`)
    5  the read end of the block pipe (`--block-fd 5`)
    6… one fd per data or copy entry, in plan order: a sealed memfd per generated file
       (`--ro-bind-data N`), the opened host file per copy (`--file N`)
    then any extra fds, which bwrap passes on to the command (the pool's shim socket)
bwrap reports the sandbox's pid on the info pipe once the namespaces exist, and the sandbox
waits on the block pipe after its mounts, before exec. In between, the launcher checks with its
own eyes (/proc/<pid>/ns/*) that the sandbox really lives in new namespaces. Only then does it
write the byte that lets the command exec; on any doubt it kills bwrap and refuses.
"""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Sequence

from nsconfine import _syscalls
from nsconfine._bwrap_args import bwrap_command_line, compiled_options, fd_entries
from nsconfine._errors import PlanError, SandboxUnavailable, UsageError
from nsconfine._plan import Kind, Plan

TYPE_CHECKING = False  # typing costs launchers milliseconds of import; mypy reads this block
if TYPE_CHECKING:
    from typing import IO, Any, Final

    Stdio = int | IO[Any] | None

# What a launch must see differ from the launcher's own; "net" is shared by design.
CONFINING_NAMESPACES: Final = ("user", "mnt", "pid", "ipc", "uts", "cgroup")
INFO_TIMEOUT_SECONDS: Final = 10.0


def _stdio_fd(value: Stdio, name: str) -> int:
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


class Sandbox:
    """A running confined session: bwrap's process, with the sandbox's pid 1 below it."""

    def __init__(self, pid: int, child_pid: int) -> None:
        self.pid = pid  # bwrap, the launcher's child
        self.child_pid = child_pid  # the sandbox's init, in the launcher's pid namespace
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Sandbox pid={self.pid} returncode={self.returncode}>"

    def poll(self) -> int | None:
        """The exit status if the session has ended, else None."""
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the session to end and return its status: the command's exit code, or
        128+N if the command was killed by signal N, or -N if bwrap itself was.
        Raises TimeoutError if it is still running after timeout seconds."""
        if timeout is not None and self.returncode is None:
            pidfd = os.pidfd_open(self.pid)
            try:
                if not select.select([pidfd], [], [], max(timeout, 0.0))[0]:
                    raise TimeoutError(f"session {self.pid} still running after {timeout} s")
            finally:
                os.close(pidfd)
        with self._lock:
            if self.returncode is None:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def kill(self) -> None:
        """SIGKILL bwrap; the sandbox and everything in it die with it (--die-with-parent)."""
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()
        self.wait()


def open_entry_fds(plan: Plan, fds: list[int]) -> None:
    """Append to fds, in fd order, a sealed memfd per data entry and the opened source per
    copy; on failure the caller closes what was appended."""
    entries = fd_entries(plan)
    _make_room_for(len(entries))
    for entry in entries:
        if entry.kind is Kind.DATA:
            assert entry.content is not None
            fds.append(_syscalls.memfd_sealed("nsconfine-data", entry.content))
            continue
        try:
            fds.append(os.open(entry.source, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY))
        except OSError as error:
            raise PlanError(f"{entry.source} cannot be copied: {error.strerror}") from None


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


def launch(
    bwrap: str,
    plan: Plan,
    argv: Sequence[str],
    *,
    stdin: Stdio = None,
    stdout: Stdio = None,
    stderr: Stdio = None,
    extra_fds: Sequence[int] = (),
) -> Sandbox:
    """Run argv under bwrap on plan, as is: no lint, no preflight (see nsconfine.spawn).

    extra_fds reach the command itself (bwrap passes on what it does not use), numbered from
    FIRST_DATA_FD + len(fd_entries(plan)): the pool's exec shim gets its socket this way."""
    stdio = (_stdio_fd(stdin, "stdin"), _stdio_fd(stdout, "stdout"), _stdio_fd(stderr, "stderr"))
    command = [os.fsencode(arg) for arg in bwrap_command_line(bwrap, argv)]
    options = compiled_options(plan)
    child_side: list[int] = []  # given to bwrap, closed here once it has them
    parent_side: list[int] = []  # kept here: the info pipe's read end, the block pipe's write end
    try:
        child_side.append(_syscalls.memfd_sealed("nsconfine-args", options))
        info_read, info_write = os.pipe2(os.O_CLOEXEC)
        parent_side.append(info_read)
        child_side.append(info_write)
        block_read, block_write = os.pipe2(os.O_CLOEXEC)
        parent_side.append(block_write)
        child_side.append(block_read)
        open_entry_fds(plan, child_side)
        pid = _syscalls.spawn(
            command[0],
            command,
            (),  # bwrap itself gets an empty environment; the session's is in the options
            stdin=stdio[0],
            stdout=stdio[1],
            stderr=stdio[2],
            pass_fds=[*child_side, *extra_fds],
            pdeathsig=signal.SIGKILL,
        )
    except _syscalls.SyscallError as error:
        for fd in parent_side:
            os.close(fd)
        raise SandboxUnavailable(f"cannot start {bwrap}: {error.strerror}") from None
    except BaseException:
        for fd in parent_side:
            os.close(fd)
        raise
    finally:
        for fd in child_side:
            os.close(fd)
    try:
        child_pid = _confirm_sandbox(bwrap, pid, info_read)
        os.write(block_write, b"x")
    except _BwrapEnded as ended:
        status = _kill_and_reap(pid)
        raise SandboxUnavailable(
            f"{bwrap} {ended} (status {status}); its message is on the session's stderr, and "
            "`nsconfine check` explains what to fix"
        ) from None
    except BaseException:
        _kill_and_reap(pid)
        raise
    finally:
        os.close(info_read)
        os.close(block_write)
    return Sandbox(pid, child_pid)


class _BwrapEnded(Exception):
    """bwrap, or its sandbox, ended before the command could start (the launcher reaps it)."""


def _kill_and_reap(pid: int) -> int:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _read_info(bwrap: str, info_fd: int) -> dict[str, Any]:
    """bwrap's info object, or a refusal if bwrap exits or stays silent first."""
    import json  # on the first launch: not on the import path of every launcher

    received = b""
    while True:
        ready, _, _ = select.select([info_fd], [], [], INFO_TIMEOUT_SECONDS)
        if not ready:
            raise SandboxUnavailable(
                f"{bwrap} did not report a sandbox within {INFO_TIMEOUT_SECONDS:g} s: it is not "
                "a working bubblewrap; reinstall it or point NSCONFINE_BWRAP at one"
            )
        chunk = os.read(info_fd, 4096)
        if not chunk:
            raise _BwrapEnded("exited before the sandbox existed")
        received += chunk
        try:
            info = json.loads(received)
        except ValueError:
            continue  # bwrap writes the object in one go, but a pipe may split it
        if not isinstance(info, dict) or not isinstance(info.get("child-pid"), int):
            raise SandboxUnavailable(f"{bwrap} reported no sandbox pid: it is not bubblewrap")
        return info


def _confirm_sandbox(bwrap: str, pid: int, info_fd: int) -> int:
    """The sandbox's pid, once its parent and namespaces are checked from /proc."""
    info = _read_info(bwrap, info_fd)
    child: int = info["child-pid"]
    try:
        with open(f"/proc/{child}/stat", "rb") as stat_file:
            parent = int(stat_file.read().rsplit(b")", 1)[1].split()[1])
        theirs = {name: os.stat(f"/proc/{child}/ns/{name}").st_ino for name in own_namespaces()}
    except (OSError, ValueError, IndexError):
        raise _BwrapEnded("lost its sandbox during set-up") from None
    if parent != pid:
        raise SandboxUnavailable(
            f"{bwrap} named pid {child} as its sandbox, but that is not its child: it is not "
            "a bubblewrap nsconfine can trust"
        )
    for name, own in own_namespaces().items():
        claimed = info.get(f"{name}-namespace", theirs[name])
        if theirs[name] == own or claimed != theirs[name]:
            raise SandboxUnavailable(
                f"{bwrap} left the sandbox in the launcher's {name} namespace (or misreported "
                "it): it does not confine; install Debian's bubblewrap or point "
                "NSCONFINE_BWRAP at a real one"
            )
    return child
