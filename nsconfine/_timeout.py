"""TimeoutExpired, apart from the other errors: it subclasses subprocess's, and subprocess is a
millisecond or two of every launcher's start-up, so it is imported only once this is first
needed (a wait or communicate that times out, or a caller naming nsconfine.TimeoutExpired)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


class TimeoutExpired(subprocess.TimeoutExpired, TimeoutError):
    """Sandbox.wait(timeout) or communicate(timeout=...) ran out while the session still runs:
    caught as subprocess.TimeoutExpired and as TimeoutError. Not a refusal: the session goes
    on; kill() ends it, and a second communicate() returns all its output."""

    def __init__(self, cmd: Sequence[str], timeout: float, pid: int) -> None:
        super().__init__(list(cmd), timeout)
        self.args = (cmd, timeout, pid)  # OSError's base leaves them empty: repr and pickle
        self.pid = pid

    def __str__(self) -> str:
        return f"session {self.pid} ({self.cmd!r}) still running after {self.timeout:g} s"
