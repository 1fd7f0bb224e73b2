"""What the attacker's pass over issue 10's launch path found: the records of the mount points
a launch makes, under a umask that lets the group write, and when a token cannot be written."""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import give_to_session_user, session

import nsconfine
from nsconfine._kernel import stub_records as _stub_records
from nsconfine._launch import sources as _sources
from nsconfine._preflight import checks as _checks


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh XDG_CACHE_HOME, the records directory looked for afresh in it (and after)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    _stub_records.forget_records()
    yield cache
    _stub_records.forget_records()


def test_records_made_under_a_group_writable_umask_are_accepted(own_cache: Path) -> None:
    """With umask 002 (user private groups: Debian's default for logins with
    USERGROUPS_ENAB), the directories nsconfine makes for its records, first the bwrap proof's
    as a launch does, then the mount points', are its own to use: not refused as writable by
    others (which made every launch of a workspace fail, for good)."""
    old = os.umask(0o002)
    try:
        _checks._remember("attack10-identity", frozenset())  # the gate does this first
        records = _stub_records.records()
    finally:
        os.umask(old)
    for path in (records, os.path.dirname(records)):
        assert os.stat(path).st_mode & 0o022 == 0, path


def test_a_token_that_cannot_be_written_leaks_no_fd(
    own_cache: Path, ws_run: tuple[Path, Path]
) -> None:
    """A stub's token that cannot be written (EFBIG here; ENOSPC or EDQUOT on a full cache)
    fails the launch without leaving the token's fd open, and leaves no stub behind."""
    workspace, run_dir = ws_run
    plan = session(workspace, run_dir).plan()
    _stub_records.records()  # found (and its directory made) before the count
    before = len(os.listdir("/proc/self/fd"))
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, limits[1]))
    try:
        for _ in range(3):
            with pytest.raises(OSError, match="too large"):
                _sources.open_for_launch(plan)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert len(os.listdir("/proc/self/fd")) == before
    assert sorted(os.listdir(workspace)) == []


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_stub_another_records_directory_holds_is_not_removed(
    ws_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two launchers of one account whose records directories differ (one's cache is
    read-only, so it keeps them in /tmp; or another XDG_CACHE_HOME) launch into one workspace.
    When the first session ends, its launcher must not remove the stubs it made while the
    second session's protected binds sit on them (the kernel would detach those binds, and
    the second session could write .envrc, which the host trusts): each sandbox holds a
    shared lock on every mount point it binds over."""
    workspace, run_dir = ws_run

    def records_in(name: str) -> None:
        cache = tmp_path / name
        cache.mkdir(exist_ok=True)
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        _stub_records.forget_records()

    records_in("cache-a")
    first = nsconfine.spawn(session(workspace, run_dir).plan(), ["/bin/sleep", "1000"])
    records_in("cache-b")
    second = nsconfine.spawn(session(workspace, run_dir).plan(), ["/bin/sleep", "1000"])
    try:
        records_in("cache-a")
        first.kill()
        first.wait()
        with open(f"/proc/{second.command_pid}/mountinfo") as mountinfo:
            bound = [line for line in mountinfo if line.split()[4].endswith("/.envrc")]
        assert (workspace / ".envrc").exists()
        assert bound
    finally:
        second.kill()
        second.wait()
        _stub_records.forget_records()


def test_a_wait_longer_than_poll_can_count_waits() -> None:
    """wait_fd (Sandbox.wait's, and the CLI's) with a timeout past poll()'s int of ms (a
    broker's float('inf'), `--grace 1e300` once a signal came) waits: no OverflowError."""
    from nsconfine._kernel.syscalls import wait_fd

    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"x")
        assert wait_fd(read_end, float("inf"))
        assert wait_fd(read_end, 1e300)
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_session_locking_a_protected_path_makes_the_next_launch_refuse(
    ws_run: tuple[Path, Path],
) -> None:
    """A session that takes an exclusive lock on a protected path it can read (to have its
    launcher, or another, remove the stub under the next session's bind) gets the next launch
    of its workspace refused, not unprotected; once it ends, launches go on."""
    workspace, run_dir = ws_run
    # A session where .envrc is left writable makes one and locks it (where it is protected,
    # the sandbox's own shared lock keeps the session from locking it).
    plan = session(workspace, run_dir, unprotect=[".envrc"]).plan()
    read_end, write_end = os.pipe()
    holder = nsconfine.spawn(
        plan,
        ["/usr/bin/flock", "-x", ".envrc", "/bin/sh", "-c", "echo locked; sleep 60"],
        stdout=write_end,
    )
    os.close(write_end)
    try:
        assert os.read(read_end, 7) == b"locked\n"
        with pytest.raises(nsconfine.SandboxUnavailable, match="locked"):
            nsconfine.spawn(session(workspace, run_dir).plan(), ["/bin/true"])
    finally:
        os.close(read_end)
        holder.kill()
        holder.wait()
    assert nsconfine.spawn(session(workspace, run_dir).plan(), ["/bin/true"]).wait() == 0


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_session_that_only_reads_a_workspace_cannot_lock_out_its_writers(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A reviewer of the workspace (read-only but for notes) holds no lock on the coder's
    mount points, so nothing stops it taking an exclusive one on a protected file it can read
    (.envrc): every launch of the coder on that workspace was then refused ("is locked"),
    for as long as the reviewer ran. A session that cannot write a path must not be able to
    keep another session of the workspace from starting."""
    workspace, run_dir = ws_run
    (workspace / ".envrc").write_text("export SAFE=1\n")
    reviewer_run = tmp_path / "reviewer-run"
    reviewer_run.mkdir()
    give_to_session_user(workspace, reviewer_run)
    reviewer = session(workspace, reviewer_run, profile=["reviewer"]).plan()
    read_end, write_end = os.pipe()
    holder = nsconfine.spawn(
        reviewer,
        ["/usr/bin/flock", "-x", f"{workspace}/.envrc", "/bin/sh", "-c", "echo locked; sleep 60"],
        stdout=write_end,
    )
    os.close(write_end)
    try:
        assert os.read(read_end, 7) == b"locked\n"
        coder = nsconfine.spawn(session(workspace, run_dir).plan(), ["/bin/true"])
        assert coder.wait() == 0
    finally:
        os.close(read_end)
        holder.kill()
        holder.wait()
