"""The deny set is every home the launcher has, and the lint judges what a path is.

A home is not only the password database's: $HOME, the directories tools are pointed at instead
of the home's defaults ($XDG_CONFIG_HOME, $GNUPGHOME, $CLAUDE_CONFIG_DIR, …), the home of
$SUDO_USER and, for a root launcher, the home of the account the session runs as. A path is not
only its name: a hardlink to a key, a bind-mount view of ~/.ssh and a symlink re-pointed after a
plan was first built are judged by the file they are. Readable output cannot be forged, and a
plan bwrap could not run is refused when it is built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import IS_ROOT, SESSION_USER, open_up, session

from nsconfine._errors import PlanError
from nsconfine._plan import model as p
from nsconfine._plan.model import Kind, Plan
from nsconfine._policy import lint as _lint
from nsconfine._session import Session, build_plan
from nsconfine._text import printable


def checked_plan(ws_run: tuple[Path, Path], environ: dict[str, str], **options: object) -> Plan:
    """The checked plan of a session, built with environ as the launcher's environment."""
    if SESSION_USER:
        options.setdefault("user", SESSION_USER)
    session = Session(workspace=ws_run[0], run_dir=ws_run[1], **options)  # type: ignore[arg-type]
    return build_plan(session, environ=environ)


def refusal(ws_run: tuple[Path, Path], environ: dict[str, str], **options: object) -> str:
    """The message the plan is refused with."""
    with pytest.raises(PlanError) as refused:
        checked_plan(ws_run, environ, **options)
    return refused.value.message


# ------------------------------------------------------------------ every home


@pytest.mark.parametrize(
    "secret", [".ssh/id_ed25519", ".ssh", ".claude/.credentials.json", ".config/app/secrets"]
)
def test_a_stand_in_home_s_stores_are_denied(
    ws_run: tuple[Path, Path], standin_home: Path, secret: str
) -> None:
    """$HOME's stores are denied even when $HOME is not the password database's home."""
    message = refusal(ws_run, {"HOME": str(standin_home)}, ro=[standin_home / secret])
    assert str(standin_home) in message


@pytest.mark.parametrize(
    ("store", "bound"),
    [
        (".m2/settings.xml", ".m2"),
        (".m2/settings-security.xml", ".m2/settings-security.xml"),
        (".gradle/gradle.properties", ".gradle"),
        (".gem/credentials", ".gem"),
        (".cache/huggingface/token", ".cache/huggingface"),
        (".huggingface/token", ".huggingface"),
        (".pgpass", ".pgpass"),
        (".my.cnf", ".my.cnf"),
        (".yarnrc.yml", ".yarnrc.yml"),
        (".composer/auth.json", ".composer"),
        (".nuget/NuGet/NuGet.Config", ".nuget"),
        (".s3cfg", ".s3cfg"),
        (".boto", ".boto"),
    ],
)
def test_package_and_service_credential_stores_are_denied(
    ws_run: tuple[Path, Path], standin_home: Path, store: str, bound: str
) -> None:
    """Maven's settings.xml, Gradle's gradle.properties, RubyGems' and Hugging Face's tokens and
    their like hold passwords as npm's .npmrc and PyPI's .pypirc do: binding them, or the
    directory holding them (~/.m2 to share the local repository), is refused (attacker's pass,
    stop 39: `--profile jvm --ro ~/.m2` printed the Maven password in the session)."""
    secret = standin_home / store
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("password=stand-in\n")
    message = refusal(ws_run, {"HOME": str(standin_home)}, ro=[standin_home / bound])
    assert str(standin_home) in message


@pytest.mark.root  # a home the session's account cannot search: the launcher must be root
def test_a_denied_store_is_refused_as_one_not_as_out_of_the_account_s_reach(
    ws_run: tuple[Path, Path], standin_home: Path
) -> None:
    """A store in a home the session's account cannot search was refused as out of that
    account's reach, "grant that account access": advice to open a credential store up
    (attacker's pass, stop 39: --ro /root/.npmrc, the ssh-agent's socket). The deny set
    speaks first."""
    standin_home.chmod(0o700)
    message = refusal(ws_run, {"HOME": str(standin_home)}, ro=[standin_home / ".ssh"])
    assert "SSH keys" in message
    assert "grant" not in message


