"""A session never holds host power, and a launcher never hangs on one.

Each test tries a hole an attacker or a crash would use: host uid 0 through a root launcher,
writable /proc/sys, setuid files left on the host, the launcher's session keyring, a sandbox
left alive (holding its pipes) after kill() or the launcher's death, pool fd leaks and stale
pins, select()'s fd limit, a bwrap planted through PATH, a FIFO among copied runner files, the
caller's terminal, and ambiguous exit statuses. Where a layer can be switched off (through
nsconfine._kernel.layers' test-only door), its twin shows the check failing without it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import random
import signal
import stat
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import (
    IS_ROOT,
    SESSION_USER,
    cli,
    fd_targets,
    give_to_session_user,
    kill_all,
    open_fds,
    open_up,
    pids_with,
    python_child,
    read_to_eof,
    session,
    session_dirs,
    session_options,
    session_uid,
    sh,
    user_options,
    wait_until_gone,
)

import nsconfine

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


# ------------------------------------------------------------------ host uid 0


def test_the_session_never_holds_host_uid_0(plan: nsconfine.Plan) -> None:
    """Every process of the session runs, on the host, as the session user (never uid 0),
    and holds no capability."""
    marker = f"nsconfine-uid-{os.urandom(6).hex()}"
    script = f'/bin/sh -c "sleep 600 # {marker}" & wait # {marker}'
    with nsconfine.spawn(plan, ["/bin/sh", "-c", script]) as sandbox:
        deadline = time.monotonic() + 10
        while len(pids := pids_with(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        statuses: list[dict[str, str]] = []
        for pid in [sandbox.pid, sandbox.child_pid, *pids]:
            with open(f"/proc/{pid}/status") as lines:
                statuses.append(dict(line.split(":", 1) for line in lines))
    assert len(statuses) >= 4
    for status in statuses:
        assert status["Uid"].split() == [str(session_uid())] * 4
        assert status["CapEff"].strip() == "0000000000000000"
    if IS_ROOT:
        assert session_uid() != 0


def test_the_manifest_names_the_user(plan: nsconfine.Plan) -> None:
    """The manifest shows whom the session runs as."""
    assert f"uid {session_uid()}" in plan.manifest()
    assert plan.to_json()["user"]["uid"] == session_uid()


# ------------------------------------------------------------------ /proc/sys

_WRITE_EVERY_SYSCTL = r"""
import os, sys
opened = []
for top in sys.argv[1:]:
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            try:
                os.close(os.open(path, os.O_WRONLY))  # opened, never written
                opened.append(path)
            except OSError:
                pass
