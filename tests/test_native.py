"""The native layer against real processes, fds and namespaces."""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import json
import os
import pickle
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from nsconfine._kernel.syscalls import (
    SHIM_WIRE,
    PathIdentities,
    SyscallError,
    memfd_sealed,
    probe_user_namespace,
    spawn,
)

PYTHON = os.fsencode(sys.executable)
SH = b"/bin/sh"

# Prints the fds open in the child, from /proc, minus listdir's own.
LIST_FDS = """
import os
def is_open(fd):
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
print(sorted(fd for fd in map(int, os.listdir("/proc/self/fd")) if is_open(fd)))
"""


def python_argv(code: str, *args: str) -> list[bytes]:
    return [PYTHON, b"-I", b"-c", code.encode(), *map(os.fsencode, args)]


def wait_exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def capture(argv: Sequence[bytes], env: Sequence[bytes] = (), **kwargs: Any) -> bytes:
    """Run argv with stdout on a pipe; return what it printed, after checking it exited 0."""
    read_end, write_end = os.pipe()
    try:
        pid = spawn(argv[0], argv, env, stdout=write_end, **kwargs)
    finally:
        os.close(write_end)
    with open(read_end, "rb") as out:
        output = out.read()
    assert wait_exit_code(pid) == 0, output
    return output


@pytest.fixture
def devnull() -> Iterator[int]:
    fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    yield fd
    os.close(fd)


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines)


def is_dead(pid: int) -> bool:
    """Gone or a zombie: an orphan's zombie waits for whatever reaps for pid 1."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_spawn_returns_the_pid_of_the_running_program() -> None:
    """spawn returns the pid of the exec'd program, which the caller then reaps."""
    pid = spawn(SH, [b"sh", b"-c", b"exit 7"], [])
    assert wait_exit_code(pid) == 7


def test_missing_executable_raises_execve_error() -> None:
    """An execve failure is a SyscallError naming execve, with errno ENOENT and the path."""
    with pytest.raises(SyscallError) as caught:
        spawn(b"/nonexistent/nsconfine-test", [b"x"], [])
    assert caught.value.errno == errno.ENOENT
    assert caught.value.syscall == "execve"
    assert caught.value.filename == "/nonexistent/nsconfine-test"
    assert caught.value.strerror == "execve: No such file or directory"


def test_bad_pass_fd_raises_dup2_error() -> None:
    """A pass fd that is not open, even one whose number spawn reuses, fails with EBADF, dup2."""
    never_opened = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(never_opened)
    just_closed = os.open(os.devnull, os.O_RDONLY)  # spawn's own error pipe will take this number
    os.close(just_closed)
    for fd in (never_opened, just_closed):
        with pytest.raises(SyscallError) as caught:
            spawn(b"/bin/true", [b"true"], [], pass_fds=[fd])
        assert (caught.value.errno, caught.value.syscall) == (errno.EBADF, "dup2")


def test_syscall_error_survives_pickling() -> None:
    """A SyscallError pickles back to the same errno, syscall and message."""
    again = pickle.loads(pickle.dumps(SyscallError(errno.ENOENT, "execve", "/x")))
    assert (again.errno, again.syscall, again.filename) == (errno.ENOENT, "execve", "/x")
    assert str(again) == "[Errno 2] execve: No such file or directory: '/x'"


def test_nul_in_argv_is_refused() -> None:
    """An argument with a NUL byte raises ValueError rather than being cut short."""
    with pytest.raises(ValueError, match="null byte"):
        spawn(b"/bin/true", [b"true", b"a\0b"], [])


def test_env_reaches_the_child_exactly() -> None:
    """The child's environment is exactly the env given, and empty when it is empty."""
    assert capture([b"/usr/bin/env"], [b"A=1", b"B=two words"]) == b"A=1\nB=two words\n"
    assert capture([b"/usr/bin/env"], []) == b""