def test_a_stand_in_home_itself_is_denied(ws_run: tuple[Path, Path], standin_home: Path) -> None:
    """$HOME itself cannot be bound, and a file in it outside every store can."""
    assert "home" in refusal(ws_run, {"HOME": str(standin_home)}, ro=[standin_home])
    bound = checked_plan(ws_run, {"HOME": str(standin_home)}, ro=[standin_home / "notes.txt"])
    assert str(standin_home / "notes.txt") in {e.source for e in bound.entries}


def test_a_workspace_equal_to_home_is_refused(standin_home: Path, tmp_path: Path) -> None:
    """$HOME (or above it) as the workspace is refused."""
    (run := tmp_path / "run2").mkdir()
    with pytest.raises(PlanError, match="home"):
        build_plan(
            Session(workspace=standin_home, run_dir=run), environ={"HOME": str(standin_home)}
        )


@pytest.mark.parametrize(
    ("variable", "relative"),
    [
        ("XDG_CONFIG_HOME", "cfg"),
        ("XDG_DATA_HOME", "data"),
        ("XDG_STATE_HOME", "state"),
        ("GNUPGHOME", "gnupg"),
        ("CLAUDE_CONFIG_DIR", "claude"),
        ("CODEX_HOME", "codex"),
        ("DOCKER_CONFIG", "docker"),
        ("AWS_SHARED_CREDENTIALS_FILE", "aws-credentials"),
        ("AWS_CONFIG_FILE", "aws-config"),
        ("KUBECONFIG", "kubeconfig"),
        ("GIT_CONFIG_GLOBAL", "gitconfig"),
    ],
)
def test_directories_tools_are_pointed_at_are_denied(
    ws_run: tuple[Path, Path], tmp_path: Path, variable: str, relative: str
) -> None:
    """A store moved by its variable ($XDG_CONFIG_HOME, $GNUPGHOME, …) is denied, and the
    manifest says which variable the rule came from."""
    store = tmp_path / "elsewhere" / relative
    store.parent.mkdir(exist_ok=True)
    if variable.endswith(("_FILE", "KUBECONFIG", "GLOBAL")):
        store.write_text("secret\n")
    else:
        store.mkdir()
        (store / "secret").write_text("secret\n")
    message = refusal(ws_run, {variable: str(store)}, ro=[store])
    assert relative in message
    made = checked_plan(ws_run, {variable: str(store)})
    origins = {rule.path: rule.origin for rule in made.deny}
    assert variable in origins[str(store.resolve())]


@pytest.mark.parametrize(
    ("variable", "secret"),
    [
        ("GRADLE_USER_HOME", "gradle.properties"),
        ("HF_HOME", "token"),
        ("HF_HOME", "stored_tokens"),
        ("CARGO_HOME", "credentials.toml"),
        ("COMPOSER_HOME", "auth.json"),
        ("HF_TOKEN_PATH", ""),
        ("PGPASSFILE", ""),
        ("BOTO_CONFIG", ""),
        ("NPM_CONFIG_USERCONFIG", ""),
    ],
)
def test_a_credential_file_moved_by_its_tool_s_variable_is_denied(
    ws_run: tuple[Path, Path], tmp_path: Path, variable: str, secret: str
) -> None:
    """The new entries of the deny set, where their tools' variables put them: with
    GRADLE_USER_HOME, HF_HOME or HF_TOKEN_PATH set, a bind of that directory showed the Gradle
    password and the Hugging Face token (its review, stop 39). The file is denied there (the
    directory around it, a cache, may be bound without it)."""
    named = tmp_path / "elsewhere" / variable.lower()
    if secret:
        named.mkdir(parents=True)
        (named / secret).write_text("password=stand-in\n")
        bound = named
    else:
        named.parent.mkdir(parents=True)
        named.write_text("password=stand-in\n")
        bound = named.parent
    message = refusal(ws_run, {variable: str(named)}, ro=[bound])
    assert f"${variable}" in message


