"""Helpers shared by the test modules (importable because pyproject sets pythonpath=tests).

As root every session runs as an unprivileged account (`user=`): NSCONFINE_TEST_USER names it
(CI creates one), else `nobody`. Its workspace and run directory must belong to it, and the
directories above them must be traversable by it; `session_dirs` makes them so.
"""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import os
import pwd
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import nsconfine
from nsconfine._kernel.accounts import RunAs
from nsconfine._launch.handoff import hand_off, prepare_launch
from nsconfine._launch.stage import stage, stdio_fd
from nsconfine._plan.model import Plan
from nsconfine._plan.protect import PROTECTED
from nsconfine._plan.system import system_entries
from nsconfine._preflight.checks import proven_bwrap, takes_bind_fds
from nsconfine._selftest.probes import Probe, probes
from nsconfine._selftest.report import pids_with as pids_with  # re-exported for the tests
from nsconfine._selftest.world import World
from nsconfine._session import session_entries

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nsconfine._launch.stage import Stdio

IS_ROOT = os.geteuid() == 0
# CI's switch: a confinement test that would skip fails instead (conftest applies it). Here, not
# in conftest: a test module that imported conftest would load it a second time, and that copy
# made a second test cache directory that nothing removed.
MUST_WORK = os.environ.get("NSCONFINE_MUST_WORK") == "1"
SESSION_USER: str | None = (os.environ.get("NSCONFINE_TEST_USER") or "nobody") if IS_ROOT else None


def session_uid() -> int:
    """The uid sessions run as: SESSION_USER's as root, else the caller's."""
    return pwd.getpwnam(SESSION_USER).pw_uid if SESSION_USER else os.getuid()


def session_gid() -> int:
    """The primary gid sessions run as."""
    return pwd.getpwnam(SESSION_USER).pw_gid if SESSION_USER else os.getgid()


def give_to_session_user(*paths: Path | str) -> None:
    """chown each path (recursively) to the session user, when running as root."""
    if not IS_ROOT:
        return
    uid, gid = session_uid(), session_gid()
    for path in paths:
        os.lchown(path, uid, gid)  # a file too (os.walk yields nothing for one)
        for root, names, files in os.walk(path):
            os.chown(root, uid, gid)
            for name in [*names, *files]:
                os.lchown(os.path.join(root, name), uid, gid)


def open_up(path: Path | str) -> None:
    """Let the session user traverse path and every directory above it (the test's own temp
    directories are 0700 when made by root)."""
    if not IS_ROOT:
        return
    current = Path(path)
    while current != current.parent:
        mode = current.stat().st_mode
        if not mode & 0o001:
            current.chmod((mode & 0o7777) | 0o011)
        current = current.parent


def session_dirs(root: Path, *names: str) -> list[Path]:
    """Fresh directories under root that the session user owns and can reach."""
    made = []
    for name in names:
        path = root / name
        path.mkdir(parents=True, exist_ok=True)
        made.append(path)
    open_up(root)
    give_to_session_user(*made)
    return made


def session(workspace: Path | str, run_dir: Path | str, **options: Any) -> nsconfine.Session:
    """A Session as these tests launch it: as SESSION_USER when root."""
    if SESSION_USER:
        options.setdefault("user", SESSION_USER)
    return nsconfine.Session(workspace=workspace, run_dir=run_dir, **options)


def user_options() -> list[str]:
    """The CLI's --user option for this run (empty unless root)."""
    return ["--user", SESSION_USER] if SESSION_USER else []


def session_options(workspace: Path | str, run_dir: Path | str) -> list[str]:
    """The CLI's options for a session on workspace and run_dir (and --user, as root)."""
    return [*user_options(), "--workspace", str(workspace), "--run-dir", str(run_dir)]


# Every python_child starts with this: session_plan() builds a plan as session() does.
CHILD_PRELUDE = """
import os, sys
import nsconfine

def session_plan(workspace, run_dir, user, **options):
    if user:
        options["user"] = user
    return nsconfine.Session(workspace=workspace, run_dir=run_dir, **options).plan()
"""


def python_child(code: str, *args: str, **popen: Any) -> subprocess.Popen[str]:
    """Run CHILD_PRELUDE and code in a fresh interpreter started from /, so it imports the
    installed package (the source tree, without its compiled parts, would shadow it from the
    repository root)."""
    program = CHILD_PRELUDE + textwrap.dedent(code)
    popen.setdefault("cwd", "/")
    return subprocess.Popen([sys.executable, "-c", program, *args], text=True, **popen)


