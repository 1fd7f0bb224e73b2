"""The credential file: systemd EnvironmentFile syntax, and who may have written or read it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nsconfine._errors import CredentialInsecure, CredentialMissing, PlanError
from nsconfine._plan.bwrap_args import bwrap_options
from nsconfine._plan.credential import parse_environment_file, read_credential
from nsconfine._plan.model import EnvVar, Origin
from nsconfine._session import Session, build_plan


def credential(tmp_path: Path, content: str | bytes, mode: int = 0o600) -> Path:
    """A credential file with content and mode, in its own directory."""
    path = tmp_path / "keep" / "session.env"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    path.chmod(mode)
    return path


def test_comments_and_blank_lines_are_skipped() -> None:
    """Lines starting with # or ; (after whitespace) and blank lines set nothing."""
    text = "# a comment\n\n; another\n   # indented comment\n\t\nA=1\n   \nB=2\n"
    assert parse_environment_file(text, "f") == {"A": "1", "B": "2"}


def test_whitespace_around_equals_and_value_is_stripped() -> None:
    """Whitespace around the name, the `=` and an unquoted value is not part of either."""
    text = "  KEY  =  some value  \nTAB\t=\tx\r\n"
    assert parse_environment_file(text, "f") == {"KEY": "some value", "TAB": "x"}


def test_unquoted_value_keeps_inner_characters() -> None:
    """An unquoted value is taken as written, `=` and `#` and quotes in the middle included."""
    text = 'URL=https://h/?a=b&c=d\nHASH=x # not a comment\nMID=foo"bar"\nEMPTY=\n'
    assert parse_environment_file(text, "f") == {
        "URL": "https://h/?a=b&c=d",
        "HASH": "x # not a comment",
        "MID": 'foo"bar"',
        "EMPTY": "",
    }


def test_single_quotes_are_literal() -> None:
    """A single-quoted value is taken literally: no escapes, no expansion, spaces kept."""
    text = "A=' two  words '\nB='back\\slash \\n $HOME \"dq\"'\n"
    assert parse_environment_file(text, "f") == {
        "A": " two  words ",
        "B": 'back\\slash \\n $HOME "dq"',
    }


def test_double_quotes_process_escapes() -> None:
    """As systemd: in double quotes \\" \\\\ \\$ \\` lose their backslash, others (\\n) keep it."""
    text = 'A="say \\"hi\\" \\\\ \\$x \\` end"\nB="tab\\there\\nnext"\nC="\\q stays"\nD=""\n'
    assert parse_environment_file(text, "f") == {
        "A": 'say "hi" \\ $x ` end',
        "B": "tab\\there\\nnext",
        "C": "\\q stays",
        "D": "",
    }


def test_backslash_continues_a_line() -> None:
    """A line ending in a backslash continues on the next, whose leading whitespace is dropped."""
    text = "A=one \\\n   two \\\n\tthree\nB=2\n"
    assert parse_environment_file(text, "f") == {"A": "one two three", "B": "2"}


def test_later_assignment_wins() -> None:
    """A name set twice takes the later value, as systemd does."""
    assert parse_environment_file("A=1\nA=2\n", "f") == {"A": "2"}


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("A=1\n# c\nnot a pair\n", 3),
        ("A=1\n1BAD=x\n", 2),
        ("=value\n", 1),
        ("A=1\nexport B=2\n", 2),
        ('A=1\n\nB="unclosed\n', 3),
        ("A=1\nB='unclosed\n", 2),
        ("A=1\nB='unclosed \\\nand continued \\\nthrice\n", 2),
    ],
    ids=[
        "no-equals",
        "bad-name",
        "no-name",
        "export",
        "unclosed-double",
        "unclosed-single",
        "continued",  # the entry's first line, where it starts (review of stop 44: its last)
    ],
)
def test_malformed_line_is_insecure_naming_its_number(tmp_path: Path, text: str, line: int) -> None:
    """A line that is not KEY=VALUE refuses the file as credential-insecure, naming the line."""
    path = credential(tmp_path, text)
    with pytest.raises(CredentialInsecure) as refused:
        read_credential(str(path))
    assert refused.value.code == "credential-insecure"
    assert refused.value.exit_status == 78
    assert str(path) in refused.value.message
    assert f"line {line}" in refused.value.message