@pytest.mark.parametrize("variable", ["SUDO_USER", "DOAS_USER", "PKEXEC_UID"])
def test_the_invoking_user_s_home_is_denied(ws_run: tuple[Path, Path], variable: str) -> None:
    """The home of the person who became root is denied, whichever tool they used: sudo
    ($SUDO_USER; sudo -E keeps the caller's variables), doas ($DOAS_USER) or pkexec
    ($PKEXEC_UID, a uid). Only sudo's was (an attacker's pass bound /home/NAME under doas)."""
    import pwd

    def owns_home(entry: pwd.struct_passwd) -> bool:
        return os.path.isdir(entry.pw_dir) and os.stat(entry.pw_dir).st_uid == entry.pw_uid

    others = [e for e in pwd.getpwall() if e.pw_uid != os.getuid() and owns_home(e)]
    if not others:
        pytest.skip("no other account on this host has a home of its own")
    value = str(others[0].pw_uid) if variable == "PKEXEC_UID" else others[0].pw_name
    made = checked_plan(ws_run, {variable: value})
    denied = [rule for rule in made.deny if variable in rule.origin]
    assert any(rule.path == others[0].pw_dir for rule in denied), made.deny


def test_every_rule_says_where_it_came_from(ws_run: tuple[Path, Path], standin_home: Path) -> None:
    """Each deny rule in the manifest names its origin."""
    made = checked_plan(ws_run, {"HOME": str(standin_home)})
    assert all(rule.origin for rule in made.deny)
    assert any(rule.origin == "$HOME" for rule in made.deny)
    assert "$HOME" in made.manifest()


def test_a_store_variable_with_a_tilde_is_denied(
    ws_run: tuple[Path, Path], standin_home: Path
) -> None:
    """AWS_SHARED_CREDENTIALS_FILE=~/creds (as a systemd unit writes it, unexpanded) denies
    the file in every home."""
    (creds := standin_home / "creds").write_text("aws_secret_access_key=x\n")
    environ = {"HOME": str(standin_home), "AWS_SHARED_CREDENTIALS_FILE": "~/creds"}
    assert "creds" in refusal(ws_run, environ, ro=[creds])


# ------------------------------------------------------------------ no stale cache


def test_a_re_pointed_symlink_is_judged_afresh(
    ws_run: tuple[Path, Path], standin_home: Path, tmp_path: Path
) -> None:
    """In a long-lived launcher, re-pointing ~/.ssh (a symlink) at another directory makes
    that directory denied at once: the decision equals a fresh one."""
    first, second = tmp_path / "keys-1", tmp_path / "keys-2"
    for keys in (first, second):
        keys.mkdir()
        (keys / "id_ed25519").write_text("key\n")
    ssh = standin_home / ".ssh"
    for child in ssh.iterdir():
        child.unlink()
    ssh.rmdir()
    ssh.symlink_to(first)
    environ = {"HOME": str(standin_home)}
    assert str(first) in refusal(ws_run, environ, ro=[first / "id_ed25519"])
    checked_plan(ws_run, environ, ro=[second / "id_ed25519"])  # allowed: not a store (yet)
    ssh.unlink()
    ssh.symlink_to(second)
    assert str(second) in refusal(ws_run, environ, ro=[second / "id_ed25519"])


# ------------------------------------------------------------------ what a path is


def test_a_hardlink_to_a_key_is_refused(ws_run: tuple[Path, Path], standin_home: Path) -> None:
    """A hardlink to ~/.ssh/id_ed25519 elsewhere is the key: refused."""
    link = ws_run[0].parent / "innocent.txt"
    os.link(standin_home / ".ssh" / "id_ed25519", link)
    assert ".ssh" in refusal(ws_run, {"HOME": str(standin_home)}, ro=[link])


# Lints, in a private mount namespace, a plan that binds argv[3] after ~/.ssh (argv[1]) is
# bind-mounted at argv[2].
_LINT_AN_SSH_VIEW = r"""
import os, subprocess, sys
from nsconfine._plan import model as p
from nsconfine._policy import lint as _lint
from nsconfine._errors import PlanError
home, view, bound = sys.argv[1], sys.argv[2], sys.argv[3]
subprocess.run(["mount", "--bind", os.path.join(home, ".ssh"), view], check=True)
rules = _lint.default_deny(homes=[home], environ={})
plan = p.Plan([p.ro_bind(bound, "/bound", "a view or a runner directory")], deny=rules)
try:
    _lint.check_plan(plan)
    print("allowed")
except PlanError as refused:
    print("refused", refused.message)
"""


