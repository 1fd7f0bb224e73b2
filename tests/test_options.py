"""The session's options are declared once (nsconfine/_plan/options.py), and every front agrees
with that table: Session's signature and its Literal types, the CLI's flags, the profile keys,
docs/options.md and the README. Each spelling that differs from the rule says why."""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import pytest

import nsconfine
from nsconfine import UsageError
from nsconfine._cli import options_doc
from nsconfine._cli.main import _parser, _session, main
from nsconfine._plan import options as o
from nsconfine._plan.profiles import load
from nsconfine._session import with_profiles

REPOSITORY = Path(__file__).resolve().parent.parent
SIGNATURE = inspect.signature(nsconfine.Session.__init__).parameters

# A value each option's flag and profile key take, as the command line writes one item. A new
# option fails test_every_flag_reaches_its_keyword and test_every_profile_key_is_applied until
# it is given one here: the test of its fronts.
EXAMPLES = {
    "ro": "/usr/share/doc",
    "harness": "/bin/sh@sha256:" + "ab" * 32,
    "tool_socket": "/run/tools.sock",
    "pass_env": "NPM_CONFIG_REGISTRY",
    "credential": "/srv/agent.env",
    "deny": "/srv/data",
    "user": "nobody",
    "protect": ".tool-config",
    "unprotect": ".envrc",
    "network": "proxy",  # (host asks for a reason too)
    "network_reason": "it serves a port the host's browser opens",
    "allow_hosts": "pypi.org",
    "inject": "anthropic",
    "audit": "/srv/audit.jsonl",
    "allow_nested_userns": "its harness runs bwrap itself",
    "setenv": "CI=1",
    "home_mode": "fresh",
    "git_identity": "Ada Lovelace <ada@example.org>",
    "profile": "python",
    "binds": "/usr/share/doc",
    "workspace_mode": "ro",
    "limits": "processes=512",
    "mask": "/srv/ws/.env",
}
SESSION_FLAGS = ["--workspace", "/srv/ws", "--run-dir", "/srv/run"]


def _literal_aliases() -> dict[str, tuple[str, ...]]:
    """The `Name: TypeAlias = Literal[...]` aliases of nsconfine/_plan/options.py (they exist
    only for mypy, so they are read from the source)."""
    aliases = {}
    for node in ast.walk(ast.parse(Path(o.__file__).read_text())):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(node.value, ast.Subscript)
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "Literal"
            and isinstance(node.value.slice, ast.Tuple)
        ):
            values = node.value.slice.elts
            aliases[node.target.id] = tuple(ast.literal_eval(value) for value in values)
    return aliases


def test_session_takes_the_table_keywords_in_order() -> None:
    """Session's keywords are the table's rows, in order, keyword-only, with their defaults."""
    parameters = [p for name, p in SIGNATURE.items() if name != "self"]
    assert [p.name for p in parameters] == [option.name for option in o.SESSION_OPTIONS]
    assert {p.kind for p in parameters} == {inspect.Parameter.KEYWORD_ONLY}
    for parameter in parameters:
        option = o.OPTIONS[parameter.name]
        if option.default is o.REQUIRED:
            assert parameter.default is inspect.Parameter.empty, option.name
        else:
            assert parameter.default == option.default, option.name


def test_choices_are_literal_types_of_the_same_values() -> None:
    """A choice's keyword is annotated with the Literal type of exactly its row's choices (so
    mypy refuses a value the table does not list); no other keyword has one."""
    aliases = _literal_aliases()
    assert aliases, "no Literal aliases found"
    for option in o.SESSION_OPTIONS:
        annotation = str(SIGNATURE[option.name].annotation)
        named = [word for word in re.findall(r"\w+", annotation) if word in aliases]
        expected = [option.choices] if option.choices else []
        assert [aliases[name] for name in named] == expected, (option.name, annotation)


def test_list_shaped_keywords_take_collections() -> None:
    """A keyword whose row says it is a list is annotated as an Iterable (or a mapping), and no
    other is: the table's shape and the signature agree."""
    for option in o.SESSION_OPTIONS:
        annotation = str(SIGNATURE[option.name].annotation)
        assert ("Iterable[" in annotation) == option.repeatable, (option.name, annotation)


def test_each_spelling_follows_the_rule_or_says_why() -> None:
    """A flag is --KEYWORD (--no-KEYWORD for a switch on by default) and a profile key is the
    keyword; a row that spells a front otherwise, or lacks it, has a reason, and only such a
    row has one (a reason left behind by a rename is stale)."""
    for option in o.SESSION_OPTIONS:
        derived = o.derived_flag(option.name, option.shape, option.default)
        assert (option.flag != derived) == bool(option.flag_why), option.name
        assert (option.key != option.name) == bool(option.key_why), option.name


def test_the_cli_session_flags_are_the_table() -> None:
    """Each subcommand that takes a session has one flag per row with a flag, spelled, shaped
    and defaulted as the row says, and no session flag besides (former flags only refuse)."""
    for subcommand in ("plan", "run", "explain", "oci-bundle", "podman-args"):
        parser = _parser(subcommand)
        command = next(action for action in parser._actions if action.dest == "subcommand").choices[
            subcommand
        ]  # type: ignore[index]
        group = next(g for g in command._action_groups if g.title == "session")
        actions = {action.option_strings[0]: action for action in group._group_actions}
        former = {flag for option in o.SESSION_OPTIONS for flag in option.old_flags}
        flagged = [option for option in o.SESSION_OPTIONS if option.flag is not None]
        assert set(actions) == {option.flag for option in flagged} | former, subcommand
        for option in flagged:
            action = actions[str(option.flag)]
            assert action.dest == option.name
            assert action.required == (option.default is o.REQUIRED)
            assert tuple(action.choices or ()) == option.choices
            repeatable = type(action).__name__ == "_AppendAction"
            assert repeatable == option.repeatable, option.name


