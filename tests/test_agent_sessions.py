"""What a real agent needs inside a session, each shown working in real sessions: the
terminal's and locale's variables, literal values, a fresh or persistent HOME, a git identity,
harness packages installed by npm, and `explain`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import cli, give_to_session_user, open_up, run, session, session_options, sh

import nsconfine
from nsconfine._plan.model import Kind

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


# ------------------------------------------------------------------ the environment


def test_the_session_s_environment_is_the_manifest_s(ws_run: tuple[Path, Path]) -> None:
    """Every variable the command gets is one the plan lists, with its value: the manifest's
    environment is the whole of it. PWD, which bwrap sets to the directory the command starts
    in, was the one the plan left out (attacker's pass, stop 33)."""
    plan = session(*ws_run).plan()
    status, output = sh(plan, "env -0")
    assert status == 0, output
    got = dict(item.split("=", 1) for item in output.split("\0") if item)
    assert got == {variable.name: variable.value for variable in plan.env}


def test_terminal_and_locale_variables_pass_by_default(
    ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TERM, COLORTERM, LANG, LC_* and TZ pass without being named, shown in the manifest."""
    for name, value in {"TERM": "xterm-256color", "COLORTERM": "truecolor", "LANG": "C.UTF-8",
                        "LC_TIME": "C", "TZ": "UTC"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    plan = session(*ws_run).plan()
    _status, output = sh(plan, "echo $TERM $COLORTERM $LANG $LC_TIME $TZ")
    assert output.strip() == "xterm-256color truecolor C.UTF-8 C UTC", output
    assert "TERM=xterm-256color" in plan.manifest()  # not secret: shown


def test_only_the_locale_categories_pass_not_any_lc_name(
    ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LC_ALL and the locale's categories pass; another name that starts with LC_ is any
    variable (ssh's AcceptEnv LC_* carries such names, a token among them), and does not."""
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("LC_MESSAGES", "C")
    monkeypatch.setenv("LC_SECRET_TOKEN", "ghp_not_for_the_session")
    plan = session(*ws_run).plan()
    _status, output = sh(plan, "echo $LC_ALL $LC_MESSAGES [$LC_SECRET_TOKEN]")
    assert output.strip() == "C.UTF-8 C []", output
    assert "ghp_not_for_the_session" not in plan.manifest()


def test_terminal_variables_can_be_left_out(
    ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """terminal_env=False leaves them out."""
    monkeypatch.setenv("TERM", "xterm-256color")
    plan = session(*ws_run, terminal_env=False).plan()
    assert sh(plan, "echo [$TERM]")[1].strip() == "[]"


def test_setenv_sets_literal_values(ws_run: tuple[Path, Path]) -> None:
    """--setenv NAME=VALUE (setenv= in the API) sets a literal value, shown in the manifest."""
    plan = session(*ws_run, setenv={"NPM_CONFIG_UPDATE_NOTIFIER": "false"}).plan()
    assert sh(plan, "echo $NPM_CONFIG_UPDATE_NOTIFIER")[1].strip() == "false"
    assert "NPM_CONFIG_UPDATE_NOTIFIER=false" in plan.manifest()
    result = cli("plan", *session_options(*ws_run), "--setenv", "A=b c")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "A=b c" in result.stdout


@pytest.mark.parametrize("bad", ["NOEQUALS", "=x", "HOME=/x", "1A=x"])
def test_a_bad_setenv_is_refused(ws_run: tuple[Path, Path], bad: str) -> None:
    """A malformed --setenv, or one that sets HOME, is a usage error naming it."""
    result = cli("plan", *session_options(*ws_run), "--setenv", bad)  # fmt: skip
    assert result.returncode == 64, result.stdout
    assert "setenv" in result.stderr
    assert "Traceback" not in result.stderr


# ------------------------------------------------------------------ HOME


def test_home_persists_by_default(ws_run: tuple[Path, Path]) -> None:
    """home_mode="persist": what one launch leaves in HOME, the next one finds."""
    plan = session(*ws_run).plan()
    sh(plan, "echo kept > $HOME/note")
    assert sh(plan, "cat $HOME/note")[1].strip() == "kept"


def test_a_fresh_home_is_empty_every_launch(ws_run: tuple[Path, Path]) -> None:
    """home_mode="fresh": each launch gets an empty HOME, and nothing of it reaches the run dir."""
    plan = session(*ws_run, home_mode="fresh").plan()
    _status, output = sh(plan, "echo gone > $HOME/note; ls -A $HOME")
    assert output.strip() == "note", output
    assert sh(plan, "ls -A $HOME")[1].strip() == ""
    assert not (ws_run[1] / "home" / "note").exists()


# ------------------------------------------------------------------ git identity


def test_a_git_identity_lets_a_fresh_session_commit(ws_run: tuple[Path, Path]) -> None:
    """--git-identity gives commits an author and committer through a generated, read-only
    HOME .gitconfig listed in the manifest."""
    plan = session(*ws_run, git_identity="Coder Bot <coder@example.org>").plan()
    _status, output = sh(
        plan,
        f"cd {ws_run[0]} && git init -q r && cd r && git commit -q --allow-empty -m one && "
        "git log --format='%an <%ae> / %cn' && (echo x >> $HOME/.gitconfig) 2>&1",
    )
    assert "Coder Bot <coder@example.org> / Coder Bot" in output, output
    assert "Read-only" in output or "Permission denied" in output, output
    gitconfig = next(e for e in plan.entries if e.dest.endswith("/.gitconfig"))
    assert gitconfig.kind is Kind.DATA
    assert b"coder@example.org" in (gitconfig.content or b"")


@pytest.mark.root  # only root can make a repository another account owns
def test_a_repository_of_another_owner_is_usable(ws_run: tuple[Path, Path], tmp_path: Path) -> None:
    """A repository bound read-only from another owner is usable (safe.directory)."""
    repo = tmp_path / "theirs"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "--allow-empty", "-m", "theirs"], check=True)  # fmt: skip
    open_up(repo)
    for root, dirs, files in os.walk(repo):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    plan = session(*ws_run, ro=[repo], git_identity="A <a@a>").plan()
    _status, output = sh(plan, f"git -C {repo} log --format=%s")
    assert output.strip() == "theirs", output


def test_a_bad_git_identity_is_refused(ws_run: tuple[Path, Path]) -> None:
    """An identity without a name and an address in angle brackets is a usage error."""
    with pytest.raises(nsconfine.UsageError, match="git identity"):
        session(*ws_run, git_identity="no address").plan()


# ------------------------------------------------------------------ harness packages


@pytest.fixture
def npm_package(tmp_path: Path) -> Path:
    """An npm-style install: node_modules/.bin/tool -> ../tool/bin/tool.js, whose package needs
    an optional dependency in a package of its own (as Codex's does)."""
    modules = tmp_path / "prefix" / "node_modules"
    (modules / "tool" / "bin").mkdir(parents=True)
    (modules / "tool-native").mkdir()
    (modules / "tool" / "package.json").write_text(
        json.dumps(
            {"name": "tool", "version": "1.0.0", "optionalDependencies": {"tool-native": "1.0.0"}}
        )
    )
    (modules / "tool-native" / "package.json").write_text(
        json.dumps({"name": "tool-native", "version": "1.0.0"})
    )
    (modules / "tool-native" / "native.txt").write_text("native part\n")
    entry = modules / "tool" / "bin" / "tool.js"
    # (a shell script, not node's: the README's set-up installs no node; what is looked at is
    # whether the dependency is bound beside the package, as node would look it up)
    entry.write_text(
        '#!/bin/sh\nhere=$(dirname "$(readlink -f "$0")")\n'
        'cat "$here/../../tool-native/native.txt"\n'
    )
    entry.chmod(0o755)
    (modules / ".bin").mkdir()
    (modules / ".bin" / "tool").symlink_to("../tool/bin/tool.js")
    (modules / "other-package").mkdir()
    (modules / "other-package" / "secret.txt").write_text("not the harness's\n")
    open_up(modules)
    for root, dirs, _files in os.walk(modules):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    return modules / ".bin" / "tool"


def test_a_harness_symlink_binds_its_package(ws_run: tuple[Path, Path], npm_package: Path) -> None:
    """A --harness that is npm's .bin link binds the package it resolves into and the packages
    it depends on, read-only, and recreates the link: the tool runs by its name."""
    plan = session(*ws_run, harness=[npm_package]).plan()
    _status, output = sh(plan, "tool")
    assert "native part" in output, output
    link = next(e for e in plan.entries if e.dest == str(npm_package))
    assert link.kind is Kind.SYMLINK
    assert link.source == "../tool/bin/tool.js"
    _status, output = sh(plan, f"cat {npm_package.parent.parent}/other-package/secret.txt")
    assert "not the harness's" not in output


def test_a_pin_covers_the_resolved_entry_file(ws_run: tuple[Path, Path], npm_package: Path) -> None:
    """A digest given with a symlinked harness pins the file the link resolves to."""
    import hashlib

    target = npm_package.resolve()
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    plan = session(*ws_run, harness=[f"{npm_package}@sha256:{digest}"]).plan()
    assert sh(plan, "tool")[0] == 0
    target.write_text(target.read_text() + "// changed\n")
    with pytest.raises(nsconfine.NsconfineError, match=r"sha256|digest|pin"):
        nsconfine.spawn(plan, ["tool"]).wait()


def test_a_harness_package_the_session_writes_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A --harness link (outside, as `npm link` leaves it) that leads into the workspace: what
    that package's package.json names, and where its node_modules links lead, are the
    session's to choose between launches; a dependency linked to another project (any
    directory with a package.json) got that project bound into the next session."""
    workspace, _run_dir = ws_run
    package = workspace / "agent"
    (package / "bin").mkdir(parents=True)
    (package / "package.json").write_text(
        json.dumps({"name": "agent", "dependencies": {"helper": "1"}})
    )
    entry = package / "bin" / "agent"
    entry.write_text("#!/bin/sh\necho agent\n")
    entry.chmod(0o755)
    other = tmp_path / "other-project"  # no home, no denied place: only never given
    other.mkdir()
    (other / "package.json").write_text(json.dumps({"name": "other"}))
    (other / "notes.txt").write_text("another project's\n")
    (package / "node_modules").mkdir()
    (package / "node_modules" / "helper").symlink_to(other)  # as the session leaves it
    link = tmp_path / "agents" / "node_modules" / ".bin" / "agent"
    link.parent.mkdir(parents=True)
    link.symlink_to(entry)
    open_up(tmp_path)
    with pytest.raises(nsconfine.PlanError, match="the session can write") as refused:
        session(*ws_run, harness=[link]).plan()  # it bound other-project read-only
    assert "agent" in str(refused.value)


def test_an_empty_harness_is_refused(ws_run: tuple[Path, Path]) -> None:
    """--harness "" is refused by name, not taken for the working directory."""
    result = cli("plan", *session_options(*ws_run), "--harness", "")  # fmt: skip
    assert result.returncode in (64, 65), result.stdout
    assert "harness" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_harness_below_a_symlinked_directory_is_refused_by_name(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A harness reached through a symlinked directory (/bin/true, /bin linking to usr/bin)
    would be bound where the link leads, and the launch refused as if bwrap did not confine:
    the plan refuses it, naming the path to give; given that path (the twin), it plans."""
    real = tmp_path / "real"
    real.mkdir()
    tool = real / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "link").symlink_to("real")
    with pytest.raises(nsconfine.PlanError, match=r"lies below a symlink.* give .*/real/tool"):
        session(*ws_run, harness=[str(tmp_path / "link" / "tool")]).plan()
    assert session(*ws_run, harness=[str(tool)]).plan()


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_harness_link_in_a_bound_system_directory_runs(ws_run: tuple[Path, Path]) -> None:
    """--harness /usr/bin/python3 (a link to python3.11 in /usr, which the plan binds as it is):
    the link shows there already, so the plan makes none (bwrap could not make one in the
    read-only /usr: the launch was refused as if bwrap did not confine)."""
    link = "/usr/bin/python3"
    if not os.path.islink(link):
        pytest.skip(f"{link} is no link on this host")
    plan = session(*ws_run, harness=[link]).plan()
    assert run(plan, [link, "-c", "print('ran')"]) == (0, "ran\n")


