"""Session's keywords refuse a value of the wrong shape by name (nsconfine/_arguments.py): a bare
string where a list is meant (Python would take it letter by letter), a mapping where names are
meant (its values dropped), a path where a Bind is meant, a choice not on its list. (That any
value for any keyword is a clear error or a correct plan is tests/test_properties.py's.)"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, session, session_options

import nsconfine
from nsconfine import Bind, RunAs, UsageError


class _BytesPath:
    """An os.PathLike whose path is bytes, which no other keyword takes."""

    def __fspath__(self) -> bytes:
        return b"/usr"

    def __repr__(self) -> str:
        return "_BytesPath()"


@pytest.mark.parametrize(
    ("keyword", "value", "said"),
    [
        ("deny", "/srv/data", "Session(deny=...) is a list: give ['/srv/data']"),
        ("ro", "/usr", "Session(ro=...) is a list: give ['/usr']"),
        ("ro", Path("/usr"), "Session(ro=...) is a list"),
        ("mask", "/etc", "Session(mask=...) is a list"),
        ("protect", ".envrc", "Session(protect=...) is a list"),
        ("harness", "/bin/sh", "Session(harness=...) is a list"),
        ("allow_hosts", "pypi.org", "Session(allow_hosts=...) is a list"),
        ("inject", "openai", "Session(inject=...) is a list"),
        ("pass_env", "TERM", "Session(pass_env=...) is a list"),
        ("pass_env", {"FOO": "bar"}, "for values, give setenv={...}"),
        ("pass_env", ["TERM", 3], "each item is a str, not 3"),
        ("pass_env", ["FOO=bar"], "pass_env (--pass-env) 'FOO=bar' is not a variable name"),
        ("binds", ["/opt/x"], "give nsconfine.Bind(source, dest, mode, reason)"),
        ("setenv", "A=b", "Session(setenv=...) is a list"),
        ("setenv", [("A", "b", "c")], "is not a (name, value) pair"),
        ("limits", "processes=5", "Session(limits=...) is a list"),
        ("network", "nonee", "Session(network='nonee'): it is one of none, proxy, host"),
        ("home_mode", "tmp", "Session(home_mode='tmp'): it is one of persist, fresh"),
        ("workspace_mode", "w", "Session(workspace_mode='w'): it is one of rw, ro"),
        ("terminal_env", "no", "Session(terminal_env=...) is True or False"),
        ("allow_nested_userns", " ", "allow_nested_userns (--allow-nested-userns) is True"),
        ("allow_nested_userns", "\u3164", "allow_nested_userns (--allow-nested-userns) is True"),
        ("user", True, "Session(user=...): an account name or uid"),
        ("credential", ["/x.env"], "Session(credential=...) is one path"),
        ("tool_socket", 3, "Session(tool_socket=...) is one path"),
        ("network_reason", ["why"], "Session(network_reason=...) is a str"),
        ("setenv", {"A": 1}, "--setenv A: the value is a str, not 1"),
        # a control character would be written into the session's .gitconfig
        ("git_identity", "A\0 <a@example.org>", "give it as 'Name <email@example.org>'"),
        ("git_identity", "A\x1b[31m <a@example.org>", "give it as 'Name <email@example.org>'"),
        ("git_identity", "A <a\x7f@example.org>", "give it as 'Name <email@example.org>'"),
        # "" would name the launcher's working directory
        ("ro", [""], "Session(ro=...) (--ro) holds an empty path"),
        ("deny", [""], "Session(deny=...) (--deny) holds an empty path"),
        ("mask", [Path("/usr"), ""], "Session(mask=...) (--mask) holds an empty path"),
        ("credential", "", "Session(credential=...) (--credential) holds an empty path"),
        ("ro", [_BytesPath()], "Session(ro=...) (--ro): b'/usr' is not a str path"),
        # past what the kernel resolves; each component cost the rules' lint more (a deny of
        # 50,000 took 10 s and 7 GB)
        ("deny", ["/" + "a/" * 2048], "Session(deny=...) (--deny) holds a path of 4,097 bytes"),
        ("ro", ["/" + "é" * 2048], "holds a path of 4,097 bytes"),
        # U+212A, KELVIN SIGN, is 'k' to a case-blind match and no unit (a KeyError)
        ("limits", ["tmp=1\u212a"], "limit tmp: '1\u212a' is not bytes"),
    ],
)
def test_a_value_of_the_wrong_shape_is_refused_by_its_keyword(
    ws_run: tuple[Path, Path], keyword: str, value: object, said: str
) -> None:
    """The refusal is a UsageError naming the keyword and what to give instead."""
    options: dict[str, Any] = {keyword: value}
    with pytest.raises(UsageError) as refused:
        session(*ws_run, **options)
    assert said in str(refused.value)


def test_the_right_shapes_make_the_plan_they_say(ws_run: tuple[Path, Path]) -> None:
    """The twin of the refusals: the same intents in the right shape are taken as meant (a
    single deny path denies that path, not "/"; setenv's value reaches the environment)."""
    bind = Bind("/usr/share/doc", "/opt/doc", "ro", "the docs the test reads")
    plan = session(
        *ws_run,
        deny=["/srv/data"],
        setenv={"FOO": "bar"},
        binds=[bind],
        network="none",
        terminal_env=False,
    ).plan()
    assert any(rule.path == "/srv/data" for rule in plan.deny)
    assert not any(rule.path == "/" for rule in plan.deny)
    assert ("FOO", "bar") in [(v.name, v.value) for v in plan.env]
    assert any(e.dest == "/opt/doc" for e in plan.entries)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (("/usr/share", None, "ro", "docs"), "a Bind's dest is a path"),
        ((3, "/opt", "ro", "docs"), "a Bind's source is a path"),
        (("/usr/share", "/opt", "ro", 5), "a Bind's reason is a str"),
        (("/usr/share", "/opt", "ro", "docs", "yes"), "a Bind's optional is True or False"),
        (("/usr/share", "/opt", "ro", "docs", False, 1), "a Bind's mkdir is True or False"),
        # "" would name the launcher's working directory (attackers' pass, stop 43: it bound it)
        (("", "/opt/x", "ro", "docs"), "a Bind's source holds an empty path"),
        (("/usr/share/doc", "", "ro", "docs"), "a Bind's dest holds an empty path"),
    ],
)
def test_a_bind_of_the_wrong_shape_is_a_usage_error(fields: tuple[Any, ...], said: str) -> None:
    """Bind's fields are checked as it is made (an AttributeError came from deep in the plan's
    build, or none at all)."""
    with pytest.raises(UsageError, match=said):
        Bind(*fields)


