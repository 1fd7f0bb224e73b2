"""The shape of the Python API's keyword arguments, checked before their meaning.

Python takes a bare string for a list of paths without a word, and iterates it letter by
letter (`deny="/srv/data"` would deny "/", "s", "r", …); a mapping where names are meant gives
its keys and drops its values; a path where a Bind is meant fails deep inside with an
AttributeError. Each helper here refuses such a value with a UsageError that names the keyword
and says what to give instead, so a caller's mistake is never a traceback or a different plan.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from nsconfine._errors import UsageError
from nsconfine._plan.options import OPTIONS
from nsconfine._text import path_too_long

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")
    P = TypeVar("P", bound=Iterable[object])


def _kind(value: object) -> str:
    return type(value).__name__


def items(
    keyword: str,
    given: Iterable[T],
    wanted: type[Any] | tuple[type[Any], ...],
    hint: str = "",
) -> tuple[T, ...]:
    """given as a tuple of wanted values: a bare str or bytes, a mapping, a non-iterable or an
    item of another type is refused, naming keyword (and saying hint, how to make an item)."""
    if isinstance(given, str | bytes | os.PathLike):
        raise UsageError(
            f"Session({keyword}=...) is a list: give [{given!r}], not the bare {_kind(given)}"
        )
    if isinstance(given, Mapping):
        raise UsageError(f"Session({keyword}=...) is a list, not a mapping ({_kind(given)})")
    if not isinstance(given, Iterable):
        raise UsageError(f"Session({keyword}=...) is a list, not {given!r}")
    found = tuple(given)
    for item in found:
        if not isinstance(item, wanted):
            names = " or ".join(
                t.__name__ for t in (wanted if isinstance(wanted, tuple) else (wanted,))
            )
            raise UsageError(
                f"Session({keyword}=...): each item is a {names}, not {item!r} "
                f"({_kind(item)}){': ' + hint if hint else ''}"
            )
    return found


def pairs(keyword: str, given: P) -> P:
    """given, if it is a mapping or a list of NAME=VALUE strings or (name, value) pairs whose
    names are str."""
    if isinstance(given, Mapping):
        found: Iterable[object] = given.items()
    else:
        found = items(keyword, given, (str, tuple), "give NAME=VALUE or (name, value)")
    for item in found:
        if isinstance(item, tuple) and (len(item) != 2 or not isinstance(item[0], str)):
            raise UsageError(f"Session({keyword}=...): {item!r} is not a (name, value) pair")
    return given


def paths(
    keyword: str, given: Iterable[str | os.PathLike[str]]
) -> tuple[str | os.PathLike[str], ...]:
    """given as a tuple of paths (str or os.PathLike), each a non-empty str path."""
    found = items(keyword, given, (str, os.PathLike))
    for item in found:
        _text_path(keyword, item)
    return found


def path(keyword: str, given: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """given, if it is one non-empty str path."""
    if not isinstance(given, str | os.PathLike):
        raise UsageError(f"Session({keyword}=...) is one path (str or os.PathLike), not {given!r}")
    _text_path(keyword, given)
    return given


def _text_path(keyword: str, given: str | os.PathLike[str]) -> None:
    """Refuse a path that is empty ("" would name the launcher's working directory, and bind
    or deny it), or an os.PathLike whose path is bytes."""
    flag = OPTIONS[keyword].flag if keyword in OPTIONS else None
    named = f"Session({keyword}=...)" + (f" ({flag})" if flag else "")
    text: object = os.fspath(given)
    if not isinstance(text, str):
        raise UsageError(f"{named}: {text!r} is not a str path; give its text")
    if not text:
        raise UsageError(
            f"{named} holds an empty path, which would name the launcher's working directory: "
            "give the path"
        )
    too_long = path_too_long(text)
    if too_long is not None:
        raise UsageError(f"{named} {too_long}")


def text(keyword: str, given: str) -> str:
    """given, if it is a str."""
    if not isinstance(given, str):
        raise UsageError(f"Session({keyword}=...) is a str, not {given!r} ({_kind(given)})")
    return given


def optional_text(keyword: str, given: str | None) -> str | None:
    """given, if it is a str or None."""
    return None if given is None else text(keyword, given)


def flag(keyword: str, given: bool) -> bool:
    """given, if it is True or False (not a truthy string such as "no")."""
    if not isinstance(given, bool):
        raise UsageError(f"Session({keyword}=...) is True or False, not {given!r}")
    return given


def choice(keyword: str, given: T | None) -> T | None:
    """given, if it is None or one of the choices keyword's row lists (nsconfine._plan.options)."""
    choices = OPTIONS[keyword].choices
    if given is not None and (not isinstance(given, str) or given not in choices):
        raise UsageError(
            f"Session({keyword}={given!r}): it is one of {', '.join(choices)} (or None)"
        )
    return given
