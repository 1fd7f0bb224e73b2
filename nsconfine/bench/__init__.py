"""The bench: what a confined launch costs, next to the floors it is built on.

Run `python -m nsconfine.bench` (the full run, about three minutes) or `--smoke` (CI, seconds).
Every section runs its variants round-robin in one process, so a noisy machine slows them
alike and the ratios hold. benchmarks/README.md says what each row measures. It needs psutil
(`pip install 'nsconfine[bench]'`); nsconfine itself does not.

The floors are what nsconfine cannot beat: the same bwrap argument vector started with
os.posix_spawn (bwrap's own cost), and /bin/true started with os.posix_spawn (a process's cost).
The naive launcher is what the obvious subprocess code costs: Popen with a preexec_fn, which
makes CPython fork instead of vfork, so it slows down as the launcher grows.

The package: _core (rows, the round-robin, the launchers compared, the world), one module per
kind of section (_launches, _checks, _memory, _scale, _cli, _network, and _soak with its _held and
_faults), _report (targets, the machine, the table and the JSON) and _main (the command line).
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; return the exit status (see nsconfine.bench._main)."""
    from nsconfine.bench._main import main as run

    return run(argv)
