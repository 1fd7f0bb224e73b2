"""--mask: a path inside what a session sees (a workspace's .env with secrets) shows as an
empty read-only file or directory, with its reason in the manifest; the host's file is
untouched and never visible, and no other bind may show it (by another name, a hardlink, a
bind-mount view).

Each check has its twin: the same plan without its mask entry shows the secret (launched past
the gate, whose lint refuses exactly that plan).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    cli,
    give_to_session_user,
    open_up,
    session,
    session_options,
    sh,
    unchecked_launcher,
)

import nsconfine
from nsconfine._policy.lint import check_plan
from nsconfine._selftest.report import run_script

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]

SECRET = "API_TOKEN=sk-masked-0f3c\n"


def _secret_file(ws_run: tuple[Path, Path], name: str = ".env") -> Path:
    path = ws_run[0] / name
    path.write_text(SECRET)
    give_to_session_user(path)
    return path


def _masked(ws_run: tuple[Path, Path], *masked: Path, **options: Any) -> nsconfine.Plan:
    return session(*ws_run, mask=[str(path) for path in masked], **options).plan()


def _without(plan: nsconfine.Plan, dest: str) -> nsconfine.Plan:
    """plan less every entry at dest (the mask's file, or its tmpfs and remount)."""
    return plan.replace(entries=tuple(e for e in plan.entries if e.dest != dest))


# ------------------------------------------------------------------ what the session sees


def test_a_masked_file_is_empty_and_read_only(ws_run: tuple[Path, Path]) -> None:
    """The session reads nothing at a masked .env and cannot write it; the workspace around it
    is as before, and the host's file is unchanged."""
    secret = _secret_file(ws_run)
    (ws_run[0] / "notes.md").write_text("notes\n")
    give_to_session_user(ws_run[0] / "notes.md")
    plan = _masked(ws_run, secret)
    status, output = sh(
        plan, "cat .env; echo read; (echo forged > .env) 2>/dev/null || echo refused; cat notes.md"
    )
    assert (status, output) == (0, "read\nrefused\nnotes\n")
    assert secret.read_text() == SECRET


def test_a_pool_masks_a_file_the_host_replaced_after_staging(ws_run: tuple[Path, Path]) -> None:
    """The host rewrites a masked .env by rename (`sed -i`, an editor) while a sandbox waits
    staged: the launch still shows it empty and read-only (attackers' pass: the kernel had
    detached the staged mask, and the session read the new secret)."""
    secret = _secret_file(ws_run)
    with nsconfine.Pool(_masked(ws_run, secret), size=1, refill="inline") as pool:
        assert pool.wait_staged(60)
        replacement = secret.with_name(".env.new")
        replacement.write_text("API_TOKEN=sk-rotated-by-the-host\n")
        give_to_session_user(replacement)
        replacement.rename(secret)
        launched = pool.launch(["/bin/sh", "-c", "cat .env; echo read"], stdout=subprocess.PIPE)
        output = launched.communicate()[0]
    assert output == b"read\n"


def test_without_its_mask_entry_the_file_shows(ws_run: tuple[Path, Path]) -> None:
    """The twin: the same plan without the mask's entry (past the gate) shows the secret."""
    secret = _secret_file(ws_run)
    weakened = _without(_masked(ws_run, secret), str(secret))
    outcome = run_script(weakened, "cat .env", unchecked_launcher)
    assert outcome.stdout == SECRET, outcome


def test_a_masked_directory_is_empty_and_read_only(ws_run: tuple[Path, Path]) -> None:
    """A masked directory shows empty, nothing can be made in it, and the host's keeps its
    files; its twin, without the mask, lists them."""
    secrets = ws_run[0] / "secrets"
    secrets.mkdir()
    (secrets / "key").write_text(SECRET)
    give_to_session_user(secrets)
    plan = _masked(ws_run, secrets)
    script = "ls -A secrets; echo listed; (: > secrets/new) 2>/dev/null || echo refused"
    assert sh(plan, script) == (0, "listed\nrefused\n")
    assert sorted(os.listdir(secrets)) == ["key"]
    outcome = run_script(_without(plan, str(secrets)), script, unchecked_launcher)
    assert outcome.stdout.startswith("key\nlisted\n"), outcome


def test_the_manifest_gives_each_mask_its_reason(ws_run: tuple[Path, Path]) -> None:
    """The mask is an entry of the plan with its reason, and a rule no other bind may break,
    in the text and JSON manifests."""
    secret = _secret_file(ws_run)
    plan = _masked(ws_run, secret)
    entry = next(e for e in plan.entries if e.dest == str(secret))
    assert entry.kind == "data"
    assert entry.content == b""
    assert "mask" in entry.reason
    rule = next(r for r in plan.to_json()["deny"] if r["path"] == str(secret))
    assert rule["mask"] is True
    assert "masked" in plan.manifest()


def test_a_masked_path_missing_on_the_host_is_an_empty_file_it_cannot_make(
    ws_run: tuple[Path, Path],
) -> None:
    """A masked path that is missing is an empty read-only file in the session (it cannot
    create it), and what the host writes there during the session stays unseen; afterwards the
    host's file is as the host left it."""
    secret = ws_run[0] / ".env"
    plan = _masked(ws_run, secret)
    go = ws_run[1] / "go"  # the session reads once the host has written
    script = (
        "(echo forged > .env) 2>/dev/null || echo refused; "
        f"while [ ! -e {go} ]; do sleep 0.05; done; cat .env; echo read"
    )
    read_end, write_end = os.pipe()
    sandbox = nsconfine.spawn(plan, ["/bin/sh", "-c", script], stdout=write_end)
    os.close(write_end)
    try:
        try:
            assert os.read(read_end, 100) == b"refused\n"
            assert secret.exists()  # the empty file the launch made to mount over
            secret.write_text(SECRET)  # the host's, written while the session runs
        finally:
            go.touch()
        assert sandbox.wait(60) == 0
        assert os.read(read_end, 100) == b"read\n"
    finally:
        os.close(read_end)
    assert secret.read_text() == SECRET


def test_a_missing_masked_path_leaves_nothing_behind(ws_run: tuple[Path, Path]) -> None:
    """The empty file made for a missing masked path is removed once the session ends."""
    secret = ws_run[0] / ".env"
    assert sh(_masked(ws_run, secret), "test -e .env && echo there") == (0, "there\n")
    assert not secret.exists()


def test_another_bind_of_the_workspace_is_masked_too(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A profile bind that shows the (read-only) workspace at another place too shows the mask
    there as well; without that cover, the lint refuses the plan."""
    secret = _secret_file(ws_run)
    view = nsconfine.Bind(str(ws_run[0]), "/view", "ro", "the workspace, again")
    plan = _masked(ws_run, secret, binds=[view], workspace_mode="ro")
    assert sh(plan, "cat /view/.env .env; echo read") == (0, "read\n")
    with pytest.raises(nsconfine.PlanError, match=r"/view/\.env"):
        check_plan(_without(plan, "/view/.env"))


def test_a_masked_file_in_a_read_only_directory_is_empty(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A mask inside a read-only bind (a directory the runner loads) covers it there."""
    runner = tmp_path / "runner"
    runner.mkdir()
    (runner / "config.py").write_text("TOKEN = 'sk-runner'\n")
    open_up(runner)
    os.chmod(runner, 0o755)
    plan = _masked(ws_run, runner / "config.py", ro=[str(runner)])
    assert sh(plan, f"cat {runner}/config.py; echo read") == (0, "read\n")


# ------------------------------------------------------------------ what the lint refuses


def test_the_lint_refuses_a_bind_that_shows_a_masked_path_uncovered(
    ws_run: tuple[Path, Path],
) -> None:
    """The workspace passes only because the mask covers the masked path where it shows it:
    the same plan without the mask's entry is refused, naming the path."""
    secret = _secret_file(ws_run)
    plan = _masked(ws_run, secret)
    check_plan(plan)
    with pytest.raises(nsconfine.PlanError, match=r"\.env"):
        check_plan(_without(plan, str(secret)))


def test_a_masked_path_bound_again_is_refused(ws_run: tuple[Path, Path]) -> None:
    """No other bind may show a masked path: the file itself given to --ro is refused."""
    secret = _secret_file(ws_run)
    with pytest.raises(nsconfine.PlanError, match="mask"):
        _masked(ws_run, secret, ro=[str(secret)])


def test_a_bind_inside_a_masked_directory_is_refused(ws_run: tuple[Path, Path]) -> None:
    """Nor a bind of what lies inside a masked directory."""
    secrets = ws_run[0] / "secrets"
    secrets.mkdir()
    (secrets / "key").write_text(SECRET)
    give_to_session_user(secrets)
    with pytest.raises(nsconfine.PlanError, match="mask"):
        _masked(ws_run, secrets, ro=[str(secrets / "key")])


def test_a_hardlinked_masked_file_is_refused(ws_run: tuple[Path, Path]) -> None:
    """A masked file with another name (a hardlink) is refused: that name would show it."""
    secret = _secret_file(ws_run)
    os.link(secret, ws_run[0] / "innocent.txt")
    with pytest.raises(nsconfine.PlanError, match="hardlink"):
        _masked(ws_run, secret)


def test_a_hardlink_inside_a_masked_directory_is_refused(ws_run: tuple[Path, Path]) -> None:
    """So is a masked directory that holds a file with another name outside it."""
    secrets = ws_run[0] / "secrets"
    secrets.mkdir()
    (secrets / "key").write_text(SECRET)
    os.link(secrets / "key", ws_run[0] / "innocent.txt")
    give_to_session_user(secrets)
    with pytest.raises(nsconfine.PlanError, match="hardlink"):
        _masked(ws_run, secrets)


def test_a_masked_symlink_is_refused(ws_run: tuple[Path, Path]) -> None:
    """A masked path that is a symlink is refused (mask what it points to)."""
    real = _secret_file(ws_run, "real.env")
    (ws_run[0] / ".env").symlink_to(real)
    with pytest.raises(nsconfine.PlanError, match="symlink"):
        _masked(ws_run, ws_run[0] / ".env")


def test_a_missing_masked_path_in_a_read_only_bind_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """Where no empty file can be put in its place (a read-only bind), a missing masked path
    is refused: the host could make it there during the session, and the session would see
    it."""
    runner = tmp_path / "runner"
    runner.mkdir()
    os.chmod(runner, 0o755)
    open_up(runner)
    with pytest.raises(nsconfine.PlanError, match="does not exist"):
        _masked(ws_run, runner / "later.env", ro=[str(runner)])


def test_a_mask_outside_every_bind_needs_nothing(ws_run: tuple[Path, Path], tmp_path: Path) -> None:
    """A masked path no bind shows adds no entry: the session does not see it anyway."""
    elsewhere = tmp_path / "elsewhere.env"
    plan = _masked(ws_run, elsewhere)
    assert all(entry.dest != str(elsewhere) for entry in plan.entries)


# ------------------------------------------------------------------ the CLI and profiles


def test_the_cli_masks_a_path(ws_run: tuple[Path, Path]) -> None:
    """`--mask PATH` (repeatable) on plan and run."""
    secret = _secret_file(ws_run)
    options = [*session_options(*ws_run), "--mask", str(secret)]
    shown = cli("plan", "--json", *options)
    assert shown.returncode == 0, shown.stderr
    assert any(r["path"] == str(secret) and r["mask"] for r in json.loads(shown.stdout)["deny"])
    ran = cli("run", *options, "--", "cat", str(secret))
    assert (ran.returncode, ran.stdout) == (0, ""), ran.stderr


def test_a_profile_masks_a_path(ws_run: tuple[Path, Path], tmp_path: Path) -> None:
    """A profile's `mask` key, with {workspace} filled in; a relative path there is refused."""
    secret = _secret_file(ws_run)
    profile = tmp_path / "masking.toml"
    profile.write_text('description = "masks"\nmask = ["{workspace}/.env"]\n')
    plan = session(*ws_run, profile=[str(profile)]).plan()
    assert any(e.dest == str(secret) and e.kind == "data" for e in plan.entries)
    profile.write_text('description = "masks"\nmask = [".env"]\n')
    with pytest.raises(nsconfine.UsageError, match="mask"):
        session(*ws_run, profile=[str(profile)]).plan()


_MASKED_VIEW = r"""
import os, subprocess, sys
from nsconfine._plan import model as p
from nsconfine._policy import lint as _lint
from nsconfine._errors import PlanError
from nsconfine._plan.mask import mask_rules
workspace, view, covered = sys.argv[1], sys.argv[2], sys.argv[3] == "covered"
subprocess.run(["mount", "--bind", workspace, view], check=True)
secret = os.path.join(workspace, ".env")
entries = [p.ro_bind(workspace, workspace, "the workspace"), p.ro_bind(view, "/view", "a view"),
           p.data(b"", secret, "masked")]
if covered:
    entries.append(p.data(b"", "/view/.env", "masked"))
try:
    _lint.check_plan(p.Plan(entries, deny=mask_rules([secret])))
    print("allowed")
except PlanError as refused:
    print("refused", refused.message)
"""


@pytest.mark.parametrize("covered", [False, True])
def test_a_bind_mount_view_of_the_workspace_needs_the_mask_too(
    ws_run: tuple[Path, Path], tmp_path: Path, covered: bool
) -> None:
    """A host bind-mount view of the workspace shows the masked path under another name: the
    lint finds it by place and refuses the plan unless a cover is there too (the twin: with
    one, it passes). Checked in a private mount namespace, as root or in a user namespace."""
    import subprocess
    import sys

    from helpers import IS_ROOT

    _secret_file(ws_run)
    view = tmp_path / "view"
    view.mkdir()
    unshare = ["unshare", "-m"] if IS_ROOT else ["unshare", "-Urm"]
    result = subprocess.run(
        [*unshare, sys.executable, "-c", _MASKED_VIEW, str(ws_run[0]), str(view),
         "covered" if covered else "bare"],
        capture_output=True, text=True, cwd="/", timeout=60, check=False,
    )  # fmt: skip
    if covered:
        assert result.stdout.startswith("allowed"), result.stdout + result.stderr
    else:
        assert result.stdout.startswith("refused"), result.stdout + result.stderr
        assert "/view/.env" in result.stdout
