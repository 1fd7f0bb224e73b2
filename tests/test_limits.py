"""One session never takes what others need: its processes, open files, ptys, inotify
instances and watches, and the memory its writable file systems hold are its own share.

Each limit is tried by a real session on real namespaces, which takes as much as it can (up to
a bound, so that a weakened twin takes a bounded amount of its account's, never all of it) and
reports how much it got; each has a twin on which the same session gets past the limit.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import (
    SESSION_USER,
    cli,
    open_up,
    python_child,
    session,
    session_dirs,
    session_options,
    sh,
)

import nsconfine
from nsconfine._launch.confirm import mount_table_problems
from nsconfine._plan.limits import SYSV_MESSAGE_QUEUES, SYSV_SEMAPHORES
from nsconfine._plan.model import Kind
from nsconfine._selftest.report import FORK_UNTIL_REFUSED, process_limit_leaks
from nsconfine._selftest.world import World

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]

MiB = 1 << 20

# The defaults, as the README states them.
DEFAULT_PROCESSES = 1024
DEFAULTOPEN_FILES = 1024
DEFAULT_TMP = 1024 * MiB
DEFAULT_SHM = 64 * MiB
DEFAULTPTYS = 16
DEFAULTINOTIFY_INSTANCES = 16

PTYS = r"""
import os, sys
held = []
while len(held) < int(sys.argv[1]):
    try:
        held.append(os.openpty())
    except OSError:
        break
print(len(held))
"""

INOTIFY = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
bound, what = int(sys.argv[1]), sys.argv[2]
got = 0
if what == "instances":
    while got < bound and libc.inotify_init1(os.O_CLOEXEC) >= 0:
        got += 1
else:
    fd = libc.inotify_init1(os.O_CLOEXEC)
    for name in sorted(os.listdir("/usr/bin"))[:bound]:
        if libc.inotify_add_watch(fd, os.fsencode("/usr/bin/" + name), 2) < 0:  # IN_MODIFY
            break
        got += 1
print(got)
"""

OPEN_FILES = r"""
import os, sys
held = []
while len(held) < int(sys.argv[1]):
    try:
        held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
print(len(held))
"""

FILL = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
try:
    os.posix_fallocate(fd, 0, int(sys.argv[2]))
    print("filled")
except OSError as error:
    print("refused", error.strerror)
