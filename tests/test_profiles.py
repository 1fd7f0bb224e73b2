"""Profiles: a TOML file (or a built-in name) that says what a kind of session gets, each entry
with its reason; command-line options add to it. Errors name the file, the line and the key.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import shutil
import socket
import ssl
import struct
import threading
from pathlib import Path

import pytest
from helpers import (
    IS_ROOT,
    attempt,
    cli,
    give_to_session_user,
    make_local_ca,
    open_up,
    outcome_without_hanging,
    run,
    session,
    session_dirs,
    session_options,
    session_uid,
    sh,
)

import nsconfine
from nsconfine._plan.model import Kind, Mode
from nsconfine._plan.network import PLACEHOLDER, route_base_url
from nsconfine._plan.profiles import load

BUILT_IN = ("claude-code", "codex", "git", "node", "python", "jvm", "tls",
            "coder", "reviewer", "researcher")  # fmt: skip


def write_profile(directory: Path, text: str, name: str = "mine.toml") -> Path:
    """A profile file of text in directory, readable by the session's account."""
    path = directory / name
    path.write_text(text)
    open_up(directory)
    path.chmod(0o644)
    return path


def agent_credential(
    directory: Path, text: str = "ANTHROPIC_API_KEY=sk-test\nOPENAI_API_KEY=sk-test\n"
) -> Path:
    """An agent's credential file (both API keys, or text) in directory, mode 0600."""
    path = directory / "agent.env"
    path.write_text(text)
    path.chmod(0o600)
    return path


# ------------------------------------------------------------------ built-ins