def test_a_bind_of_paths_is_taken_as_their_text(ws_run: tuple[Path, Path]) -> None:
    """Bind takes os.PathLike for source and dest, as it says (a Path raised TypeError from deep
    in the plan's build)."""
    bind = Bind(Path("/usr/share/doc"), Path("/opt/doc"), "ro", "the docs the test reads")
    plan = session(*ws_run, binds=[bind]).plan()
    assert any(e.source == "/usr/share/doc" and e.dest == "/opt/doc" for e in plan.entries)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (("agent", -1, 1000), "a RunAs's uid is a whole number from 0 to 4294967294, not -1"),
        (("agent", 1000, 2**32 - 1), "a RunAs's gid is a whole number from 0 to 4294967294"),
        (("agent", True, 1000), "a RunAs's uid is a whole number from 0 to 4294967294, not True"),
        (("agent", 1000, "1000"), "a RunAs's gid is a whole number"),
        ((None, 1000, 1000), "a RunAs's name is a str"),
    ],
)
def test_a_run_as_of_the_wrong_shape_is_a_usage_error(fields: tuple[Any, ...], said: str) -> None:
    """RunAs's fields are checked as it is made: a negative uid raised OverflowError from deep
    in the launch, and True ran the session as uid 1 (attackers' pass)."""
    with pytest.raises(UsageError, match=re.escape(said)):
        RunAs(*fields)


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("user", "nobody", "user is a RunAs (nsconfine.RunAs(name, uid, gid)), not 'nobody'"),
        ("entries", ("x",), "a Plan's entries are Entry records, not 'x'"),
        ("env", [b"/usr"], "a Plan's env is EnvVar records, not b'/usr'"),
        ("deny", ["0"], "a Plan's deny is DenyRule records, not '0'"),
        (
            "chdir",
            Bind("/usr", "/usr", "ro", "tools"),
            "a Plan's chdir is an absolute path (str), not Bind(",
        ),
        ("chdir", "usr", "a Plan's chdir is an absolute path (str), not 'usr'"),
        ("nested_userns", 999, "a Plan's nested_userns is a reason (str) or None, not 999"),
        ("audit", 3, "a Plan's audit is a path (str) or None, not 3"),
        ("limits", {"tmp": 1}, "a Plan's limits is a Limits record, not {'tmp': 1}"),
    ],
)
def test_a_plan_of_the_wrong_shape_is_a_usage_error(
    plan: nsconfine.Plan, field: str, value: object, said: str
) -> None:
    """Plan.replace checks what it is given (an AttributeError came from the gate, or from
    deep in the plan's build, or from a launch's staging: found again by a fuzzing pass)."""
    with pytest.raises(UsageError, match=re.escape(said)):
        plan.replace(**{field: value})


@pytest.mark.parametrize("option", ["--ro", "--mask", "--deny"])
def test_an_empty_path_on_the_command_line_runs_nothing(
    ws_run: tuple[Path, Path], option: str
) -> None:
    """`--ro ""` would bind the launcher's working directory (and run the command with it
    there): a usage error, and nothing runs."""
    marker = ws_run[0] / "ran"
    result = cli("run", *session_options(*ws_run), option, "", "--", "/usr/bin/touch", str(marker))
    assert result.returncode == 64, result
    assert "holds an empty path" in result.stderr, result.stderr
    assert not marker.exists()


