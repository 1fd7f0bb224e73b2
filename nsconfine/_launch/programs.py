"""nsconfine's own two programs, built from csrc/ by `pip install` into the package:

- the reaper (csrc/reaper.c), the launcher's child: it runs bwrap and, once bwrap ends or the
  launcher is gone, kills whatever bwrap left behind;
- the exec shim (csrc/shim.c), the first command of every sandbox: it reports that the sandbox
  is built, then execs the command the launcher hands it over a socket.

Both are static executables, and both run from sealed memfds that the launcher loads once per
process: the reaper already as the session's account, the shim inside the sandbox as
/proc/self/fd/N. So neither is ever bound into a sandbox, and a root launcher whose venv lies
where the session's account cannot look (/root) still launches. The seal means nobody, the
session included, can change the program a later launch runs.
"""

from __future__ import annotations

import os
import struct

from nsconfine._errors import SandboxUnavailable
from nsconfine._kernel import syscalls as sys_

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import Final

# The helpers are built into the package directory (setup.py), one above this subpackage.
_HERE: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAPER_PATH: Final = os.path.join(_HERE, "_reaper")
SHIM_PATH: Final = os.path.join(_HERE, "_shim")

# The shim's wire, whose numbers csrc/nsconfine.h defines for both sides.
SHIM_HEADER: Final = struct.Struct("=5I")  # magic, fd mask, argc, envc, body size
SHIM_REPORT: Final = struct.Struct("=ii")  # errno, stage
SHIM_MAGIC: Final = sys_.SHIM_WIRE["MAGIC"]
SHIM_MAX_BODY: Final = sys_.SHIM_WIRE["MAX_BODY"]
SHIM_CLOSE_MASK: Final = sys_.SHIM_WIRE["CLOSE_MASK"]
SHIM_TTY: Final = sys_.SHIM_WIRE["TTY"]
SHIM_EXEC_STAGE: Final = sys_.SHIM_WIRE["STAGE_EXEC"]
SHIM_EXECUTING: Final = bytes([sys_.SHIM_WIRE["EXECUTING"]])
SHIM_STAGES: Final = {
    sys_.SHIM_WIRE["STAGE_RECV"]: "recvmsg",
    sys_.SHIM_WIRE["STAGE_PROTOCOL"]: "launch message",
    sys_.SHIM_WIRE["STAGE_DUP"]: "dup2",
    sys_.SHIM_WIRE["STAGE_ENV"]: "putenv",
    sys_.SHIM_WIRE["STAGE_CLOSE"]: "close_range",
    sys_.SHIM_WIRE["STAGE_EXEC"]: "execvp",
    sys_.SHIM_WIRE["STAGE_SIGNALS"]: "sigprocmask",
    sys_.SHIM_WIRE["STAGE_TTY"]: "a new terminal (/dev/ptmx)",
    sys_.SHIM_WIRE["STAGE_LIMITS"]: "prlimit(RLIMIT_NOFILE)",
    sys_.SHIM_WIRE["STAGE_RELAY"]: "the loopback relay (listen on 127.0.0.1, fork)",
}

_INSTALL_HINT: Final = (
    "reinstall nsconfine (pip install, which compiles csrc/ and needs a C compiler)"
)

_loaded: dict[str, int] = {}


def program_fd(path: str) -> int:
    """A sealed, close-on-exec memfd holding the program at path, loaded once per process."""
    fd = _loaded.get(path)
    if fd is None:
        try:
            with open(path, "rb") as file:
                image = file.read()
        except OSError as error:
            raise SandboxUnavailable(
                f"nsconfine's program {path} cannot be read ({error.strerror}): {_INSTALL_HINT}"
            ) from error
        if not image.startswith(b"\x7fELF"):
            raise SandboxUnavailable(f"nsconfine's program {path} is not one: {_INSTALL_HINT}")
        fd = _loaded[path] = sys_.memfd_sealed(os.path.basename(path), image)
    return fd
