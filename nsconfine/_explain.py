"""`nsconfine explain PATH`: would a session see PATH, through which entry, or why not.

The first thing a user wants when an agent says "No such file": the plan entry whose
destination holds PATH (its kind, mode, source and reason), or that nothing in the plan grants
it; and, for a host path, the deny rule that keeps it out of every session, with where the rule
came from.
"""

from __future__ import annotations

import os

from nsconfine._plan import Entry, Kind, Plan, printable, within
from nsconfine._policy import Judge, resolve


def explain(plan: Plan, path: str) -> tuple[bool, list[str]]:
    """Whether a session of plan sees path, and the lines that say why."""
    path = os.path.normpath(os.path.abspath(path))
    shown = printable(path)
    lines: list[str] = []
    entry = _covering(plan, path)
    if entry is None:
        lines.append(f"{shown}: not visible: nothing in the plan grants it")
    else:
        lines.append(f"{shown}: {_through(entry, path)}")
    found = Judge(plan.deny).violated(resolve(path))
    if found is not None:
        rule, relation = found
        lines.append(
            f"{shown} {relation} {printable(rule.path)}, which no session may see: "
            f"{printable(rule.reason)} [from {printable(rule.origin or 'the plan')}]"
        )
    return entry is not None and found is None, lines


def _covering(plan: Plan, path: str) -> Entry | None:
    """The entry whose destination is path or the nearest directory above it; None for the
    sandbox's own empty, read-only root."""
    best: Entry | None = None
    for entry in plan.entries:
        if entry.kind is Kind.REMOUNT_RO or entry.dest == "/":
            continue
        if within(path, entry.dest) and (best is None or len(entry.dest) > len(best.dest)):
            best = entry
    return best


def _through(entry: Entry, path: str) -> str:
    where = f"through the {entry.kind} entry at {printable(entry.dest)} ({entry.mode})"
    reason = f": {printable(entry.reason)}"
    if entry.kind is Kind.BIND:
        host = entry.source + path[len(entry.dest) :]
        exists = "" if os.path.lexists(host) else " (not there on the host now)"
        return f"visible {where}, showing the host's {printable(host)}{exists}{reason}"
    if entry.kind is Kind.SYMLINK:
        return f"a symlink to {printable(entry.source)} {where}{reason}"
    if entry.kind in (Kind.DATA, Kind.COPY):
        return f"a file nsconfine makes {where}{reason}"
    return f"visible {where}, which the sandbox makes itself (no host path){reason}"
