"""Real sessions on real namespaces try what they must not, and what they need: selftest's
probe catalogue, and `nsconfine selftest` itself.

Every probe runs twice: on the coder session's real plan, where it must come out as expected,
and on a weakened plan (a bind exposing the secret, or the needed entry removed), where it must
flip. A probe that cannot flip proves nothing, so its twin is part of the proof.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import catalogue_probe, cli, unchecked_launcher, user_options, writable_by

from nsconfine._kernel import layers as _layers
from nsconfine._launch.confirm import mount_table_problems
from nsconfine._launch.stage import open_entry_fds
from nsconfine._plan.bwrap_args import (
    ARGS_FD,
    FIRST_DATA_FD,
    INFO_FD,
    bwrap_command_line,
    bwrap_options,
    encode_options,
)
from nsconfine._plan.model import Plan
from nsconfine._preflight.checks import proven_bwrap
from nsconfine._selftest import report as _report
from nsconfine._selftest.probes import plan_for, probes
from nsconfine._selftest.report import (
    killed_launches_leave_nothing,
    run_probe,
    run_script,
)
from nsconfine._selftest.world import World

if TYPE_CHECKING:
    from nsconfine._launch.stage import Stdio

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


def _probe_names() -> list[str]:
    # Names are fixed by the catalogue; a throwaway world lists them for parametrization.
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        return [probe.name for probe in probes(World(root))]


class NaiveSandbox:
    """The handle of a naive launch: bwrap's pid, killed and waited for directly."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def wait(self, timeout: float | None = None) -> int:
        """bwrap's exit status (the command's), blocking."""
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        """SIGKILL bwrap, and nothing else."""
        os.kill(self.pid, signal.SIGKILL)


def naive_launch(
    plan: Plan,
    argv: Sequence[str],
    *,
    stdout: Stdio = None,
    stderr: Stdio = None,
    keep_info: bool = False,
) -> NaiveSandbox:
    """bwrap on the same options and the same account, started the naive way: os.posix_spawn
    (as root, through setpriv), every inheritable fd passed on, no reaper, no
    --die-with-parent, no namespace or mount check, the command run directly: what nsconfine's
    executor exists to avoid. keep_info: report the sandbox's pid on the info fd (to kill
    bwrap right after it, as kill() at once would)."""
    import nsconfine._kernel.syscalls as syscalls
    from nsconfine.bench._core import floor_plan

    plan = floor_plan(plan)  # with the stubs nsconfine would make (and later remove)
    options = bwrap_options(plan, seccomp=False, bind_fds=False)
    if not keep_info:
        at = options.index("--info-fd")
        del options[at : at + 2]
    options.remove("--die-with-parent")
    sources = [syscalls.memfd_sealed("args", encode_options(options))]
    open_entry_fds(plan, sources)  # no bind sources: data and copies only
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in sources]
    targets = [ARGS_FD, *range(FIRST_DATA_FD, FIRST_DATA_FD + len(sources) - 1)]
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in zip(high, targets, strict=True)]
    for number, stream in ((1, stdout), (2, stderr)):
        if stream is not None:
            fd = stream if isinstance(stream, int) else stream.fileno()
            actions.append((os.POSIX_SPAWN_DUP2, fd, number))
    info_read = -1
    if keep_info:
        info_read, info_write = os.pipe()
        actions.append((os.POSIX_SPAWN_DUP2, info_write, INFO_FD))
    bwrap = proven_bwrap()
    command = bwrap_command_line(bwrap, argv)
    if os.geteuid() == 0:
        user = plan.user
        command = ["/usr/bin/setpriv", f"--reuid={user.uid}", f"--regid={user.gid}",
                   "--clear-groups", *command]  # fmt: skip
    pid = os.posix_spawn(command[0], command, {}, file_actions=actions)
    for fd in [*sources, *high]:
        os.close(fd)
    if keep_info:
        os.close(info_write)
        os.read(info_read, 4096)  # the sandbox exists: kill() now lands in bwrap's window
        os.close(info_read)
    return NaiveSandbox(pid)


@pytest.mark.parametrize("name", _probe_names())
def test_probe_holds_on_the_real_plan(world: World, name: str) -> None:
    """Each refusal is refused and each need is met, judged by the host's own files."""
    probe = catalogue_probe(world, name)
    allowed, outcome = run_probe(plan_for(world, probe), probe)
    assert allowed == probe.expect_allowed, outcome