@pytest.mark.parametrize("below", [False, True], ids=["at-another-path", "below-a-bound-dir"])
def test_a_bind_mount_view_of_ssh_is_refused(
    standin_home: Path, tmp_path: Path, below: bool
) -> None:
    """A host bind-mount view of ~/.ssh is ~/.ssh: binding it (at another path), or a directory
    it is mounted below (bwrap binds recursively, carrying it into the sandbox), is refused
    (checked in a private mount namespace, as root or in a user namespace)."""
    bound = tmp_path / "lib"
    view = bound / "view" if below else bound
    view.mkdir(parents=True)
    unshare = ["unshare", "-m"] if IS_ROOT else ["unshare", "-Urm"]
    result = subprocess.run(
        [*unshare, sys.executable, "-c", _LINT_AN_SSH_VIEW, str(standin_home), str(view),
         str(bound)],
        capture_output=True, text=True, cwd="/", timeout=60, check=False,
    )  # fmt: skip
    assert result.stdout.startswith("refused"), result.stdout + result.stderr
    assert ".ssh" in result.stdout


# Lints, in a private mount namespace, a plan that binds argv[3] with the bind mounts of
# argv[2] made (JSON: [source, target] each, in order), the deny rules those of a home at
# argv[1] and of the environment in argv[4] (JSON).
_LINT_WITH_A_MOUNT = r"""
import json, subprocess, sys
from nsconfine._plan import model as p
from nsconfine._policy import lint as _lint
from nsconfine._errors import PlanError
home, mounts, bound, environ = sys.argv[1:5]
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
for source, target in json.loads(mounts):
    subprocess.run(["mount", "--bind", source, target], check=True)
rules = _lint.default_deny(homes=[home], environ=json.loads(environ))
plan = p.Plan([p.ro_bind(bound, bound, "a system or runner directory")], deny=rules)
try:
    _lint.check_plan(plan)
    print("allowed")
except PlanError as refused:
    print("refused", refused.message)
"""


def _linted_with_a_mount(
    home: Path, source: Path, target: str, bound: str, environ: dict[str, str] | None = None
) -> str:
    """What the lint says of a plan binding bound while source is mounted at target (in a
    private mount namespace: as root, or in a user namespace)."""
    return _linted_with_mounts(home, [(str(source), target)], bound, environ)


def _linted_with_mounts(
    home: Path, mounts: list[tuple[str, str]], bound: str, environ: dict[str, str] | None = None
) -> str:
    """What the lint says of a plan binding bound once mounts (source, target: bind mounts,
    in order) are made in a private mount namespace (as root, or in a user namespace)."""
    unshare = ["unshare", "-m"] if IS_ROOT else ["unshare", "-Urm"]
    result = subprocess.run(
        [*unshare, sys.executable, "-c", _LINT_WITH_A_MOUNT, str(home), json.dumps(mounts),
         bound, json.dumps(environ or {})],
        capture_output=True, text=True, cwd="/", timeout=120, check=False,
    )  # fmt: skip
    assert result.stdout.startswith(("refused", "allowed")), result.stdout + result.stderr
    return result.stdout


def test_a_secret_s_other_name_mounted_below_usr_is_refused(
    standin_home: Path, tmp_path: Path
) -> None:
    """A directory holding another name of a denied key, mounted below /usr (a user's own
    directory at /usr/local/src): the system's /usr bind carries it into the sandbox, so /usr
    is looked through as any bound directory is. This stop's first version skipped /usr by its
    path and showed the key to every session (hostile review, stop 33); it is refused."""
    project = tmp_path / "proj"
    project.mkdir()
    os.link(standin_home / ".ssh" / "id_ed25519", project / "key.bak")
    said = _linted_with_a_mount(standin_home, project, "/usr/local/src", "/usr")
    assert said.startswith("refused"), said
    assert "id_ed25519" in said, said