def test_profiles_lists_every_built_in_with_what_it_is_for() -> None:
    """`nsconfine profiles` lists the built-in profiles, each with a description."""
    result = cli("profiles")
    assert result.returncode == 0, result.stderr
    for name in BUILT_IN:
        line = next((line for line in result.stdout.splitlines() if line.startswith(name)), "")
        assert len(line.split(None, 1)) == 2, (name, result.stdout)


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_built_in_profile_builds_a_plan(
    ws_run: tuple[Path, Path], tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every built-in profile gives a plan (with a credential where it asks for one), and each
    entry it adds says which profile added it."""
    bundle = tmp_path / "ca" / "proxy-ca.pem"  # as behind a TLS-intercepting proxy
    bundle.parent.mkdir()
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    open_up(bundle.parent)
    bundle.chmod(0o644)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    needs = name in ("claude-code", "codex")
    plan = session(
        *ws_run, profile=[name], credential=agent_credential(tmp_path) if needs else None
    ).plan()
    added = [e for e in plan.entries if f"[profile {name}]" in e.reason]
    variables = [v for v in plan.env if v.origin == "setenv"]
    # Every bind of it is optional where a host may lack its source (a fresh Debian has no
    # /etc/gitconfig and no JDK): each present here is in the plan, marked as its (or shown by
    # a bind the plan has already), and it marks no other.
    profile = load(name)
    patterns = [
        os.path.expandvars(b.source.replace("{workspace}", str(ws_run[0]))) for b in profile.binds
    ]
    others = [e.source for e in plan.entries if e.kind is Kind.BIND and e not in added]
    for source in (path for pattern in patterns for path in glob.glob(pattern)):
        shown = any(source == other or source.startswith(other + "/") for other in others)
        assert shown or source in {e.source for e in added}, (name, source)
    for entry in added:
        assert any(fnmatch.fnmatchcase(entry.source, p) for p in patterns), (name, entry)
    assert bool(variables) >= bool(profile.values.get("setenv")), name


def test_plan_shows_what_a_profile_adds(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine plan --profile node` shows the values the profile sets."""
    result = cli("plan", *session_options(*ws_run), "--profile", "node")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "NPM_CONFIG_UPDATE_NOTIFIER=false" in result.stdout


def test_an_agent_profile_without_a_credential_refuses(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """claude-code without a credential refuses before anything starts, naming the file it
    looked for."""
    environ = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    result = cli("run", *session_options(*ws_run), "--profile", "claude-code", "--", "/bin/true",
                 env=environ)  # fmt: skip
    assert result.returncode == 78, (result.stdout, result.stderr)
    assert "credential-missing" in result.stderr
    assert str(tmp_path / "cfg" / "nsconfine" / "claude-code.env") in result.stderr


def test_an_agent_gets_nothing_of_the_host_s_claude(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """The claude-code profile binds nothing of the host's ~/.claude; the agent's own state
    lives in its HOME inside the run directory."""
    plan = session(*ws_run, profile=["claude-code"], credential=agent_credential(tmp_path)).plan()
    home = os.path.expanduser("~")
    assert not any(e.source.startswith(f"{home}/.claude") for e in plan.entries)
    assert dict((v.name, v.value) for v in plan.env)["HOME"].startswith(str(ws_run[1]))


@pytest.mark.parametrize("variable", ["OPENAI_API_KEY", "CODEX_API_KEY"])
def test_codex_is_pointed_at_its_route_by_a_generated_config(
    ws_run: tuple[Path, Path], tmp_path: Path, variable: str
) -> None:
    """Codex reads no OPENAI_BASE_URL: the codex profile's plan generates its config.toml,
    read-only in the session's HOME, whose model provider is the openai route on the relay and
    whose key variable is the one holding the placeholder; one without the route (another
    network) is refused, as the key would be in its environment."""
    key_file = agent_credential(tmp_path, f"{variable}=sk-test-codex\n")
    plan = session(*ws_run, profile=["codex"], credential=key_file).plan()
    home = dict((v.name, v.value) for v in plan.env)["HOME"]
    config = next(e for e in plan.entries if e.dest == f"{home}/.codex/config.toml")
    assert config.kind is Kind.DATA
    assert config.mode is Mode.RO
    assert config.content is not None
    text = config.content.decode()
    assert f'base_url = "{route_base_url("openai")}"' in text
    assert f'env_key = "{variable}"' in text
    assert dict((v.name, v.value) for v in plan.env)[variable] == PLACEHOLDER
    assert "sk-test-codex" not in text
    host = session(
        *ws_run, profile=["codex"], credential=key_file, network="host", network_reason="twin"
    )
    with pytest.raises(nsconfine.UsageError, match="inject"):
        host.plan()


@pytest.mark.parametrize("name", ["ws", 'odd "ws" \\ é'])
def test_codex_s_generated_config_trusts_the_workspace(tmp_path: Path, name: str) -> None:
    """Codex's TUI asks whether to trust the folder it starts in, and saves the answer in its
    config.toml, which nsconfine generates read-only: it failed to, and never reached the
    model (agents' pass, stop 44). The config trusts the workspace (nsconfine is the sandbox),
    its path a TOML string whatever it holds."""
    import tomllib

    from helpers import session_dirs

    workspace, run_dir = session_dirs(tmp_path, name, "run")
    key_file = agent_credential(tmp_path, "OPENAI_API_KEY=sk-test-codex\n")
    plan = session(workspace, run_dir, profile=["codex"], credential=key_file).plan()
    home = dict((v.name, v.value) for v in plan.env)["HOME"]
    config = next(e for e in plan.entries if e.dest == f"{home}/.codex/config.toml")
    assert config.content is not None
    parsed = tomllib.loads(config.content.decode())
    assert parsed["projects"] == {str(workspace): {"trust_level": "trusted"}}


# ------------------------------------------------------------------ a profile of one's own


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_profile_file_binds_sets_and_passes(
    ws_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile's binds (with reasons), literal values and passed names reach the session;
    command-line options add to it."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "table.csv").write_text("a,b\n")
    open_up(data)
    (data / "table.csv").chmod(0o644)
    profile = write_profile(
        tmp_path,
        f"""
description = "a test profile"
pass_env = ["NSC_TEST_PASSED"]
network = "none"

[setenv]
NSC_TEST_LITERAL = "literal"

[[bind]]
source = "{data}"
mode = "ro"
reason = "the data the runner reads"
""",
    )
    monkeypatch.setenv("NSC_TEST_PASSED", "passed")
    plan = session(*ws_run, profile=[str(profile)], setenv={"NSC_TEST_CLI": "cli"}).plan()
    assert plan.network == "none"
    entry = next(e for e in plan.entries if e.dest == str(data))
    assert entry.mode is Mode.RO
    assert "the data the runner reads" in entry.reason
    _status, output = sh(
        plan, f"cat {data}/table.csv; echo $NSC_TEST_LITERAL $NSC_TEST_PASSED $NSC_TEST_CLI"
    )
    assert "a,b" in output
    assert "literal passed cli" in output, output


def test_command_line_options_win_over_the_profile(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A scalar given on the command line (network) overrides the profile's."""
    profile = write_profile(tmp_path, 'description = "x"\nnetwork = "none"\n')
    given = session(*ws_run, profile=[str(profile)], network="host", network_reason="given")
    assert given.plan().network == "host"


def test_a_profile_cannot_bind_a_denied_path(ws_run: tuple[Path, Path], tmp_path: Path) -> None:
    """A profile's binds pass the same lint: a home's credential store is refused."""
    home = os.path.expanduser("~")
    profile = write_profile(
        tmp_path,
        f'description = "x"\n[[bind]]\nsource = "{home}/.ssh"\nmode = "ro"\nreason = "keys"\n',
    )
    with pytest.raises(nsconfine.PlanError, match=r"\.ssh"):
        session(*ws_run, profile=[str(profile)]).plan()


@pytest.mark.parametrize("holds", ["workspace", "another bind", "a file there", "a link there"])
def test_a_read_only_bind_holding_a_place_its_source_lacks_is_refused(
    tmp_path: Path, holds: str
) -> None:
    """A profile's read-only bind above another entry's place (the workspace, another bind),
    from a source that has no such place, or a file or a link where the workspace's
    directory would be: bwrap could not make the mount point in a read-only bind, and the
    launch failed as if bwrap could not confine (attacker's pass and its review, stop 41).
    Refused when the plan is built, naming both; from a source that holds the place (the
    very directory), it is not."""
    outer, other, data = tmp_path / "outer", tmp_path / "other", tmp_path / "data"
    (workspace,) = session_dirs(outer, "ws")
    (run_dir,) = session_dirs(tmp_path, "run")  # (not in outer: only the workspace's place)
    other.mkdir()
    data.mkdir()
    if holds == "a file there":
        (other / "ws").write_text("")
    elif holds == "a link there":
        (other / "ws").symlink_to(workspace)
    text = 'description = "x"\n'
    if holds == "another bind":
        text += f'[[bind]]\nsource = "{data}"\ndest = "/srv/x/data"\nmode = "ro"\nreason = "d"\n'
    dest = "/srv/x" if holds == "another bind" else outer

    def planned(source: Path) -> nsconfine.Plan:
        bind = f'[[bind]]\nsource = "{source}"\ndest = "{dest}"\nmode = "ro"\nreason = "o"\n'
        profile = write_profile(tmp_path, text + bind)
        return session(workspace, run_dir, profile=[str(profile)]).plan()

    with pytest.raises(nsconfine.PlanError, match="mount point") as refused:
        planned(other)
    assert str(dest) in str(refused.value)
    if holds != "another bind":
        assert attempt(planned(outer), "true") == (0, "")


@pytest.mark.parametrize("there", ["nothing", "another link", "the very link"])
def test_a_read_only_bind_holding_a_link_the_plan_makes_is_judged(
    tmp_path: Path, there: str
) -> None:
    """A profile's read-only bind of a directory at /etc, where the plan makes its own link
    (/etc/localtime): bwrap can make no link in a read-only bind ("Read-only file system"),
    nor over another one ("File exists"), and the launch failed as if bwrap could not
    confine (the review of 921ecbb, stop 41). Refused at plan time, unless the very link is
    there."""
    from nsconfine._plan import model as p
    from nsconfine._session import _refuse_mount_points_a_bind_lacks

    source = tmp_path / "etc"
    source.mkdir()
    if there != "nothing":
        (source / "localtime").symlink_to("/usr/share/zoneinfo/" + (
            "Etc/UTC" if there == "the very link" else "Europe/Paris"))  # fmt: skip
    holder = p.ro_bind(str(source), "/etc", "a profile's /etc")
    link = p.symlink("/usr/share/zoneinfo/Etc/UTC", "/etc/localtime", "the time zone")
    if there == "the very link":
        _refuse_mount_points_a_bind_lacks([holder], [link])
    else:
        with pytest.raises(nsconfine.PlanError, match="symlink"):
            _refuse_mount_points_a_bind_lacks([holder], [link])


@pytest.mark.parametrize(
    ("dest", "network"),
    [
        ("/run/nsconfine/proxy", "proxy"),
        ("/run/nsconfine/proxy", None),
        ("/run/nsconfine/proxy/socket", "proxy"),
        ("/run/nsconfine", None),
        ("/run", "proxy"),
    ],
)
def test_a_profile_s_bind_at_nsconfine_s_own_place_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path, dest: str, network: str | None
) -> None:
    """/run/nsconfine is nsconfine's own: a proxy session's relay is bound at
    /run/nsconfine/proxy at each launch. A profile's bind there took the relay's place, and the
    session's traffic went to whatever socket it held, past the allowlist the manifest showed
    (attacker's pass, stop 41); one above it, in a proxy session, would hold the place the
    relay is bound at. Each is refused, naming the place."""
    (other := tmp_path / "other").mkdir()
    text = f'description = "x"\n[[bind]]\nsource = "{other}"\ndest = "{dest}"\n'
    profile = write_profile(tmp_path, text + 'mode = "ro"\nreason = "mine"\n')
    allow = ["pypi.org:443"] if network else []
    with pytest.raises(nsconfine.PlanError, match="/run/nsconfine"):
        session(*ws_run, profile=[str(profile)], network=network, allow_hosts=allow).plan()


@pytest.mark.parametrize(
    ("source", "dest", "mode"),
    [("/etc/hostname", "/etc/passwd", "ro"), ("{other}", "{workspace}", "rw"), ("/", "/", "ro")],
)
def test_a_profile_s_bind_at_a_place_the_plan_holds_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path, source: str, dest: str, mode: str
) -> None:
    """A profile's bind whose destination the plan already holds, of another source or in
    another mode, is refused: it was left out without a word, so the manifest a reviewer
    read lacked a bind the profile's author asked for. The very bind given again is not."""
    (other := tmp_path / "other").mkdir()
    text = f'description = "x"\n[[bind]]\nsource = "{source}"\ndest = "{dest}"\n'
    text += f'mode = "{mode}"\nreason = "mine"\n'
    profile = write_profile(tmp_path, text.replace("{other}", str(other)))
    with pytest.raises(nsconfine.PlanError, match="in the plan already"):
        session(*ws_run, profile=[str(profile)]).plan()
    again = 'description = "x"\n[[bind]]\nsource = "/usr"\nmode = "ro"\nreason = "again"\n'
    plan = session(*ws_run, profile=[str(write_profile(tmp_path, again, "again.toml"))]).plan()
    assert [e.reason for e in plan.entries if e.dest == "/usr"] != ["again"]


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ('description = "x"\nnetwork = "everywhere"\n', 2, "network"),
        ('description = "x"\n\n[[bind]]\nsource = "/usr"\nmode = "ro"\n', 3, "reason"),
        # A reason of blanks says no more than none (attacker's pass, stop 39: accepted, and
        # the manifest row read only "[profile mine]").
        (
            'description = "x"\n[[bind]]\nsource = "/usr"\nmode = "ro"\nreason = " \t"\n',
            2,
            "reason",
        ),
        (
            'description = "x"\n[[bind]]\nsource = "/usr"\nmode = "ro"\nreason = "\u3164"\n',
            2,
            "reason",
        ),
        ('description = "x"\nunknown_key = 1\n', 2, "unknown_key"),
        ('description = "x"\nenv = "NOT_A_LIST"\n', 2, "env"),
        ('description = "x"\n[[bind]]\nsource = "/usr"\nmode = "rx"\nreason = "r"\n', 4, "mode"),
        ('description = "x"\nnetwork = \n', 2, ""),
    ],
)
def test_profile_errors_name_the_file_line_and_key(
    ws_run: tuple[Path, Path], tmp_path: Path, text: str, line: int, key: str
) -> None:
    """A malformed profile is a usage error naming the file, the line and the key: never a
    traceback, and nothing runs."""
    profile = write_profile(tmp_path, text)
    result = cli("run", *session_options(*ws_run), "--profile", str(profile), "--", "/bin/true")
    assert result.returncode == 64, (result.stdout, result.stderr)
    assert str(profile) in result.stderr
    assert f"line {line}" in result.stderr
    assert key in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "key", "code"),
    [
        ("inject = ['x']\n", "inject", 64),
        ("git_identity = 'x'\n", "git_identity", 64),
        ("allow_nested_userns = ''\n", "allow_nested_userns", 64),
        ("network = 'host'\n", "network", 64),
        ("protect = ['../../etc']\n", "protect", 65),
        ("unprotect = ['no-such-name']\n", "unprotect", 65),
        ("network = 'none'\ninject = ['anthropic']\n", "inject", 64),
    ],
)
def test_a_value_a_profile_gives_wrongly_is_refused_by_its_file_line_and_key(
    ws_run: tuple[Path, Path], tmp_path: Path, text: str, key: str, code: int
) -> None:
    """A value of the right type that the session refuses, given by a profile (included by
    another, as a user meets it), is refused naming that file, its line and its key, not a
    command-line flag the user never gave (attacker's pass, stop 40)."""
    inner = write_profile(tmp_path, f'description = "inner"\n{text}', "inner.toml")
    outer = write_profile(tmp_path, f'description = "outer"\ninclude = ["{inner}"]\n')
    result = cli("plan", *session_options(*ws_run), "--profile", str(outer))
    assert result.returncode == code, (result.stdout, result.stderr)
    line = text.splitlines().index(next(t for t in text.splitlines() if t.startswith(key))) + 2
    assert f"{inner}, line {line}, key {key}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_an_unknown_profile_name_is_refused(ws_run: tuple[Path, Path]) -> None:
    """A name that is neither built in nor a file is refused, listing the built-in ones."""
    with pytest.raises(nsconfine.UsageError, match="claude-code"):
        session(*ws_run, profile=["no-such-profile"]).plan()


