"""Plan → bwrap arguments, pinned exactly: what bwrap reads is what the manifest says."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsconfine._plan import model as p
from nsconfine._plan.bwrap_args import (
    FIRST_DATA_FD,
    NAMESPACE_OPTIONS,
    bwrap_command_line,
    bwrap_options,
    encode_options,
    fd_entries,
    reaper_command_line,
    shim_command,
)
from nsconfine._plan.model import EnvVar, Kind, Origin, Plan
from nsconfine._session import Session, build_plan

PASSWD = b"root:x:0:0::/tmp/home:/bin/sh\n"
GROUP = b"root:x:0:\n"


def small_plan() -> Plan:
    """One entry of every kind, two of them data, given out of execution order."""
    return Plan(
        [
            p.remount_ro("/", "read-only root"),
            p.rw_bind("/srv/ws", "/srv/ws", "the workspace"),
            p.data(PASSWD, "/etc/passwd", "names root only"),
            p.tmpfs("/tmp", "a private /tmp"),
            p.ro_bind("/usr", "/usr", "system programs"),
            p.symlink("usr/bin", "/bin", "merged /usr"),
            p.data(GROUP, "/etc/group", "names root's group only"),
            p.directory("/tmp/home", "an empty HOME"),
            p.proc("/proc", "own pids"),
            p.dev("/dev", "harmless devices"),
        ],
        env=[
            EnvVar("HOME", "/tmp/home", Origin.NSCONFINE),
            EnvVar("TOKEN", "s3cret value", Origin.CREDENTIAL),
        ],
        chdir="/srv/ws",
    )


def test_golden_options_of_a_small_plan() -> None:
    """A small plan becomes exactly this option list, in this order."""
    assert bwrap_options(small_plan()) == [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname", "localhost",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
        "--unshare-net",
        "--disable-userns",
        "--setenv", "HOME", "/tmp/home",
        "--setenv", "TOKEN", "s3cret value",
        "--info-fd", "4",
        "--seccomp", "6",
        "--size", "1073741824", "--tmpfs", "/tmp",
        "--ro-bind-fd", "9", "/usr",
        "--symlink", "usr/bin", "/bin",
        "--proc", "/proc",
        "--dev", "/dev",
        "--bind-fd", "10", "/srv/ws",
        "--ro-bind-data", "11", "/etc/passwd",
        "--ro-bind-data", "12", "/etc/group",
        "--dir", "/tmp/home",
        "--remount-ro", "/",
        "--chdir", "/srv/ws",
    ]  # fmt: skip


def test_data_fds_follow_fd_entries_in_plan_order() -> None:
    """The nth data entry the launcher hands over is the one bwrap reads from fd 9+n."""
    plan = small_plan()
    options = bwrap_options(plan)
    for number, entry in enumerate(fd_entries(plan), start=FIRST_DATA_FD):
        index = options.index(entry.dest)
        assert options[index - 1] == str(number)
    assert [e.content for e in fd_entries(plan) if e.content] == [PASSWD, GROUP]


@pytest.mark.parametrize(
    "argv",
    [["/bin/true"], ["--dev-bind", "/", "/"], ["--", "x"], ["--args", "3"], ["sh", "-c", "--"]],
)
def test_command_line_always_puts_the_command_after_double_dash(argv: list[str]) -> None:
    """The command follows `--`, so a command that looks like a bwrap option stays a command."""
    assert bwrap_command_line("/usr/bin/bwrap", argv) == [
        "/usr/bin/bwrap",
        "--args",
        "3",
        "--",
        *argv,
    ]


def test_without_bind_fd_sources_are_paths() -> None:
    """For a bwrap without --bind-fd, binds name their sources and data fds come first."""
    options = bwrap_options(small_plan(), bind_fds=False)
    assert options[options.index("/usr") - 1 : options.index("/usr") + 2] == [
        "--ro-bind", "/usr", "/usr"
    ]  # fmt: skip
    assert "--bind-fd" not in options
    assert options[options.index("/etc/passwd") - 1] == "9"


def test_without_seccomp_the_option_is_left_out() -> None:
    """The seccomp layer is the one option a test's twin may leave out; nothing else moves."""
    with_filter = bwrap_options(small_plan())
    without = bwrap_options(small_plan(), seccomp=False)
    at = with_filter.index("--seccomp")
    assert with_filter[:at] + with_filter[at + 2 :] == without


def test_the_reaper_runs_bwrap_with_its_lifeline_and_info_fd() -> None:
    """The launcher's child is the reaper, told its lifeline and info fds, the session's
    limits (processes, ptys, inotify instances and watches, System V shared memory's pages,
    then each tmpfs's KiB and files; "-": none) and where the holds on its mount points begin
    ("-": none), then bwrap's argv, whose command is the shim, told the command's open files."""
    bwrap = bwrap_command_line("/usr/bin/bwrap", shim_command(5000, True, 1024))
    limits = ["1024", "16", "16", "8192", "16384", "1048576:262144"]
    assert reaper_command_line("/x/_reaper", bwrap, limits, 12) == [
        "/x/_reaper", "8", "4", "1024,16,16,8192,16384,1048576:262144", "12",
        "/usr/bin/bwrap", "--args", "3", "--", "/proc/self/fd/7", "5", "5000", "1", "1024",
    ]  # fmt: skip
    assert reaper_command_line("/x/_reaper", bwrap)[3:5] == ["-", "-"]


