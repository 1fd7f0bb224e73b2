"""docs/options.md, made from the table of session options (nsconfine._plan.options).

    python -m nsconfine._cli.options_doc > docs/options.md

tests/test_options.py fails when the file in the tree is not what this prints.
"""

from __future__ import annotations

import sys

from nsconfine._plan import options as o

# How each shape is written, in words (a new shape needs its words here).
_SHAPES = {
    o.PATH: "a path",
    o.PATHS: "paths",
    o.NAMES: "names",
    o.VARIABLES: "variable names",
    o.TEXT: "a str",
    o.CHOICE: "one of",
    o.SWITCH: "True or False",
    o.REASON: "True, False or the reason",
    o.ACCOUNT: "an account name or uid",
    o.VALUES: "a mapping, or NAME=VALUE strings",
    o.SPECS: "records, or their string form",
    o.RECORDS: "records",
}


def _value(option: o.Option) -> str:
    if option.choices:
        return "one of " + ", ".join(f"`{choice}`" for choice in option.choices)
    return _SHAPES[option.shape]


def _flag(option: o.Option) -> str:
    if option.flag is None:
        return "—"
    written = option.flag if option.shape == o.SWITCH else f"{option.flag} {option.metavar}"
    return f"`{written}`" + (" (repeatable)" if option.repeatable else "")


def _key(option: o.Option) -> str:
    return "—" if option.key is None else f"`{option.key}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The whole of docs/options.md."""
    lines = [
        "# Session options",
        "",
        "<!-- Generated from nsconfine/_plan/options.py by "
        "`python -m nsconfine._cli.options_doc > docs/options.md`: edit the table, not this "
        "file. -->",
        "",
        "Each option is a keyword of `nsconfine.Session`, a flag of `nsconfine plan`, `run`, "
        "`explain`, `oci-bundle` and `podman-args`, and a key of a profile file, spelled alike: "
        "the flag is `--` and the keyword with `-` for `_` (`--no-` and the keyword for a "
        "switch that is on by default), the profile key is the keyword. Where a front spells "
        "it otherwise, or lacks it, the notes below say why. A profile's own keys are "
        "`description` (required) and `requires_credential`.",
        "",
        "| Keyword | Flag | Profile key | Value | Default | What it does |",
        "|---|---|---|---|---|---|",
    ]
    for option in o.SESSION_OPTIONS:
        default = "required" if option.default is o.REQUIRED else f"`{option.default!r}`"
        cells = (
            f"`{option.name}`",
            _flag(option),
            _key(option),
            ("a list of " if option.repeatable and option.shape != o.VALUES else "")
            + _value(option),
            default,
            o.help_text(option, as_flags=False),
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    lines += ["", "## Spelled otherwise, or absent", ""]
    for option in o.SESSION_OPTIONS:
        if option.flag_why:
            flag = "no flag" if option.flag is None else f"flag `{option.flag}`"
            lines.append(f"- `{option.name}`: {flag}: {option.flag_why}.")
        if option.key_why:
            key = "no profile key" if option.key is None else f"profile key `{option.key}`"
            lines.append(f"- `{option.name}`: {key}: {option.key_why}.")
    renamed = []
    for option in o.SESSION_OPTIONS:
        fronts = (("keyword", option.old_keywords), ("flag", option.old_flags),
                  ("profile key", option.old_keys))  # fmt: skip
        former = [f"{front} `{old}`" for front, olds in fronts for old in olds]
        if former:
            renamed.append(f"- `{option.name}`: formerly {', '.join(former)}")
    lines += [
        "",
        "## Former spellings",
        "",
        "A former flag or profile key is refused with a message naming the new one; a former "
        "keyword is a TypeError, as any unknown keyword is.",
        "",
        *renamed,
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