def _example_flags(option: o.Option) -> list[str]:
    if option.shape == o.SWITCH:
        return [str(option.flag)]
    return [str(option.flag), EXAMPLES[option.name]]


def _example_keyword(option: o.Option) -> object:
    if option.shape == o.SWITCH:
        return not option.default
    example = EXAMPLES[option.name]
    return [example] if option.repeatable else example


@pytest.mark.parametrize(
    "option",
    [option for option in o.SESSION_OPTIONS if option.flag and option.default is not o.REQUIRED],
    ids=lambda option: option.name,
)
def test_every_flag_reaches_its_keyword(option: o.Option) -> None:
    """`--flag VALUE` makes the Session that `keyword=[VALUE]` (or `=VALUE`) makes."""
    arguments = _parser("plan").parse_args(["plan", *SESSION_FLAGS, *_example_flags(option)])
    keywords = {
        "workspace": "/srv/ws",
        "run_dir": "/srv/run",
        option.name: _example_keyword(option),
    }
    assert _session(arguments) == nsconfine.Session(**keywords)  # type: ignore[arg-type]


def _example_profile(option: o.Option) -> str:
    """A profile file setting option's key to its example, in the TOML form of its shape."""
    key, example = option.key, EXAMPLES[option.name]
    if option.shape == o.VALUES:
        name, _, value = example.partition("=")
        return f'[{key}]\n{name} = "{value}"\n'
    if option.shape == o.SPECS:
        return f'[[{key}]]\nhost = "{example}"\nreason = "the example"\n'
    if option.shape == o.RECORDS:
        return f'[[{key}]]\nsource = "{example}"\nmode = "ro"\nreason = "the example"\n'
    return f"{key} = {json.dumps([example] if option.repeatable else example)}\n"


@pytest.mark.parametrize(
    "option",
    [option for option in o.SESSION_OPTIONS if option.key is not None],
    ids=lambda option: option.name,
)
def test_every_profile_key_is_applied(option: o.Option, tmp_path: Path) -> None:
    """A profile giving the key loads, and applying it changes the session (or its deny rules):
    no key the loader takes is dropped on the way to the plan."""
    base = nsconfine.Session(workspace=tmp_path, run_dir=tmp_path)
    plain, given = tmp_path / "plain.toml", tmp_path / "given.toml"
    plain.write_text('description = "the baseline"\n')
    given.write_text('description = "the example"\n' + _example_profile(option))
    load(str(given))
    without = with_profiles(base.replace(profile=(str(plain),)), {})
    with_key = with_profiles(base.replace(profile=(str(given),)), {})
    assert with_key != without, option.name


def test_a_key_that_is_no_option_is_refused(tmp_path: Path) -> None:
    """A profile key that is neither an option's nor the profile's own is refused by name."""
    profile = tmp_path / "odd.toml"
    profile.write_text('description = "x"\npass_terminal = false\n')
    with pytest.raises(UsageError, match="key pass_terminal: is not a profile key"):
        load(str(profile))


@pytest.mark.parametrize(
    ("old", "new"),
    [(old, option.key) for option in o.SESSION_OPTIONS for old in option.old_keys],
)
def test_a_former_profile_key_is_refused_naming_the_new_one(
    tmp_path: Path, old: str, new: str
) -> None:
    """A profile written with a key an option had before is refused, naming the key now."""
    profile = tmp_path / "old.toml"
    profile.write_text(f'description = "x"\n{old} = "ro"\n')
    with pytest.raises(UsageError, match=f"line 2, key {old}: is now {new}$"):
        load(str(profile))


@pytest.mark.parametrize(
    ("old", "new"),
    [(old, option.flag) for option in o.SESSION_OPTIONS for old in option.old_flags],
)
def test_a_former_flag_is_refused_naming_the_new_one(
    capsys: pytest.CaptureFixture[str], old: str, new: str
) -> None:
    """`--env NAME` (say) is a one-line usage error naming --pass-env, and nothing runs."""
    assert main(["plan", *SESSION_FLAGS, old, "x"]) == 64
    said = f"nsconfine: usage: {old} is now {new} (see nsconfine plan --help)\n"
    assert capsys.readouterr().err == said


def test_docs_options_md_is_the_table() -> None:
    """docs/options.md is what `python -m nsconfine._cli.options_doc` prints from the table."""
    assert (REPOSITORY / "docs" / "options.md").read_text() == options_doc.render()


def test_the_readme_names_every_option_as_spelled_now() -> None:
    """The README's CLI reference lists every flag once, its Python API's signature every
    keyword with its default, and the README names no former flag."""
    readme = (REPOSITORY / "README.md").read_text()
    reference = readme[readme.index("SESSION:\n") : readme.index("NSCONFINE_BWRAP=PATH")]
    listed = re.findall(r"^  (--[a-z-]+)", reference, re.MULTILINE)
    assert sorted(listed) == sorted(option.flag for option in o.SESSION_OPTIONS if option.flag)
    signature = re.search(r"`Session\(\*, (.*?)\)`", readme, re.DOTALL)
    assert signature is not None
    shown = [item.partition("=")[::2] for item in " ".join(signature[1].split()).split(", ")]
    assert shown == [
        (option.name, "" if option.default is o.REQUIRED else repr(option.default))
        for option in o.SESSION_OPTIONS
    ]
    for option in o.SESSION_OPTIONS:
        for old in option.old_flags:
            assert not re.search(rf"`{old}\b[^-]", readme), old