def test_a_proxy_network_unshares_it_and_has_the_shim_start_the_relay(
    session_plan: Plan, tmp_path: Path
) -> None:
    """Network proxy: a network namespace of its own, as none, and the relay's port and
    socket after the shim's own arguments; other networks give the shim neither."""
    proxy = session_plan.replace(
        network="proxy", entries=(*session_plan.entries, p.relay_entry(str(tmp_path)))
    )
    assert "--unshare-net" in bwrap_options(proxy)
    assert bwrap_options(proxy)[: len(NAMESPACE_OPTIONS)] == list(NAMESPACE_OPTIONS)
    assert shim_command(5000, True, 1024, relay=True)[5:] == ["3128", "/run/nsconfine/proxy/socket"]
    assert len(shim_command(5000, True, 1024)) == 5


def test_encode_options_is_nul_terminated() -> None:
    """Every option is followed by one NUL byte, the last one included."""
    assert encode_options(["--setenv", "A", "b c", ""]) == b"--setenv\0A\0b c\0\0"
    assert encode_options([]) == b""
    assert encode_options(["\udcff"]) == b"\xff\0"  # undecodable path bytes survive
    assert encode_options(bwrap_options(small_plan())).count(b"\0") == len(
        bwrap_options(small_plan())
    )


@pytest.fixture
def session_plan(tmp_path: Path) -> Plan:
    """The plan of a plain session on a workspace and run directory in tmp_path."""
    workspace, run_dir = tmp_path / "ws", tmp_path / "run"
    workspace.mkdir()
    run_dir.mkdir()
    return build_plan(Session(workspace=workspace, run_dir=run_dir), environ={})


def test_session_plan_unshares_every_namespace(session_plan: Plan) -> None:
    """A session's options have every namespace option, the network's too by default."""
    options = bwrap_options(session_plan)
    assert options[: len(NAMESPACE_OPTIONS)] == list(NAMESPACE_OPTIONS)
    assert {"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"} <= set(options)
    assert "--unshare-net" in options
    for absent in ("--share-net", "--unshare-all", "--unshare-user-try"):
        assert absent not in options


def test_a_launch_binds_the_reapers_tmpfs_and_makes_no_ipc_namespace(session_plan: Plan) -> None:
    """A launch's reaper made the session's IPC namespace and its writable tmpfs, each sized:
    bwrap binds the i-th from /dev/shm/i and makes no IPC namespace. The bwrap line as printed
    or exported, without that reaper, makes both itself."""
    launched = bwrap_options(session_plan, limits_by_reaper=True)
    assert "--unshare-ipc" not in launched
    assert "--size" not in launched
    sized = [e.dest for e in session_plan.entries if e.kind is Kind.TMPFS and e.capacity]
    assert len(sized) >= 2
    binds = [
        (launched[i + 1], launched[i + 2])
        for i, option in enumerate(launched)
        if option == "--bind" and launched[i + 1].startswith("/dev/shm/")
    ]
    assert binds == [(f"/dev/shm/{i}", dest) for i, dest in enumerate(sized)]
    printed = bwrap_options(session_plan)
    assert "--unshare-ipc" in printed
    assert printed.count("--size") == len(sized)


def test_session_plan_never_binds_the_host_root(session_plan: Plan) -> None:
    """No bind option of a session's plan has `/` as its source."""
    options = bwrap_options(session_plan)
    for index, option in enumerate(options):
        if option in ("--bind", "--ro-bind", "--dev-bind", "--bind-try", "--ro-bind-try"):
            assert options[index + 1] != "/", options[index : index + 3]
    dev_binds = [options[i + 1 : i + 3] for i, o in enumerate(options) if o == "--dev-bind"]
    assert dev_binds == [["/dev/pts", "/dev/pts"]]  # the session's own, which the reaper made
    assert options[-6:-2] == ["--remount-ro", "/", "--remount-ro", "/dev"]


def test_session_plan_data_fds_are_numbered_from_nine(session_plan: Plan) -> None:
    """A session's generated files (passwd, group) are read from fds 9, 10, … in order."""
    options = bwrap_options(session_plan)
    fd_options = ("--ro-bind-data", "--ro-bind-fd", "--bind-fd", "--file")
    fds = [options[i + 1] for i, option in enumerate(options) if option in fd_options]
    assert fds == [str(FIRST_DATA_FD + n) for n in range(len(fd_entries(session_plan)))]
    assert sum(1 for e in session_plan.entries if e.kind is Kind.DATA) >= 2