def ended_child_output(child: subprocess.Popen[str], timeout: float, hang: str) -> tuple[str, str]:
    """child's (stdout, stderr) once it has ended within timeout; else it is killed and the
    test fails, saying what hung."""
    try:
        return child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"{hang} hung")


def wait_until_gone(marker: str, timeout: float = 60.0) -> list[int]:
    """Wait up to timeout for every process whose command line holds marker to end; return
    the ones still there."""
    deadline = time.monotonic() + timeout
    while (alive := pids_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive


def sleeper(marker: str) -> list[str]:
    """A command that sleeps 10 minutes with marker in its command line (for pids_with): in
    sleep's own, as its argv[0], so that it is there once the shell has exec'd sleep (a
    comment in the shell's script was gone from it then, and pids_with found nothing)."""
    return ["/bin/bash", "-c", f'exec -a "sleep {marker}" sleep 600']


def ended_session_output(read_end: int, marker: str, attempt: object = "") -> bytes:
    """What the session whose command line holds marker wrote to read_end (closed here), once
    it has ended: asserts that its stdout reaches EOF and that no process of it is left,
    waiting up to a minute for each (a loaded host tears a session down slowly), and kills
    what is left, so that a failure leaves nothing running."""
    output = read_to_eof(read_end, 60)
    os.close(read_end)
    alive = wait_until_gone(marker, 60)
    kill_all(alive)
    assert alive == [], f"attempt {attempt}: {alive} still running"
    assert output is not None, f"attempt {attempt}: no EOF"
    return output


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL each pid, ignoring those already gone (cleanup after a failed check)."""
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def read_to_eof(fd: int, timeout: float) -> bytes | None:
    """Everything on fd until EOF, or None if EOF does not come within timeout seconds."""
    import select

    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def read_until(fd: int, wanted: bytes, timeout: float = 60) -> bytes:
    """What fd gives until wanted shows up (or the timeout, or the end)."""
    import select

    seen = b""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    return seen


# Hands its stdout to the process listening on argv[1] (holder_socket), then ends: that
# process then holds a copy of the session's pipe, and no EOF comes while it does.
HAND_OUT = """
import array, os, socket, sys
print("handed out", flush=True)
holder = socket.socket(socket.AF_UNIX)
holder.connect(sys.argv[1])
holder.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [1]))])
"""


def holder_socket(path: str) -> socket.socket:
    """A unix socket listening at path (in a session's workspace), which the session's
    account may connect to; a minute's timeout on each wait."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen()
    server.settimeout(60)
    return server


# Fills the pipe at fd argv[1] (raised to 1 MiB) a MiB at a time until its reader is gone, or
# for two minutes at most.
_FLOOD = """
import fcntl, os, sys, time
fd = int(sys.argv[1])
fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ
block, deadline = b"x" * (1 << 20), time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        os.write(fd, block)
    except BrokenPipeError:
        break
"""


class Flood:
    """Processes outside a session that keep filling a pipe the session handed out (fd), four
    at once (one alone leaves it empty now and then), until the pipe's reader is gone or
    stop()."""

    def __init__(self, fd: int, writers: int = 4) -> None:
        argv = [sys.executable, "-c", _FLOOD, str(fd)]
        self._writers = [
            subprocess.Popen(argv, pass_fds=[fd], stdin=subprocess.DEVNULL) for _ in range(writers)
        ]

    def until_full(self, read_end: int) -> None:
        """Wait until the pipe holds half its 1 MiB at least (the writers have started), a
        minute at most."""
        import fcntl
        import termios

        deadline = time.monotonic() + 60
        held = 0
        while held < 1 << 19 and time.monotonic() < deadline:
            time.sleep(0.01)
            held = int.from_bytes(fcntl.ioctl(read_end, termios.FIONREAD, bytes(4)), "little")

    def ended(self, within: float = 20) -> bool:
        """Have the writers stopped (their pipe's reader gone) within that many seconds?"""
        deadline = time.monotonic() + within
        try:
            for writer in self._writers:
                writer.wait(max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> None:
        for writer in self._writers:
            writer.kill()
            writer.wait()


def receive_fd(connection: socket.socket) -> int:
    """The one fd sent on connection (by HAND_OUT)."""
    import array

    connection.setblocking(True)
    fds = array.array("i")
    _data, ancillary, _flags, _address = connection.recvmsg(1, socket.CMSG_SPACE(4))
    for _level, _kind, payload in ancillary:
        fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    [fd] = fds
    return fd


def open_fds() -> list[int]:
    """This process's open fd numbers."""
    return sorted(int(name) for name in os.listdir("/proc/self/fd"))


def fd_targets() -> dict[int, str]:
    """This process's open fds and what each one is (a leak is named by what it holds)."""
    found = {}
    for fd in open_fds():
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own fd)
    return found


def run(plan: nsconfine.Plan, argv: Sequence[str], timeout: float = 120) -> tuple[int, str]:
    """argv's exit status and everything it wrote to stdout and stderr, in a session of plan."""
    read_end, write_end = os.pipe()
    try:
        try:
            sandbox = nsconfine.spawn(plan, argv, stdout=write_end, stderr=write_end)
        finally:
            os.close(write_end)
        output = read_to_eof(read_end, timeout)
    finally:  # a refused launch too: the suite's fds must not pile up
        os.close(read_end)
    return sandbox.wait(timeout=timeout), (output or b"").decode(errors="replace")


def sh(plan: nsconfine.Plan, script: str, timeout: float = 120) -> tuple[int, str]:
    """A shell snippet's exit status and output, in a session of plan."""
    return run(plan, ["/bin/sh", "-c", script], timeout)


def attempt(plan: nsconfine.Plan, script: str) -> tuple[int, str]:
    """A shell snippet's status and output, in a session; -1 and the refusal if refused."""
    try:
        return sh(plan, script)
    except (nsconfine.NsconfineError, OSError) as refused:
        return -1, str(refused)


def cli(
    *arguments: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m nsconfine ARGUMENTS` in a fresh interpreter started from /, so it imports the
    installed package; its status and output."""
    return subprocess.run(
        [sys.executable, "-m", "nsconfine", *arguments],
        capture_output=True, text=True, cwd="/", timeout=timeout, check=False, env=env,
    )  # fmt: skip


def outcome_without_hanging(build: Callable[[], object], what: str, timeout: float = 20) -> object:
    """What build() returns or the NsconfineError it raises, run in a thread that must end
    within timeout (a launcher that opens a planted FIFO would hang there for good)."""
    import threading

    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(build())
        except (nsconfine.NsconfineError, MemoryError) as error:
            outcome.append(error)

    builder = threading.Thread(target=run, daemon=True)
    builder.start()
    builder.join(timeout)
    assert not builder.is_alive(), f"building the plan hangs on {what}"
    return outcome[0]


def tmux(socket: str, *arguments: str) -> str:
    """`tmux -S socket ARGUMENTS`'s output (a server of the test's own, on socket)."""
    # tmux runs commands with $SHELL, else the account's login shell (nobody's is nologin).
    environ = {**os.environ, "SHELL": "/bin/sh"}
    return subprocess.run(
        ["tmux", "-S", socket, *arguments], capture_output=True, text=True, check=False,
        env=environ,
    ).stdout  # fmt: skip


def without_fd(argv: Sequence[str], fd: int) -> list[str]:
    """argv run with fd (0, 1 or 2) closed, by a shell that then execs it (a preexec_fn would
    fork the test runner with its threads, which can deadlock under ASan)."""
    closing = {0: "<&-", 1: ">&-", 2: "2>&-"}[fd]
    return ["/bin/sh", "-c", f'exec "$@" {closing}', "sh", *argv]


def with_sigchld_ignored(argv: Sequence[str]) -> list[str]:
    """argv run with SIGCHLD ignored, which an exec keeps (set by a fresh interpreter that then
    execs it: no preexec_fn, as for without_fd)."""
    ignore = (
        "import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", ignore, *argv]


# A session's attempt on a host abstract unix socket named by argv[1]: "connected", or
# "refused" and the errno.
CONNECT_ABSTRACT = (
    "import socket,sys; s=socket.socket(socket.AF_UNIX)\n"
    "try:\n    s.connect('\\0'+sys.argv[1]); print('connected')\n"
    "except OSError as e:\n    print('refused', e.errno)"
)


def abstract_listener() -> tuple[socket.socket, str]:
    """A host abstract unix socket listening under a fresh name: the socket and the name."""
    name = f"nsconfine-test-abstract-{os.urandom(4).hex()}"
    server = socket.socket(socket.AF_UNIX)
    server.bind("\0" + name)
    server.listen(4)
    return server, name


def unchecked_launcher(
    plan: Plan, argv: Sequence[str], *, stdout: Stdio = None, stderr: Stdio = None
) -> nsconfine.Sandbox:
    """Launch without the gate (no lint, no refusal of uid 0): only for the weakened plans of
    twins, which must expose what the gate refuses."""
    launch = prepare_launch(argv, stdio=(None, stdout, stderr))
    bwrap = proven_bwrap()
    staged = stage(bwrap, plan, bind_fds=takes_bind_fds(bwrap), stderr=stdio_fd(stderr, "stderr"))
    return hand_off(staged, launch)


def unlinted_next_plan(world: World, workspace: str) -> Plan:
    """The next session's plan at workspace built past the lint, and without protected paths
    (each of which refuses a planted symlink too): the twin of the selftest's planted-symlink
    check, which must leak. Its workspace is bound read-only: a launch reaches a writable
    bind's directory itself, by fds, and refuses a symlink on its way that a session could
    have planted (stop 43), which the lint's twin does not weaken."""
    session = world.session().replace(
        workspace=workspace,
        workspace_mode="ro",
        ro=(world.runner_file,),
        unprotect=tuple(name for name, _, _ in PROTECTED),
    )
    system = system_entries(world.user, session.home)
    return Plan(
        [*system, *session_entries(session, reserved=system)], chdir=workspace, user=world.user
    )


@dataclass(frozen=True)
class LocalCA:
    """A CA of a test's own (outside every trust store) and a server certificate it signed."""

    ca: Path
    cert: Path
    key: Path


def make_local_ca(where: Path, names: Sequence[str] = ("localhost", "127.0.0.1")) -> LocalCA:
    """A CA in where and a certificate it signed for names (host names or IP addresses), made
    by the openssl CLI; the CA certificate is readable by the session's account (a session
    trusts it through a bind), the keys are not."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl on this host")

    def run(*argv: str) -> None:
        subprocess.run([openssl, *argv], cwd=where, check=True, capture_output=True)

    def alt_name(name: str) -> str:
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return f"DNS:{name}"
        return f"IP:{name}"

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
        "ca.pem", "-days", "2", "-subj", "/CN=nsconfine test CA")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
        "server.csr", "-subj", f"/CN={names[0]}")  # fmt: skip
    (where / "san.ext").write_text(f"subjectAltName={','.join(map(alt_name, names))}\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    open_up(where)
    (where / "ca.pem").chmod(0o644)
    return LocalCA(where / "ca.pem", where / "server.pem", where / "server.key")


@contextmanager
def serving(
    handler: type[http.server.BaseHTTPRequestHandler], tls: LocalCA | None = None
) -> Iterator[int]:
    """An HTTP server (HTTPS with tls's certificate) on the host's loopback, on a free port,
    answering with handler until the block ends: its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert, tls.key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def swap_with_symlink(directory: Path, target: Path, stop: threading.Event) -> None:
    """Swap directory with a symlink to target, and back, staying in each state from a
    fraction of a millisecond to longer than a launch: every moment of a launch is hit."""
    import random

    rng = random.Random(7)
    real = directory.with_name(directory.name + ".real")
    link = directory.with_name(directory.name + ".link")
    while not stop.is_set():
        try:
            os.symlink(target, link)
            os.rename(directory, real)
            os.rename(link, directory)
            time.sleep(rng.choice((0.0002, 0.002, 0.02)))
            os.rename(directory, link)
            os.rename(real, directory)
            os.unlink(link)
            time.sleep(rng.choice((0.0002, 0.002, 0.05)))
        except OSError:  # EBUSY: a live sandbox pins the directory; start again from the real one
            _put_back(directory, real, link)
    _put_back(directory, real, link)


def _put_back(directory: Path, real: Path, link: Path) -> None:
    """The real directory at its name again, and no symlink left, whatever step failed."""
    with contextlib.suppress(OSError):
        if directory.is_symlink():
            directory.unlink()
    with contextlib.suppress(OSError):
        if not directory.exists() and real.exists():
            real.rename(directory)
    with contextlib.suppress(OSError):
        if link.is_symlink():
            link.unlink()


def catalogue_probe(world: World, name: str) -> Probe:
    """The probe of selftest's catalogue called name, on world."""
    return next(probe for probe in probes(world) if probe.name == name)


def writable_by(path: Path, uid: int) -> bool:
    """Whether uid may write path by its owner and mode bits (no ACLs here)."""
    info = path.stat()
    return (info.st_uid == uid and bool(info.st_mode & 0o200)) or bool(info.st_mode & 0o002)


@contextmanager
def running_world(root: str, user: RunAs | None) -> Iterator[World]:
    """selftest's World at root, running (World.running)."""
    with World(root, user).running() as running:
        yield running