def test_include_cycles_are_refused(ws_run: tuple[Path, Path], tmp_path: Path) -> None:
    """Profiles that include each other are refused, not followed forever."""
    a = write_profile(tmp_path, f'description = "a"\ninclude = ["{tmp_path}/b.toml"]\n', "a.toml")
    write_profile(tmp_path, f'description = "b"\ninclude = ["{a}"]\n', "b.toml")
    with pytest.raises(nsconfine.UsageError, match="include"):
        session(*ws_run, profile=[str(a)]).plan()


def test_a_chain_of_includes_too_deep_is_refused(ws_run: tuple[Path, Path], tmp_path: Path) -> None:
    """Profiles that include one another 1,000 deep are refused on one line, not followed
    until Python's recursion limit; 32 deep are taken (the twin)."""
    for depth in range(1000):
        include = f'include = ["p{depth + 1}.toml"]\n' if depth < 999 else ""
        write_profile(tmp_path, f'description = "p{depth}"\n{include}', f"p{depth}.toml")
    with pytest.raises(nsconfine.UsageError, match="includes more than 32 deep"):
        session(*ws_run, profile=[str(tmp_path / "p0.toml")]).plan()
    assert session(*ws_run, profile=[str(tmp_path / "p968.toml")]).plan()


def test_a_number_past_what_python_reads_is_a_usage_error(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A profile's integer of 5,000 digits (tomllib refuses it with a ValueError) is refused as
    the profile's error."""
    profile = write_profile(tmp_path, f'description = "d"\n[limits]\nprocesses = {"9" * 5000}\n')
    with pytest.raises(nsconfine.UsageError, match="not valid TOML"):
        session(*ws_run, profile=[str(profile)]).plan()


def test_a_profile_that_is_not_utf8_is_a_usage_error(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A profile with a byte that is not UTF-8 (TOML is UTF-8) is refused, naming its line: it
    was read with U+FFFD in the byte's place, so `mask = ["{workspace}/cl\\xe9.env"]` masked
    a name no file had and the real file stayed readable, the manifest saying only that the
    mask matched nothing (attacker's pass, stop 42)."""
    profile = write_profile(tmp_path, "")
    profile.write_bytes(b'description = "d"\nmask = ["{workspace}/cl\xe9.env"]\n')
    with pytest.raises(nsconfine.UsageError, match=r"mine.toml, line 2: not UTF-8"):
        session(*ws_run, profile=[str(profile)]).plan()


# ------------------------------------------------------------------ the roles


# coder as it was: without tls and jvm (the twin of the tests below)
CODER_BEFORE = ["git", "node", "python"]


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
@pytest.mark.parametrize("profiles", [["coder"], CODER_BEFORE], ids=["coder", "without-jvm"])
def test_javac_and_maven_run_in_a_coder_session(
    ws_run: tuple[Path, Path], profiles: list[str]
) -> None:
    """coder includes jvm: javac compiles and runs a class and `mvn -v` answers (their
    configuration is in /etc, which /usr links into); without it, both fail."""
    if not (shutil.which("javac") and shutil.which("mvn")):
        pytest.skip("no JDK and Maven on this host")
    script = (
        "cd /tmp && printf 'class A { public static void main(String[] a) "
        '{ System.out.println("java ok"); } }\\n\' > A.java && javac A.java && java -cp . A; '
        "mvn -v"
    )
    status, output = sh(session(*ws_run, profile=profiles).plan(), script)
    if profiles == ["coder"]:
        assert "java ok" in output, output
        assert "Apache Maven" in output, output
        assert status == 0, output
    else:
        assert "java ok" not in output, output
        assert status != 0, output


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
@pytest.mark.parametrize("profiles", [["coder"], CODER_BEFORE], ids=["coder", "without-tls"])
def test_tls_verifies_against_ssl_cert_file_in_a_coder_session(
    ws_run: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    profiles: list[str],
) -> None:
    """coder includes tls: python's default verification (as requests and uv do it) trusts the
    CA SSL_CERT_FILE names, outside the default store, as behind a TLS-intercepting proxy;
    without tls, CERTIFICATE_VERIFY_FAILED."""
    (ca_dir := tmp_path / "ca").mkdir()
    local_ca = make_local_ca(ca_dir, ["localhost"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(local_ca.cert, local_ca.key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(connection, server_side=True) as tls:
                    tls.sendall(b"hello over tls\n")
            except (OSError, ssl.SSLError):
                pass

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    monkeypatch.setenv("SSL_CERT_FILE", str(local_ca.ca))
    client = (
        "import socket, ssl\n"
        "context = ssl.create_default_context()\n"
        "try:\n"
        f"    raw = socket.create_connection(('127.0.0.1', {port}))\n"
        "    with context.wrap_socket(raw, server_hostname='localhost') as tls:\n"
        "        print('verified', tls.recv(100).decode().strip())\n"
        "except ssl.SSLError as error:\n"
        "    print('refused', error.reason)\n"
    )
    try:
        shared = session(
            *ws_run, profile=profiles, network="host", network_reason="the test's TLS server"
        )
        _status, output = run(shared.plan(), ["python3", "-c", client])
    finally:  # shutdown, not close alone, ends the accept() the server thread waits in
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        server.join(60)
    if profiles == ["coder"]:
        assert "verified hello over tls" in output, output
    else:
        assert "refused CERTIFICATE_VERIFY_FAILED" in output, output


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_the_reviewer_reads_the_workspace_and_writes_only_its_notes(
    ws_run: tuple[Path, Path],
) -> None:
    """reviewer: the workspace is read-only, but for its notes."""
    workspace = ws_run[0]
    (workspace / "code.py").write_text("print(1)\n")
    from helpers import give_to_session_user

    give_to_session_user(workspace)
    plan = session(*ws_run, profile=["reviewer"]).plan()
    workspace_entry = next(e for e in plan.entries if e.dest == str(workspace))
    assert workspace_entry.mode is Mode.RO
    _status, output = sh(
        plan,
        f"cat {workspace}/code.py; (echo x >> {workspace}/code.py) 2>&1; "
        f"echo looked > {workspace}/notes/review.md && echo NOTED",
    )
    assert "print(1)" in output
    assert "NOTED" in output, output
    assert (workspace / "code.py").read_text() == "print(1)\n"
    assert (workspace / "notes" / "review.md").read_text() == "looked\n"
    assert any(e.kind is Kind.BIND and e.mode is Mode.RW and e.dest.endswith("/notes")
               for e in plan.entries)  # fmt: skip


def test_a_made_directory_is_never_made_through_a_swapped_symlink(
    ws_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mkdir = true makes the directory only where its parent was checked to be: a directory
    on the way swapped for a symlink after the check (a concurrent session's race, forced
    here by making the check see no symlink) refuses the plan, and nothing is made through
    it (a root launcher would have made, and given away, a directory anywhere)."""
    import nsconfine._session

    workspace = ws_run[0]
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "b").mkdir(parents=True)
    (workspace / "a").symlink_to(elsewhere)
    profile = write_profile(
        tmp_path,
        """
description = "a test profile"
workspace_mode = "ro"

[[bind]]
source = "{workspace}/a/b/notes"
mode = "rw"
reason = "notes"
mkdir = true
""",
    )
    monkeypatch.setattr(nsconfine._session, "realpath", lambda path: path)  # the check passes
    with pytest.raises(nsconfine.PlanError, match="cannot be made"):
        session(*ws_run, profile=[str(profile)]).plan()
    assert not (elsewhere / "b" / "notes").exists()


@pytest.mark.root  # only a root launcher gives the directory it made away
def test_a_directory_renamed_over_a_made_one_is_not_given_away(
    ws_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root launcher gives the directory mkdir = true made to the session's account. A
    root-owned directory renamed over it the moment it was made (a session can rename one that
    lies where it writes) was given away with what it held; it is refused and kept."""
    workspace = ws_run[0]
    held = workspace / "held"
    (held / "inside").mkdir(parents=True)  # root's, in the session's workspace
    profile = write_profile(
        tmp_path,
        """
description = "a test profile"
workspace_mode = "ro"

[[bind]]
source = "{workspace}/notes"
mode = "rw"
reason = "notes"
mkdir = true
""",
    )
    made = os.mkdir

    def mkdir_then_rename(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        made(path, mode, dir_fd=dir_fd)
        if path == "notes" and dir_fd is not None:
            os.rename(held, workspace / "notes")

    monkeypatch.setattr(os, "mkdir", mkdir_then_rename)
    with pytest.raises(nsconfine.PlanError, match="replaced while it was made"):
        session(*ws_run, profile=[str(profile)]).plan()
    monkeypatch.undo()
    assert (workspace / "notes").stat().st_uid == 0
    assert (workspace / "notes" / "inside").stat().st_uid == 0


def test_an_include_by_file_name_is_found_beside_the_including_file(
    ws_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """include = ["base.toml"] names the file beside the profile that includes it, never one
    in the launcher's working directory (which may be a workspace, and its base.toml the
    session's)."""
    roles, planted = tmp_path / "roles", tmp_path / "cwd"
    roles.mkdir()
    planted.mkdir()
    write_profile(roles, 'description = "base"\n[setenv]\nNSC_FROM = "beside"\n', "base.toml")
    write_profile(planted, 'description = "planted"\n[setenv]\nNSC_FROM = "cwd"\n', "base.toml")
    role = write_profile(roles, 'description = "role"\ninclude = ["base.toml"]\n', "role.toml")
    monkeypatch.chdir(planted)
    plan = session(*ws_run, profile=[str(role)]).plan()
    assert {v.name: v.value for v in plan.env}["NSC_FROM"] == "beside"


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_profile_that_is_no_regular_file_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path, kind: str
) -> None:
    """A profile (or an include) that is a FIFO or /dev/zero: refused by what it is, where the
    launcher hung on the FIFO, or read /dev/zero until MemoryError."""
    if kind == "fifo":
        profile = tmp_path / "role.toml"
        os.mkfifo(profile)
    else:
        profile = write_profile(tmp_path, 'description = "r"\ninclude = ["/dev/zero"]\n')
    outcome = outcome_without_hanging(
        lambda: session(*ws_run, profile=[str(profile)]).plan(), "the profile"
    )
    assert isinstance(outcome, nsconfine.UsageError), outcome
    assert "regular file" in str(outcome)


def test_a_workspace_path_is_a_path_in_a_profile_s_bind_not_a_pattern(tmp_path: Path) -> None:
    """reviewer's {workspace}/notes with a workspace at r[1]/ws: the notes of r[1]/ws, never
    those of r1/ws, another session's, which the glob the path made matched (an attacker's
    pass: bound read-write, read and written); and a $ in the workspace's own path is not a
    variable."""
    other_ws, _other_run = session_dirs(tmp_path / "r1", "ws", "run")
    (other_ws / "notes").mkdir()
    workspace, run_dir = session_dirs(tmp_path / "r[1]", "ws", "run")
    plan = session(workspace, run_dir, profile=["reviewer"]).plan()
    notes = [e.source for e in plan.entries if e.kind is Kind.BIND and e.mode is Mode.RW]
    assert str(other_ws / "notes") not in notes, notes
    assert str(workspace / "notes") in notes, notes
    dollar_ws, dollar_run = session_dirs(tmp_path / "$HOME", "ws", "run")
    dollar = session(dollar_ws, dollar_run, profile=["reviewer"]).plan()
    assert str(dollar_ws / "notes") in [e.source for e in dollar.entries], dollar.manifest()


@pytest.mark.parametrize("where", ["workspace", "run-dir", "include", "symlink"])
def test_a_profile_a_session_could_write_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path, where: str
) -> None:
    """A profile (or a file it includes) in the session's workspace or run directory, or a
    path that leads there: the session could rewrite what its next launch is given (a
    read-write bind of another workspace, the host's network, the launcher's variables), so
    the plan is refused, and `run` runs nothing. Found by an attacker's pass: a session
    rewrote its own --profile and the next launch bound ~/.bashrc read-write."""
    workspace, run_dir = ws_run
    inside = write_profile(run_dir if where == "run-dir" else workspace, 'description = "x"\n')
    profile = inside
    if where == "include":
        profile = write_profile(tmp_path, f'description = "y"\ninclude = ["{inside}"]\n', "y.toml")
    elif where == "symlink":
        profile = tmp_path / "linked.toml"
        profile.symlink_to(inside)
    # (As root the workspace is the session account's: the profile is refused as a file
    # another account could change, before its place is looked at.)
    refused = r"profile .* (lies inside the writable bind|could change it)"
    with pytest.raises(nsconfine.PlanError, match=refused):
        session(*ws_run, profile=[str(profile)]).plan()
    result = cli("run", *session_options(*ws_run), "--profile", str(profile), "--",
                 "/bin/sh", "-c", f"touch {workspace}/ran")  # fmt: skip
    assert result.returncode == 65, (result.stdout, result.stderr)
    assert re.search(refused, result.stderr), result.stderr
    assert not (workspace / "ran").exists()


def _posix_acl(*entries: tuple[int, int, int]) -> bytes:
    """A system.posix_acl_access value: (tag, permissions, id) entries after its version."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


@pytest.mark.parametrize(
    "how",
    [
        "owned",
        "directory-owned",
        "symlink-in-theirs",
        "group-writable",
        "writable-by-all",
        "acl",
        "hardlink",
    ],
)
def test_a_profile_another_account_could_change_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path, how: str
) -> None:
    """A profile only root or the launcher's own account can change, as nsconfine's programs
    are: not one another account owns (as root, the session's), nor one in a directory it
    owns, nor one reached through a symlink in such a directory (re-pointed, it chose which of
    root's profiles applied), nor one a group not the launcher's may write, by the bits or an
    ACL, nor one with a second name (a hardlink a session could write through). Attackers'
    passes found each; the twin, the same profile root's alone, is taken."""
    other = session_uid() if IS_ROOT else 65534  # (an unprivileged launcher: nobody's)
    admin = tmp_path / "admin"
    admin.mkdir()
    profile = write_profile(admin, 'description = "x"\n')
    session(*ws_run, profile=[str(profile)]).plan()  # the twin
    given = profile
    if how == "owned" and IS_ROOT:
        os.chown(profile, other, -1)
    elif how == "directory-owned" and IS_ROOT:
        os.chown(admin, other, -1)
    elif how == "symlink-in-theirs" and IS_ROOT:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        (theirs / "profiles").symlink_to(admin)
        os.chown(theirs, other, -1)
        given = theirs / "profiles" / profile.name
    elif how == "group-writable" and IS_ROOT:
        os.chown(admin, -1, 65534)  # nogroup: no group of the launcher's
        admin.chmod(0o775)
    elif how == "writable-by-all":
        admin.chmod(0o777)
    elif how == "acl":
        user, user_obj, group_obj, mask, others = 2, 1, 4, 0x10, 0x20
        acl = _posix_acl((user_obj, 7, 0xFFFFFFFF), (user, 7, 65534),
                         (group_obj, 5, 0xFFFFFFFF), (mask, 7, 0xFFFFFFFF),
                         (others, 5, 0xFFFFFFFF))  # fmt: skip
        os.setxattr(admin, "system.posix_acl_access", acl)
    elif how == "hardlink":
        os.link(profile, tmp_path / "second.toml")
    else:
        pytest.skip("an unprivileged launcher cannot give its files to another account")
    with pytest.raises(nsconfine.PlanError, match=r"could change it|names"):
        session(*ws_run, profile=[str(given)]).plan()


def test_a_profile_root_s_own_links_lead_to_is_taken(
    ws_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the trust check must not refuse (an attacker's pass over it): a profile reached
    through a symlink in a directory only root (or the launcher) may write, as stow or a
    `current -> release` link make (a symlink's own mode, 0777, was taken as writable by all);
    and a built-in profile with a second name, as an installer that links files from its
    cache (uv) leaves them."""
    real = tmp_path / "release"
    real.mkdir()
    write_profile(real, 'description = "x"\n')
    (tmp_path / "current").symlink_to(real)
    session(*ws_run, profile=[str(tmp_path / "current" / "mine.toml")]).plan()
    from nsconfine._plan import profiles

    built_in = tmp_path / "built-in"
    shutil.copytree(profiles.BUILT_IN_DIRECTORY, built_in)
    os.link(built_in / "git.toml", tmp_path / "cached-git.toml")
    monkeypatch.setattr(profiles, "BUILT_IN_DIRECTORY", str(built_in))
    session(*ws_run, profile=["git"]).plan()


def test_a_group_another_account_is_in_is_not_the_launcher_s_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launcher's group is trusted as its own only when no other account is in it: a
    launcher whose group is shared (nogroup, users) had a profile another member rewrote
    (an attacker's pass: _apt, whose group nogroup is nobody's too)."""
    import grp
    import pwd

    from nsconfine._kernel import accounts

    me = accounts.launcher_account().name
    shared = grp.struct_group(("shared", "x", 4242, [me, "someone"]))
    own = grp.struct_group(("own", "x", 4243, [me]))
    groups = {4242: shared, 4243: own}
    monkeypatch.setattr(grp, "getgrgid", lambda gid: groups[gid])
    monkeypatch.setattr(pwd, "getpwall", list)
    accounts._private_groups.clear()
    assert not accounts._private_group(4242)
    assert accounts._private_group(4243)
    accounts._private_groups.clear()


# ------------------------------------------------------------------ paths a profile gives


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
@pytest.mark.parametrize("form", ["{workspace}", "$NSC_T15_DATA", "~"])
def test_a_profile_s_deny_rule_is_expanded_like_its_binds(
    ws_run: tuple[Path, Path], tmp_path: Path, form: str
) -> None:
    """A deny entry naming {workspace}, $NAME or ~ denies that path, not one of that name
    under the launcher's working directory: the bind that would show it is refused, and the
    secret behind it is not read."""
    data = tmp_path / "data"
    data.mkdir()
    open_up(data)
    secret = (ws_run[0] if form == "{workspace}" else data) / "secret.txt"
    secret.write_text("T15-SECRET\n")
    secret.chmod(0o644)
    profile = write_profile(tmp_path, f'description = "x"\ndeny = ["{form}/secret.txt"]\n')
    environ = {**os.environ, "NSC_T15_DATA": str(data), "HOME": str(data)}
    ro = [] if form == "{workspace}" else ["--ro", str(secret)]
    result = cli(
        "run", *session_options(*ws_run), *ro, "--profile", str(profile), "--",
        "/bin/cat", str(secret), env=environ,
    )  # fmt: skip
    assert "T15-SECRET" not in result.stdout, result.stdout
    assert result.returncode == 65, (result.returncode, result.stderr)
    assert "secret.txt" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ('description = "x"\ndeny = ["secret.txt"]\n', 2, "deny"),
        ('description = "x"\n\ncredential = "agent.env"\n', 3, "credential"),
        ('description = "x"\n[[bind]]\nsource = "data"\nmode = "ro"\nreason = "r"\n', 3,
         "source"),
        ('description = "x"\n[[bind]]\nsource = "/usr"\ndest = "usr"\nmode = "ro"\n'
         'reason = "r"\n', 4, "dest"),
    ],
)  # fmt: skip
def test_a_relative_path_in_a_profile_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path, text: str, line: int, key: str
) -> None:
    """A path in a profile that is neither absolute nor one of the expanded forms is a usage
    error naming the file, the line and the key, never a path under the launcher's working
    directory."""
    profile = write_profile(tmp_path, text)
    result = cli("run", *session_options(*ws_run), "--profile", str(profile), "--", "/bin/true")
    assert result.returncode == 64, (result.returncode, result.stderr)
    assert str(profile) in result.stderr
    assert f"line {line}" in result.stderr
    assert f"key {key}" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_deny_rule_that_matches_nothing_says_so(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A profile's deny rule whose variable is unset, or whose path does not exist, is shown as
    matching nothing now, in the manifest's text and its JSON; one that matches is not."""
    present = tmp_path / "present"
    present.mkdir()
    profile = write_profile(
        tmp_path,
        f'description = "x"\ndeny = ["$NSC_T15_UNSET/token", "{tmp_path}/absent/token", '
        f'"{present}"]\n',
    )
    environ = {k: v for k, v in os.environ.items() if k != "NSC_T15_UNSET"}
    text = cli("plan", *session_options(*ws_run), "--profile", str(profile), env=environ)
    assert text.returncode == 0, text.stderr
    lines = {line.split()[0]: line for line in text.stdout.splitlines() if "[from profile" in line}
    assert "(matches nothing now" in lines["$NSC_T15_UNSET/token"], text.stdout
    assert "(matches nothing now" in lines[f"{tmp_path}/absent/token"], text.stdout
    assert "matches nothing" not in lines[str(present)], text.stdout
    shown = cli("plan", *session_options(*ws_run), "--profile", str(profile), "--json", env=environ)
    rules = {rule["path"]: rule for rule in json.loads(shown.stdout)["deny"]}
    assert rules["$NSC_T15_UNSET/token"]["matches_now"] is False
    assert rules[f"{tmp_path}/absent/token"]["matches_now"] is False
    assert rules[str(present)]["matches_now"] is True


@pytest.mark.parametrize("key", ["deny", "mask", "protect"])
def test_a_profile_s_path_past_what_the_kernel_resolves_is_refused(
    ws_run: tuple[Path, Path], tmp_path: Path, key: str
) -> None:
    """A profile's path of 4,096 bytes or more is refused as the Session's own are (a deny of
    20,000 components was taken, at a cost growing with the square of its depth: found by the
    review of the Session's check)."""
    deep = "/x" + "/a" * 2100 if key != "protect" else "xx" + "/a" * 2100  # (names: relative)
    profile = write_profile(tmp_path, f'description = "deep"\n{key} = ["{deep}"]\n')
    with pytest.raises(nsconfine.UsageError, match="holds a path of 4,202 bytes"):
        session(*ws_run, profile=[str(profile)]).plan()


@pytest.mark.root  # a directory the session's account cannot reach: the launcher must be root
def test_a_profile_bind_the_session_s_account_cannot_reach_is_refused_by_name(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """bwrap binds as the session's account: a profile's bind of a path that account cannot
    reach passed `plan` and failed `run` with bwrap's "Can't find source path /proc/self/fd/40"
    and a message about process limits, neither naming it (attacker's pass, stop 39). Refused
    when the plan is made, by name, as a --ro path is."""
    hidden = tmp_path / "hidden"
    (hidden / "tools").mkdir(parents=True)
    hidden.chmod(0o700)
    (tmp_path / "profiles").mkdir()
    text = f'description = "x"\n[[bind]]\nsource = "{hidden}/tools"\nmode = "ro"\nreason = "x"\n'
    profile = write_profile(tmp_path / "profiles", text)
    result = cli("plan", *session_options(*ws_run), "--profile", str(profile))
    assert result.returncode == 65, (result.stdout, result.stderr)
    assert f"{hidden}/tools cannot be given to the session" in result.stderr


def test_a_profile_bind_into_a_missing_place_in_the_workspace_says_to_make_it(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A profile's bind whose destination is a path not (yet) in the workspace: every launch
    was refused with "is missing since its plan was built: build the plan again", though `run`
    had just built it and nothing had changed (attacker's pass, stop 39). The refusal says to
    make it."""
    source = tmp_path / "cache"
    source.mkdir()
    give_to_session_user(source)
    (tmp_path / "profiles").mkdir()
    text = (
        f'description = "x"\n[[bind]]\nsource = "{source}"\ndest = "{{workspace}}/newdir"\n'
        'mode = "rw"\nreason = "the tool cache"\n'
    )
    profile = write_profile(tmp_path / "profiles", text)
    result = cli("run", *session_options(*ws_run), "--profile", str(profile), "--", "true")
    assert result.returncode in (65, 69), (result.stdout, result.stderr)
    assert "build the plan again" not in result.stderr
    assert "create it" in result.stderr, result.stderr