print(len(opened), *opened[:5])
"""


def _writable_proc_entries(plan: nsconfine.Plan) -> list[str]:
    return [e.dest for e in plan.entries if e.dest.startswith("/proc/") and e.kind == "bind"]


def test_proc_sys_and_friends_are_read_only_entries(plan: nsconfine.Plan) -> None:
    """/proc/sys (and every other writable procfs entry this host has) is a read-only entry
    of the plan, with its reason."""
    entries = {e.dest: e for e in plan.entries}
    assert entries["/proc/sys"].mode == "ro"
    assert entries["/proc/sys"].reason
    for path in ("/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/mtrr", "/proc/pressure"):
        if os.path.lexists(path):
            assert entries[path].mode == "ro", path


def test_no_sysctl_opens_for_write(plan: nsconfine.Plan) -> None:
    """Not one file under the writable procfs entries opens for write in a session."""
    tops = ["/proc/sys", *_writable_proc_entries(plan)]
    status, output = sh(plan, f"python3 -c '{_WRITE_EVERY_SYSCTL}' {' '.join(tops)}")
    assert status == 0, output
    assert output.split()[0] == "0", output


def _sysctls_opened_for_write(plan: nsconfine.Plan) -> int:
    from helpers import unchecked_launcher

    read_end, write_end = os.pipe()
    sandbox = unchecked_launcher(
        plan,
        ["python3", "-c", _WRITE_EVERY_SYSCTL, "/proc/sys"],
        stdout=write_end,
        stderr=write_end,
    )
    os.close(write_end)
    output = (read_to_eof(read_end, 60) or b"").decode()
    os.close(read_end)
    sandbox.wait(timeout=60)
    return int(output.split()[0])


def test_without_the_entries_some_sysctl_opens_for_write(plan: nsconfine.Plan) -> None:
    """The twin: without the read-only entries the session opens sysctls of its own
    namespaces for write, so the check above can fail."""
    weakened = plan.replace(entries=tuple(e for e in plan.entries if e.dest != "/proc/sys"))
    assert _sysctls_opened_for_write(weakened) > 0


# ------------------------------------------------------------------ setuid files


_PLANT_SETUID = r"""
cp /bin/sh by-chmod && chmod 4755 by-chmod
chmod g+s by-chmod
python3 -c 'import os; os.umask(0); os.close(os.open("by-open", os.O_CREAT|os.O_WRONLY, 0o4755))'
python3 -c 'import os; os.umask(0); os.mknod("by-mknod", 0o102755)'
true
"""


def _setid_files(workspace: Path) -> list[str]:
    return [
        path.name
        for path in workspace.iterdir()
        if path.stat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    ]


def test_no_setuid_file_can_be_planted(plan: nsconfine.Plan, ws_run: tuple[Path, Path]) -> None:
    """chmod u+s / g+s, open(O_CREAT) and mknod with set-id bits all fail: nothing in the
    workspace keeps a setuid or setgid bit on the host."""
    _status, output = sh(plan, _PLANT_SETUID)
    assert _setid_files(ws_run[0]) == [], output


def test_without_seccomp_a_setuid_file_is_planted(
    plan: nsconfine.Plan, ws_run: tuple[Path, Path], without: Callable[..., None]
) -> None:
    """The twin: with the seccomp layer off the same script leaves setuid files."""
    without("seccomp")
    sh(plan, _PLANT_SETUID)
    assert set(_setid_files(ws_run[0])) >= {"by-chmod", "by-open", "by-mknod"}


# ------------------------------------------------------------------ lifecycle


def _sleeper(marker: str) -> list[str]:
    return ["/bin/sh", "-c", f"exec sleep 600 # {marker}"]


def test_kill_right_after_spawn_leaves_nothing(plan: nsconfine.Plan) -> None:
    """kill() at once, or leaving the with block, ends every process of the session and its
    stdout reaches EOF, every time."""
    for attempt in range(30):
        marker = f"nsconfine-kill-{os.urandom(6).hex()}"
        read_end, write_end = os.pipe()
        try:
            sandbox = nsconfine.spawn(plan, _sleeper(marker), stdout=write_end)
        finally:
            os.close(write_end)
        if attempt % 2:
            sandbox.kill()
            sandbox.wait(timeout=10)
        else:
            with sandbox:
                pass
        eof = read_to_eof(read_end, 5)
        os.close(read_end)
        alive = wait_until_gone(marker, 5)
        kill_all(alive)
        assert alive == [], f"attempt {attempt}"
        assert eof is not None, f"attempt {attempt}: no EOF"


_DYING_LAUNCHER = r"""
plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[4])
print("ready", flush=True)
sandbox = nsconfine.spawn(
    plan, ["/bin/sh", "-c", "exec sleep 600 # " + sys.argv[3]], stdout=int(sys.argv[5])
)
print("spawned", flush=True)
sandbox.wait()
"""


def test_the_launchers_death_at_any_moment_leaves_nothing(ws_run: tuple[Path, Path]) -> None:
    """SIGKILL of the launcher at any moment of a launch (before, during or right after
    spawn) ends the whole session and its stdout reaches EOF."""
    rng = random.Random(6)
    for attempt in range(24):
        marker = f"nsconfine-dying-{os.urandom(6).hex()}"
        read_end, write_end = os.pipe()
        child = python_child(
            _DYING_LAUNCHER, str(ws_run[0]), str(ws_run[1]), marker, SESSION_USER or "",
            str(write_end), stdout=subprocess.PIPE, pass_fds=(write_end,),
        )  # fmt: skip
        os.close(write_end)
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        if attempt % 3 == 0:
            child.stdout.readline()  # right after spawn returned
        else:
            time.sleep(rng.uniform(0, 0.03))  # somewhere inside spawn
        child.kill()
        child.wait()
        child.stdout.close()
        eof = read_to_eof(read_end, 10)
        os.close(read_end)
        alive = wait_until_gone(marker, 5)
        kill_all(alive)
        assert alive == [], f"attempt {attempt}"
        assert eof is not None, f"attempt {attempt}: no EOF"


def test_a_forwarded_sigterm_leaves_nothing(ws_run: tuple[Path, Path]) -> None:
    """SIGTERM to `nsconfine run` at any moment ends the session, and its stdout reaches EOF."""
    rng = random.Random(7)
    for attempt in range(12):
        marker = f"nsconfine-term-{os.urandom(6).hex()}"
        read_end, write_end = os.pipe()
        cli = subprocess.Popen(
            [sys.executable, "-m", "nsconfine", "run", *session_options(*ws_run), "--",
             *_sleeper(marker)],
            stdout=write_end, cwd="/",
        )  # fmt: skip
        os.close(write_end)
        time.sleep(rng.uniform(0.05, 0.4))
        cli.send_signal(signal.SIGTERM)
        cli.wait(timeout=30)
        eof = read_to_eof(read_end, 10)
        os.close(read_end)
        alive = wait_until_gone(marker, 5)
        kill_all(alive)
        assert alive == [], f"attempt {attempt}"
        assert eof is not None, f"attempt {attempt}: no EOF"


# ------------------------------------------------------------------ pools


def test_a_busy_pool_leaks_no_fd(plan: nsconfine.Plan) -> None:
    """Many warm launches leave the launcher with the fds it had."""
    with nsconfine.Pool(plan) as pool:
        pool.launch(["/bin/true"]).wait(timeout=30)
        # Counted with the pool at rest (one staged, its refill done) both times: a refill in
        # flight holds a launch's fds for a moment.
        assert pool.wait_staged(30)
        before = fd_targets()
        for _ in range(60):
            pool.launch(["/bin/true"]).wait(timeout=30)
        assert pool.wait_staged(30)
        after = fd_targets()
    new = {fd: what for fd, what in after.items() if before.get(fd) != what}
    assert len(after) <= len(before) + 1, new


def test_a_pool_checks_pins_at_launch(tmp_path: Path) -> None:
    """A pinned harness rewritten after its sandbox was staged is refused at launch."""
    import hashlib

    workspace, run_dir, tools = session_dirs(tmp_path, "ws", "run", "tools")
    harness = tools / "agent"
    harness.write_text("#!/bin/sh\necho agent\n")
    harness.chmod(0o755)
    digest = hashlib.sha256(harness.read_bytes()).hexdigest()
    plan = session(workspace, run_dir, harness=[f"{harness}@sha256:{digest}"]).plan()
    marker = workspace / "ran"
    with nsconfine.Pool(plan) as pool:
        assert pool.wait_staged(30)
        harness.write_text(f"#!/bin/sh\ntouch {marker}\n")
        with pytest.raises(nsconfine.PlanError, match="sha256"):
            pool.launch([str(harness)]).wait(timeout=30)
    assert not marker.exists()


_MANY_FDS = r"""
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3])
sandbox = nsconfine.spawn(plan, ["/bin/sh", "-c", "exit 3"])
assert sandbox.wait(timeout=30) == 3
with nsconfine.Pool(plan) as pool:
    assert pool.launch(["/bin/sh", "-c", "exit 4"]).wait(timeout=30) == 4
