"""Text as nsconfine shows and checks it: what a person reads (escaped, unforgeable), what
the kernel can take (encodable), environment names, and paths one inside another. A leaf:
errors, the plan and the kernel layer all use it, and it uses none of them."""

from __future__ import annotations

import os
import posixpath

# No regular expressions: importing re and compiling patterns would cost every `nsconfine run`
# about a millisecond before its sandbox starts (nothing on a launch's import path compiles one).


def is_env_name(name: object) -> bool:
    """A portable environment variable name (letters, digits and _, not a digit first): the one
    rule for every name a session's environment gets, from any source. bwrap reads its options
    NUL-separated, so this also keeps a name from smuggling options in."""
    return (
        isinstance(name, str)
        and name.isascii()
        and (name[:1].isalpha() or name[:1] == "_")
        and name.replace("_", "a").isalnum()
    )


def has_control(text: str) -> bool:
    """Does text hold a C0 control character or DEL (a newline, a tab, an escape)?"""
    if text.isprintable():  # the usual answer, without a loop over the text
        return False
    return any(character < " " or character == "\x7f" for character in text)


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}
# Unicode categories a terminal may act on instead of showing: controls (C0, C1), format
# characters (bidi overrides and isolates, zero-width ones), line and paragraph separators; and
# surrogates (a non-UTF-8 byte of a path), which a UTF-8 terminal cannot be sent at all.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def inside(dest: str, top: str) -> str | None:
    """dest relative to top if it lies strictly inside it (both absolute and normalized)."""
    prefix = top.rstrip("/") + "/"
    return dest[len(prefix) :] if dest.startswith(prefix) else None


def within(path: str, top: str) -> bool:
    """Is path top itself or inside it (both absolute and normalized)?"""
    return path == top or path.startswith(top.rstrip("/") + "/")


def ancestors(path: str) -> list[str]:
    """path (absolute) and every directory above it, / last. A leading // is / (POSIX keeps
    it, and dirname("//") is itself: walking up from //root would never end)."""
    found = ["/" + path.lstrip("/")]
    while found[-1] != "/":
        found.append(posixpath.dirname(found[-1]))
    return found


def is_decimal(text: str) -> bool:
    """ASCII digits only (str.isdigit takes "²" and Arabic-Indic digits, which int() reads)."""
    return text.isascii() and text.isdigit()


# The kernel resolves no path of this many bytes or more (PATH_MAX, its NUL counted).
PATH_MAX = 4096


def path_too_long(text: str) -> str | None:
    """Why the kernel would take no path of text (its length), or None. Refused where it is
    given: each of its components costs the rules' lint and explain more, past measure (a
    deny of 50,000 components took 10 s and 7 GB)."""
    try:
        size = len(os.fsencode(text))  # as the kernel gets it
    except UnicodeEncodeError:  # a lone surrogate, refused where it is given
        size = len(text.encode("utf-8", "surrogatepass"))
    if size < PATH_MAX:
        return None
    return f"holds a path of {size:,} bytes: the kernel resolves none of {PATH_MAX:,} or more"


def encodable(text: str) -> bool:
    """Can text reach the kernel and bwrap as bytes (a non-UTF-8 byte, kept as a surrogate
    escape, can; a lone surrogate from elsewhere cannot)?"""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def is_hidden(character: str) -> bool:
    """Would a terminal act on character rather than show it (a newline, a bidi override)?"""
    if " " <= character <= "~":
        return False
    import unicodedata  # only for text that is not plain ASCII

    return unicodedata.category(character) in _HIDDEN_CATEGORIES


# What shows as nothing, or as a blank, besides whitespace: the hidden categories above, space
# separators, combining marks with nothing to mark, unassigned code points; and the fillers of
# other categories, letters to str.isalnum (Hangul's) or symbols (the braille blank, the musical
# null notehead).
_BLANK_CATEGORIES = _HIDDEN_CATEGORIES | {"Zs", "Mn", "Me", "Cn"}
_BLANK_FILLERS = frozenset("\u115f\u1160\u3164\uffa0\u2800\U0001d159")


def says_nothing(text: str) -> bool:
    """Would a reader see nothing in text, or only blanks? A reason must say something."""
    if text.isascii():
        return not text.strip()
    import unicodedata

    return all(
        c.isspace() or c in _BLANK_FILLERS or unicodedata.category(c) in _BLANK_CATEGORIES
        for c in text
    )


def file_kind(mode: int) -> str:
    """What a file of mode (st_mode) is, as a refusal names it: "a FIFO", "a device", …"""
    import stat

    kinds = {
        stat.S_IFDIR: "a directory",
        stat.S_IFREG: "a file",
        stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket",
        stat.S_IFLNK: "a symlink",
    }
    return kinds.get(stat.S_IFMT(mode), "a device")


def printable(text: str) -> str:
    """text with control and format characters written as escapes: what a person reads (a
    manifest row, a refusal) cannot be forged by a newline, a C1 control, a bidi override or a
    terminal sequence inside a path; a backslash is doubled, so that no name reads as one
    escaped (a literal backslash and n, as a newline)."""
    if text.isascii() and text.isprintable() and "\\" not in text:  # nothing to look at
        return text
    return "".join(_escaped(c) if c == "\\" or is_hidden(c) else c for c in text)


def one_line(text: str) -> str:
    """text with its control and format characters written as escapes, and nothing else: for
    a message whose quoted parts printable() (or repr) has already written, whose backslashes
    a second printable() would double (a newline in a path then read as a backslash and an
    n). What a message quotes raw still cannot forge a line."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(_escaped(c) if is_hidden(c) else c for c in text)


def _escaped(character: str) -> str:
    code = ord(character)
    if character in _ESCAPES:
        return _ESCAPES[character]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
