"""The preflight's canary stands alone: whatever the caller's TMPDIR, HOME and cache layout,
`nsconfine check` proves bwrap in a world of its own (issue 10: a TMPDIR under ~/.config
made `check` fail with plan-refused when the canary came from the session layer)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
