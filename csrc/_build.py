"""cffi build script for nsconfine._native (API mode); the cdef is csrc/nsconfine.h."""

from __future__ import annotations

import os
from pathlib import Path

import cffi

_HERE = Path(__file__).resolve().parent
_GUARD = ("#include", "#ifndef NSCONFINE_H", "#define NSCONFINE_H", "#endif")


def _cdef_text() -> str:
    """The header's declarations, without the include guard and #includes cffi cannot parse."""
    header = (_HERE / "nsconfine.h").read_text()
    return "\n".join(line for line in header.splitlines() if not line.startswith(_GUARD))


# NSCONFINE_SANITIZE=1 builds the extension under AddressSanitizer and UBSan (a CI section runs
# the confinement tests with it, the sanitizer runtimes preloaded into the interpreter).
_SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
_SANITIZING = os.environ.get("NSCONFINE_SANITIZE") == "1"

ffibuilder = cffi.FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "nsconfine._native",
    '#include "nsconfine.h"',
    # Relative to the repository root, where setup.py runs.
    sources=["csrc/nsconfine.c", "csrc/seccomp.c"],
    include_dirs=["csrc"],
    extra_compile_args=[
        "-Wall",
        "-Wextra",
        "-Werror",
        "-O1" if _SANITIZING else "-O2",
        "-D_GNU_SOURCE",
        *(_SANITIZE if _SANITIZING else []),
    ],
    extra_link_args=_SANITIZE if _SANITIZING else [],
)