def test_nul_byte_in_value_is_refused(tmp_path: Path) -> None:
    """A credential value holding a NUL byte (which no environment can carry) is refused."""
    path = credential(tmp_path, b"A=x\0--ro-bind\0/\0/leak\n")
    with pytest.raises(CredentialInsecure):
        read_credential(str(path))


def test_well_formed_file_is_read(tmp_path: Path) -> None:
    """A regular file of yours with mode 0600 is read (the control for every refusal below)."""
    path = credential(tmp_path, "# api\nTOKEN='t0k'\nOTHER=\"o\"\n")
    assert read_credential(str(path)) == {"TOKEN": "t0k", "OTHER": "o"}


def test_read_only_for_owner_is_accepted(tmp_path: Path) -> None:
    """Mode 0400 has no group or other bits, so it is accepted."""
    assert read_credential(str(credential(tmp_path, "A=1\n", 0o400))) == {"A": "1"}


def test_missing_file_is_credential_missing(tmp_path: Path) -> None:
    """A credential file that does not exist is credential-missing (78), naming the file."""
    path = tmp_path / "no-such.env"
    with pytest.raises(CredentialMissing) as refused:
        read_credential(str(path))
    assert isinstance(refused.value, FileNotFoundError)
    assert refused.value.code == "credential-missing"
    assert refused.value.exit_status == 78
    assert str(path) in refused.value.message


@pytest.mark.parametrize("content", ["", "\n\n", "# only a comment\n; and another\n"])
def test_file_without_variables_is_credential_missing(tmp_path: Path, content: str) -> None:
    """An empty file, or one with only comments, holds no credential: credential-missing."""
    path = credential(tmp_path, content)
    with pytest.raises(CredentialMissing) as refused:
        read_credential(str(path))
    assert refused.value.code == "credential-missing"
    assert str(path) in refused.value.message


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o602, 0o610, 0o601, 0o644])
def test_group_or_other_bits_are_insecure(tmp_path: Path, mode: int) -> None:
    """Any group or other permission bit makes the file insecure; the message says chmod 600."""
    path = credential(tmp_path, "A=1\n", mode)
    with pytest.raises(CredentialInsecure) as refused:
        read_credential(str(path))
    assert isinstance(refused.value, PermissionError)
    assert refused.value.code == "credential-insecure"
    assert refused.value.exit_status == 78
    assert str(path) in refused.value.message
    assert "chmod 600" in refused.value.message
    assert f"{mode:04o}" in refused.value.message


def test_symlink_is_insecure(tmp_path: Path) -> None:
    """A symlink to a good credential file is refused: the file itself must be named."""
    target = credential(tmp_path, "A=1\n")
    link = tmp_path / "link.env"
    link.symlink_to(target)
    with pytest.raises(CredentialInsecure, match="symlink") as refused:
        read_credential(str(link))
    assert str(link) in refused.value.message


@pytest.mark.root  # a directory of another account's: the launcher must be root to make one
def test_a_directory_above_it_another_account_can_change_is_insecure(tmp_path: Path) -> None:
    """A credential file reached through a directory another account can write (a session's,
    whose account may plant a symlink there) is refused: the launcher would read through the
    link whichever of its own files the session chose (attackers' pass: a link to a root-only
    directory gave the session root's KEY=VALUE file)."""
    target = credential(tmp_path, "KEY=root-only\n")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "nsconfine").symlink_to(target.parent)
    os.lchown(theirs, 65534, 65534)
    os.lchown(theirs / "nsconfine", 65534, 65534)
    with pytest.raises(CredentialInsecure, match="someone else") as refused:
        read_credential(str(theirs / "nsconfine" / "session.env"))
    assert "65534" in refused.value.message


