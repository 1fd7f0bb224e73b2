"""The session's credential: a KEY=VALUE file in systemd EnvironmentFile= syntax.

The file must be a regular file (not a symlink) owned by the caller with no group or other
permission bits, in directories only the caller (and root) can change, so that nothing but the
caller (and root) can have put a value there, read it, or put another file in its place.
"""

from __future__ import annotations

import errno
import os
import stat

from nsconfine._errors import CredentialInsecure, CredentialMissing
from nsconfine._kernel.accounts import untrusted_reason
from nsconfine._text import is_env_name

_MAX_BYTES = 64 * 1024
# As systemd: inside double quotes only these lose their backslash; others keep it.
_DOUBLE_QUOTED_ESCAPES = frozenset('\\"$`')


def read_credential(path: str) -> dict[str, str]:
    """The variables in the credential file at path, after checking who may read or write it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CredentialMissing(
            f"credential file {path} does not exist: create it (KEY=VALUE, mode 0600)"
        ) from None
    except ValueError:  # a NUL byte or a lone surrogate: no file has such a name
        raise CredentialInsecure(
            f"credential file {path} cannot be used: its name holds a NUL byte or a character "
            "no path can; give the file's real path"
        ) from None
    except OSError as error:
        reason = "it is a symlink" if error.errno == errno.ELOOP else error.strerror
        raise CredentialInsecure(
            f"credential file {path} cannot be used: {reason}; use a regular file, mode 0600"
        ) from error
    try:
        info = os.fstat(fd)
        _check_ownership(path, info)
        _check_way(path)
        raw = os.read(fd, _MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > _MAX_BYTES:
        raise CredentialInsecure(f"credential file {path} is larger than {_MAX_BYTES} bytes")
    if b"\0" in raw:
        # No environment can carry a NUL, and bwrap's --args stream is NUL-separated.
        raise CredentialInsecure(f"credential file {path} contains a NUL byte: remove it")
    variables = parse_environment_file(raw.decode("utf-8", "surrogateescape"), path)
    if not variables:
        raise CredentialMissing(f"credential file {path} holds no KEY=VALUE line: add one")
    return variables


def _check_ownership(path: str, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise CredentialInsecure(f"credential file {path} is not a regular file")
    if info.st_uid != os.geteuid():
        raise CredentialInsecure(
            f"credential file {path} is owned by uid {info.st_uid}, not by you "
            f"(uid {os.geteuid()}): chown it"
        )
    if info.st_mode & 0o077:
        raise CredentialInsecure(
            f"credential file {path} has mode {stat.S_IMODE(info.st_mode):04o}, readable or "
            f"writable by others: run chmod 600 {path}"
        )


def _check_way(path: str) -> None:
    # The directories above it too: one that another account can change (a session's, whose
    # account may plant a symlink in it) would have the launcher read whichever file of its
    # own that account chose, and hand its values to the session.
    reason = untrusted_reason(path)
    if reason is not None:
        raise CredentialInsecure(
            f"credential file {path} could be redirected or replaced by someone else "
            f"({reason}): keep it in a directory only you (and root) can write"
        )


def parse_environment_file(text: str, path: str) -> dict[str, str]:
    """Parse systemd's EnvironmentFile= syntax: comments (# ;), blank lines, KEY=VALUE with
    optional single or double quotes, backslash line continuations."""
    variables: dict[str, str] = {}
    lines = text.split("\n")
    number = 0
    while number < len(lines):
        line = lines[number].strip()
        number += 1
        first = number  # the entry's first line, which a refusal names
        while line.endswith("\\") and number < len(lines) and not line.startswith(("#", ";")):
            line = line[:-1] + lines[number].strip()
            number += 1
        if not line or line.startswith(("#", ";")):
            continue
        name, equals, value = line.partition("=")
        name = name.strip()
        if not equals or not is_env_name(name):
            raise CredentialInsecure(
                f"credential file {path} line {first} is not KEY=VALUE: fix or remove it"
            )
        variables[name] = _unquote(value.strip(), path, first)
    return variables


def _unquote(value: str, path: str, number: int) -> str:
    if len(value) < 2 or value[0] not in "'\"" or value[-1] != value[0]:
        if value[:1] in ("'", '"'):
            raise CredentialInsecure(f"credential file {path} line {number}: unclosed quote")
        return value
    inner = value[1:-1]
    if value[0] == "'":
        return inner
    out: list[str] = []
    characters = iter(inner)
    for character in characters:
        if character == "\\":
            escaped = next(characters, "\\")
            out.append(escaped if escaped in _DOUBLE_QUOTED_ESCAPES else "\\" + escaped)
        else:
            out.append(character)
    return "".join(out)