"""


def _count(plan: nsconfine.Plan, script: str, *args: object) -> int:
    status, output = sh(plan, f"python3 -c '{script}' {' '.join(map(str, args))}")
    assert status == 0, output
    return int(output.split()[-1])


def _fill(plan: nsconfine.Plan, path: str, size: int) -> str:
    status, output = sh(plan, f"python3 -c '{FILL}' {path} {size}; rm -f {path}")
    assert status == 0, output
    return output.strip()


def _limited(ws_run: tuple[Path, Path], **limits: object) -> nsconfine.Plan:
    return session(*ws_run, limits=limits).plan()


def _raised(plan: nsconfine.Plan, **limits: int) -> nsconfine.Plan:
    return plan.replace(limits=plan.limits.replace(**limits))


# ------------------------------------------------------------------ processes


def test_a_session_cannot_fork_past_its_process_limit(ws_run: tuple[Path, Path]) -> None:
    """A session allowed 50 processes gets fewer than 50 (bwrap's own count too)."""
    plan = _limited(ws_run, processes=50)
    assert plan.limits.processes == 50
    assert 30 < _count(plan, FORK_UNTIL_REFUSED, 200) < 50


def test_a_session_with_a_raised_process_limit_forks_past_it(ws_run: tuple[Path, Path]) -> None:
    """The twin: the same session with room for 100,000 gets all 200 it asks for."""
    plan = _raised(_limited(ws_run, processes=50), processes=100_000)
    assert _count(plan, FORK_UNTIL_REFUSED, 200) == 200


def test_a_default_session_cannot_fork_past_1024_processes(plan: nsconfine.Plan) -> None:
    """By default a session gets at most 1,024 processes."""
    assert _count(plan, FORK_UNTIL_REFUSED, DEFAULT_PROCESSES + 50) < DEFAULT_PROCESSES
    assert plan.limits.processes == DEFAULT_PROCESSES


_LAUNCH_AND_FORK = """
import resource
if sys.argv[4]:  # the twin: this launcher's own process limit is the session's
    resource.setrlimit(resource.RLIMIT_NPROC, (int(sys.argv[4]), int(sys.argv[4])))
plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3] or None)
try:
    read_end, write_end = os.pipe()
    sandbox = nsconfine.spawn(plan, ["python3", "-c", sys.argv[5], "20"], stdout=write_end)
    os.close(write_end)
    got = os.read(read_end, 100).decode().strip()
    sandbox.wait(60)
    print("forked", got)
except (nsconfine.NsconfineError, OSError) as error:
    print("refused", error)
"""


def _second_launch(ws_run: tuple[Path, Path], launcher_nproc: str) -> str:
    child = python_child(
        _LAUNCH_AND_FORK,
        str(ws_run[0]),
        str(ws_run[1]),
        SESSION_USER or "",
        launcher_nproc,
        FORK_UNTIL_REFUSED,
        stdout=-1,
    )
    output, _ = child.communicate(timeout=120)
    return output.strip()


def _holding_all_it_can(plan: nsconfine.Plan) -> tuple[nsconfine.Sandbox, int, int]:
    read_end, write_end = os.pipe()
    sandbox = nsconfine.spawn(
        plan, ["python3", "-c", FORK_UNTIL_REFUSED, "300", "hold"], stdout=write_end
    )
    os.close(write_end)
    held = int(os.read(read_end, 100).decode().strip())
    return sandbox, held, read_end


def test_a_session_at_its_process_limit_leaves_its_account_room(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """While a session holds every process it may (forking until fork fails), its account
    still launches another session, which forks: the cap is the session's, not the account's
    (RLIMIT_NPROC is set only once the session's own user namespace exists)."""
    sandbox, held, read_end = _holding_all_it_can(_limited(ws_run, processes=50))
    try:
        assert held < 50
        other = session_dirs(tmp_path, "ws2", "run2")
        assert _second_launch((other[0], other[1]), "") == "forked 20"
    finally:
        sandbox.kill()
        sandbox.wait(60)
        os.close(read_end)


def test_a_process_cap_on_the_launcher_starves_its_account(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """The twin: a launcher whose own process limit is the session's (what a limit set before
    the session's user namespace would do to the account) cannot launch while the first
    session holds its share."""
    sandbox, held, read_end = _holding_all_it_can(_limited(ws_run, processes=50))
    try:
        assert held < 50
        other = session_dirs(tmp_path, "ws2", "run2")
        assert _second_launch((other[0], other[1]), "50").startswith("refused")
    finally:
        sandbox.kill()
        sandbox.wait(60)
        os.close(read_end)


# ------------------------------------------------------------------ open files


def test_a_session_cannot_open_past_its_open_file_limit(ws_run: tuple[Path, Path]) -> None:
    """A session allowed 64 open files per process opens fewer than 64."""
    plan = _limited(ws_run, open_files=64)
    assert 40 < _count(plan, OPEN_FILES, 200) < 64


def test_a_session_with_a_raised_open_file_limit_opens_past_it(
    ws_run: tuple[Path, Path],
) -> None:
    """The twin: raised, the same session opens all 200 it asks for."""
    plan = _raised(_limited(ws_run, open_files=64), open_files=4096)
    assert _count(plan, OPEN_FILES, 200) == 200


def test_a_default_session_holds_at_most_1024_files_per_process(plan: nsconfine.Plan) -> None:
    """By default the command's hard limit on open files is at most 1,024."""
    status, output = sh(plan, "grep 'Max open files' /proc/self/limits")
    assert status == 0, output
    assert int(output.split()[4]) <= DEFAULTOPEN_FILES, output


# Crashes itself (SIGSEGV) after raising its core limit as far as it may; the limits it had.
CRASH_WITH_A_CORE = (
    "ulimit -S -c; ulimit -H -c; ulimit -c unlimited 2>/dev/null && echo raised; "
    "sh -c 'ulimit -c unlimited 2>/dev/null; kill -SEGV $$'; ls"
)


def test_a_session_dumps_no_core(ws_run: tuple[Path, Path]) -> None:
    """A session's processes dump no core: RLIMIT_CORE 0, soft and hard, which the command
    cannot raise. A crash's core is written by the host's handler where core_pattern is a pipe
    (systemd-coredump, apport: as root, into the host's storage, with a session that crashes
    at will filling it); here, where it is a file name, into the crashing process's directory.
    The control: the same script run as the session's account outside any sandbox, in the
    same directory, leaves a core there (found this stop: the session raised its limit to
    unlimited and dumped; this test failed on the code before)."""
    workspace = ws_run[0]
    _status, output = sh(session(*ws_run).plan(), f"cd {workspace} && {CRASH_WITH_A_CORE}")
    words = output.split()
    assert words[:2] == ["0", "0"], output
    assert "raised" not in words, output
    assert "core" not in words, output
    assert not [name for name in os.listdir(workspace) if name.startswith("core")]
    # Nor can any process of the sandbox be made to: each holds hard 0, bwrap's init too (a
    # process of the same account may raise another's soft limit to its hard one, prlimit)
    _status, output = sh(
        session(*ws_run).plan(),
        "for p in /proc/[0-9]*; do grep 'Max core file size' $p/limits; done",
    )
    found = [line.split()[4:6] for line in output.splitlines()]
    assert len(found) >= 2, output  # pid 1 and the shell
    assert all(limits == ["0", "0"] for limits in found), output
    with open("/proc/sys/kernel/core_pattern") as pattern:
        if pattern.read().startswith("|") or resource.getrlimit(resource.RLIMIT_CORE)[1] == 0:
            return  # the control needs a core dumped as a file, and a launcher that may dump
    demote = [] if SESSION_USER is None else ["runuser", "-u", SESSION_USER, "--"]
    # (without a sanitizer's runtime preloaded, as CI's ASan run has: it takes the SEGV itself)
    plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    control = subprocess.run(
        [*demote, "sh", "-c", f"ulimit -H -c unlimited 2>/dev/null; {CRASH_WITH_A_CORE}"],
        cwd=workspace, capture_output=True, text=True, check=False, env=plain,
    )  # fmt: skip
    assert "raised" in control.stdout, control
    assert "core" in control.stdout.split(), control


def test_a_plan_that_hands_bwrap_many_fds_still_launches(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """The open-file limit is the command's, not bwrap's: a plan that copies 100 runner files
    (an fd each, handed to bwrap) launches with open_files=32, and each copy is there."""
    runner = tmp_path / "runner"
    runner.mkdir()
    files = []
    for number in range(100):
        path = runner / f"mod{number}.py"
        path.write_text(f"# {number}\n")
        files.append(str(path))
    os.chmod(runner, 0o755)
    plan = session(*ws_run, ro=files, limits={"open_files": 32}).plan()
    assert any(entry.kind == "copy" for entry in plan.entries)
    status, output = sh(plan, f"cat {files[0]} {files[-1]}")
    assert (status, output) == (0, "# 0\n# 99\n")


# ------------------------------------------------------------------ ptys


def test_a_default_session_holds_at_most_16_ptys(plan: nsconfine.Plan) -> None:
    """A session's ptys come from a devpts of its own that holds 16."""
    assert _count(plan, PTYS, 40) == DEFAULTPTYS
    assert plan.limits.ptys == DEFAULTPTYS


def test_a_session_without_its_own_devpts_takes_the_hosts_ptys(plan: nsconfine.Plan) -> None:
    """The twin: with bwrap's own devpts (the plan without its /dev/pts entry), the same
    session gets all 40 it asks for, from the ptys the host has for every sandbox."""
    assert _count(plan.without("/dev/pts"), PTYS, 40) == 40


def test_a_session_with_3_ptys_gets_3(ws_run: tuple[Path, Path]) -> None:
    """limits={"ptys": 3}: the fourth pty is refused."""
    assert _count(_limited(ws_run, ptys=3), PTYS, 40) == 3


def test_the_mount_check_refuses_the_hosts_devpts(
    plan: nsconfine.Plan, without: Callable[..., None]
) -> None:
    """Were the launcher's child not to make the session's devpts (its limits step switched
    off), bwrap would bind the host's /dev/pts: the mount check refuses that sandbox."""
    without("session-limits")
    with pytest.raises(nsconfine.SandboxUnavailable, match="/dev/pts"):
        sh(plan, "ls /dev/pts")


def test_the_mount_check_tells_the_hosts_devpts_by_its_device(plan: nsconfine.Plan) -> None:
    """The check behind the table's: the launcher looks at the sandbox's /dev/pts through its
    root, and refuses the host's devpts even when the table reads as the plan's (a host devpts
    mounted with the session's max= would pass the option check above). Through a live
    sandbox's root nothing differs; through the host's root, whose binds show their sources
    as the sandbox's do, only /dev/pts does, and the files the plan generates (the host's
    /etc/hosts is not the session's), whose sizes are looked at there too."""
    status, mountinfo = sh(plan, "cat /proc/self/mountinfo")
    assert status == 0
    sandbox = nsconfine.spawn(plan, ["/bin/cat"], stdin=subprocess.PIPE)
    try:
        sandbox_root = f"/proc/{sandbox.child_pid}/root"
        assert mount_table_problems(mountinfo, plan, root=sandbox_root) == []
        # While it runs, as the mount points it made for missing protected paths exist.
        problems = mount_table_problems(mountinfo, plan, root="/")
        generated = tuple(f"{e.dest} does not hold" for e in plan.entries if e.kind is Kind.DATA)
        assert "/dev/pts is not the session's own devpts" in problems
        others = [p for p in problems if p != "/dev/pts is not the session's own devpts"]
        assert all(p.startswith(generated) for p in others), problems
    finally:
        assert sandbox.stdin is not None
        sandbox.stdin.close()
        assert sandbox.wait() == 0


# ------------------------------------------------------------------ inotify


def test_a_default_session_holds_at_most_16_inotify_instances(plan: nsconfine.Plan) -> None:
    """A session's inotify instances are counted in a user namespace of its own: 16."""
    assert _count(plan, INOTIFY, 40, "instances") == DEFAULTINOTIFY_INSTANCES
    assert plan.limits.inotify_instances == DEFAULTINOTIFY_INSTANCES


def test_a_session_with_raised_inotify_instances_takes_more(plan: nsconfine.Plan) -> None:
    """The twin: raised to 1,000, the same session gets all 40 it asks for."""
    assert _count(_raised(plan, inotify_instances=1000), INOTIFY, 40, "instances") == 40


def test_a_session_cannot_watch_past_its_inotify_watches(ws_run: tuple[Path, Path]) -> None:
    """limits={"inotify_watches": 10}: the eleventh watch is refused; raised, 30 are not."""
    plan = _limited(ws_run, inotify_watches=10)
    assert _count(plan, INOTIFY, 30, "watches") == 10
    assert _count(_raised(plan, inotify_watches=1000), INOTIFY, 30, "watches") == 30


# ------------------------------------------------------------------ memory: /tmp, HOME, /dev


def test_a_default_sessions_tmp_holds_at_most_1_gib(plan: nsconfine.Plan) -> None:
    """/tmp is a tmpfs of 1 GiB: a session cannot fill the host's memory through it."""
    assert _fill(plan, "/tmp/filler", DEFAULT_TMP + MiB).startswith("refused")


def test_a_sessions_tmp_holds_its_size(ws_run: tuple[Path, Path]) -> None:
    """limits={"tmp": "4M"}: 5 MiB do not fit in /tmp; raised to 64 MiB, they do."""
    plan = _limited(ws_run, tmp="4M")
    assert plan.limits.tmp == 4 * MiB
    assert _fill(plan, "/tmp/filler", 5 * MiB).startswith("refused")
    assert _fill(_raised(plan, tmp=64 * MiB), "/tmp/filler", 5 * MiB) == "filled"


def test_a_fresh_home_holds_the_tmp_size(ws_run: tuple[Path, Path]) -> None:
    """A fresh HOME (a tmpfs too) holds no more than /tmp does."""
    plan = session(*ws_run, home_mode="fresh", limits={"tmp": "4M"}).plan()
    home = os.path.join(ws_run[1], "home")
    assert _fill(plan, f"{home}/filler", 5 * MiB).startswith("refused")
    assert _fill(_raised(plan, tmp=64 * MiB), f"{home}/filler", 5 * MiB) == "filled"


# Makes empty files in a directory until one is refused or it holds `bound`; prints how many.
MAKE_FILES = r"""
import os, sys
directory, bound = sys.argv[1], int(sys.argv[2])
made = 0
try:
    while made < bound:
        os.close(os.open(os.path.join(directory, str(made)), os.O_CREAT | os.O_WRONLY, 0o600))
        made += 1
except OSError:
    pass
print(made)
"""


def test_a_tmpfs_holds_at_most_a_file_per_page_of_its_size(ws_run: tuple[Path, Path]) -> None:
    """An empty file takes no space but ~1 KiB of the host's kernel memory, which no process is
    charged for: 400,000 in a tmpfs of the kernel's default number of files took 530 MiB. A
    writable tmpfs holds at most one file (or directory) per page of its size: /tmp of 4 MiB
    1,024, its own root and the directories bwrap made there for the plan's mount points (the
    test's workspace lies below /tmp) among them; raised to 16 MiB, the same 1,500 files fit."""
    plan = _limited(ws_run, tmp="4M")
    files = 4 * MiB // os.sysconf("SC_PAGE_SIZE")
    assert files - 16 <= _count(plan, MAKE_FILES, "/tmp", 1500) < files
    assert _count(_raised(plan, tmp=16 * MiB), MAKE_FILES, "/tmp", 1500) == 1500


def test_dev_shm_and_a_fresh_home_hold_a_file_per_page_too(ws_run: tuple[Path, Path]) -> None:
    """/dev/shm of 1 MiB holds 256 files (its root among them), a fresh HOME as /tmp does."""
    plan = session(*ws_run, home_mode="fresh", limits={"tmp": "1M", "shm": "1M"}).plan()
    home = os.path.join(ws_run[1], "home")
    files = MiB // os.sysconf("SC_PAGE_SIZE")
    for directory in ("/dev/shm", home):
        assert _count(plan, MAKE_FILES, directory, 400) < files, directory
    raised = _raised(plan, tmp=4 * MiB, shm=4 * MiB)
    for directory in ("/dev/shm", home):
        assert _count(raised, MAKE_FILES, directory, 400) == 400, directory


def test_dev_is_read_only(plan: nsconfine.Plan) -> None:
    """bwrap's /dev tmpfs is read-only: nothing can be stored there (it is unlimited)."""
    _status, output = sh(plan, ": > /dev/planted && echo written")
    assert "written" not in output, output


def test_without_its_remount_dev_is_writable(plan: nsconfine.Plan) -> None:
    """The twin: without the plan's remount-ro of /dev, the session writes there."""
    weakened = plan.replace(
        entries=tuple(e for e in plan.entries if not (e.dest == "/dev" and e.kind == "remount-ro"))
    )
    _status, output = sh(weakened, ": > /dev/planted && echo written")
    assert "written" in output, output


def test_dev_shm_holds_at_most_its_size(plan: nsconfine.Plan) -> None:
    """/dev/shm is a tmpfs of 64 MiB by default; raised, the same fill fits."""
    assert _fill(plan, "/dev/shm/filler", DEFAULT_SHM + MiB).startswith("refused")
    assert _fill(_raised(plan, shm=128 * MiB), "/dev/shm/filler", DEFAULT_SHM + MiB) == "filled"


def test_the_mount_check_checks_tmpfs_sizes(plan: nsconfine.Plan) -> None:
    """The mount check reads each tmpfs's size: a /tmp of another size than the plan's is
    refused, as a missing size would be."""
    status, mountinfo = sh(plan, "cat /proc/self/mountinfo")
    assert status == 0
    assert mount_table_problems(mountinfo, plan) == []
    lines = mountinfo.splitlines()
    tmp = next(i for i, line in enumerate(lines) if line.split()[4] == "/tmp")
    assert "size=" in lines[tmp]
    lines[tmp] = lines[tmp].replace("size=", "size=9")
    problems = mount_table_problems("\n".join(lines), plan)
    assert any("/tmp" in problem for problem in problems), problems


def test_the_mount_check_checks_tmpfs_files(plan: nsconfine.Plan) -> None:
    """The mount check reads each tmpfs's number of files too: a /tmp holding more is
    refused."""
    status, mountinfo = sh(plan, "cat /proc/self/mountinfo")
    assert status == 0
    lines = mountinfo.splitlines()
    tmp = next(i for i, line in enumerate(lines) if line.split()[4] == "/tmp")
    assert "nr_inodes=" in lines[tmp]
    lines[tmp] = lines[tmp].replace("nr_inodes=", "nr_inodes=9")
    problems = mount_table_problems("\n".join(lines), plan)
    assert len(problems) == 1, problems
    assert problems[0].startswith("/tmp is not mounted with size="), problems
    assert "nr_inodes=" in problems[0], problems


def test_the_mount_check_refuses_a_mount_that_takes_in_the_host_s(plan: nsconfine.Plan) -> None:
    """Every mount of the sandbox is private: the reaper made its namespace's copies of the
    host's mounts so, and a mount that still takes in what is mounted outside (master:N, as
    each did before: tests/test_confinement.py's host mount reached the session) or shares
    with a peer group (shared:N) is refused at the launch."""
    status, mountinfo = sh(plan, "cat /proc/self/mountinfo")
    assert status == 0
    assert mount_table_problems(mountinfo, plan) == []
    lines = mountinfo.splitlines()
    usr = next(i for i, line in enumerate(lines) if line.split()[4] == "/usr")
    for tag in ("master:1", "shared:7"):
        fields = lines[usr].split(" ")
        changed = [*lines[:usr], " ".join([*fields[:6], tag, *fields[6:]]), *lines[usr + 1 :]]
        problems = mount_table_problems("\n".join(changed), plan)
        assert problems == [f"/usr takes in mounts made outside the sandbox ({tag})"], problems


# ------------------------------------------------------------------ System V IPC

# Makes System V objects (IPC_PRIVATE, IPC_CREAT) until one is refused or it holds `bound`:
# semaphore sets of `size` semaphores, message queues, or shared memory segments of `size`
# bytes; prints how many it made.
SYSV_IPC = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
what, size, bound = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
make = {"sem": lambda: libc.semget(0, size, 0o1600), "msg": lambda: libc.msgget(0, 0o1600),
        "shm": lambda: libc.shmget(0, ctypes.c_size_t(size), 0o1600)}[what]
got = 0
while got < bound and make() >= 0:
    got += 1
print(got)
"""


def _unlimited_ipc(plan: nsconfine.Plan, without: Callable[..., None]) -> nsconfine.Plan:
    """The twin: the reaper takes no limits (bwrap makes the IPC namespace, with the kernel's
    defaults), and the plan has no devpts of its own, which that step would have mounted."""
    without("session-limits")
    return plan.without("/dev/pts")


def test_a_default_session_holds_at_most_128_semaphore_sets_of_250(
    plan: nsconfine.Plan, without: Callable[..., None]
) -> None:
    """A semaphore set costs the kernel ~64 bytes a semaphore, charged to no process; with the
    kernel's defaults a session could make 32,000 sets of 32,000 (64 GiB). Its own IPC
    namespace holds 128 sets of at most 250; the twin makes 200 sets, and a set of 251."""
    assert _count(plan, SYSV_IPC, "sem", 250, 200) == 128
    assert _count(plan, SYSV_IPC, "sem", 251, 1) == 0
    assert sh(plan, "cat /proc/sys/kernel/sem")[1].split() == SYSV_SEMAPHORES.split()
    unlimited = _unlimited_ipc(plan, without)
    assert _count(unlimited, SYSV_IPC, "sem", 250, 200) == 200
    assert _count(unlimited, SYSV_IPC, "sem", 251, 1) == 1


def test_a_default_session_holds_at_most_32_message_queues(
    plan: nsconfine.Plan, without: Callable[..., None]
) -> None:
    """A message queue holds 16 KiB of the kernel's memory: a session has 32 of them (the
    kernel's default is 32,000); the twin makes 100."""
    assert _count(plan, SYSV_IPC, "msg", 0, 100) == 32
    assert _count(_unlimited_ipc(plan, without), SYSV_IPC, "msg", 0, 100) == 100


def test_system_v_shared_memory_holds_at_most_the_shm_size(plan: nsconfine.Plan) -> None:
    """A System V segment outlives its maker until the session ends: the session's segments
    hold at most its shm size in all (64 MiB by default, not the kernel's unlimited default);
    raised, the same segments fit."""
    assert _count(plan, SYSV_IPC, "shm", 16 * MiB, 8) == DEFAULT_SHM // (16 * MiB)
    assert _count(_raised(plan, shm=128 * MiB), SYSV_IPC, "shm", 16 * MiB, 8) == 8


def test_a_session_cannot_raise_its_ipc_limits(plan: nsconfine.Plan) -> None:
    """The limits are its IPC namespace's sysctls, which the session's account could write were
    /proc/sys writable: it is not, in the session."""
    status, output = sh(plan, "echo 32000 > /proc/sys/kernel/msgmni; cat /proc/sys/kernel/msgmni")
    assert status == 0
    assert output.split()[-1] == str(SYSV_MESSAGE_QUEUES), output


# ------------------------------------------------------------------ plan data


def test_the_manifest_states_each_limit_with_its_reason(plan: nsconfine.Plan) -> None:
    """The manifest (text and JSON) lists every limit, its value and why; memory too, saying
    whether this host can enforce it."""
    data = plan.to_json()["limits"]
    names = {limit["name"] for limit in data}
    assert {"processes", "open_files", "tmp", "shm", "ptys", "inotify_instances",
            "inotify_watches", "memory"} <= names  # fmt: skip
    assert all(limit["reason"] for limit in data)
    text = plan.manifest()
    assert "limits" in text
    assert "inotify_instances" in text
    assert "memory" in text


def test_limits_come_from_the_cli_and_profiles(ws_run: tuple[Path, Path], tmp_path: Path) -> None:
    """--limit NAME=VALUE and a profile's [limits] table set them; the command line wins."""
    profile = tmp_path / "limited.toml"
    profile.write_text('description = "limited"\n[limits]\nptys = 4\nprocesses = 64\n')
    result = cli(
        "plan", "--json", *session_options(*ws_run), "--profile", str(profile),
        "--limit", "processes=128", "--limit", "tmp=8M",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    values = {limit["name"]: limit["value"] for limit in json.loads(result.stdout)["limits"]}
    assert (values["ptys"], values["processes"], values["tmp"]) == (4, 128, 8 * MiB)


@pytest.mark.parametrize(
    "given",
    ["bogus=1", "processes=0", "processes=many", "tmp=12Q", "ptys", "memory=1G",
     "processes=" + "9" * 5000, "tmp=" + "9" * 5000 + "G"],  # past what int() takes from a text
)  # fmt: skip
def test_a_bad_limit_is_a_usage_error(ws_run: tuple[Path, Path], given: str) -> None:
    """A limit nsconfine does not know, or a value it cannot take (or, for memory, cannot
    enforce here), is refused on one line, exit 64, and nothing runs."""
    result = cli("plan", *session_options(*ws_run), "--limit", given)
    assert result.returncode == 64, result.stderr
    assert result.stderr.startswith("nsconfine: usage: ")
    assert "Traceback" not in result.stderr
    assert given.partition("=")[0] in result.stderr


def test_check_says_which_limits_this_host_enforces() -> None:
    """`nsconfine check` has a row saying how each limit is enforced here, memory included."""
    result = cli("check", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row["detail"] for row in json.loads(result.stdout)["checks"]}
    assert "limits" in rows
    for name in ("processes", "ptys", "inotify", "memory"):
        assert name in rows["limits"], rows["limits"]


def test_selftest_probes_the_process_limit(world: World) -> None:
    """selftest's process-limit probe holds, and its weakened twin (the limit raised) fails."""
    assert process_limit_leaks(world) is None
    assert process_limit_leaks(world, weakened=True) is not None


def test_two_sessions_of_one_account_are_limited_apart(
    ws_run: tuple[Path, Path],
) -> None:
    """Two sessions of one account are limited each on its own: both hold close to their 50
    processes at once."""
    first, held_first, first_end = _holding_all_it_can(_limited(ws_run, processes=50))
    try:
        second, held_second, second_end = _holding_all_it_can(_limited(ws_run, processes=50))
        second.kill()
        second.wait(60)
        os.close(second_end)
    finally:
        first.kill()
        first.wait(60)
        os.close(first_end)
    assert 30 < held_first < 50
    assert 30 < held_second < 50


def test_the_largest_limits_still_launch(ws_run: tuple[Path, Path]) -> None:
    """Every limit at the largest value it takes still launches (the reaper parses it, the
    mount check reads it back)."""
    from nsconfine._plan.limits import LIMITS

    largest = {name: LIMITS[name][2] for name in LIMITS}
    assert sh(_limited(ws_run, **largest), "echo ran") == (0, "ran\n")


# ------------------------------------------------------------------ failing to take them


def _reachable_reaper(tmp_path: Path) -> Path:
    """A copy of the reaper the session's account can reach wherever the package is installed
    (CI's clone may sit where no other account can look)."""
    import shutil

    from nsconfine._launch.programs import REAPER_PATH

    reaper = tmp_path / "tools" / "reaper"
    reaper.parent.mkdir()
    shutil.copy(REAPER_PATH, reaper)
    open_up(reaper.parent)
    return reaper


def _refusal_of(report: bytes) -> str:
    """The launcher's refusal of a launch whose reaper reported report on its info fd."""
    import socket

    from nsconfine._launch.confirm import read_info

    read_end, write_end = os.pipe()
    os.write(write_end, report)
    os.close(write_end)
    quiet, other = socket.socketpair()
    try:
        with pytest.raises(nsconfine.SandboxUnavailable) as refused:
            read_info("/usr/bin/bwrap", read_end, quiet.fileno())
    finally:
        os.close(read_end)
        quiet.close()
        other.close()
    return str(refused.value)


def test_the_reaper_reports_a_limit_it_cannot_take(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """Where the session's own user namespace cannot be made (here: inside a session, whose
    filter refuses one), the reaper reports the failed step on its info fd and starts nothing;
    told to take no limits, the same reaper starts its command (the twin)."""
    from nsconfine._kernel import syscalls as _syscalls

    reaper = _reachable_reaper(tmp_path)
    plan = session(*ws_run, ro=[reaper]).plan()
    # Its lifeline is the session's stderr (a pipe's write end: never readable, so never EOF).
    status, output = sh(plan, f"{reaper} 2 1 64,4,4,64,16 - /bin/echo started")
    assert status == 127, output
    report = json.loads(output)
    assert report["reaper-errno"] == errno.EPERM
    assert _syscalls.stage_syscall(report["reaper-stage"]).startswith("unshare")
    assert sh(plan, f"{reaper} 2 1 - - /bin/echo started") == (0, "started\n")


def test_a_limit_step_that_failed_is_a_clear_refusal() -> None:
    """The launcher turns the reaper's report into a refusal naming the step."""
    refusal = _refusal_of(b'{"reaper-errno": 1, "reaper-stage": 29}\n')
    assert re.search(r"limits: unshare.*not permitted", refusal), refusal


def test_bwrap_not_started_at_the_account_s_process_limit_is_not_blamed_on_bwrap(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A reaper whose account is at its process limit (a session of the launcher's account
    forked to it) cannot start bwrap: the refusal says so, and not "reinstall bubblewrap"
    (attacker's pass, stop 33). The report is a real reaper's, run where it cannot fork."""
    reaper = _reachable_reaper(tmp_path)
    plan = session(*ws_run, ro=[reaper]).plan()
    status, output = sh(plan, f"prlimit --nproc=1 {reaper} 2 1 - - /bin/echo started")
    assert status == 127, output
    assert json.loads(output)["reaper-errno"] == errno.EAGAIN
    refusal = _refusal_of(output.encode())
    assert "process limit" in refusal, refusal
    assert "reinstall" not in refusal, refusal


_SHARE_SEEN = (
    "python3 -c 'import os; print(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))';"
    " ionice; cat /proc/self/oom_score_adj"
)


def test_a_session_runs_with_linux_s_own_personality(ws_run: tuple[Path, Path]) -> None:
    """A launcher started under `setarch -R --uname-2.6` passed its personality to its
    sessions (attackers' pass, stop 44): no address randomization (the same stack address on
    each run) and a 2.6 kernel's version, though the session's filter refuses to set either.
    The session runs as PER_LINUX; the launcher's own is the control. Its real-time priority
    and nice limits are 0 too (this machine cannot raise them above: that half cannot fail
    here)."""
    launcher = ["setarch", "-R", "--uname-2.6"]
    seen = "cat /proc/self/personality; grep -E '^Max (nice|realtime) priority' /proc/self/limits"
    control = subprocess.run([*launcher, "sh", "-c", seen], capture_output=True, text=True)
    assert control.stdout.startswith("00060000\n"), control
    done = subprocess.run(
        [*launcher, sys.executable, "-m", "nsconfine", "run", *session_options(*ws_run),
         "--", "sh", "-c", seen],
        capture_output=True, text=True, cwd="/", timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    personality, *limits = done.stdout.splitlines()
    assert personality == "00000000"
    assert [line.split()[3:5] for line in limits] == [["0", "0"], ["0", "0"]], limits


@pytest.mark.root  # a real-time policy and I/O class, and a negative nice, take root
def test_a_session_gets_no_more_than_a_default_share_of_the_machine(tmp_path: Path) -> None:
    """A root launcher running at SCHED_RR (a broker started under chrt), nice -5 and in the
    real-time I/O class passed all three to its sessions (attacker's pass, stop 39): a busy
    loop at SCHED_RR takes a CPU from every other process. The session runs at SCHED_OTHER,
    nice 0, best-effort I/O, and no negative oom_score_adj. The launcher's own are the
    control."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    launcher = ["chrt", "-r", "1", "nice", "-n", "-5", "ionice", "-c", "1", "-n", "0"]
    control = subprocess.run(
        [*launcher, "sh", "-c", _SHARE_SEEN], capture_output=True, text=True, check=True
    )
    assert control.stdout.split("\n")[:2] == ["2 -5", "realtime: prio 0"], control
    done = subprocess.run(
        [*launcher, sys.executable, "-m", "nsconfine", "run", *session_options(workspace, run_dir),
         "--", "sh", "-c", _SHARE_SEEN],
        capture_output=True, text=True, cwd="/", timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    policy_nice, io_class, oom = done.stdout.split("\n")[:3]
    assert policy_nice == "0 0"
    assert io_class.startswith("best-effort")
    assert int(oom) >= 0
