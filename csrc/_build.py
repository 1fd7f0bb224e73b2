"""cffi build script for nsconfine._native (API mode); the cdef is csrc/nsconfine.h."""

from __future__ import annotations

from pathlib import Path

import cffi

_HERE = Path(__file__).resolve().parent
_GUARD = ("#include", "#ifndef NSCONFINE_H", "#define NSCONFINE_H", "#endif")


def _cdef_text() -> str:
    """The header's declarations, without the include guard and #includes cffi cannot parse."""
    header = (_HERE / "nsconfine.h").read_text()
    return "\n".join(line for line in header.splitlines() if not line.startswith(_GUARD))


ffibuilder = cffi.FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "nsconfine._native",
    '#include "nsconfine.h"',
    # Relative to the repository root, where setup.py runs.
    sources=["csrc/nsconfine.c", "csrc/seccomp.c"],
    include_dirs=["csrc"],
    extra_compile_args=["-Wall", "-Wextra", "-Werror", "-O2", "-D_GNU_SOURCE"],
)