def test_pass_fds_land_at_3_and_up_in_order() -> None:
    """pass_fds[i] is fd 3 + i in the child, in list order rather than number order."""
    pipes = [os.pipe() for _ in range(2)]
    for (_, write_end), data in zip(pipes, (b"first\n", b"second\n"), strict=True):
        os.write(write_end, data)
        os.close(write_end)
    (read_first, _), (read_second, _) = pipes
    try:
        output = capture([SH, b"-c", b"cat <&3; cat <&4"], pass_fds=[read_second, read_first])
    finally:
        os.close(read_first)
        os.close(read_second)
    assert output == b"second\nfirst\n"


def test_only_stdio_and_pass_fds_reach_the_child(devnull: int) -> None:
    """An fd the launcher left inheritable does not reach the child; only 0-2 and pass_fds do."""
    leaked = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(leaked, True)
    passed = os.memfd_create("passed")
    try:
        # The same lister without nsconfine does see the inheritable fd.
        unconfined = subprocess.run(
            [sys.executable, "-I", "-c", LIST_FDS], capture_output=True, close_fds=False, check=True
        )
        assert leaked in json.loads(unconfined.stdout)
        output = capture(python_argv(LIST_FDS), stdin=devnull, stderr=devnull, pass_fds=[passed])
    finally:
        os.close(leaked)
        os.close(passed)
    assert json.loads(output) == [0, 1, 2, 3]


def test_fds_land_right_when_sources_collide_with_targets() -> None:
    """Each target gets its source even when a source's number is another target's."""
    report = os.memfd_create("report")
    mine: list[int] = []
    # Enough fds that some have numbers inside the target range 0..n_targets-1.
    while not mine or min(mine) >= 6 + len(mine):
        mine.append(os.memfd_create(f"mine{len(mine)}"))  # CLOEXEC, as the child must undo
    pass_fds = [report, 1, 0, *reversed(mine)]
    sources = [1, 0, mine[0], *pass_fds]  # stdin is our stdout and stdout our stdin
    code = """if 1:
        import json, os, sys
        ids = [(s.st_dev, s.st_ino) for s in map(os.fstat, range(int(sys.argv[1])))]
        os.write(3, json.dumps(ids).encode())
    """
    try:
        pid = spawn(
            PYTHON,
            python_argv(code, str(len(sources))),
            [],
            stdin=1,
            stdout=0,
            stderr=mine[0],
            pass_fds=pass_fds,
        )
        assert wait_exit_code(pid) == 0, os.pread(mine[0], 65536, 0)
        reported = json.loads(os.pread(report, 65536, 0))
        expected = [[os.fstat(fd).st_dev, os.fstat(fd).st_ino] for fd in sources]
    finally:
        for fd in (report, *mine):
            os.close(fd)
    assert reported == expected


def test_stdio_goes_to_the_given_fds() -> None:
    """stdin, stdout and stderr are the given fds in the child."""
    stdin_read, stdin_write = os.pipe()
    stderr_read, stderr_write = os.pipe()
    os.write(stdin_write, b"hello\n")
    os.close(stdin_write)
    try:
        output = capture([SH, b"-c", b"cat; echo oops >&2"], stdin=stdin_read, stderr=stderr_write)
    finally:
        os.close(stdin_read)
        os.close(stderr_write)
    with open(stderr_read, "rb") as errors:
        assert errors.read() == b"oops\n"
    assert output == b"hello\n"


def test_signal_dispositions_reset_and_mask_restored() -> None:
    """SIGPIPE, ignored by Python, is default in the child, whose mask is the caller's."""
    sigpipe_bit = 1 << (signal.SIGPIPE - 1)
    sigusr1_bit = 1 << (signal.SIGUSR1 - 1)
    assert int(proc_status(os.getpid())["SigIgn"], 16) & sigpipe_bit  # what must not leak
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    try:
        pid = spawn(b"/bin/sleep", [b"sleep", b"60"], [])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        status = proc_status(pid)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert int(status["SigIgn"], 16) == 0
    assert int(status["SigBlk"], 16) == sigusr1_bit