@pytest.mark.parametrize("name", _probe_names())
def test_probe_flips_on_a_weakened_plan(
    world: World, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same probe comes out the other way once the plan exposes the secret or loses the
    entry the need depends on: the check can fail."""
    probe = catalogue_probe(world, name)
    plan = plan_for(world, probe)
    launcher: _report.Launcher = unchecked_launcher
    if name == "use an fd the launcher leaked":
        launcher = naive_launch  # type: ignore[assignment]  # a launcher that passes fds on
    weakened = probe.weaken(plan)
    if name == "write /usr":
        # Sessions never hold host uid 0, so the host's own permissions refuse this write on a
        # read-write /usr too: what flips is who refuses it, the read-only bind or the host.
        assert not writable_by(Path("/usr"), plan.user.uid)
        assert "Read-only file system" in run_probe(plan, probe)[1].stderr
        refused = run_probe(weakened, probe, launcher)[1]
        assert "Permission denied" in refused.stderr, refused
        return
    assert weakened != plan or name == "use an fd the launcher leaked" or probe.layers_off
    monkeypatch.setattr(_layers, "DISABLED_FOR_TESTS", frozenset(probe.layers_off))
    allowed, outcome = run_probe(weakened, probe, launcher)
    assert allowed != probe.expect_allowed, outcome


def test_host_secrets_are_really_there(world: World) -> None:
    """The refusals mean something: the launcher itself can read every stand-in secret."""
    for path in world.secrets.values():
        assert world.token in Path(path).read_text()


def test_every_mount_is_a_plan_entry(world: World) -> None:
    """/proc/self/mountinfo inside the session is exactly the plan's mounts and modes."""
    plan = world.plan()
    mountinfo = run_script(plan, "cat /proc/self/mountinfo").stdout
    assert mountinfo.count("\n") >= len([e for e in plan.entries if e.kind != "symlink"]) - 5
    assert mount_table_problems(mountinfo, plan) == []


def test_an_unlisted_mount_is_caught(world: World) -> None:
    """The whole-truth check fails when the sandbox has a mount the plan does not list, or a
    mode other than the plan's."""
    plan = world.plan()
    mountinfo = run_script(plan, "cat /proc/self/mountinfo").stdout
    assert mount_table_problems(mountinfo, plan.without(world.workspace)) == [
        f"{world.workspace} is mounted, and no plan entry accounts for it"
    ]
    as_ro = plan.replace(
        entries=tuple(
            e.replace(mode="ro") if e.dest == world.workspace else e for e in plan.entries
        )
    )
    assert mount_table_problems(mountinfo, as_ro) == [
        f"{world.workspace} is mounted rw, the plan says ro"
    ]


def test_session_cannot_gain_privileges_as_root(world: World) -> None:
    """The session holds no capabilities, even when the launcher is root."""
    outcome = run_script(world.plan(), "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")
    values = {line.split()[1] for line in outcome.stdout.splitlines()}
    assert values == {"0000000000000000"}, outcome


def test_environment_is_only_the_plan(world: World) -> None:
    """The session's environment is exactly the plan's variables (and bwrap's PWD)."""
    os.environ["NSCONFINE_TEST_LEAK"] = "leaked"
    try:
        plan = world.plan()
        outcome = run_script(plan, "env")
    finally:
        del os.environ["NSCONFINE_TEST_LEAK"]
    names = {line.split("=", 1)[0] for line in outcome.stdout.splitlines()}
    assert names == {v.name for v in plan.env} | {"PWD"}


def test_a_naive_launch_killed_at_once_leaves_its_command_running(world: World) -> None:
    """selftest's killed-launch check fails for bwrap started directly and killed as soon as
    its sandbox exists (before the sandbox's own death signal is set): the check can fail.
    (That nsconfine's own launches killed at once leave nothing: test_lifecycle.py.)"""

    def kill_bwrap_in_its_window(
        plan: Plan, argv: Sequence[str], *, stdout: Stdio = None
    ) -> NaiveSandbox:
        return naive_launch(plan, argv, stdout=stdout, keep_info=True)

    left = killed_launches_leave_nothing(world.plan(), 3, kill_bwrap_in_its_window)  # type: ignore[arg-type]
    assert left is not None


def test_selftest_runs_every_probe_and_passes() -> None:
    """`nsconfine selftest --json` runs every probe of the catalogue this host has (host power,
    trusted files, one per kernel layer) and the checks beyond it, and passes (as root,
    through an unprivileged account)."""
    result = cli("selftest", "--json", *user_options(), timeout=600)
    report = json.loads(result.stdout)
    names = {row["check"] for row in report["checks"]}
    beyond = {
        "every mount is a plan entry",
        "outlive a launch killed at once",
        "fork past the session's process limit, starving its account",
        "read what the user types at the terminal its output goes to",
        "redirect the next workspace by a planted symlink",
    }
    assert names >= {*_probe_names(), *beyond}, sorted({*_probe_names(), *beyond} - names)
    assert report["ok"], [row for row in report["checks"] if not row["ok"]]
    assert result.returncode == 0


def test_selftest_passes_whatever_the_launcher_s_umask() -> None:
    """The selftest builds its own stand-in world, whose modes are its own to set: under a
    launcher's umask of 0777 it refused its own workspace as not writable, naming a directory
    it had removed (attacker's pass, stop 40)."""
    result = subprocess.run(
        [sys.executable, "-m", "nsconfine", "selftest", *user_options()],
        capture_output=True, text=True, cwd="/", timeout=600, check=False, umask=0o777,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout, result.stdout


def test_a_stopped_world_leaves_no_server_behind(tmp_path: Path) -> None:
    """selftest's stand-in world, once stopped, has ended the threads serving its tool socket,
    loopback service and stand-in API, and those ports accept no more (each thread held the
    port and the session keyring it ran under: a run of many worlds used up an unprivileged
    account's keys)."""
    import socket
    import threading

    from helpers import SESSION_USER, open_up, running_world

    from nsconfine._kernel.accounts import run_as

    open_up(tmp_path)
    before = threading.active_count()
    with running_world(str(tmp_path), run_as(SESSION_USER)) as world:
        ports = (world.loopback_port, world.api_port)
        assert threading.active_count() >= before + 3
    assert threading.active_count() == before
    for port in ports:
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", port))


@pytest.mark.root  # only a root launcher gives the world away
def test_the_selftest_world_is_given_away_deepest_first_and_by_no_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The selftest's world, made by root, is given to the sessions' account deepest first,
    each file without following a link: when one is given away, every directory above it is
    still root's, so that account cannot swap a name on its way (attacker's pass on the root
    launcher, stop 32: given top-down, a directory the account owned already had its child
    swapped for a symlink, and root chowned where it led); the tool socket, in the account's
    directory, is given away without following a link either."""
    from nsconfine._kernel.accounts import run_as
    from nsconfine._selftest import world as _world

    account = run_as(os.environ.get("NSCONFINE_TEST_USER") or "nobody")
    given: list[tuple[str, bool]] = []
    real_chown = os.chown

    building = [True]

    def chown(path: str, uid: int, gid: int, *, follow_symlinks: bool = True) -> None:
        above = os.path.dirname(path)
        while building[0] and above.startswith(str(tmp_path) + "/world"):
            assert os.lstat(above).st_uid != account.uid, f"{above} was given before {path}"
            above = os.path.dirname(above)
        given.append((path, follow_symlinks))
        real_chown(path, uid, gid, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(os, "chown", chown)  # (the world module calls os.chown and lchown)
    monkeypatch.setattr(
        os, "lchown", lambda path, uid, gid: chown(path, uid, gid, follow_symlinks=False)
    )
    root = tmp_path / "world"
    root.mkdir()
    world = _world.World(str(root), account)
    building[0] = False  # (the socket is made in the account's directory: by no link)
    with world.running():
        pass
    assert len(given) > 10
    assert all(not follows for _, follows in given), given


@pytest.mark.root  # a mount on the launcher's side takes root
def test_a_host_mount_made_during_a_session_does_not_reach_it(tmp_path: Path) -> None:
    """A mount the host makes below a bound directory while a session runs (an automounter's,
    a disk plugged in, a FUSE file system) is not seen in the session: the plan, checked at the
    launch, stays the whole truth of what it sees. bwrap's mounts are slaves of the host's, and
    such a mount arrived as the host made it: writable below a read-only bind, without nosuid
    or nodev, and the session wrote in it (found this stop; this test failed on the code before
    the reaper made its mount namespace's mounts private). The host side is a mount namespace
    of the test's own, so nothing reaches the machine's; there the mount is seen, and the session
    sees the host's file written next to it (the controls)."""
    from helpers import session_dirs

    workspace, run_dir, shown = session_dirs(tmp_path, "ws", "run", "shown")
    (shown / "sub").mkdir(mode=0o755)
    started, ready, marker = workspace / "started", shown / "ready", shown / "sub" / "marker"
    wait = "i=0; while [ ! -e {0} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"
    inside = (
        f"touch {started}; {wait.format(ready)}; test -e {ready} && echo READY; "
        f"test -e {marker} && echo SEEN || echo NOT"
    )
    launch = [
        sys.executable, "-m", "nsconfine", "run", *user_options(), "--workspace", str(workspace),
        "--run-dir", str(run_dir), "--ro", str(shown), "--", "sh", "-c", inside,
    ]  # fmt: skip
    host = f"""set -e
mount --bind {tmp_path} {tmp_path}
mount --make-rshared {tmp_path}
{shlex.join(launch)} &
{wait.format(started)}
mount -t tmpfs -o mode=0777 tmpfs {shown / "sub"}
touch {marker} {ready}
test -e {marker} && echo HOST-SEES
wait $!
"""
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", host],
        capture_output=True, text=True, cwd="/", timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result
    # (in either order: the host's echo and the session's share one pipe; CI, stop 40)
    assert sorted(result.stdout.split()) == ["HOST-SEES", "NOT", "READY"], result