def test_directory_is_insecure(tmp_path: Path) -> None:
    """A directory in place of the credential file is refused as not a regular file."""
    path = tmp_path / "dir.env"
    path.mkdir(mode=0o700)
    with pytest.raises(CredentialInsecure, match="not a regular file") as refused:
        read_credential(str(path))
    assert str(path) in refused.value.message


def test_fifo_is_insecure_and_does_not_block(tmp_path: Path) -> None:
    """A named pipe is refused as not a regular file, without waiting for a writer."""
    path = tmp_path / "fifo.env"
    os.mkfifo(path, 0o600)
    with pytest.raises(CredentialInsecure, match="not a regular file"):
        read_credential(str(path))


def test_oversized_file_is_insecure(tmp_path: Path) -> None:
    """A credential file over 64 KiB is refused rather than read in part."""
    path = credential(tmp_path, "A=" + "x" * (64 * 1024) + "\n")
    with pytest.raises(CredentialInsecure, match="larger than"):
        read_credential(str(path))


def test_values_reach_the_plan_env_as_credential(tmp_path: Path, ws_run: tuple[Path, Path]) -> None:
    """The file's variables are in the plan's environment with origin credential, passed to
    bwrap, and hidden in the manifest."""
    path = credential(tmp_path, "API_TOKEN='tok-5d1e'\nREGION=eu\n")
    session = Session(workspace=ws_run[0], run_dir=ws_run[1], credential=path)
    plan = build_plan(session, environ={})
    env = {v.name: v for v in plan.env}
    assert env["API_TOKEN"] == EnvVar("API_TOKEN", "tok-5d1e", Origin.CREDENTIAL)
    assert env["REGION"] == EnvVar("REGION", "eu", Origin.CREDENTIAL)
    assert env["HOME"].origin is Origin.NSCONFINE
    options = bwrap_options(plan)
    index = options.index("API_TOKEN")
    assert options[index - 1 : index + 2] == ["--setenv", "API_TOKEN", "tok-5d1e"]
    assert "tok-5d1e" not in plan.manifest()
    assert "tok-5d1e" not in plan.manifest_json()


def test_plan_refuses_an_insecure_credential(tmp_path: Path, ws_run: tuple[Path, Path]) -> None:
    """build_plan passes the credential refusal on: no plan comes from a world-readable file."""
    path = credential(tmp_path, "A=1\n", 0o644)
    with pytest.raises(CredentialInsecure):
        build_plan(Session(workspace=ws_run[0], run_dir=ws_run[1], credential=path), environ={})


def test_credential_cannot_set_home(tmp_path: Path, ws_run: tuple[Path, Path]) -> None:
    """The credential file cannot replace the session's own HOME."""
    path = credential(tmp_path, "HOME=/root\n")
    with pytest.raises(PlanError, match="HOME"):
        build_plan(Session(workspace=ws_run[0], run_dir=ws_run[1], credential=path), environ={})


def test_credential_cannot_collide_with_pass_env(tmp_path: Path, ws_run: tuple[Path, Path]) -> None:
    """A name both passed by pass_env and set by the credential file is refused."""
    path = credential(tmp_path, "TOKEN=from-file\n")
    session = Session(workspace=ws_run[0], run_dir=ws_run[1], credential=path, pass_env=["TOKEN"])
    with pytest.raises(PlanError, match="TOKEN"):
        build_plan(session, environ={"TOKEN": "from-launcher"})


@pytest.mark.unprivileged  # root searches any directory
def test_a_credential_in_a_directory_out_of_reach_is_not_called_missing(
    tmp_path: Path, ws_run: tuple[Path, Path]
) -> None:
    """A credential file in a directory the launcher cannot search was taken for one not
    there: credential-missing, "does not exist" (attacker's pass, stop 39). It is there, and
    unreadable: refused saying so."""
    path = credential(tmp_path, "API_TOKEN=x\n")
    hidden = path.parent
    hidden.chmod(0)
    try:
        session = Session(workspace=ws_run[0], run_dir=ws_run[1], credential=path)
        with pytest.raises(CredentialInsecure, match="Permission denied"):
            build_plan(session, environ={})
    finally:
        hidden.chmod(0o700)
