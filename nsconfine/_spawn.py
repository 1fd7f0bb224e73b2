"""Where a launch is refused: the checks every session passes before its command may run.

There is no path from here to an unconfined command: a plan that fails the lint, a pinned file
that changed, or a bwrap that is missing, broken or does not confine, refuses the launch.
"""

from __future__ import annotations

from collections.abc import Sequence

from nsconfine._errors import UsageError
from nsconfine._executor import Sandbox, launch
from nsconfine._pins import verify_pins
from nsconfine._plan import Plan
from nsconfine._policy import check_plan
from nsconfine._preflight import proven_bwrap

TYPE_CHECKING = False  # see nsconfine/_executor.py
if TYPE_CHECKING:
    from nsconfine._executor import Stdio


def spawn(
    plan: Plan,
    argv: Sequence[str],
    *,
    stdin: Stdio = None,
    stdout: Stdio = None,
    stderr: Stdio = None,
) -> Sandbox:
    """Run argv confined by plan. Each stdio is None (inherit), an fd, or a file object."""
    if isinstance(argv, str | bytes) or not argv:
        raise UsageError("argv must be a non-empty list of strings, the command and its args")
    check_plan(plan)
    verify_pins(plan)
    bwrap = proven_bwrap()
    return launch(bwrap, plan, argv, stdin=stdin, stdout=stdout, stderr=stderr)
