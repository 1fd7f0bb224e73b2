"""The one gate every launch passes (spawn, a Pool's launch, the CLI): a plan the lint refuses,
a pinned harness that changed, a launcher whose children's statuses would be lost are refused
before anything runs; the refused command leaves no trace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    SESSION_USER,
    open_up,
    outcome_without_hanging,
    python_child,
    running_world,
    session,
    session_dirs,
)

import nsconfine
import nsconfine._launch.programs
from nsconfine._kernel.accounts import SEARCH, RunAs, access_problem, run_as
from nsconfine._plan import model as p

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


def test_a_refused_bind_runs_nothing(tmp_path: Path, trace_file: Path) -> None:
    """A plan that binds a secret, built by hand past Session, is refused by spawn itself."""
    open_up(tmp_path)
    (tmp_path / "world").mkdir()
    with running_world(str(tmp_path / "world"), run_as(SESSION_USER)) as world:
        plan = world.plan()
        secret = world.secrets["~/.ssh/id_ed25519"]
        weakened = plan.replace(entries=(*plan.entries, p.ro_bind(secret, secret, "wants it")))
        session_dirs(tmp_path, "ws")
        with pytest.raises(nsconfine.PlanError, match=r"\.ssh"):
            nsconfine.spawn(weakened, ["/bin/sh", "-c", f"touch {trace_file}"])
    assert not trace_file.exists()


def test_a_changed_pinned_harness_runs_nothing(tmp_path: Path, trace_file: Path) -> None:
    """A harness whose content no longer matches its pin is refused before launch."""
    open_up(tmp_path)
    (tmp_path / "world").mkdir()
    with running_world(str(tmp_path / "world"), run_as(SESSION_USER)) as world:
        plan = world.plan()
        with open(world.harness, "a") as harness:
            harness.write(f"touch {trace_file}\n")
        with pytest.raises(nsconfine.PlanError, match="sha256"):
            nsconfine.spawn(plan, [world.harness])
    assert not trace_file.exists()


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


def _pinned_harness_plan(tmp_path: Path) -> tuple[nsconfine.Plan, Path]:
    import hashlib

    workspace, run_dir, tools = session_dirs(tmp_path, "ws", "run", "tools")
    harness = tools / "agent"
    harness.write_text("#!/bin/sh\necho agent\n")
    harness.chmod(0o755)
    digest = hashlib.sha256(harness.read_bytes()).hexdigest()
    return session(workspace, run_dir, harness=[f"{harness}@sha256:{digest}"]).plan(), harness


def test_a_pinned_harness_made_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    """A FIFO where the pinned harness was (the place writable by whoever planted it) is
    refused; the launcher does not wait on it for a writer. (The lint, which refuses any
    read-only bind of a FIFO, says so before the pin is read; the pin's own check of the file
    stays behind it.)"""
    plan, harness = _pinned_harness_plan(tmp_path)
    harness.unlink()
    os.mkfifo(harness)
    outcome = outcome_without_hanging(lambda: nsconfine.spawn(plan, [str(harness)]), "the pin")
    assert isinstance(outcome, nsconfine.PlanError), outcome
    assert "is a FIFO" in str(outcome)


def test_a_pinned_harness_grown_past_any_harness_is_refused_unread(tmp_path: Path) -> None:
    """A pinned harness made a sparse file of 64 GiB is refused by its size, not hashed (at
    ~1 GiB/s, a minute per launch; 16 TiB, hours)."""
    plan, harness = _pinned_harness_plan(tmp_path)
    os.truncate(harness, 64 << 30)
    with pytest.raises(nsconfine.PlanError, match="larger than"):
        nsconfine.spawn(plan, [str(harness)])


def test_a_pinned_harness_that_grows_as_it_is_hashed_is_refused(tmp_path: Path) -> None:
    """A pin hashes the size it found on opening, and no more: a harness something keeps
    growing (a writer of the place) is refused, not read for as long as it grows."""
    from nsconfine._policy import pins

    harness = tmp_path / "agent"
    harness.write_bytes(b"x" * 10)
    fd, opened = pins.open_pinned(str(harness))
    try:
        found = opened.st_size
        with open(harness, "ab") as writer:
            writer.write(b"y" * 5)
        with pytest.raises(nsconfine.PlanError, match="changed while"):
            pins._sha256(fd, found, str(harness))
    finally:
        os.close(fd)


@pytest.mark.root
def test_a_session_group_of_gid_0_is_refused_at_the_gate(ws_run: tuple[Path, Path]) -> None:
    """A plan whose account's group is gid 0, made past Session (whose run_as refuses such an
    account), is refused by spawn itself as uid 0 is: the session read a root:root 0640 file
    in its workspace, running as gid 0 (attackers' pass)."""
    import os

    from nsconfine._kernel.accounts import RunAs

    secret = ws_run[0] / "g0secret"
    secret.write_text("root's group only\n")
    os.chown(secret, 0, 0)
    secret.chmod(0o640)
    plan = session(*ws_run).plan()
    rooted = plan.replace(user=RunAs(plan.user.name, plan.user.uid, 0))
    marker = ws_run[0] / "ran"
    with pytest.raises(nsconfine.SandboxUnavailable, match="gid 0"):
        nsconfine.spawn(rooted, ["/bin/sh", "-c", f"cat g0secret > {marker}"])
    assert not marker.exists()


def test_a_plan_made_to_run_as_uid_0_is_refused_at_the_gate(
    ws_run: tuple[Path, Path], trace_file: Path
) -> None:
    """A plan whose account is uid 0, made past Session (whose run_as never gives one), is
    refused by the gate itself, saying the session would hold host uid 0, before bwrap runs.
    Mutation pass, stop 35: with the gate's uid-0 check dropped, a root launcher's launch was
    refused only later, by accident (the reaper cannot map uid 0), and an unprivileged one's
    as a usage error for another account, neither naming uid 0."""
    plan = session(*ws_run).plan()
    rooted = plan.replace(user=RunAs(plan.user.name, 0, plan.user.gid))
    with pytest.raises(nsconfine.SandboxUnavailable, match="would hold host uid 0"):
        nsconfine.spawn(rooted, ["/bin/sh", "-c", f"touch {trace_file}"])
    assert not trace_file.exists()


# Ways a launcher comes to ignore SIGCHLD: through Python, or behind its back (C code, which
# signal.getsignal cannot see).
IGNORE_SIGCHLD = {
    "python": "signal.signal(signal.SIGCHLD, signal.SIG_IGN)",
    "c": "ctypes.CDLL(None).signal(int(signal.SIGCHLD), ctypes.c_void_p(1))  # SIG_IGN",
}


@pytest.mark.parametrize("how", sorted(IGNORE_SIGCHLD))
def test_a_launcher_that_ignores_sigchld_is_refused(ws_run: tuple[Path, Path], how: str) -> None:
    """With SIGCHLD set to SIG_IGN the kernel reaps the launcher's children itself, and every
    status is lost (`exit 7` came back as 0, a failed exec as a raw ChildProcessError with
    fds and mount points left behind): refused before anything runs, saying what to fix."""
    child = python_child(
        f"""
        import ctypes, signal
        {IGNORE_SIGCHLD[how]}
        plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3])
        try:
            print("status", nsconfine.spawn(plan, ["/bin/sh", "-c", "exit 7"]).wait())
        except nsconfine.NsconfineError as refused:
            print(refused.code, refused.message)
        """,
        str(ws_run[0]), str(ws_run[1]), SESSION_USER or "",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = child.communicate(timeout=60)
    assert out.startswith("sandbox-unavailable"), out + err
    assert "SIGCHLD" in out
    assert sorted(ws_run[0].iterdir()) == []


def test_a_pool_launch_is_refused_once_sigchld_is_ignored(plan: nsconfine.Plan) -> None:
    """SIGCHLD ignored after the pool was made: its launch is refused as spawn's is (it
    returned 0 for `exit 3`)."""
    with nsconfine.Pool(plan, size=1, refill="inline") as pool:
        previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        try:
            with pytest.raises(nsconfine.SandboxUnavailable, match="SIGCHLD"):
                pool.launch(["/bin/sh", "-c", "exit 3"])
        finally:
            signal.signal(signal.SIGCHLD, previous)


@pytest.mark.root
@pytest.mark.parametrize(
    "chain", ["to-a-file-of-theirs", "through-a-link-of-theirs", "through-a-directory-of-theirs"]
)
def test_a_program_reached_through_a_link_another_account_controls_is_untrusted(
    tmp_path: Path, chain: str
) -> None:
    """A program (the reaper, the shim, bwrap) or a profile reached through a symlink is
    judged where the link leads, and by every name looked up on the way: a root-owned link in
    root's directory that leads to a file another account owns, or through a link of its, or
    through a directory of its that `..` then leaves (it could make that a symlink), is refused
    (attackers' passes: a symlinked _reaper into nobody's directory ran nobody's binary,
    unconfined, at the next root launch). The twin, a link to root's own file, is taken."""
    import os

    from nsconfine._kernel.accounts import untrusted_reason

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    program = ours / "program"
    program.write_bytes(b"root's\n")
    (ours / "direct").symlink_to(program)
    assert untrusted_reason(str(ours / "direct")) is None
    if chain == "to-a-file-of-theirs":
        planted = theirs / "program"
        planted.write_bytes(b"nobody's\n")
        os.chown(planted, 65534, 65534)
        (ours / "link").symlink_to(planted)
    elif chain == "through-a-link-of-theirs":
        (theirs / "hop").symlink_to(program)
        (ours / "link").symlink_to(theirs / "hop")
    else:  # left by `..`: made a symlink later, it leads the `..` into their tree
        (theirs / "sub").mkdir()
        os.chown(theirs / "sub", 65534, 65534)
        (ours / "link").symlink_to("../theirs/sub/../../ours/program")
    reason = untrusted_reason(str(ours / "link"))
    assert reason is not None
    assert "uid 65534" in reason


def test_a_file_the_session_cannot_run_is_said_to_lack_execute_permission(tmp_path: Path) -> None:
    """The bit that lets an account search a directory runs a file: a bwrap the session's
    account cannot run is "no execute permission", not "no search permission" (which read,
    of NSCONFINE_BWRAP=/etc/passwd, as a path problem; found by a fuzzing pass)."""
    program = tmp_path / "bwrap"
    program.write_bytes(b"")
    program.chmod(0o644)
    stranger = RunAs("stranger", os.geteuid() + 4242, os.getegid() + 4242)
    assert access_problem(str(program), stranger, SEARCH) == (
        f"stranger (uid {stranger.uid}) has no execute permission on {program}"
    )


@pytest.mark.root
def test_a_launcher_that_dropped_only_its_effective_uid_is_refused(
    ws_run: tuple[Path, Path],
) -> None:
    """A root process that only set its effective uid (os.seteuid, the usual way to act as an
    account for a while) keeps real uid 0, which an exec keeps too: it was refused for the
    wrong cause ("not a working bubblewrap", or its limits), and a bwrap that took the state
    would run the session with real uid 0 (attacker's pass, stop 40). Refused by its cause,
    before anything runs. (Launches with every uid the account's are the unprivileged suite.)"""
    script = f"""
import os
import subprocess  # (what proving bwrap for the account imports: the tree may be root's)
import nsconfine
from nsconfine._kernel.accounts import run_as
account = run_as({SESSION_USER!r})
plan = nsconfine.Session(
    workspace={str(ws_run[0])!r}, run_dir={str(ws_run[1])!r}, user=account.name
).plan()
spawn = nsconfine.spawn
assert spawn(plan, ["/bin/true"]).wait() == 0  # (all it imports loaded while root)
os.setresuid(0, account.uid, 0)
try:
    print("status", spawn(plan, ["/bin/true"]).wait())
except nsconfine.NsconfineError as error:
    print(error)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd="/", timeout=120,
        check=False,
    )  # fmt: skip
    assert "real uid is 0" in result.stdout, (result.stdout, result.stderr)