HELPER = """if 1:
    import os, sys
    from nsconfine._kernel.syscalls import spawn
    null = os.open(os.devnull, os.O_RDWR)
    pid = spawn(b"/bin/sleep", [b"sleep", b"60"], [], stdin=null, stdout=null, stderr=null,
                pdeathsig=int(sys.argv[1]))
    print(pid, flush=True)
    sys.stdin.read()
"""


def orphan_sleep(pdeathsig: int) -> int:
    """Have a helper spawn `sleep 60` with pdeathsig, SIGKILL the helper; return sleep's pid."""
    with subprocess.Popen(
        [sys.executable, "-c", HELPER, str(pdeathsig)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd="/",  # -c puts the cwd first on sys.path; the source tree would shadow the install
    ) as helper:
        assert helper.stdout is not None
        pid = int(helper.stdout.readline())
        assert not is_dead(pid)
        helper.kill()
    return pid


def test_pdeathsig_kills_the_child_when_the_launcher_dies() -> None:
    """With pdeathsig=SIGKILL the child dies with its launcher; without it, it lives on."""
    survivor = orphan_sleep(0)
    try:
        assert not is_dead(survivor)
    finally:
        os.kill(survivor, signal.SIGKILL)
    killed = orphan_sleep(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not is_dead(killed) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert is_dead(killed)


def test_memfd_sealed_reads_back_and_refuses_changes() -> None:
    """The memfd reads back whole from offset 0, is CLOEXEC, fully sealed, and refuses writes."""
    data = b"--ro-bind\0/usr\0/usr\0"
    fd = memfd_sealed("args", data)
    try:
        assert os.read(fd, 4096) == data
        assert not os.get_inheritable(fd)
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) == seals
        with pytest.raises(PermissionError):
            os.write(fd, b"x")
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def test_memfd_sealed_is_read_whole_by_a_child() -> None:
    """A child given the memfd reads all of it from the start, as bwrap's --args does."""
    fd = memfd_sealed("args", b"a\0b\0")
    empty = memfd_sealed("empty", b"")
    try:
        assert capture([SH, b"-c", b"cat <&3; cat <&4"], pass_fds=[fd, empty]) == b"a\0b\0"
    finally:
        os.close(fd)
        os.close(empty)


def test_probe_user_namespace_succeeds_here() -> None:
    """This host lets a child create a user namespace and write its id maps."""
    probe_user_namespace()


def _linked_by_python(top: str, depth: int, budget: int) -> tuple[list[tuple[int, int, str]], int]:
    """What linked_files finds, walked with os.scandir as the lint did before it was in C."""
    found: list[tuple[int, int, str]] = []

    def walk(directory: str, depth: int, budget: int) -> int:
        with os.scandir(directory) as listing:
            entries = list(listing)
        for entry in entries:
            budget -= 1
            if budget <= 0:
                return 0
            if entry.is_file(follow_symlinks=False):
                info = entry.stat(follow_symlinks=False)
                if info.st_nlink > 1:
                    found.append((info.st_dev, info.st_ino, entry.path))
            elif depth > 1 and entry.is_dir(follow_symlinks=False):
                budget = walk(entry.path, depth - 1, budget)
        return budget

    return found, walk(top, depth, budget)


@pytest.mark.parametrize("budget", [3, 12, 40, 5000])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_linked_files_finds_what_a_walk_finds(tmp_path: Path, depth: int, budget: int) -> None:
    """The files with several names in a directory, depth levels down, within a budget of
    entries, never through a symlink: as a walk in Python finds them, path for path."""
    from nsconfine._kernel.syscalls import linked_files

    top = tmp_path / "denied"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for where in ("", "a", "a/b", "a/b/c", "d"):
        (top / where).mkdir(parents=True, exist_ok=True)
        for number in range(3):
            (top / where / f"file{number}").write_text("x")
        os.link(top / where / "file0", elsewhere / f"{where.replace('/', '-')}-link")
    (top / "a" / "to-elsewhere").symlink_to(elsewhere)  # never followed
    (top / "a" / "fifo").touch()
    expected, left = _linked_by_python(str(top), depth, budget)
    found, found_left = linked_files(str(top), depth, budget)
    assert sorted(found) == sorted(expected)
    assert found_left == left
    assert not any("elsewhere" in path for _, _, path in found)
    with pytest.raises(OSError, match="No such file") as missing:
        linked_files(str(tmp_path / "missing"), depth, budget)
    assert missing.value.errno == errno.ENOENT


def test_linked_files_finds_more_paths_than_its_first_buffer_holds(tmp_path: Path) -> None:
    """Paths past the 16 KiB it first makes room for: it looks again with more room."""
    from nsconfine._kernel.syscalls import linked_files

    (top := tmp_path / "denied").mkdir()
    (elsewhere := tmp_path / "elsewhere").mkdir()
    for number in range(200):
        name = f"{number:03}-" + "n" * 200
        (top / name).write_text("x")
        os.link(top / name, elsewhere / name)
    found, _ = linked_files(str(top), 1, 5000)
    assert sorted(path for _, _, path in found) == sorted(str(p) for p in top.iterdir())


@pytest.mark.parametrize("where", ["last", "middle", "last, to a directory", "first"])
def test_open_no_symlinks_refuses_a_symlink_at_any_component(
    tmp_path: Path, open_walk: str, where: str
) -> None:
    """A path with a symlink on it (as its last component, to a file or a directory, or on
    its way) is refused with ELOOP, whether openat2 or the fallback walk opens it: a bind
    source is handed over as exactly the file the lint judged, never what a symlink swapped
    in since leads to. The twin: the real path opens, as the file it names. Mutation pass,
    stop 35: with the walk's S_ISLNK check dropped (csrc/nsconfine.c, open_by_walk), the
    forced-walk cases failed (the last component's symlink opened; one on the way refused
    with ENOTDIR, not ELOOP)."""
    from nsconfine._kernel.syscalls import open_no_symlinks

    real = tmp_path / "real"
    (real / "lib").mkdir(parents=True)
    (real / "lib" / "config.py").write_text("real\n")
    (tmp_path / "secret").write_text("secret\n")
    (tmp_path / "link-dir").symlink_to(real)
    (real / "lib" / "link").symlink_to(tmp_path / "secret")
    (real / "lib" / "dir-link").symlink_to(real)
    path = {
        "last": real / "lib" / "link",
        "middle": tmp_path / "link-dir" / "lib" / "config.py",
        "last, to a directory": real / "lib" / "dir-link",
        "first": tmp_path / "link-dir",
    }[where]
    with pytest.raises(SyscallError, match=r"open \(no symlinks\)") as refused:
        os.close(open_no_symlinks(str(path)))
    assert refused.value.errno == errno.ELOOP, refused.value
    fd = open_no_symlinks(str(real / "lib" / "config.py"))
    try:
        assert os.path.samestat(os.fstat(fd), (real / "lib" / "config.py").stat())
    finally:
        os.close(fd)


def _observed(*paths: Path | str) -> list[tuple[str, tuple[int, int, int, int] | None]]:
    """What a protection scan records of each path: its lstat identity, or None."""
    seen: list[tuple[str, tuple[int, int, int, int] | None]] = []
    for path in map(str, paths):
        try:
            info = os.lstat(path)
        except OSError:
            seen.append((path, None))
        else:
            seen.append((path, (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)))
    return seen


@pytest.mark.parametrize(
    "change",
    [
        "a file written",
        "an entry added",
        "a missing path made",
        "a path removed",
        "a file replaced by another",
        "a directory's times set back",
        "a file behind a trailing slash made a directory",
    ],
)
def test_path_identities_see_each_change_a_scan_depends_on(tmp_path: Path, change: str) -> None:
    """Every launch asks nsc_first_changed whether what its protection scan looked at has
    changed: unchanged paths say no, and each kind of change says yes."""
    directory, file, missing = tmp_path / "dir", tmp_path / "file", tmp_path / "missing"
    directory.mkdir()
    file.write_text("x")
    slashed = f"{tmp_path}/later/"
    (tmp_path / "later").write_text("")  # a file: lstat of "later/" fails (ENOTDIR)
    os.utime(directory, ns=(10**18, 10**18))
    identities = PathIdentities(_observed(directory, file, missing, slashed))
    assert not identities.any_changed()
    if change == "a file written":
        file.write_text("y")
    elif change == "an entry added":
        (directory / "new").mkdir()
    elif change == "a missing path made":
        missing.write_text("")
    elif change == "a path removed":
        file.unlink()
    elif change == "a file replaced by another":
        (tmp_path / "other").write_text("x")
        os.rename(tmp_path / "other", file)
    elif change == "a directory's times set back":  # the change time still moves
        (directory / "new").mkdir()
        os.rmdir(directory / "new")
        os.utime(directory, ns=(10**18, 10**18))
    else:
        (tmp_path / "later").unlink()
        (tmp_path / "later").mkdir()
    assert identities.any_changed()


def test_same_file_identities_ask_only_which_file_each_path_names(tmp_path: Path) -> None:
    """A pool's launch asks whether each bind's path still names the file its sandbox binds
    (same_file), following symlinks as the bind did: what the files hold may change, which
    files they are may not."""
    directory, file, link = tmp_path / "dir", tmp_path / "file", tmp_path / "link"
    directory.mkdir()
    file.write_text("x")
    link.symlink_to(directory)
    bound = []
    for path in (directory, file, link):
        info = path.stat()
        bound.append((str(path), (info.st_dev, info.st_ino, 0, 0)))
    identities = PathIdentities(bound, same_file=True)
    assert not identities.any_changed()
    file.write_text("y")
    (directory / "new").mkdir()
    assert not identities.any_changed()
    directory.rename(tmp_path / "archived")
    directory.mkdir()
    assert identities.any_changed()


@pytest.mark.parametrize(
    ("argc", "envc", "size"),
    [(0x80000001, 0x80000000, 10), (0xFFFFFFFF, 1, 10), (1, 0xFFFFFFFF, 10), (3, 0, 4)],
)
def test_the_shim_refuses_a_header_counting_more_strings_than_its_body_holds(
    argc: int, envc: int, size: int
) -> None:
    """Each argument and variable ends in a NUL of the body: a launch message whose header
    counts more of them than its body has bytes is refused as a protocol error before
    anything is mapped for them (two counts whose 32-bit sum wrapped to 1 sent the shim,
    run here outside any sandbox, on with no room for the variables)."""
    from nsconfine._launch.programs import SHIM_HEADER, SHIM_MAGIC, SHIM_PATH

    launcher, shim_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    report_read, report_write = os.pipe()
    with launcher:
        shim = subprocess.Popen(
            [SHIM_PATH, str(shim_end.fileno()), "60000", "0", "0"],
            pass_fds=[shim_end.fileno()],
            stdin=subprocess.DEVNULL,
            env={},
        )
        shim_end.close()
        assert launcher.recv(1) in (b"R", b"U")  # built, waiting for its command
        header = SHIM_HEADER.pack(SHIM_MAGIC, 0, argc, envc, size)
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [report_write]))]
        launcher.sendmsg([header], rights)
        os.close(report_write)
        with contextlib.suppress(BrokenPipeError):  # refused before the body is read
            launcher.sendall(b"/bin/true\0"[:size].ljust(size, b"\0"))
        assert shim.wait(timeout=30) == 127
    with os.fdopen(report_read, "rb") as report:
        err, stage = struct.unpack("=ii", report.read())
    assert (err, stage) == (errno.EPROTO, SHIM_WIRE["STAGE_PROTOCOL"])