def test_explain_and_a_bundle_refuse_an_empty_path(ws_run: tuple[Path, Path]) -> None:
    """`explain ""` and `oci-bundle … ""` would take the working directory, and `selftest
    --user ""` ran as nobody: usage errors."""
    options = session_options(*ws_run)
    for arguments in (["explain", "", *options], ["oci-bundle", *options, ""]):
        result = cli(*arguments)
        assert result.returncode == 64, result
        assert "is empty, which would name the working directory" in result.stderr, result
    result = cli("selftest", "--user", "")
    assert result.returncode == 64, result
    assert "--user is empty" in result.stderr, result


@pytest.mark.parametrize(
    "columns", ["\u00b2", "\u0663", "9" * 5000]
)  # SUPERSCRIPT TWO, ARABIC-INDIC 3, past the digits int() reads
def test_a_width_in_columns_that_is_no_number_is_not_taken(columns: str) -> None:
    """COLUMNS is the host's, an input like any other: '²' is a digit to str.isdigit(), and not
    to int(), and the help and every usage error of the argparse commands ended in a
    traceback (found by a fuzzing pass). Such a width is not taken."""
    environment = {**os.environ, "COLUMNS": columns}
    result = cli("profiles", "--help", env=environment)
    assert result.returncode == 0, result
    assert "Traceback" not in result.stderr, result.stderr
    result = cli("explain", env=environment)
    assert result.returncode == 64, result
    assert "Traceback" not in result.stderr, result.stderr


def test_a_path_of_bytes_that_are_no_utf_8_is_measured_in_bytes(ws_run: tuple[Path, Path]) -> None:
    """A path's length is its bytes as the kernel gets them: a byte that is no UTF-8, held as a
    surrogate escape, is one byte (counted as three, a path of 1,413 bytes was refused as
    4,237: found by the review of the check)."""
    path = "/" + "\udcff" * 1412
    plan = session(*ws_run, deny=[path]).plan()
    assert any(rule.path == path for rule in plan.deny)


def test_explain_refuses_a_path_the_kernel_would_not_take(ws_run: tuple[Path, Path]) -> None:
    """`explain PATH`, PATH past what the kernel resolves (4,095 bytes): a usage error (40,000
    components took explain past 20 s, found by a fuzzing pass)."""
    result = cli("explain", "/" + "a/" * 2048, *session_options(*ws_run))
    assert result.returncode == 64, result
    assert "holds a path of 4,097 bytes" in result.stderr, result.stderr


def test_explain_says_port_0_is_no_port(ws_run: tuple[Path, Path]) -> None:
    """A URL's port 0 is not its scheme's default port (explain said pypi.org:0 was reachable,
    as pypi.org:443, found by a fuzzing pass)."""
    options = ["--network", "proxy", "--allow-host", "pypi.org"]
    result = cli("explain", "https://pypi.org:0/", *session_options(*ws_run), *options)
    assert result.returncode == 1, result
    assert "not reachable: port 0" in result.stdout, result.stdout
    result = cli("explain", "https://pypi.org/", *session_options(*ws_run), *options)
    assert result.returncode == 0, result


@pytest.mark.parametrize(
    "option",
    [["--user", "1" * 4301], ["--network", "proxy", "--allow-host", "pypi.org:" + "1" * 4301]],
    ids=["uid", "port"],
)
def test_a_number_past_what_python_reads_is_a_usage_error(
    ws_run: tuple[Path, Path], option: list[str]
) -> None:
    """Digits past what int() takes from a text (4,300) are refused on one line, exit 64."""
    result = cli("plan", *session_options(*ws_run), *option)  # the last --user counts
    assert result.returncode == 64, result
    assert result.stderr.startswith("nsconfine: usage: "), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (("/usr/bin/true", "zz"), "the digest must be 64 hex digits"),
        (("/usr/bin/true", ""), "the digest must be 64 hex digits"),
        (("/usr/bin/true", 5), "the digest must be 64 hex digits"),
        ((1,), "Harness(path) is a path"),
        ((b"/usr/bin/true",), "Harness(path) is a path"),
    ],
)
def test_a_harness_of_the_wrong_shape_is_a_usage_error(fields: tuple[Any, ...], said: str) -> None:
    """nsconfine.Harness checks its pin when made, as --harness PATH@sha256:HEX does (a bad
    one was refused at launch as "the harness changed")."""
    from nsconfine import Harness

    with pytest.raises(UsageError, match=re.escape(said)):
        Harness(*fields)


def test_a_harness_pin_is_taken_in_either_case() -> None:
    from nsconfine import Harness

    assert Harness("/usr/bin/true", "AB" * 32).sha256 == "ab" * 32