print("ok")
"""


def test_a_launcher_with_many_fds_launches_and_waits(ws_run: tuple[Path, Path]) -> None:
    """A launcher holding more than 1,023 fds can spawn, wait with a timeout, and use a pool."""
    child = python_child(
        _MANY_FDS, str(ws_run[0]), str(ws_run[1]), SESSION_USER or "",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = child.communicate(timeout=120)
    assert out == "ok\n", err


# ------------------------------------------------------------------ where bwrap comes from


def _planted_bwrap(directory: Path, marker: Path) -> Path:
    real = nsconfine.preflight().bwrap
    fake = directory / "bwrap"
    fake.write_text(f'#!/bin/sh\ntouch {marker}\nexec {real} "$@"\n')
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("path", ["", ".", "::", ":/usr/bin", "bin"])
def test_bwrap_is_never_found_through_a_relative_path_entry(
    ws_run: tuple[Path, Path], path: str
) -> None:
    """Empty and relative PATH entries are skipped: a bwrap planted in the working directory
    (a previous session's workspace) is never run."""
    workspace = ws_run[0]
    (workspace / "bin").mkdir()
    marker = workspace / "planted-bwrap-ran"
    _planted_bwrap(workspace, marker)
    _planted_bwrap(workspace / "bin", marker)
    code = r"""
plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3])
try:
    print(nsconfine.spawn(plan, ["/bin/true"]).wait(timeout=30))
except nsconfine.SandboxUnavailable as refused:
    print(refused.code)
"""
    env = {k: v for k, v in os.environ.items() if k != "NSCONFINE_BWRAP"}
    env["PATH"] = f"{path}:/usr/bin" if path else ""
    child = python_child(
        code, str(workspace), str(ws_run[1]), SESSION_USER or "",
        cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = child.communicate(timeout=60)
    assert not marker.exists(), out + err
    assert out.strip() in ("0", "sandbox-unavailable"), err


def test_a_relative_nsconfine_bwrap_is_refused(
    plan: nsconfine.Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NSCONFINE_BWRAP must be an absolute path."""
    monkeypatch.setenv("NSCONFINE_BWRAP", "bwrap")
    with pytest.raises(nsconfine.SandboxUnavailable, match="absolute"):
        nsconfine.spawn(plan, ["/bin/true"])


def test_a_bwrap_inside_a_writable_bind_is_refused(
    plan: nsconfine.Plan, ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bwrap a session could have written (inside its workspace) is refused by name."""
    marker = ws_run[0] / "planted-bwrap-ran"
    fake = _planted_bwrap(ws_run[0], marker)
    monkeypatch.setenv("NSCONFINE_BWRAP", str(fake))
    with pytest.raises(nsconfine.SandboxUnavailable, match="writable"):
        nsconfine.spawn(plan, ["/bin/true"])
    assert not marker.exists()


# ------------------------------------------------------------------ runner files


_SPAWN_WITH_FIFO = r"""
tree = sys.argv[1]
files = [os.path.join(tree, f"f{i}.py") for i in range(20)]
plan = session_plan(sys.argv[2], sys.argv[3], sys.argv[4], ro=files)
os.unlink(files[7])
os.mkfifo(files[7])
try:
    nsconfine.spawn(plan, ["/bin/true"]).wait(timeout=30)
    print("ran")
except nsconfine.PlanError as refused:
    print(refused.code, refused.message)
"""


def test_a_fifo_among_copied_runner_files_is_refused(tmp_path: Path) -> None:
    """A runner file swapped for a FIFO after the plan was built is refused, not waited on."""
    workspace, run_dir, tree = session_dirs(tmp_path, "ws", "run", "tree")
    for i in range(20):
        (tree / f"f{i}.py").write_text(f"print({i})\n")
    give_to_session_user(tree)
    child = python_child(
        _SPAWN_WITH_FIFO, str(tree), str(workspace), str(run_dir), SESSION_USER or "",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail("spawn hung on the FIFO")
    assert out.startswith("plan-refused"), out + err
    assert "f7.py" in out


# ------------------------------------------------------------------ the caller's terminal


_TERMINAL_MESS = r"""
import fcntl, os, struct, termios
fcntl.fcntl(0, fcntl.F_SETFL, fcntl.fcntl(0, fcntl.F_GETFL) | os.O_NONBLOCK)
fcntl.ioctl(0, termios.TIOCEXCL)
termios.tcflow(0, termios.TCOOFF)
try:
    fcntl.ioctl(0, termios.TIOCSETD, struct.pack("i", 27))  # N_NULL: every read and write fails
except OSError:
    pass
"""


def test_the_callers_terminal_is_restored(plan: nsconfine.Plan) -> None:
    """A session that turns echo off, makes the terminal non-blocking and exclusive and
    suspends its output leaves the caller's terminal as it found it. (Not its window size: a
    window resized meanwhile must keep its new size, see test_tty.py.)"""
    controller, terminal = pty.openpty()
    try:
        before = termios.tcgetattr(terminal)
        flags = fcntl.fcntl(terminal, fcntl.F_GETFL)
        sandbox = nsconfine.spawn(
            plan,
            [
                "/bin/sh",
                "-c",
                f"stty -echo -icanon; python3 -c '{_TERMINAL_MESS}'",
            ],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
        )
        assert sandbox.wait(timeout=30) == 0
        after = termios.tcgetattr(terminal)
        assert fcntl.fcntl(terminal, fcntl.F_GETFL) == flags
        discipline = struct.unpack("i", fcntl.ioctl(terminal, termios.TIOCGETD, b"\0" * 4))[0]
        assert discipline == 0  # N_TTY
        os.close(os.open(os.ttyname(terminal), os.O_RDWR | os.O_NOCTTY))  # not exclusive
        os.write(terminal, b"flows\n")  # output not suspended: this returns
        assert os.read(controller, 100).endswith(b"flows\r\n")
    finally:
        os.close(controller)
        os.close(terminal)
    assert after == before


# ------------------------------------------------------------------ exit statuses


def test_a_missing_command_raises_oserror(plan: nsconfine.Plan) -> None:
    """A command that does not exist raises OSError with ENOENT and its name."""
    with pytest.raises(OSError, match="no-such-command") as failed:
        nsconfine.spawn(plan, ["no-such-command"])
    assert failed.value.errno == errno.ENOENT
    assert failed.value.filename == "no-such-command"


def test_a_non_executable_command_raises_oserror(
    plan: nsconfine.Plan, ws_run: tuple[Path, Path]
) -> None:
    """A command that is not executable raises OSError with EACCES."""
    script = ws_run[0] / "script"
    script.write_text("#!/bin/sh\n")
    give_to_session_user(script)
    with pytest.raises(OSError, match="script") as failed:
        nsconfine.spawn(plan, [str(script)])
    assert failed.value.errno == errno.EACCES


def _cli_run(ws_run: tuple[Path, Path], *command: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "run",
        *session_options(*ws_run),
        "--",
        *command,
    )


def test_cli_exits_127_for_a_missing_command(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine run -- no-such-command` exits 127, as a shell does, in one line."""
    result = _cli_run(ws_run, "no-such-command")
    assert result.returncode == 127, result.stderr
    assert "no-such-command" in result.stderr
    assert result.stderr.count("\n") == 1


def test_cli_exit_1_is_the_commands_own(ws_run: tuple[Path, Path]) -> None:
    """A command's own exit 1 is 1."""
    assert _cli_run(ws_run, "/bin/sh", "-c", "exit 1").returncode == 1


def test_a_sandbox_that_fails_to_set_up_is_69(ws_run: tuple[Path, Path]) -> None:
    """A previous session that replaced run/home with a file makes the next launch's set-up
    fail: the CLI exits 69 with nsconfine's refusal, the API raises SandboxUnavailable."""
    home = ws_run[1] / "home"
    if home.is_dir():
        home.rmdir()
    home.write_text("not a directory")
    give_to_session_user(home)
    result = _cli_run(ws_run, "/bin/true")
    assert result.returncode == 69, result.stderr
    assert "nsconfine: sandbox-unavailable: " in result.stderr
    with pytest.raises(nsconfine.SandboxUnavailable):
        nsconfine.spawn(session(*ws_run).plan(), ["/bin/true"])


# ------------------------------------------------------------------ found by an attacker's pass


def test_bwrap_is_used_by_its_resolved_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PATH entry that is a symlink is resolved once: every later use (proof, exec) names the
    real file, so a symlink flipped between them cannot swap the binary."""
    from nsconfine._preflight.checks import located_bwrap

    (link := tmp_path / "pbin").symlink_to("/usr/bin")
    monkeypatch.setenv("PATH", f"{link}:/usr/bin")
    monkeypatch.delenv("NSCONFINE_BWRAP", raising=False)
    found = located_bwrap()
    assert found == os.path.realpath(found)
    assert not found.startswith(str(tmp_path))


@pytest.mark.root  # only a root launcher must refuse a bwrap others can write
@pytest.mark.parametrize("how", ["owned-by-the-session-account", "world-writable-directory"])
def test_a_bwrap_others_can_change_is_refused_as_root(
    plan: nsconfine.Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """As root, a bwrap that anyone but root could replace (its file or a directory above it)
    is refused before it ever runs."""
    import shutil

    place = tmp_path / "bins"
    place.mkdir()
    open_up(place)
    copy = place / "bwrap"
    shutil.copy("/usr/bin/bwrap", copy)
    if how == "owned-by-the-session-account":
        give_to_session_user(place)
    else:
        place.chmod(0o777)
    monkeypatch.setenv("NSCONFINE_BWRAP", str(copy))
    with pytest.raises(nsconfine.SandboxUnavailable, match="could be replaced"):
        nsconfine.spawn(plan, ["/bin/true"])


@pytest.mark.root  # only a root launcher could run bwrap as root
def test_bwrap_never_runs_as_root(
    plan: nsconfine.Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root, bwrap is never run as root, not even to ask it for --help."""
    place = tmp_path / "bins"
    place.mkdir()
    open_up(place)
    log = tmp_path / "uids"
    log.touch()
    log.chmod(0o666)
    wrapper = place / "bwrap"
    wrapper.write_text(f'#!/bin/sh\nid -u >> {log}\nexec /usr/bin/bwrap "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("NSCONFINE_BWRAP", str(wrapper))
    nsconfine.spawn(plan, ["/bin/true"]).wait(timeout=30)
    uids = log.read_text().split()
    assert uids
    assert "0" not in uids


_MQ_SETGID = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.umask(0)
fd = libc.mq_open(b"/nsconfine-probe", os.O_CREAT | os.O_RDWR, 0o2644, None)
print("created" if fd >= 0 else "refused %d" % ctypes.get_errno())
"""


def test_mq_open_cannot_ask_for_a_set_id_mode(plan: nsconfine.Plan) -> None:
    """mq_open with a set-group-ID mode is refused (EPERM) by the seccomp filter."""
    _status, output = sh(plan, f"python3 -c '{_MQ_SETGID}'")
    assert output.startswith("refused 1"), output


def test_sigterm_to_run_ends_even_a_session_that_ignores_it(ws_run: tuple[Path, Path]) -> None:
    """SIGTERM to `nsconfine run` reaches the command; a session that ignores it is killed
    when the grace period ends: nothing is left, and its stdout reaches EOF."""
    marker = f"nsconfine-grace-{os.urandom(6).hex()}"
    read_end, write_end = os.pipe()
    cli = subprocess.Popen(
        [sys.executable, "-m", "nsconfine", "run", *user_options(), "--grace", "1",
         "--workspace", str(ws_run[0]), "--run-dir", str(ws_run[1]), "--",
         "/bin/sh", "-c", f"trap '' TERM; echo started; sleep 600 & wait; sleep 600 # {marker}"],
        stdout=write_end, cwd="/",
    )  # fmt: skip
    os.close(write_end)
    time.sleep(1.5)
    cli.send_signal(signal.SIGTERM)
    assert cli.wait(timeout=30) != 0
    eof = read_to_eof(read_end, 10)
    os.close(read_end)
    alive = wait_until_gone(marker, 5)
    kill_all(alive)
    assert alive == []
    assert eof == b"started\n"  # it ran, ignored SIGTERM, and was killed after the grace


def test_a_refused_argv_leaves_nothing_staged(ws_run: tuple[Path, Path]) -> None:
    """A launch refused for its argv or environment (a NUL byte, a bad name) leaves no pidfd
    and no process behind, from spawn as from a pool."""
    plan = session(*ws_run).plan()
    with nsconfine.Pool(plan, refill="inline") as pool:
        pool.launch(["/bin/true"]).wait(timeout=30)
        before = open_fds()
        for _ in range(5):
            with pytest.raises(nsconfine.UsageError):
                pool.launch(["/bin/true", "a\0b"])
            with pytest.raises(nsconfine.UsageError):
                pool.launch(["/bin/true"], env={"BAD=NAME": "x"})
            with pytest.raises(nsconfine.UsageError):
                nsconfine.spawn(plan, ["/bin/true", "a\0b"])
        assert len(open_fds()) <= len(before) + 1


def test_user_zero_is_refused_as_uid_0() -> None:
    """`--user 0` is refused as uid 0, not as an unknown account."""
    result = cli("plan", "--user", "0", "--workspace", "/tmp", "--run-dir", "/tmp")
    assert result.returncode == 64
    assert "uid 0" in result.stderr
