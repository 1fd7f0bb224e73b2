"""The cli section: whole `nsconfine run` processes against Python's start-up and bwrap."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

from nsconfine.bench._core import (
    SESSION_USER,
    TRUE_ARGV,
    Config,
    Launchers,
    Results,
    Row,
    Task,
    World,
    _check_status,
    _high_copy,
    _ms,
    _now,
    _progress,
    interleave,
    until_exit,
)


def _time_process(argv: Sequence[str], devnull: int, env: dict[str, str]) -> int:
    began = _now()
    source = _high_copy(devnull)
    try:
        pid = os.posix_spawn(
            argv[0], list(argv), env, file_actions=[(os.POSIX_SPAWN_DUP2, source, 1)]
        )
    finally:
        os.close(source)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    ended = _now()
    _check_status(status, " ".join(argv))
    return ended - began


def _import_breakdown() -> dict[str, Any]:
    """`python -X importtime -c 'import nsconfine'`: its total and the costliest modules."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import nsconfine"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    parsed: list[tuple[int, int, str]] = []
    for line in lines[1:]:  # the first is the header
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|")
        parsed.append((int(self_us), int(cumulative_us), name.rstrip()))
    site_end = next((i for i, (_, _, name) in enumerate(parsed) if name.strip() == "site"), -1)
    ours = next(
        ((i, c) for i, (_, c, name) in enumerate(parsed) if name.strip() == "nsconfine"),
        (len(parsed) - 1, 0),
    )
    pulled = parsed[site_end + 1 : ours[0] + 1]
    top = sorted(pulled, key=lambda item: -item[0])[:10]
    return {
        "cumulative_us": ours[1],
        "modules": len(pulled),
        "top_self_us": [{"module": name.strip(), "self_us": s} for s, _, name in top],
    }


def bench_cli(results: Results, w: World, config: Config) -> None:
    """Whole-process `nsconfine run` against python's start-up plus the bwrap floor."""
    python = sys.executable
    user = ["--user", SESSION_USER] if os.geteuid() == 0 else []
    session_args = ["--workspace", w.workspace, "--run-dir", w.run_dir, *user, "--", *TRUE_ARGV]
    commands: dict[str, tuple[list[str], str]] = {
        "cli.run": (
            [python, "-m", "nsconfine", "run", *session_args],
            "python -m nsconfine run ... -- /bin/true",
        ),
        "cli.python": ([python, "-c", "pass"], "python -c pass"),
        "cli.import": ([python, "-c", "import nsconfine"], "python -c 'import nsconfine'"),
    }
    script = os.path.join(os.path.dirname(python), "nsconfine")
    if os.access(script, os.X_OK):
        commands["cli.script"] = (
            [script, "run", *session_args],
            f"console script {script} run ... -- /bin/true",
        )
    launchers = Launchers(w.bwrap, w.session().plan())
    rounds = config.few

    # The environment as given, and with a bytecode cache (PYTHONDONTWRITEBYTECODE=1 makes
    # every start compile nsconfine from source; an installed package has its .pyc files).
    as_given = dict(os.environ)
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = os.path.join(w.root, "pycache")
    environments = {"": as_given, ".pyc": cached}

    def whole_process(argv: Sequence[str], env: dict[str, str]) -> Callable[[], int]:
        return lambda: _time_process(argv, w.devnull, env)

    tasks = [
        Task(name + suffix, whole_process(argv, env), rounds)
        for name, (argv, _) in commands.items()
        for suffix, env in environments.items()
    ]
    tasks.append(Task("cli.bwrap", until_exit(launchers.floor, w.devnull), rounds))
    _progress(f"command line: {len(tasks)} commands x {rounds} rounds")
    samples = interleave(tasks)
    for suffix in environments:
        for name, (_, note) in commands.items():
            baseline = None if name == "cli.python" else "cli.python" + suffix
            shown = note + (" (bytecode cache)" if suffix else "")
            results.add(
                Row(
                    "cli",
                    name + suffix,
                    "ms",
                    _ms(samples[name + suffix]),
                    baseline=baseline,
                    note=shown,
                )
            )
    results.add(
        Row(
            "cli",
            "cli.bwrap",
            "ms",
            _ms(samples["cli.bwrap"]),
            note="bwrap floor: the same plan via os.posix_spawn, to exit",
        )
    )
    bw = results.p("cli.bwrap")
    assert bw is not None
    for suffix in environments:
        key = suffix.replace(".", "_")
        run, py, imp = (results.p(n + suffix) for n in ("cli.run", "cli.python", "cli.import"))
        assert run is not None
        assert py is not None
        assert imp is not None
        results.derived[f"cli_overhead{key}_ms"] = run - (py + bw)
        results.derived[f"import{key}_ms"] = imp - py
        script_p50 = results.p("cli.script" + suffix)
        if script_p50 is not None:
            results.derived[f"cli_script_overhead{key}_ms"] = script_p50 - (py + bw)
    results.derived["import_breakdown"] = _import_breakdown()


# ---------------------------------------------------------------- targets
