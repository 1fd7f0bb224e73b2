"""Shared fixtures: whether this host can confine, the must-work switch for CI, and what most
tests launch sessions in (each fixture defined here once, for every module).

With NSCONFINE_MUST_WORK=1 (set in CI) a confinement test that would skip fails instead: a
skipped proof is no proof.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import (
    MUST_WORK,
    SESSION_USER,
    give_to_session_user,
    open_up,
    running_world,
    session,
    session_dirs,
)

import nsconfine
from nsconfine._kernel import layers as _layers
from nsconfine._kernel.accounts import run_as
from nsconfine._selftest.world import World

# Proofs of bwrap binaries are cached on disk; the suite proves them afresh in its own cache.
TEST_CACHE = tempfile.mkdtemp(prefix="nsconfine-test-cache-")
os.environ["XDG_CACHE_HOME"] = TEST_CACHE


def pytest_unconfigure() -> None:
    shutil.rmtree(TEST_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `root` skip unless the suite runs as root; those marked `unprivileged`
    skip when it does."""
    wrong, reason = (
        ("unprivileged", "needs an unprivileged launcher (the suite runs as root)")
        if os.geteuid() == 0
        else ("root", "needs a root launcher (the suite runs unprivileged)")
    )
    for item in items:
        if item.get_closest_marker(wrong) is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    must_work = item.get_closest_marker("confinement") is not None
    wrong = "root" if os.geteuid() != 0 else "unprivileged"
    if item.get_closest_marker(wrong) is not None:
        must_work = False  # skipped by design here; CI runs the suite as root and as a user
    if MUST_WORK and report.skipped and must_work:
        report.outcome = "failed"
        report.longrepr = f"confinement test skipped with NSCONFINE_MUST_WORK=1: {report.longrepr}"


@pytest.fixture(scope="session")
def sandbox_ready() -> None:
    """Skip (or, with NSCONFINE_MUST_WORK=1, fail) unless this host can confine a session."""
    import nsconfine

    report = nsconfine.preflight()
    if not report.ready:
        message = f"this host cannot confine: {report.error}"
        if MUST_WORK:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def ws_run(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace and a run directory that the session's account owns and can reach."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    return workspace, run_dir


@pytest.fixture
def plan(ws_run: tuple[Path, Path]) -> nsconfine.Plan:
    """A default session's plan on ws_run (as the session's account when root)."""
    return session(*ws_run).plan()


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Switch kernel layers off for one test (nsconfine._kernel.layers' test-only door, for the
    mutation twins and the forced fallbacks)."""

    def switch_off(*names: str) -> None:
        monkeypatch.setattr(_layers, "DISABLED_FOR_TESTS", frozenset(names))

    return switch_off


@pytest.fixture(params=["openat2", "forced-walk"])
def open_walk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How a path is opened with no symlink followed (open_no_symlinks: bind sources, runner
    files' directories): openat2's RESOLVE_NO_SYMLINKS, or, forced, the fallback walk of one
    O_NOFOLLOW openat per component that runs where openat2 is refused (a kernel before 5.6,
    a seccomp filter answering EPERM). Mutation pass, stop 35: no test forced the walk. (The
    swap tests it reruns swap a directory on the way, which the walk refuses with ENOTDIR even
    without its S_ISLNK check; test_native's symlink test is the one that fails then.)"""
    from nsconfine._kernel import syscalls as _syscalls

    monkeypatch.setattr(_syscalls, "FORCE_WALK", request.param == "forced-walk")
    return str(request.param)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """A stand-in host (selftest's world: a home with secrets, a data root, a checkout, another
    session) with its tool socket served and its secret fd leaked; owned by the session's
    account when the launcher is root."""
    open_up(tmp_path)
    with running_world(str(tmp_path), run_as(SESSION_USER)) as running:
        yield running


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace that is a git repository with a commit, and a bare remote beside it, and a
    nested repository inside it; owned by the session's account."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    environ = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path)}

    def git(where: Path, *args: str) -> None:
        subprocess.run(["git", "-c", "safe.directory=*", "-C", str(where), *args], check=True,
                       capture_output=True, env=environ)  # fmt: skip

    git(workspace, "init", "-q", "-b", "main")
    (workspace / "README").write_text("hello\n")
    (workspace / ".envrc").write_text("export SAFE=1\n")
    git(workspace, "add", "README", ".envrc")
    git(workspace, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    (nested := workspace / "vendor" / "lib").mkdir(parents=True)
    git(nested, "init", "-q")
    git(workspace, "init", "-q", "--bare", str(workspace / "remote.git"))
    give_to_session_user(workspace)
    return workspace, run_dir


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    """Where the refused command would leave its trace."""
    return tmp_path / "ws" / "command-ran"


@pytest.fixture
def standin_home(tmp_path: Path) -> Path:
    """A stand-in home (as a test harness or a systemd unit's $HOME would be) with a few real
    secrets in it (an SSH key, Claude's credentials, an app's secrets) and a file that is
    none, resolved."""
    home = tmp_path / "home" / "alice"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (home / ".claude").mkdir()
    (home / ".claude" / ".credentials.json").write_text('{"token": "x"}\n')
    (home / ".config" / "app").mkdir(parents=True)
    (home / ".config" / "app" / "secrets").write_text("token=1\n")
    (home / "notes.txt").write_text("nothing secret\n")
    return home.resolve()