def test_names_seen_through_a_view_of_a_denied_directory_are_counted_once(
    standin_home: Path, tmp_path: Path
) -> None:
    """A denied file whose every name lies in denied directories has none elsewhere to look
    for; a name seen through two denied directories that show one place (~/.config and a
    bind-mount view of it named by XDG_CONFIG_HOME) is one name. Counted by path, it made
    the file's other name, in a bound directory, look accounted for, and the secret was shown
    (hostile review, stop 33); it is refused."""
    secrets = standin_home / ".config" / "app" / "secrets"
    project = tmp_path / "proj"
    project.mkdir()
    os.link(secrets, project / "secrets.orig")
    view = tmp_path / "config-view"
    view.mkdir()
    environ = {"XDG_CONFIG_HOME": str(view)}
    said = _linted_with_a_mount(standin_home, standin_home / ".config", str(view), str(project),
                                environ)  # fmt: skip
    assert said.startswith("refused"), said
    assert "secrets.orig" in said, said


def test_a_view_of_ssh_is_placed_by_the_mount_seen_not_one_hidden(
    standin_home: Path, tmp_path: Path
) -> None:
    """A mount at ~/.ssh hidden by a later bind over the home (mountinfo lists it still, but
    no path reaches it), then a bind-mount view of the real ~/.ssh: the view is ~/.ssh, and
    binding the key through it is refused. Placed through the hidden mount's root, the view
    was taken for another place and the key shown (hostile review, stop 33; the placing is
    older than this stop, the hidden mount the host's own doing)."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    view = tmp_path / "view"
    view.mkdir()
    home = str(standin_home)
    mounts = [(str(other), f"{home}/.ssh"), (home, home), (f"{home}/.ssh", str(view))]
    said = _linted_with_mounts(standin_home, mounts, str(view / "id_ed25519"))
    assert said.startswith("refused"), said
    assert ".ssh" in said, said


@pytest.mark.parametrize("socket_name", ["docker.sock", "podman/podman.sock", "bus"])
def test_user_daemon_sockets_are_refused(
    ws_run: tuple[Path, Path], tmp_path: Path, socket_name: str
) -> None:
    """The rootless Docker, Podman and D-Bus session sockets cannot be a tool socket."""
    import socket

    runtime = tmp_path / "runtime"
    path = runtime / socket_name
    path.parent.mkdir(parents=True)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    path.chmod(0o777)  # connectable by the session's account: only the deny rule may refuse
    open_up(path.parent)
    try:
        message = refusal(ws_run, {"XDG_RUNTIME_DIR": str(runtime)}, tool_socket=path)
    finally:
        server.close()
    assert socket_name.split("/")[-1] in message


def test_deny_root_refuses_every_bind(ws_run: tuple[Path, Path], tmp_path: Path) -> None:
    """`--deny /` refuses every bind instead of doing nothing."""
    (runner := tmp_path / "runner.py").write_text("print(1)\n")
    assert refusal(ws_run, {}, ro=[runner], deny=["/"])


def test_a_hardlinked_key_inside_a_bound_directory_is_refused(
    ws_run: tuple[Path, Path], standin_home: Path, tmp_path: Path
) -> None:
    """A directory whose file system holds a second name of a denied key may hold that name:
    binding it is refused, naming the key."""
    lib = tmp_path / "checkout" / "lib"
    lib.mkdir(parents=True)
    os.link(standin_home / ".ssh" / "id_ed25519", lib / "key")
    assert "id_ed25519" in refusal(ws_run, {"HOME": str(standin_home)}, ro=[lib])
    # Found in lib itself (a session's plan binds /usr, on this file system, which is too
    # large to look through: it alone is refused first).
    rules = _lint.default_deny(homes=[str(standin_home)], environ={})
    with pytest.raises(PlanError) as refused:
        _lint.check_plan(Plan([p.ro_bind(str(lib), "/lib-view", "a runner directory")], deny=rules))
    key = standin_home / ".ssh" / "id_ed25519"
    assert f"holds {lib / 'key'}, another name of {key}" in refused.value.message


def test_a_denied_file_s_other_name_elsewhere_is_refused_saying_how_to_find_it(
    ws_run: tuple[Path, Path], standin_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of the launcher's config with a second name elsewhere (a backup made with ln),
    on the file system of /usr: /usr, bound in every plan, is too large to look through for
    that name, so the launch is refused (a mount below /usr may hold it: the test below); the
    refusal names the `find` that lists the file's names, not only "bind a narrower path",
    which /usr cannot be (attacker's pass, stop 33). The limit is set below /usr's size here: a
    fresh Debian's /usr (~20,000 files) is looked through whole, and rightly launched."""
    monkeypatch.setattr(_lint, "BOUND_SCAN", 1_000)
    backup = tmp_path / "backup"
    backup.mkdir()
    secrets = standin_home / ".config" / "app" / "secrets"
    os.link(secrets, backup / "secrets")
    assert os.stat(backup).st_dev == os.stat("/usr").st_dev  # where /usr is looked at
    message = refusal(ws_run, {"HOME": str(standin_home)})
    assert f"find / -xdev -samefile {secrets}" in message, message


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_session_s_own_hardlink_in_a_denied_workspace_refuses_no_other_session(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """Another session's workspace, denied to this one, in which that session made a file
    two names: both are in the denied directory, so there is no third to look for, and this
    session's launches go on. They were refused (/usr too large to look through) for as long
    as the link stayed (attacker's pass, stop 33). The twin: a second name outside it, in a
    bound directory, is refused."""
    from helpers import session, session_dirs, sh

    other = session_dirs(tmp_path, "other-ws", "other-run")
    assert sh(session(*other).plan(), "echo x > a && ln a b") == (0, "")
    checked_plan(ws_run, {}, deny=[other[0]])
    lib = tmp_path / "checkout" / "lib"
    lib.mkdir(parents=True)
    os.link(other[0] / "a", lib / "a")
    assert f"another name of {other[0]}" in refusal(ws_run, {}, ro=[lib], deny=[other[0]])


@pytest.mark.parametrize(
    "path",
    ["/run/podman/podman.sock", "/run/containerd/containerd.sock", "/run/crio/crio.sock",
     "/run/libvirt/libvirt-sock", "/run/dbus/system_bus_socket"],
)  # fmt: skip
def test_every_plan_denies_the_hosts_root_daemons(ws_run: tuple[Path, Path], path: str) -> None:
    """Rootful Podman, containerd, CRI-O and libvirt are root on the host, as Docker is, and the
    system bus reaches the host's services: every plan's deny set holds their sockets (a
    session bind of one is refused where it exists; this host runs none of them)."""
    deny = session(*ws_run).plan().deny
    judge = _lint.Judge(deny)
    assert judge.violated(path) is not None


# Written out, not read from the lint's own tables: a test parametrized over the constant the
# code uses loses its case with the entry (mutation pass, stop 35: dropping any of these from
# nsconfine/_policy/lint.py failed no test).
NAMED_SECRETS = [
    "~/.aws",
    "~/.vault-token",
    "/etc/gshadow",
    "/etc/ssl/private",
    "$XDG_RUNTIME_DIR/keyring",
    "$XDG_RUNTIME_DIR/systemd",
    "$SSH_AUTH_SOCK",
]


@pytest.mark.parametrize("named", NAMED_SECRETS)
def test_each_named_secret_is_refused_as_a_bind_source(
    ws_run: tuple[Path, Path], standin_home: Path, tmp_path: Path, named: str
) -> None:
    """AWS keys and a Vault token in a (stand-in) home, the host's group password hashes and
    TLS private keys, the desktop keyring's and systemd's user manager's sockets in a (stand-in)
    runtime directory, and the ssh-agent $SSH_AUTH_SOCK names (a socket in /tmp/ssh-XXXX,
    connectable by the session's account, offered as the tool socket): each is refused, by the
    rule that names it (the host's two, which no session's account may read here and so are
    refused for that first, by the plan's own rules). The twin: a file beside each in the same
    home or runtime directory, or /etc/hostname, is allowed, and the agent's socket is bound
    when $SSH_AUTH_SOCK names none. Shown failing with each entry dropped from lint.py's
    tables (mutation pass, stop 35)."""
    import socket
    import tempfile

    runtime = tmp_path / "runtime"
    runtime.mkdir()
    environ = {"HOME": str(standin_home), "XDG_RUNTIME_DIR": str(runtime)}
    agent_dir = Path(tempfile.mkdtemp(prefix="ssh-", dir="/tmp"))
    agent = socket.socket(socket.AF_UNIX)
    try:
        if named == "$SSH_AUTH_SOCK":
            denied = agent_dir / "agent.1"
            agent.bind(str(denied))
            denied.chmod(0o777)  # connectable by the session's account: only the rule refuses
            open_up(agent_dir)
            environ["SSH_AUTH_SOCK"] = str(denied)
            message = refusal(ws_run, environ, tool_socket=denied)
            del environ["SSH_AUTH_SOCK"]
            allowed = checked_plan(ws_run, environ, tool_socket=denied)
            assert str(denied) in {e.source for e in allowed.entries}
        elif named.startswith("/"):
            # (No account a session runs as here may read these: a bind of one is refused for
            # that first, whatever the deny set holds; so the plan's own rules judge the path.)
            denied = Path(named)
            judge = _lint.Judge(checked_plan(ws_run, environ).deny)
            found = judge.violated(named)
            message = f"{found[1]} {found[0].path} " if found else f"no rule denies {named}"
            assert judge.violated("/etc/hostname") is None
        else:
            base, relative = named.split("/", 1)
            root = standin_home if base == "~" else runtime
            denied = root / relative
            if relative == ".vault-token":  # a store that is a file
                denied.write_text("hvs.secret\n")
            else:  # a store, or a runtime directory's sockets: a directory
                denied.mkdir()
                (denied / "credentials").write_text("[default]\n")
            beside = root / f"{relative}-notes"
            beside.write_text("nothing secret\n")
            message = refusal(ws_run, environ, ro=[denied])
            allowed = checked_plan(ws_run, environ, ro=[beside])
            assert str(beside) in {e.source for e in allowed.entries}
    finally:
        agent.close()
        shutil.rmtree(agent_dir)
    assert f"is or contains {denied} " in message, message


# ------------------------------------------------------------------ output and limits


@pytest.mark.parametrize("name", ["line\nbind rw ~.ssh", "bell\a", "tab\there", "esc\x1b[31m"])
def test_control_characters_in_paths_are_refused(
    ws_run: tuple[Path, Path], tmp_path: Path, name: str
) -> None:
    """A path with a newline or another control character cannot forge a manifest row: it is
    refused by name, escaped."""
    path = tmp_path / name
    path.write_text("x\n")
    message = refusal(ws_run, {}, ro=[path])
    assert "\n" not in message
    assert "control character" in message


def test_manifest_escapes_what_it_prints() -> None:
    """Every human-readable field of a manifest is printed with control characters escaped."""
    plan = Plan(
        [p.tmpfs("/tmp", "reason with\nnew line")],
        env=[p.EnvVar("X", "v\nbind rw /root", p.Origin.NSCONFINE)],
    )
    text = plan.manifest()
    assert "reason with\\nnew line" in text
    assert "v\\nbind rw /root" in text
    assert not any(line.startswith("bind rw /root") for line in text.splitlines())


def test_a_plan_bwrap_cannot_run_is_refused_when_built(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A 10,000-file session, past bwrap's 9,000 arguments, is refused when its plan is built,
    saying what to do."""
    tree = tmp_path / "tree"
    tree.mkdir()
    files = []
    for index in range(10_000):
        path = tree / f"f{index}.py"
        path.write_text("")
        files.append(path)
    message = refusal(ws_run, {}, ro=files)
    assert "9000" in message or "9,000" in message
    assert "--ro" in message


def test_rules_of_kind_bind_only_judge_sources() -> None:
    """A plan without any bind passes the lint whatever the rules (the control)."""
    rules = [p.DenyRule("/", "everything", origin="--deny")]
    _lint.check_plan(Plan([p.tmpfs("/tmp", "private")], deny=rules))
    assert all(e.kind is not Kind.BIND for e in Plan([p.tmpfs("/tmp", "x")]).entries)


@pytest.mark.parametrize("character", ["\u0085", "\u009b", "\u202e", "\u2066", "\u2028"])
def test_unicode_controls_are_escaped(character: str) -> None:
    """C1 controls, bidi overrides and line separators are escaped in readable output: in a
    reason, and in a destination and a source, which a session chooses when it names a
    repository in its workspace (attacker's pass, stop 40: the DEST column printed them)."""
    plan = Plan([p.tmpfs("/tmp", f"reason{character}bind rw /root/.ssh")])
    assert character not in plan.manifest()
    assert character not in printable(f"x{character}y")
    named = f"/ws/repo{character}x/.git/config"
    plan = Plan([p.ro_bind(named, named, "a repository's config, read-only")])
    assert character not in plan.manifest()
    assert printable(named) in plan.manifest()


def test_a_backslash_is_escaped_so_that_no_name_reads_as_another() -> None:
    """A name holding a backslash and an n is shown apart from one holding a newline, which
    reads \\n (noticed at stop 31: the two were shown alike)."""
    literal, newline = "x\\ny", "x\ny"
    assert printable(literal) != printable(newline)
    assert printable(literal) == "x\\\\ny"
    assert printable("plain/path") == "plain/path"


def test_a_dangling_tool_socket_is_a_clean_refusal(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A tool socket that is a dangling symlink is refused by name, not a traceback."""
    (link := tmp_path / "tool.sock").symlink_to(tmp_path / "gone.sock")
    assert "tool.sock" in refusal(ws_run, {}, tool_socket=link)


def test_the_records_are_denied_wherever_the_environment_puts_them() -> None:
    """nsconfine's records are denied where this launcher keeps them: with HOME=/ (a unit's
    home), /.cache/nsconfine, which no home's rules cover (attackers' pass: `--ro /.cache`
    was accepted), and the fallback of an account with no writable home."""
    from nsconfine._kernel.stub_records import FALLBACK_BASE

    denied = {rule.path for rule in _lint.default_deny(environ={"HOME": "/"}) if rule.records}
    assert "/.cache/nsconfine" in denied, denied
    assert os.path.join(FALLBACK_BASE, f"nsconfine-{os.geteuid()}") in denied, denied


def test_the_launcher_s_records_do_not_use_up_the_look_for_other_names(
    ws_run: tuple[Path, Path], standin_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The denied directories are looked through for files with other names within a budget
    of entries. A token per mount point a launch made, nsconfine's records came first and
    used it up (thousands with many sessions live): a hardlinked secret in a directory denied
    after them went unseen, and a bind of the directory holding its other name was allowed.
    The records hold only nsconfine's own files, and are not looked through."""
    from nsconfine._kernel import stub_records

    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    stub_records.forget_records()
    try:
        records = Path(stub_records.records())
        for number in range(40):  # tokens of live stubs: the files are there
            (stub := tmp_path / f"stub{number}").touch()
            info = stub.stat()
            (records / f"{info.st_dev}-{info.st_ino}").symlink_to(stub)
    finally:
        stub_records.forget_records()
    monkeypatch.setattr(_lint, "LINKED_SCAN", 30)
    secrets = tmp_path / "data-root"
    secrets.mkdir()
    (secrets / "token").write_text("secret\n")
    lib = tmp_path / "checkout" / "lib"
    lib.mkdir(parents=True)
    os.link(secrets / "token", lib / "token")
    environ = {"HOME": str(standin_home), "XDG_CACHE_HOME": str(cache)}
    assert "token" in refusal(ws_run, environ, ro=[lib], deny=[secrets])


@pytest.mark.confinement
def test_the_launch_lint_keeps_the_default_rules_a_caller_dropped(
    ws_run: tuple[Path, Path],
) -> None:
    """Principle 2 holds whatever a plan's own deny set holds: the launch's lint judges every
    bind by the default rules too, made afresh. A plan whose deny set a caller emptied
    (plan.replace(deny=())) still cannot bind the host's SSH keys; the twin, the same plan
    binding a harmless file, launches."""
    from helpers import run

    bare = session(*ws_run).plan().replace(deny=())
    keys = p.ro_bind("/etc/ssh", "/mnt/ssh", "asked for")
    with pytest.raises(PlanError, match="/etc/ssh"):
        run(bare.replace(entries=(*bare.entries, keys)), ["/bin/true"])
    harmless = p.ro_bind("/etc/hostname", "/mnt/hostname", "asked for")
    assert run(bare.replace(entries=(*bare.entries, harmless)), ["/bin/true"])[0] == 0
