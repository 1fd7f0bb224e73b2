"""Where a program's own library path leads the dynamic loader: the directories its DT_RPATH
or DT_RUNPATH names ($ORIGIN: the program's own directory), and the libraries it needs that
they hold, for the gate to judge as it judges the program (a bwrap from a wheel loads the
libcap beside it: whoever can write there runs code in every bwrap, outside the sandbox).

Read from the ELF file itself (64-bit, little-endian: x86_64 and aarch64); the loader's
system directories and its cache are root's, and bwrap runs with no environment (no
LD_LIBRARY_PATH, no LD_PRELOAD). Anything else, a script for one, names no library.
"""

from __future__ import annotations

import os
import stat
import struct

from nsconfine._errors import SandboxUnavailable
from nsconfine._text import printable

_READ_AT_MOST = 64 << 20  # a larger file is no bwrap, nor a library of one
_DT_NEEDED, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 1, 5, 15, 29
_PT_LOAD, _PT_DYNAMIC = 1, 2
_MOST_LIBRARIES = 64  # the most libraries followed from one program (each judged)


def loaded_from_own_path(program: str) -> list[str]:
    """The directories the library paths of program, and of the libraries found there, name
    (each one the loader searches for every library needed, libc too; one missing is judged
    by the nearest directory that is there: who may make it), then the libraries found in
    them: all that someone able to write there could have the loader run. Every need of
    every object is looked for in every such directory (glibc also searches the program's
    DT_RPATH for its libraries' needs). Raises SandboxUnavailable for a library path the gate
    cannot tell (relative, $LIB, $PLATFORM), an ELF file it cannot read or make out, or more
    than _MOST_LIBRARIES libraries."""
    directories: list[str] = []
    libraries: list[str] = []
    needs: set[str] = set()
    # The program by its real path (the kernel gives the loader that one, for its $ORIGIN);
    # each library by the name it is found at (its $ORIGIN is that name's directory).
    pending = [os.path.realpath(program)]
    while pending and len(libraries) < _MOST_LIBRARIES:
        needed, named = _dynamic(pending.pop(0))
        directories += [d for d in named if d not in directories]
        needs.update(needed)
        for directory in directories:
            for name in sorted(needs):
                candidate = os.path.join(directory, name)
                if candidate not in libraries and os.path.isfile(candidate):
                    libraries.append(candidate)
                    pending.append(candidate)
    if pending:  # (what the rest would load stays unjudged)
        raise SandboxUnavailable(
            f"{printable(program)} loads over {_MOST_LIBRARIES} libraries by its own library "
            "path: no bwrap does; install Debian's bubblewrap (/usr/bin/bwrap)"
        )
    return [*dict.fromkeys(_nearest_existing(d) for d in directories), *libraries]


def _nearest_existing(directory: str) -> str:
    while not os.path.isdir(directory) and directory != "/":
        directory = os.path.dirname(directory)
    return directory


def _dynamic(path: str) -> tuple[list[str], list[str]]:
    """(DT_NEEDED names, DT_RPATH/DT_RUNPATH directories with $ORIGIN expanded) of the ELF
    file at path; nothing for a static one, or one that is no ELF file (a script; garbage,
    which the proof refuses). SandboxUnavailable for one that cannot be read, or told."""
    try:
        # O_NONBLOCK: a FIFO named as bwrap (NSCONFINE_BWRAP) is refused, never waited on.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise SandboxUnavailable(
                    f"{printable(path)} is not a regular file: no bwrap (nor a library of one) "
                    "is; install Debian's bubblewrap (/usr/bin/bwrap)"
                )
            size = info.st_size
            if size > _READ_AT_MOST:  # (its library path unread: judged as one that names any)
                raise SandboxUnavailable(
                    f"{printable(path)} is over {_READ_AT_MOST >> 20} MiB: no bwrap (nor a "
                    "library of one) is; install Debian's bubblewrap (/usr/bin/bwrap)"
                )
            data = file.read(size)  # (what it holds: a buffer of _READ_AT_MOST would be taken)
    except FileNotFoundError:
        return [], []  # (binary_identity says it is missing)
    except OSError as error:
        raise _untold(path, error.strerror or str(error)) from None
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return [], []  # a script, or nothing the kernel runs (the proof says so)
    if data[4:6] != b"\x02\x01" or len(data) < 64:  # 32-bit, big-endian
        raise SandboxUnavailable(
            f"{printable(path)} is no 64-bit little-endian ELF file: nsconfine cannot read "
            "which libraries the loader maps for it; install Debian's bubblewrap "
            "(/usr/bin/bwrap)"
        )
    program_headers, entry_size, count = (
        struct.unpack_from("<Q", data, 0x20)[0],
        *(struct.unpack_from("<HH", data, 0x36)),
    )
    loads: list[tuple[int, int, int]] = []  # (virtual address, file offset, size)
    dynamic: tuple[int, int] | None = None  # (file offset, size)
    for index in range(count):
        at = program_headers + index * entry_size
        if at + 56 > len(data):
            raise _untold(path, "its program headers end past the file")
        kind, _flags, offset, address, _physical, size = struct.unpack_from("<IIQQQQ", data, at)
        if kind == _PT_LOAD:
            loads.append((address, offset, size))
        elif kind == _PT_DYNAMIC:
            dynamic = (offset, size)
    if dynamic is None:
        return [], []  # static
    tags: list[tuple[int, int]] = []
    offset, size = dynamic
    for at in range(offset, min(offset + size, len(data) - 15), 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == 0:
            break
        tags.append((tag, value))
    table = next((value for tag, value in tags if tag == _DT_STRTAB), None)
    strings = None if table is None else _file_offset(loads, table)
    if strings is None:
        raise _untold(path, "its dynamic section names no string table in the file")

    def text(value: int) -> str:
        start = strings + value
        end = data.find(b"\0", start)
        return os.fsdecode(data[start : end if end >= 0 else len(data)])

    needed = [text(value) for tag, value in tags if tag == _DT_NEEDED]
    if any("/" in name for name in needed):  # (loaded by that path, from the working directory)
        raise _untold(path, "it needs a library by a path")
    origin = os.path.dirname(path)
    directories = [
        _expanded(entry, origin, path)
        for tag, value in tags
        if tag in (_DT_RPATH, _DT_RUNPATH)
        for entry in text(value).split(":")
        if entry
    ]
    return needed, directories


def _untold(path: str, why: str) -> SandboxUnavailable:
    return SandboxUnavailable(
        f"which libraries the loader maps for {printable(path)} cannot be told ({why}): "
        "install Debian's bubblewrap (/usr/bin/bwrap)"
    )


def _file_offset(loads: list[tuple[int, int, int]], address: int) -> int | None:
    for start, offset, size in loads:
        if start <= address < start + size:
            return address - start + offset
    return None


def _expanded(entry: str, origin: str, path: str) -> str:
    expanded = entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
    if "$" in expanded or not expanded.startswith("/"):
        raise SandboxUnavailable(
            f"{printable(path)} has the loader search {printable(entry)} for its libraries, "
            "which nsconfine cannot judge (only absolute paths and $ORIGIN): install Debian's "
            "bubblewrap (/usr/bin/bwrap)"
        )
    return os.path.normpath(expanded)