# ------------------------------------------------------------------ explain


def test_explain_says_through_which_entry(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine explain PATH SESSION` names the entry, its mode and reason."""
    result = cli("explain", "/usr/bin/git", *session_options(*ws_run))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "/usr" in result.stdout
    assert "ro" in result.stdout
    workspace_file = ws_run[0] / "src" / "main.py"
    result = cli("explain", str(workspace_file), *session_options(*ws_run))  # fmt: skip
    assert "rw" in result.stdout
    assert "workspace" in result.stdout


def test_explain_names_the_deny_rule(ws_run: tuple[Path, Path]) -> None:
    """A denied path: which rule, where it came from, and that the session cannot see it."""
    home = os.path.expanduser("~")
    result = cli("explain", f"{home}/.ssh/id_ed25519", *session_options(*ws_run))  # fmt: skip
    assert result.returncode == 1, result.stdout
    assert ".ssh" in result.stdout
    assert "SSH keys" in result.stdout


def test_explain_says_when_nothing_grants_a_path(ws_run: tuple[Path, Path]) -> None:
    """A path no entry grants (and no rule denies): 'nothing in the plan grants it'."""
    result = cli("explain", "/var/lib/dpkg/status", *session_options(*ws_run))  # fmt: skip
    assert result.returncode == 1
    assert "nothing in the plan grants it" in result.stdout


def test_explain_answers_for_a_host_file_under_the_session_s_own_tmp(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A host file under /tmp is not visible (the session's /tmp is a tmpfs of its own):
    explain says so and what the session has there, and a session indeed does not see it."""
    host_file = tmp_path / "host-note.txt"
    host_file.write_text("host\n")
    open_up(tmp_path)
    host_file.chmod(0o644)
    result = cli("explain", str(host_file), *session_options(*ws_run))
    assert result.returncode == 1, result.stdout
    assert "not visible" in result.stdout, result.stdout
    assert "tmpfs entry at /tmp" in result.stdout, result.stdout
    _status, output = sh(session(*ws_run).plan(), f"test -e {host_file} && echo SEEN || echo NO")
    assert output.strip() == "NO", output
    generated = cli("explain", "/etc/passwd", *session_options(*ws_run))
    assert generated.returncode == 1, generated.stdout
    assert "not visible" in generated.stdout, generated.stdout


def test_explain_answers_for_a_host_file_in_a_kept_home(ws_run: tuple[Path, Path]) -> None:
    """A kept HOME (--home-mode persist, the default) is a directory the sandbox makes inside
    the run directory's writable bind: the host's files there are the session's to read and
    write, and explain says so. It said "not visible" (the directory entry taken for the
    sandbox's own) while the session read and rewrote the file (attacker's pass, stop 33).
    The twin: a fresh HOME is a tmpfs of the sandbox's own, and the same file is not seen."""
    home_file = ws_run[1] / "home" / "hostfile"
    home_file.parent.mkdir(exist_ok=True)
    home_file.write_text("host-wrote\n")
    give_to_session_user(home_file.parent)
    give_to_session_user(home_file)
    result = cli("explain", str(home_file), *session_options(*ws_run))
    assert result.returncode == 0, result.stdout
    assert "showing the host's" in result.stdout, result.stdout
    assert sh(session(*ws_run).plan(), "cat ~/hostfile") == (0, "host-wrote\n")
    fresh = cli("explain", str(home_file), *session_options(*ws_run), "--home-mode", "fresh")
    assert fresh.returncode == 1, fresh.stdout
    assert sh(session(*ws_run, home_mode="fresh").plan(), "cat ~/hostfile")[0] != 0


def test_explain_follows_no_link_a_session_planted_at_its_kept_home(
    ws_run: tuple[Path, Path],
) -> None:
    """A symlink at RUN/home, where the plan makes the kept HOME (a session can plant one in
    its run directory): every launch is refused, and explain follows it nowhere (it answered
    "visible" through it once a directory entry let the run directory's bind cover the path:
    hostile review, stop 33)."""
    elsewhere = ws_run[0] / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".gitconfig").write_text("[user]\n")
    (ws_run[1] / "home").symlink_to(elsewhere)
    result = cli("explain", str(ws_run[1] / "home" / ".gitconfig"), *session_options(*ws_run))
    assert "a symlink to" not in result.stdout, result.stdout
    refused = cli("run", *session_options(*ws_run), "--", "true")
    assert refused.returncode == 65, refused.stderr
    assert refused.stderr.startswith("nsconfine: plan-refused: "), refused.stderr
    assert "Traceback" not in refused.stderr


def test_explain_names_the_profile_that_would_show_a_path(ws_run: tuple[Path, Path]) -> None:
    """A path the plan does not show, but a built-in profile's bind would: explain names the
    profile (`--profile jvm`)."""
    if not os.path.isdir("/etc/maven"):
        pytest.skip("no Maven on this host")
    result = cli("explain", "/etc/maven/m2.conf", *session_options(*ws_run))
    assert result.returncode == 1, result.stdout
    assert "--profile jvm" in result.stdout, result.stdout


def test_explain_follows_a_link_to_where_the_session_cannot_see(
    ws_run: tuple[Path, Path],
) -> None:
    """A path the plan shows that is a symlink leading somewhere not visible (Debian's /usr
    links into /etc): explain says where it leads, that the target is not visible, and which
    profile gives it; with that profile, the link leads somewhere visible."""
    link = "/usr/share/maven/bin/m2.conf"
    if not os.path.islink(link):
        pytest.skip("no Maven on this host")
    result = cli("explain", link, *session_options(*ws_run))
    assert result.returncode == 1, result.stdout
    assert os.readlink(link) in result.stdout, result.stdout
    assert "not visible" in result.stdout, result.stdout
    assert "--profile jvm" in result.stdout, result.stdout
    given = cli("explain", link, *session_options(*ws_run), "--profile", "jvm")
    assert given.returncode == 0, given.stdout
    assert os.readlink(link) in given.stdout, given.stdout


def test_explain_answers_for_a_host_file_a_symlinked_bind_shows(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A --ro path given through a symlink: bwrap binds what it leads to, as a directory, at
    the link's path. explain says the host's file is visible there (by its own path or the
    link's), and the manifest names where the link leads, as a session indeed sees it
    (attackers' pass: explain said "not visible" of a file the session read)."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "notes.txt").write_text("seen\n")
    (link := tmp_path / "link").symlink_to(real)
    open_up(real)
    (real / "notes.txt").chmod(0o644)
    options = [*session_options(*ws_run), "--ro", str(link)]
    _status, output = sh(session(*ws_run, ro=[link]).plan(), f"cat {link}/notes.txt")
    assert output == "seen\n", output  # what explain must answer for
    for asked in (real / "notes.txt", link / "notes.txt"):
        result = cli("explain", str(asked), *options)
        assert result.returncode == 0, result.stdout
        assert f"{link}/notes.txt" in result.stdout, result.stdout
    manifest = cli("plan", *options).stdout
    assert any(str(link) in row and str(real) in row for row in manifest.splitlines()), manifest
    # masked where the bind shows it: not visible (hostile review: explain said it was)
    masked = [*options, "--mask", str(real / "notes.txt")]
    _status, output = sh(session(*ws_run, ro=[link], mask=[real / "notes.txt"]).plan(),
                         f"cat {link}/notes.txt")  # fmt: skip
    assert "seen" not in output, output
    for asked in (real / "notes.txt", link / "notes.txt"):
        result = cli("explain", str(asked), *masked)
        assert result.returncode == 1, result.stdout


@pytest.mark.parametrize("name", ["{outside}", "../other-package", "@scope/../../other-package"])
def test_a_dependency_name_cannot_reach_outside_node_modules(
    ws_run: tuple[Path, Path], npm_package: Path, tmp_path: Path, name: str
) -> None:
    """A harness's package.json naming a dependency by an absolute path or with `..` (npm
    allows neither): the directory it names is not bound (an absolute name bound any host
    directory holding a package.json, another session's node workspace say)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "package.json").write_text("{}")
    (outside / "secret.txt").write_text("not the harness's\n")
    open_up(outside)
    manifest = npm_package.parent.parent / "tool" / "package.json"
    dependencies = {name.format(outside=outside): "*"}
    manifest.write_text(json.dumps({"name": "tool", "optionalDependencies": dependencies}))
    plan = session(*ws_run, harness=[npm_package]).plan()
    bound = {entry.source for entry in plan.entries}
    assert str(outside) not in bound
    assert str(npm_package.parent.parent / "other-package") not in bound
