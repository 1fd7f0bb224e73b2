"""The mount points a launch makes (the stubs of missing protected paths) and their records:
each launch removes what it made, and none while another session, another launcher's
records or an OCI bundle still sits on it; a killed launcher's stubs go with the next
session; stubs are never made through a planted symlink; the records directory is the
account's own, wherever the launcher's environment points, and is never written through a
symlink; a session cannot lock another's stubs away."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    IS_ROOT,
    SESSION_USER,
    attempt,
    give_to_session_user,
    read_to_eof,
    session,
    session_dirs,
    user_options,
)

import nsconfine
from nsconfine._kernel import stub_records as _stub_records
from nsconfine._launch import sources as _sources
from nsconfine._plan.model import COMMONDIR_STUB
from nsconfine._preflight import checks as _checks

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


def test_no_stub_is_left_behind(repo: tuple[Path, Path]) -> None:
    """After the session, the workspace holds nothing nsconfine created only as a mount
    point: the files and directories are exactly those before it."""
    workspace = repo[0]
    before = sorted(str(p) for p in workspace.rglob("*"))
    plan = session(*repo).plan()
    assert attempt(plan, "true")[0] == 0
    after = sorted(str(p) for p in workspace.rglob("*"))
    assert set(after) ^ set(before) == set(), set(after) ^ set(before)
    assert after == before


def test_the_last_of_one_launchers_sessions_to_end_removes_the_stubs(
    repo: tuple[Path, Path], tmp_path: Path
) -> None:
    """Two sessions of one launcher bind the same stubs: the first to end leaves them to the
    other (they still keep its protected paths), and the last one's end removes them."""
    workspace = repo[0]
    (run_b,) = session_dirs(tmp_path, "run-b")
    before = {str(p) for p in workspace.rglob("*")}
    first = nsconfine.spawn(session(*repo).plan(), ["sleep", "600"])
    try:
        made = {str(p) for p in workspace.rglob("*")} - before
        assert made, "the workspace has no missing protected path to stub"
        assert attempt(session(workspace, run_b).plan(), "true")[0] == 0
        assert {str(p) for p in workspace.rglob("*")} - before == made
    finally:
        first.kill()
        first.wait()
    assert {str(p) for p in workspace.rglob("*")} == before


def test_the_session_account_owns_nothing_new_outside(tmp_path: Path) -> None:
    """Stub creation never follows a planted symlink out of the workspace."""
    workspace, run_dir, elsewhere = session_dirs(tmp_path, "ws", "run", "elsewhere")
    (workspace / ".vscode").symlink_to(elsewhere)
    plan_or_refusal: object
    try:
        plan_or_refusal = session(workspace, run_dir).plan()
    except nsconfine.PlanError as refused:
        plan_or_refusal = refused
    if isinstance(plan_or_refusal, nsconfine.Plan):
        attempt(plan_or_refusal, "true")
    assert list(elsewhere.iterdir()) == []


@contextlib.contextmanager
def _session_of_another_launcher(
    ws_run: tuple[Path, Path], cache: Path | None = None
) -> Iterator[None]:
    """Session A, launched by another launcher process (with cache as its XDG_CACHE_HOME, if
    given: other records), running until the block ends; then killed, its launcher's exit
    awaited (0)."""
    from helpers import python_child

    first = python_child(
        """
        plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3] or None)
        sandbox = nsconfine.spawn(plan, ["sleep", "600"])
        print("launched", flush=True)
        sys.stdin.read()  # until the test ends A
        sandbox.kill()
        sandbox.wait()
        """,
        str(ws_run[0]), str(ws_run[1]), SESSION_USER or "",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env={**os.environ, **({"XDG_CACHE_HOME": str(cache)} if cache is not None else {})},
    )  # fmt: skip
    assert first.stdin is not None
    assert first.stdout is not None
    try:
        assert first.stdout.readline() == "launched\n"  # A runs: B's launch finds A's stubs
        yield
    finally:
        first.stdin.close()
        ended = first.wait(timeout=120)
        first.stdout.close()
    assert ended == 0


def _writer(plan: nsconfine.Plan, go: Path, script: str) -> nsconfine.Sandbox:
    """Session B: waits until go exists (once A has ended), then runs script, whose `echo
    wrote` says it could write; its output piped."""
    return nsconfine.spawn(
        plan,
        ["/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; ({script}) 2>&1"],
        stdout=subprocess.PIPE,
    )


def _assert_wrote_nothing(writer: nsconfine.Sandbox) -> None:
    output = writer.communicate(timeout=120)[0]
    assert output is not None
    assert b"wrote" not in output, output


