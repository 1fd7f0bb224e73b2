"""The launcher's own environment (TMPDIR, HOME, XDG_CACHE_HOME) is an input like any other:
`nsconfine check` proves bwrap in a world of its own whatever its layout (issue 10: a TMPDIR
under ~/.config made `check` fail with plan-refused when the canary came from the session
layer), and a cache directory it cannot write does not stop a launch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import IS_ROOT, session_dirs, user_options

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


def check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nsconfine", "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


@pytest.mark.parametrize(
    "layout",
    ["tmpdir-under-config", "tmpdir-missing", "cache-unwritable", "home-missing"],
)
def test_check_proves_bwrap_whatever_the_callers_layout(tmp_path: Path, layout: str) -> None:
    home = tmp_path / "home"
    (home / ".config" / "tmp").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # a fresh proof, not a remembered one
    if layout == "tmpdir-under-config":
        env["TMPDIR"] = str(home / ".config" / "tmp")
    elif layout == "tmpdir-missing":
        env["TMPDIR"] = str(tmp_path / "no-such-dir")
    elif layout == "cache-unwritable":
        env["XDG_CACHE_HOME"] = "/proc/nsconfine-no-such-cache"
    else:
        env["HOME"] = str(tmp_path / "no-such-home")
    done = check(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "canary: a canary session" in done.stdout
    assert "Traceback" not in done.stderr


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


# ------------------------------------------ the records directories (an attacker's pass)


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


def test_a_planted_symlink_among_the_bwrap_proofs_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proof's file replaced by a symlink to another file: the launcher that remembers the
    proof does not write through it (a root launcher would overwrite any file)."""
    from nsconfine._preflight import checks as _checks

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    proofs = Path(_checks._cache_dir())
    proofs.mkdir(parents=True, mode=0o700)
    (proofs / "some-identity").symlink_to(victim)
    _checks._remember("some-identity", frozenset({"--bind-fd"}))
    assert victim.read_text() == "precious\n"
    assert _checks._recalled("some-identity") is None