def test_a_concurrent_session_keeps_its_protection(repo: tuple[Path, Path], tmp_path: Path) -> None:
    """Session A (another launcher process) ends while session B of the same workspace runs:
    B's protected paths stay protected, and no stub is left once both have ended."""
    workspace = repo[0]
    (run_b,) = session_dirs(tmp_path, "run-b")
    before = sorted(str(p) for p in workspace.rglob("*"))
    go = run_b / "go"  # B writes once A has ended
    try:
        with _session_of_another_launcher(repo):
            plan_b = session(workspace, run_b).plan()
            read_end, write_end = os.pipe()
            second = nsconfine.spawn(
                plan_b,
                ["/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; cd {workspace}; "
                 "(echo evil > .mcp.json) 2>/dev/null; "
                 "(mkdir -p .vscode && echo {{}} > .vscode/tasks.json) 2>/dev/null; ls -a"],
                stdout=write_end, stderr=write_end,
            )  # fmt: skip
            os.close(write_end)
    finally:  # A ends while B runs (and B goes on whatever failed)
        go.touch()
    output = (read_to_eof(read_end, 120) or b"").decode()
    os.close(read_end)
    assert second.wait(timeout=120) == 0, output
    assert (
        not (workspace / ".mcp.json").exists()
        or "evil" not in (workspace / ".mcp.json").read_text()
    )
    assert not (workspace / ".vscode" / "tasks.json").exists(), output
    after = sorted(str(p) for p in workspace.rglob("*"))
    assert set(after) ^ set(before) == set(), set(after) ^ set(before)
    assert after == before


def test_a_stub_directory_written_into_stays_while_a_session_binds_it(
    ws_run: tuple[Path, Path],
) -> None:
    """Session A made the stub directory .claude; something wrote a file into it (the host's
    own Claude Code, or a session of the workspace that may write there) before session B's
    launch, then removed it; A ended while B ran. B's .claude stays read-only, and no file
    appears in it on the host. (B did not hold the stub, a directory with a file in it then,
    so A's end removed it once empty, the kernel detached B's bind with it, and B wrote
    .claude/settings.json onto the host.)"""
    workspace, run_dir = ws_run
    claude = workspace / ".claude"
    first = nsconfine.spawn(session(workspace, run_dir).plan(), ["sleep", "600"])
    go = run_dir / "go"  # B writes once A has ended
    try:
        note = claude / "note"
        note.write_text("")
        give_to_session_user(note)
        second = _writer(
            session(workspace, run_dir).plan(),
            go,
            "mkdir -p .claude && echo {} > .claude/settings.json && echo wrote",
        )
        note.unlink()
    finally:
        first.kill()
        first.wait()
        go.touch()
    _assert_wrote_nothing(second)
    assert not (claude / "settings.json").exists()


@pytest.mark.parametrize("then", ["emptied", "kept", "rewritten"])
def test_a_stub_file_the_host_wrote_into_is_never_removed(
    ws_run: tuple[Path, Path], then: str
) -> None:
    """Session A made the .envrc stub; the host wrote into it in place, and session B then
    launched. Whatever the host does next (empties it, or keeps its content), A's end never
    removes it: B's bind stays, and the host's file with it (attackers' pass: B took no hold of
    a file with content, A's end found it empty again and removed it, the kernel detached B's
    bind, and B wrote .envrc on the host; kept, the host's own words went with an unlinked
    file when it rewrote them as A ended)."""
    workspace, run_dir = ws_run
    envrc = workspace / ".envrc"
    first = nsconfine.spawn(session(workspace, run_dir).plan(), ["sleep", "600"])
    go = run_dir / "go"
    try:
        assert envrc.stat().st_size == 0  # A's stub
        envrc.write_text("export HOST=1\n")
        second = _writer(
            session(workspace, run_dir).plan(), go, f"echo pwned > {envrc} && echo wrote"
        )
        if then == "emptied":
            os.truncate(envrc, 0)
        rewriting = envrc.open("w") if then == "rewritten" else None  # `cat new > .envrc`
    finally:
        first.kill()
        first.wait()
        go.touch()
    if rewriting is not None:  # the shell writes once A has ended
        rewriting.write("export HOST=2\n")
        rewriting.close()
    _assert_wrote_nothing(second)
    expected = {"emptied": "", "kept": "export HOST=1\n", "rewritten": "export HOST=2\n"}
    assert envrc.read_text() == expected[then]


def test_a_stub_directory_another_records_directory_binds_stays(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """Launchers with different records (another XDG_CACHE_HOME): A made the .vscode stub,
    the host wrote a note into it and B (the other records) launched, then the note went and A
    ended. B's .vscode stays read-only (attackers' pass: B held no stub of other records with
    something in it, A's end removed the emptied directory, and B wrote .vscode/tasks.json)."""
    workspace, run_dir = ws_run
    vscode = workspace / ".vscode"
    other_cache = tmp_path / "other-cache"
    other_cache.mkdir()
    go = run_dir / "go"
    try:
        with _session_of_another_launcher(ws_run, other_cache):
            note = vscode / "note"
            note.write_text("")
            second = _writer(
                session(workspace, run_dir).plan(),
                go,
                f"mkdir -p {vscode} && echo pwned > {vscode}/tasks.json && echo wrote",
            )
            note.unlink()
    finally:
        go.touch()
    _assert_wrote_nothing(second)
    assert not (vscode / "tasks.json").exists()


@pytest.mark.parametrize(
    ("name", "option", "written", "records"),
    [
        (".mcp.json", "ro", ".mcp.json", "same"),
        (".mcp.json", "ro", ".mcp.json", "other"),
        (".envrc", "mask", ".envrc", "same"),
        (".vscode", "ro", ".vscode/tasks.json", "other"),
        (".vscode", "mask", ".vscode/tasks.json", "same"),
        (".vscode", "mask", ".vscode/tasks.json", "other"),
        (".git/commondir", "mask", ".git/commondir", "same"),
        (".git/commondir", "ro", ".git/commondir", "same"),
    ],
)
def test_a_stub_another_entry_binds_stays_while_its_session_runs(
    ws_run: tuple[Path, Path], tmp_path: Path, name: str, option: str, written: str, records: str
) -> None:
    """Session A made a stub; session B binds the same path by another entry (`--ro` of it, a
    mask of it), from the same records or another launcher's (another XDG_CACHE_HOME), and
    goes on after A ends: B's path stays read-only, and nothing is written on the host
    (attackers' pass: B held only what its own entry would have made, A's end removed the
    stub, the kernel detached B's bind, and B wrote .mcp.json, .git/commondir (git then takes
    its config from where that names) or .vscode/tasks.json)."""
    workspace, run_dir = ws_run
    if name.startswith(".git/"):
        subprocess.run(["git", "init", "-q", str(workspace)], check=True)
        give_to_session_user(workspace)
    cache = tmp_path / "other-cache"
    cache.mkdir()
    go = run_dir / "go"
    target = workspace / written
    try:
        with _session_of_another_launcher(ws_run, cache if records == "other" else None):
            assert (workspace / name).exists()  # A's stub
            plan = session(workspace, run_dir, **{option: [str(workspace / name)]}).plan()
            second = _writer(
                plan, go, f"mkdir -p {target.parent} && echo pwned >> {target} && echo wrote"
            )
    finally:
        go.touch()
    _assert_wrote_nothing(second)
    assert not target.exists() or "pwned" not in target.read_text()


def test_a_mount_point_another_launcher_makes_meanwhile_is_taken_as_found(
    ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launcher of other records makes a missing mount point between this launch's look
    and its own making of it: the launch takes it as found (attackers' pass: `plan-refused:
    .vscode cannot be made: File exists` when launchers of several records started at once)."""
    make = _sources._make

    def made_by_another_first(parent: int, name: str, *args: Any) -> Any:
        os.mkdir(name, 0o755, dir_fd=parent)  # another launcher's stub, made this moment
        monkeypatch.setattr(_sources, "_make", make)
        return make(parent, name, *args)

    monkeypatch.setattr(_sources, "_make", made_by_another_first)
    status, output = attempt(session(*ws_run).plan(), "true")
    assert status == 0, output


def test_a_stub_turned_into_a_dangling_symlink_is_a_clean_refusal(repo: tuple[Path, Path]) -> None:
    """A plan built, then its stub's place made a dangling symlink before the launch: a clean
    refusal (never an OSError that reads as the command failing)."""
    workspace = repo[0]
    plan = session(*repo).plan()
    (workspace / ".mcp.json").symlink_to("/nonexistent")
    with pytest.raises(nsconfine.NsconfineError):
        nsconfine.spawn(plan, ["/bin/true"]).wait()


@pytest.mark.root  # only then does its owner tell a session's directory from the launcher's
def test_a_directory_renamed_over_a_stub_as_it_is_made_is_not_taken_for_it(
    ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running session can rename an empty directory of its own over a stub directory the
    moment the launcher has made it (here: at once after the mkdir). The launcher chowned,
    recorded, bound and after the session removed whatever the name then held; it now takes
    the directory it made through an fd, and as root refuses one that is not its own."""
    workspace, run_dir = ws_run
    plan = session(workspace, run_dir).plan()
    own = workspace / "own"
    own.mkdir()
    give_to_session_user(own)
    made = os.mkdir

    def mkdir_then_rename(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        made(path, mode, dir_fd=dir_fd)
        if path == ".vscode" and dir_fd is not None:
            os.rename(own, workspace / ".vscode")

    monkeypatch.setattr(os, "mkdir", mkdir_then_rename)
    with pytest.raises(nsconfine.NsconfineError, match="replaced while it was made"):
        nsconfine.spawn(plan, ["/bin/true"]).wait()
    monkeypatch.undo()
    assert (workspace / ".vscode").is_dir()  # the session's own, left where it put it
    assert (workspace / ".vscode").stat().st_uid == own.parent.stat().st_uid


@pytest.mark.root  # as the directory's case above
def test_a_file_renamed_over_a_commondir_stub_as_it_is_made_is_not_taken_for_it(
    repo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race for the commondir stub a repository's .git gets: a session's own file
    renamed over it just after its content is written. The launcher chowned and recorded by
    name whatever was there then, and removed the session's file after the session as its
    own stub; it now takes the file it made through the fd it made it with."""
    workspace, _run_dir = repo
    plan = session(*repo).plan()
    own = workspace / "own"
    own.write_bytes(b"x\n")  # a stub's size: removed as one, were it taken for one
    give_to_session_user(own)
    target = workspace / ".git" / "commondir"  # (the other repositories' are left alone)
    written = os.write

    def write_then_rename(fd: int, data: bytes) -> int:
        count = written(fd, data)
        if data == COMMONDIR_STUB and os.readlink(f"/proc/self/fd/{fd}") == str(target):
            os.rename(own, target)
        return count

    monkeypatch.setattr(os, "write", write_then_rename)
    outcome = attempt(plan, "true")
    monkeypatch.undo()
    assert target.read_bytes() == b"x\n", outcome
    info = target.stat()
    records = _stub_records.records()
    assert not os.path.lexists(_stub_records.token_path(records, (info.st_dev, info.st_ino)))


def test_stubs_of_a_killed_launcher_go_with_the_next_session(repo: tuple[Path, Path]) -> None:
    """A launcher killed with SIGKILL leaves its stubs; the next session of the workspace
    adopts them and removes them when it ends."""
    from helpers import python_child

    workspace = repo[0]
    before = sorted(str(p) for p in workspace.rglob("*"))
    launcher = python_child(
        """
        plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3] or None)
        nsconfine.spawn(plan, ["sleep", "600"])
        print("launched", flush=True)
        sys.stdin.read()
        """,
        str(workspace), str(repo[1]), SESSION_USER or "",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert launcher.stdout is not None
    assert launcher.stdin is not None
    with launcher.stdin, launcher.stdout:
        assert launcher.stdout.readline() == "launched\n"
        launcher.kill()
        launcher.wait()
    assert (workspace / ".mcp.json").exists()  # left behind (its sandbox dies with it)
    assert attempt(session(*repo).plan(), "true")[0] == 0
    assert sorted(str(p) for p in workspace.rglob("*")) == before


@pytest.mark.parametrize("moved", [".git", "the workspace"])
def test_stubs_of_a_place_moved_aside_during_a_session_go_once_it_is_back(
    repo: tuple[Path, Path], tmp_path: Path, moved: str
) -> None:
    """The session's account moves its workspace (or a repository's .git) aside while a
    session runs and puts a symlink in its place, then moves it back: the stubs the session's
    end could not reach stay recorded, and the next session's end removes them (the
    acceptance re-check: they stayed in the workspace for good, unrecorded, 23 of them)."""
    workspace = repo[0]
    place = workspace / ".git" if moved == ".git" else workspace
    aside = place.with_name(place.name + ".aside")
    before = sorted(str(p) for p in workspace.rglob("*"))
    sandbox = nsconfine.spawn(session(*repo).plan(), ["sleep", "600"])
    try:
        assert sorted(str(p) for p in workspace.rglob("*")) != before  # stubs made
        place.rename(aside)
        place.symlink_to(tmp_path)
    finally:
        sandbox.kill()
        sandbox.wait()
    place.unlink()
    aside.rename(place)
    assert attempt(session(*repo).plan(), "true")[0] == 0
    assert sorted(str(p) for p in workspace.rglob("*")) == before


def test_a_stub_recorded_by_a_file_token_goes_with_the_next_session(
    own_cache: Path, ws_run: tuple[Path, Path]
) -> None:
    """Tokens are symlinks naming their stub; one that earlier code made, a file holding the
    stub's path, still makes its stub the launcher's: adopted, and removed after the next
    session (taken for the session's own file, it would stay in the workspace for good)."""
    workspace = ws_run[0]
    plan = session(*ws_run).plan()
    left = workspace / ".envrc"
    left.touch()
    give_to_session_user(left)
    info = left.stat()
    token = Path(_stub_records.token_path(_stub_records.records(), (info.st_dev, info.st_ino)))
    token.write_bytes(os.fsencode(os.path.realpath(left)))
    assert attempt(plan, "true")[0] == 0
    assert not left.exists()
    assert not token.exists()


def test_an_oci_bundle_keeps_its_stubs_while_it_exists(
    repo: tuple[Path, Path], tmp_path: Path
) -> None:
    """The mount points `oci-bundle` makes for missing protected paths stay while the bundle
    exists, whatever sessions of the workspace start and end meanwhile (a running container
    would otherwise lose them, and write .envrc on the host); they go with the first session
    to end after the bundle is removed."""
    from helpers import cli, session_options

    workspace = repo[0]
    bundle = tmp_path / "bundle"
    made = cli("oci-bundle", *session_options(*repo), str(bundle))
    assert made.returncode == 0, made.stderr
    assert (workspace / ".mcp.json").exists()
    assert attempt(session(*repo).plan(), "true")[0] == 0
    assert (workspace / ".mcp.json").exists()
    import shutil

    shutil.rmtree(bundle)
    assert attempt(session(*repo).plan(), "true")[0] == 0
    assert not (workspace / ".mcp.json").exists()


def test_concurrent_launches_of_one_workspace_all_run_and_leave_nothing_there(
    ws_run: tuple[Path, Path],
) -> None:
    """16 spawns at once of one workspace's plan, 6 times: each runs, and once they have ended
    no mount point they made is left (a launch that saw another's stub before its record was
    written took it for the session's own directory and made stubs inside it). The soft fd
    limit is raised to the hard one: while it starts bwrap a launch holds ~80 fds (a source
    per bind, a hold per mount point), and 16 at that moment would pass 1,024; a launch short
    of fds is refused (test_lifecycle), which is not what this test looks at."""
    import threading

    plan = session(*ws_run).plan()
    failures: list[str] = []

    def launch() -> None:
        try:
            status = nsconfine.spawn(plan, ["/bin/true"]).wait()
        except nsconfine.NsconfineError as error:
            failures.append(str(error))
        else:
            if status != 0:
                failures.append(f"status {status}")

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        for _ in range(6):
            threads = [threading.Thread(target=launch) for _ in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert not failures, failures[:3]
            assert os.listdir(ws_run[0]) == []
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


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


def test_records_below_a_directory_others_can_write_are_refused(own_cache: Path) -> None:
    """The records (stub tokens, their lock, the bwrap proofs) are never kept below a directory
    someone else could write (XDG_CACHE_HOME or HOME in another account's home, as a root
    launcher may be given): that account could swap the records' directory for its own after
    it was checked, with the lock or a token a symlink the launcher (root) creates or truncates
    through, or a forged proof. Before the fix the check stopped two levels up: a root
    launcher's next launch created the file a planted `.lock` symlink named. Nor is anything
    made there before the refusal (the records' directories were made, through whatever that
    account had planted, then refused). Twin: the same cache, writable by its owner alone, is
    used."""
    os.chmod(own_cache, 0o777)  # (not sticky: anyone may rename what lies in it)
    with pytest.raises(nsconfine.SandboxUnavailable, match="could be replaced by another account"):
        _stub_records.records()
    assert list(own_cache.iterdir()) == []
    _checks._remember("attack2-identity", frozenset())
    assert not (own_cache / "nsconfine" / "proven-bwrap" / "attack2-identity").exists()
    os.chmod(own_cache, 0o755)
    _stub_records.forget_records()
    assert _stub_records.records().startswith(str(own_cache))
    _checks._remember("attack2-identity", frozenset())
    assert (own_cache / "nsconfine" / "proven-bwrap" / "attack2-identity").exists()


def test_records_reached_through_a_symlink_are_checked_where_it_leads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache reached through a symlink (/home -> /var/home on some systems) is used when
    the symlink and every directory where it leads are safe: a symlink's own mode is always
    0777 and says nothing (only who can write its directory can swap it). Twin: the same
    symlink leading below a directory anyone can write is refused."""
    real = tmp_path / "real"
    (real / "cache").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("XDG_CACHE_HOME", str(link / "cache"))
    _stub_records.forget_records()
    try:
        assert _stub_records.records().startswith(str(link / "cache"))
        _stub_records.forget_records()
        os.chmod(real, 0o777)
        with pytest.raises(nsconfine.SandboxUnavailable, match="could be replaced by another"):
            _stub_records.records()
    finally:
        os.chmod(real, 0o755)
        _stub_records.forget_records()


def test_a_token_that_cannot_be_written_leaks_no_fd(
    own_cache: Path, ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stub's token that cannot be made (ENOSPC or EDQUOT on a full cache) fails the launch
    without leaving an fd open (the stub's hold, the records' lock), and leaves no stub
    behind."""
    workspace, run_dir = ws_run
    plan = session(workspace, run_dir).plan()
    _stub_records.records()  # found (and its directory made) before the count
    before = len(os.listdir("/proc/self/fd"))

    def full(target: str, path: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(os, "symlink", full)
    for _ in range(3):
        with pytest.raises(OSError, match="No space left"):
            _sources.open_for_launch(plan)
    monkeypatch.undo()
    assert len(os.listdir("/proc/self/fd")) == before
    assert sorted(os.listdir(workspace)) == []


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


@pytest.mark.root  # another account's link: only root can make one for the test
def test_a_fallback_records_directory_another_account_made_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no cache directory to write, the records go to /tmp/nsconfine-UID (here, in a
    stand-in /tmp). Another account that made that name first, a symlink to a directory of
    its own, had root make the records' directory there (refused only after); it is refused
    before anything is made."""
    base, elsewhere = tmp_path / "tmp", tmp_path / "elsewhere"
    base.mkdir()
    elsewhere.mkdir()
    link = base / f"nsconfine-{os.geteuid()}"
    link.symlink_to(elsewhere)
    give_to_session_user(elsewhere, link)
    monkeypatch.setattr(_stub_records, "FALLBACK_BASE", str(base))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "missing" / "cache"))
    _stub_records.forget_records()
    try:
        with pytest.raises(nsconfine.SandboxUnavailable, match="no one else"):
            _stub_records.records()
    finally:
        _stub_records.forget_records()
    assert os.listdir(elsewhere) == []


@pytest.mark.root
def test_a_scratch_directory_is_made_where_the_launcher_owns_tmp(tmp_path: Path) -> None:
    """In a user namespace where /tmp shows as the launcher's own (root outside mapped to its
    uid), the scratch directory the canary and the selftest use is made there (attackers'
    pass: only a root-owned /tmp was taken, and `check` failed in such a namespace)."""
    made = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable, "-c",
         "import os; from nsconfine._kernel.accounts import scratch_directory as s; "
         "d = s('nsconfine-test-'); print(os.stat('/tmp').st_uid, d); os.rmdir(d)"],
        capture_output=True, text=True, check=False, cwd="/",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    owner, directory = made.stdout.split()
    assert (owner, os.path.dirname(directory)) == ("1000", "/tmp")


def test_a_scratch_directory_a_killed_launcher_left_is_removed_by_the_next() -> None:
    """A launcher killed (SIGKILL) while it proves bwrap or reads a session's index left its
    scratch directory in /tmp for good: no later launch removed it (attacker's pass, stop
    41). The next scratch directory of the kind removes those whose launcher is gone, and no
    other: a live launcher's, another kind's."""
    from nsconfine._kernel.accounts import scratch_directory

    kinds = ("nsconfine-test-sweep-", "nsconfine-test-other-")
    killed = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from nsconfine._kernel.accounts import "
         "scratch_directory as s; print(*(s(k) for k in sys.argv[1:]), flush=True); "
         "time.sleep(600)", *kinds],
        stdout=subprocess.PIPE, text=True, cwd="/",
    )  # fmt: skip
    assert killed.stdout is not None
    left, other = killed.stdout.readline().split()
    Path(left, "inside").write_text("what it worked on\n")
    killed.kill()
    killed.communicate()
    made = [scratch_directory(kinds[0]), scratch_directory(kinds[0])]
    try:
        assert not os.path.lexists(left), "the killed launcher's directory is left"
        assert os.path.isdir(made[0])  # (this launcher's: it lives)
        assert os.path.isdir(other)
    finally:
        for directory in (left, other, *made):
            shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.root  # only root makes a pid namespace without a user namespace
def test_a_scratch_directory_of_a_launcher_in_another_pid_namespace_is_kept() -> None:
    """A launcher in another pid namespace (a container sharing /tmp, as the same account)
    took a live launcher's scratch directory for a dead one's, its pid unknown there, and
    removed it (the review of 050e81b, stop 41). Only those of its own pid namespace are
    judged."""
    from nsconfine._kernel.accounts import scratch_directory

    live = scratch_directory("nsconfine-test-pidns-")
    try:
        subprocess.run(
            ["unshare", "--pid", "--fork", sys.executable, "-c", "import os; from "
             "nsconfine._kernel.accounts import scratch_directory as s; "
             "os.rmdir(s('nsconfine-test-pidns-'))"],
            check=True, cwd="/", timeout=60,
        )  # fmt: skip
        assert os.path.isdir(live), "another pid namespace's launcher removed a live one's"
    finally:
        shutil.rmtree(live, ignore_errors=True)


def test_a_read_only_cache_directory_does_not_stop_a_launch(tmp_path: Path) -> None:
    """An existing cache directory the launcher cannot write (a unit's ProtectSystem=strict, a
    read-only home) is passed over for a directory of the account's own, as a missing one is."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    cache = tmp_path / "cache"
    (cache / "nsconfine" / "mountpoints").mkdir(parents=True)
    run = [
        sys.executable, "-m", "nsconfine", "run", *user_options(),
        "--workspace", str(workspace), "--run-dir", str(run_dir), "--", "/bin/echo", "ran",
    ]  # fmt: skip
    if IS_ROOT:  # root writes through mode bits: a read-only mount, in a namespace of its own
        script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
        run = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(cache), *run]
    else:
        for directory in (cache, cache / "nsconfine", cache / "nsconfine" / "mountpoints"):
            directory.chmod(0o500)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    try:
        done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120, cwd="/")
    finally:
        for directory in (cache, cache / "nsconfine", cache / "nsconfine" / "mountpoints"):
            directory.chmod(0o700)
    assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr


def test_a_relative_cache_or_home_never_puts_records_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """XDG_CACHE_HOME=cache (or HOME=.) from a launcher started in a workspace: the XDG spec
    ignores a relative value, and so does nsconfine; its records never land where a session
    could have planted a symlink for root to write through."""
    from nsconfine._kernel.accounts import records_directory

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", "cache")
    assert os.path.isabs(records_directory("x"))
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", ".")
    assert os.path.isabs(records_directory("x"))
    assert not records_directory("x").startswith(str(tmp_path))


def test_a_home_that_does_not_exist_is_never_made(tmp_path: Path) -> None:
    """A launcher whose HOME is not there (a system account's /nonexistent) keeps its records
    elsewhere and makes no home: root made /nonexistent (and its .cache) for `nobody`, whose
    home then existed, root's, and was no longer denied to nobody's sessions as the home of
    the account they run as. Twin: a HOME that exists gets its .cache made."""
    missing = tmp_path / "nonexistent"
    env = {**os.environ, "HOME": str(missing)}
    env.pop("XDG_CACHE_HOME", None)
    check = [sys.executable, "-m", "nsconfine", "check"]
    done = subprocess.run(check, env=env, capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    assert not missing.exists()
    missing.mkdir()
    done = subprocess.run(check, env=env, capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    assert (missing / ".cache" / "nsconfine").is_dir()


def test_tokens_of_stubs_that_are_gone_are_removed(own_cache: Path, tmp_path: Path) -> None:
    """A token outlives its stub when a launcher is killed and its workspace then removed: the
    records grew by thousands, and a token whose stub's inode number came back to a file at its
    path would make that file nsconfine's. Tokens a week old whose stub is gone, or is another
    file now, go when the records are first looked up; one whose stub is there stays, and so
    do younger ones (a launcher in another mount namespace sees their stubs), and what is not
    a token."""
    records = Path(_stub_records.records())
    kept_stub = tmp_path / "kept"
    kept_stub.touch()
    info = kept_stub.stat()
    kept = Path(_stub_records.token_path(str(records), (info.st_dev, info.st_ino)))
    kept.symlink_to(kept_stub)
    gone = records / f"{info.st_dev}-{info.st_ino + 1}"
    gone.symlink_to(tmp_path / "removed-workspace" / ".envrc")
    another = records / f"{info.st_dev}-{info.st_ino + 2}"
    another.symlink_to(kept_stub)  # the path holds another file now
    young = records / f"{info.st_dev}-{info.st_ino + 3}"
    young.symlink_to(tmp_path / "elsewhere" / ".envrc")
    not_token = records / "notes"
    not_token.symlink_to(tmp_path / "missing")
    weeks_ago = time.time() - 15 * 24 * 3600
    for token in (kept, gone, another, not_token):
        os.utime(token, (weeks_ago, weeks_ago), follow_symlinks=False)
    os.utime(records / _stub_records.PRUNED, (weeks_ago, weeks_ago))  # the last, long ago
    _stub_records.forget_records()
    assert _stub_records.records() == str(records)
    left = sorted(p.name for p in records.iterdir() if p.name not in (".lock", ".pruned"))
    assert left == sorted([kept.name, young.name, not_token.name])
    # Pruned a moment ago: the next process to find the records does not look again.
    (stale_again := records / f"{info.st_dev}-{info.st_ino + 4}").symlink_to(tmp_path / "gone")
    os.utime(stale_again, (weeks_ago, weeks_ago), follow_symlinks=False)
    _stub_records.forget_records()
    _stub_records.records()
    assert stale_again.is_symlink()


def test_a_lock_table_too_long_to_read_keeps_the_stub(tmp_path: Path) -> None:
    """Whether only this launcher holds a stub is read from /proc/locks, which lists every
    lock on the host: a session can take 100,000 POSIX locks in half a second, and each read of
    the table then took seconds (under the records lock, which every launch of the account
    waits on; once per stub). Past LOCKS_READ_LIMIT bytes the table is not read through, and
    the stub is taken as held (kept); a short table naming this launcher alone lets it go."""
    from nsconfine._launch import sources

    stub = tmp_path / "stub"
    stub.touch()
    info = os.stat(stub)
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    ours = f"1: FLOCK  ADVISORY  READ  {os.getpid()} {inode} 0 EOF\n"
    other = "2: POSIX  ADVISORY  WRITE 1 00:01:1 0 0\n"
    short, long = tmp_path / "short", tmp_path / "long"
    short.write_text(other + ours)
    long.write_text(other * (sources.LOCKS_READ_LIMIT // len(other) + 1) + ours)
    assert sources.locked_by_this_launcher_alone(info, str(short))
    assert not sources.locked_by_this_launcher_alone(info, str(long))


def test_a_directory_renamed_over_a_stub_as_it_is_made_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory stub is made empty: one holding anything when it is opened was renamed
    over it (a session racing a launch, which a root launcher's chown would then give it,
    another tenant's root-owned directory and what it holds). Refused, and left as it is.
    Found by an attacker's pass (the race widened with strace's delay injection; here, the
    rename is made between the mkdir and the open)."""
    parent = tmp_path / "ws"
    parent.mkdir()
    other = parent / "other"
    other.mkdir()
    (other / "held").write_text("another's\n")
    before = other.stat()
    real_mkdir = os.mkdir

    def mkdir_then_swap(name: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(name, mode, dir_fd=dir_fd)
        os.rename("other", name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(nsconfine.PlanError, match="replaced while it was made"):
            _sources._make_directory(parent_fd, ".stub", (before.st_uid + 1, before.st_gid + 1))
    finally:
        os.close(parent_fd)
    swapped = (parent / ".stub").stat()
    assert (swapped.st_ino, swapped.st_uid, swapped.st_gid) == (
        before.st_ino, before.st_uid, before.st_gid
    )  # fmt: skip
    assert (parent / ".stub" / "held").read_text() == "another's\n"


def test_a_bundles_record_that_is_no_directory_stops_no_stub_s_removal(
    own_cache: Path, ws_run: tuple[Path, Path]
) -> None:
    """The records' `bundles` (the OCI bundles' companions) made a file: a session's stubs are
    still removed at its end. They were all left, each launch's, with no word (found by an
    attacker's pass on a broken launcher environment)."""
    records = Path(_stub_records.records())
    (records / _stub_records.BUNDLES).write_text("")
    workspace = ws_run[0]
    before = sorted(os.listdir(workspace))
    assert nsconfine.spawn(session(*ws_run).plan(), ["/bin/true"]).wait() == 0
    assert sorted(os.listdir(workspace)) == before


@pytest.mark.parametrize("planted", ["a directory", "a dangling symlink", "a FIFO"])
def test_a_records_lock_that_is_no_file_is_refused_saying_what_to_remove(
    own_cache: Path, tmp_path: Path, planted: str
) -> None:
    """The records' `.lock` made something else than a file refuses each launch with a
    message that names it and says to remove it (it said "launch again", which never helps),
    and never makes a file where a symlink there leads (found by an attacker's pass on a
    broken launcher environment)."""
    lock = Path(_stub_records.records()) / ".lock"
    with contextlib.suppress(FileNotFoundError):
        lock.unlink()
    target = tmp_path / "led-to"
    if planted == "a directory":
        lock.mkdir()
    elif planted == "a dangling symlink":
        lock.symlink_to(target)
    else:
        os.mkfifo(lock)
    locking = _stub_records.records_locked()
    with pytest.raises(nsconfine.SandboxUnavailable, match="remove it") as refused:
        locking.__enter__()
    assert str(lock) in refused.value.message
    assert not target.exists()


def test_records_made_under_a_umask_that_denies_all_are_the_account_s_to_use(
    own_cache: Path,
) -> None:
    """Under umask 777 the directories nsconfine makes for its records are 0700 all the
    same: they were made mode 000, the account's whole cache unusable after (found by an
    attacker's pass on a broken launcher environment)."""
    old = os.umask(0o777)
    try:
        records = _stub_records.records()
    finally:
        os.umask(old)
    for path in (records, os.path.dirname(records)):
        assert os.stat(path).st_mode & 0o777 == 0o700, path


def test_a_full_cache_is_named_where_a_token_could_not_be_made(
    own_cache: Path, ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch refused because a stub's token could not be made (a full cache) names the
    records, where the space is missing: it named the token's target, a workspace file, as
    symlink()'s error gives it first (found by an attacker's pass on a broken launcher
    environment)."""
    plan = session(*ws_run).plan()
    records = _stub_records.records()

    def full(target: str, path: str) -> None:  # as the kernel's refusal comes
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), target, None, path)

    monkeypatch.setattr(os, "symlink", full)
    with pytest.raises(nsconfine.SandboxUnavailable, match="No space left") as refused:
        nsconfine.spawn(plan, ["/bin/true"])
    monkeypatch.undo()
    assert records in refused.value.message, refused.value.message


def test_a_child_forked_while_the_records_are_locked_does_not_hold_their_lock() -> None:
    """flock's lock belongs to the open file, which a fork shares: a child forked while a
    launch held the records' lock (a multiprocessing worker, started as a session began or
    ended) kept it as long as it lived, and every launch of the account waited that long
    (attacker's pass, stop 39: `nsconfine run -- true` took 19-29 s). The parent's release
    frees it."""
    import fcntl

    started, ready = os.pipe()
    with _stub_records.records_locked() as directory:
        child = os.fork()
        if child == 0:
            os.write(ready, b"x")  # past fork's hooks in the child
            time.sleep(30)
            os._exit(0)
    os.close(ready)
    try:
        assert os.read(started, 1) == b"x"
        os.close(started)
        fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while held
        finally:
            os.close(fd)
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


@pytest.mark.root
def test_a_canary_world_a_killed_root_launcher_left_is_removed_by_the_next() -> None:
    """A root launcher killed while it proved bwrap left its canary's world in /tmp for good:
    it had given the world to the canary account, and the next launcher removes only what
    its own account made (attackers' pass, stop 43). The world stays root's."""
    from nsconfine._kernel.accounts import scratch_directory

    killed = subprocess.Popen(
        [sys.executable, "-c", "import time; from nsconfine._kernel.accounts import "
         "scratch_directory as s; from nsconfine._preflight.checks import canary_account, "
         "canary_plan; w = s('nsconfine-canary-'); canary_plan(w, canary_account(), 'x'); "
         "print(w, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd="/",
    )  # fmt: skip
    assert killed.stdout is not None
    left = killed.stdout.readline().strip()
    killed.kill()
    killed.communicate()
    made = scratch_directory("nsconfine-canary-")
    try:
        assert not os.path.lexists(left), "the killed launcher's canary world is left"
    finally:
        for directory in (left, made):
            shutil.rmtree(directory, ignore_errors=True)
