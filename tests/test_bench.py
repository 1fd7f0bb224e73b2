"""The bench program runs and reports what benchmarks/README.md documents (never its times)."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import nsconfine
from nsconfine._preflight.checks import proven_bwrap
from nsconfine.bench._core import FloorSession, Launchers, children

TOP_LEVEL_KEYS = {
    "schema",
    "smoke",
    "launches",
    "elapsed_s",
    "machine",
    "versions",
    "rows",
    "targets",
    "derived",
    "skipped",
    "samples",
}
ROW_KEYS = {
    "section",
    "name",
    "unit",
    "n",
    "p50",
    "p95",
    "p99",
    "mean",
    "min",
    "max",
    "baseline",
    "ratio_p50",
    "ratio_p99",
    "note",
    "extra",
}
TARGET_KEYS = {"name", "goal", "value", "limit", "unit", "met", "value_over_limit"}
SECTIONS = {
    "launch", "pool", "layers", "checks", "plan", "binds", "concurrency", "memory", "scale",
    "size", "cli", "network",
}  # fmt: skip
POOL_RUNS = 5
LEVELS = (1, 8, 32, 128)
HELD = ("none", "proxy", "floor")
ROWS = {
    "launch.exec.nsconfine",
    "launch.exec.floor",
    "launch.exec.naive",
    "launch.exec.process",
    "launch.exit.nsconfine",
    "launch.exit.floor",
    "launch.exit.naive",
    "launch.exit.process",
    "launch.exit.nsconfine-empty-workspace",
    "launch.end.nsconfine",
    "launch.end.floor",
    "pool.exec.warm",
    "pool.exit.cold",
    "layers.spawn.on",
    "layers.spawn.off",
    "layers.pool.on",
    "layers.pool.off",
    "plan.binds-0",
    "plan.binds-1000",
    "binds.nsconfine.0",
    "binds.nsconfine.100",
    "concurrency.nsconfine.32",
    *(f"concurrency.{name}.{n}" for name in ("nsconfine", "floor") for n in LEVELS),
    *(
        f"pool.{name}.run{run}"
        for name in ("launch.warm", "process")
        for run in range(1, POOL_RUNS + 1)
    ),
    "pool.launch.warm.in-flight-32",
    "pool.process.in-flight-32",
    *(f"scale.held.{kind}.{what}" for kind in HELD for what in ("rss", "fds")),
    "scale.runner-files.0",
    "scale.runner-files.10000",
    "memory.bwrap.rss",
    "memory.launcher.python",
    "size.20MiB.nsconfine",
    "size.20MiB.naive",
    "cli.run",
    "cli.python",
    "cli.bwrap",
    "network.launch.proxy",
    "network.launch.none",
    "network.request.proxy",
    "network.request.direct",
    "network.download.plain",
    "network.download.tunnel",
    "network.download.direct",
    "network.memory.rss.proxy",
    "network.memory.rss.none",
    "network.memory.threads.proxy",
    "network.memory.threads.none",
}
TARGETS = {
    "end-of-session",
    "pool-layers-p50",
    "spawn-exec-p50-vs-floor",
    "spawn-exec-p99-vs-floor",
    "spawn-exit-p50-vs-floor",
    "spawn-exit-p99-vs-floor",
    "faster-than-naive-20MiB",
    "plan-default",
    "plan-1000-binds",
    "pool-warm-vs-process",
    "import",
    "cli-overhead",
    "network-launch-p50",
    "network-launch-p99",
    "network-request-p50",
    "network-download-plain",
    "network-download-tunnel",
    "pool-in-flight-32",
    *(f"concurrency-rate-{n}" for n in LEVELS),
    "held-fds-none",
    "held-fds-proxy",
    "runner-files-10000",
}


@pytest.fixture(scope="module")
def smoke_report(sandbox_ready: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "nsconfine.bench", "--smoke", "--json"],
        cwd=tmp_path_factory.mktemp("bench"),  # not the source tree: it would shadow the install
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.mark.confinement
def test_smoke_json_has_the_documented_keys(smoke_report: dict[str, Any]) -> None:
    """`--smoke --json` prints one JSON object with every documented top-level key."""
    assert set(smoke_report) >= TOP_LEVEL_KEYS
    assert smoke_report["smoke"] is True
    assert smoke_report["schema"] == 1


@pytest.mark.confinement
def test_smoke_rows_cover_every_section_with_full_statistics(
    smoke_report: dict[str, Any],
) -> None:
    """Every row carries n, the percentiles and its ratio fields, and every section has rows."""
    rows = {row["name"]: row for row in smoke_report["rows"]}
    assert set(rows) >= ROWS
    assert {row["section"] for row in rows.values()} == SECTIONS
    for row in rows.values():
        assert set(row) >= ROW_KEYS, row["name"]
        assert row["n"] == len(smoke_report["samples"][row["name"]]) >= 1
        assert all(math.isfinite(row[key]) for key in ("p50", "p95", "p99"))
        if row["baseline"] is not None:
            assert row["baseline"] in rows
            assert row["ratio_p50"] is not None


@pytest.mark.confinement
def test_smoke_judges_every_target(smoke_report: dict[str, Any]) -> None:
    """Each target is judged, met or not, with the numbers it was judged on."""
    targets = {target["name"]: target for target in smoke_report["targets"]}
    assert set(targets) >= TARGETS
    for target in targets.values():
        assert set(target) >= TARGET_KEYS
        assert isinstance(target["met"], bool)
    assert {"cli_overhead_ms", "import_ms"} <= set(smoke_report["derived"])
    assert {"network_request_added_p50_ms", "network_request_added_p99_ms"} <= set(
        smoke_report["derived"]
    )


@pytest.mark.confinement
def test_smoke_network_rows_have_their_baselines_from_the_run(smoke_report: dict[str, Any]) -> None:
    """Each proxy row of the network section is paired with its baseline from the same run:
    the launch with "none", the request and both downloads with the direct ones."""
    rows = {row["name"]: row for row in smoke_report["rows"]}
    assert rows["network.launch.proxy"]["baseline"] == "network.launch.none"
    assert rows["network.request.proxy"]["baseline"] == "network.request.direct"
    for how in ("plain", "tunnel"):
        assert rows[f"network.download.{how}"]["baseline"] == "network.download.direct"
        assert rows[f"network.download.{how}"]["unit"] == "MiB/s"


@pytest.mark.confinement
def test_smoke_scale_rows_have_their_floors_from_the_run(smoke_report: dict[str, Any]) -> None:
    """Each launch rate in flight is paired with the bwrap floor's at the same concurrency, the
    launcher's live sessions with the floor's, and the runner files with a bare launch."""
    rows = {row["name"]: row for row in smoke_report["rows"]}
    for level in LEVELS:
        ours, floor = rows[f"concurrency.nsconfine.{level}"], rows[f"concurrency.floor.{level}"]
        assert ours["baseline"] == f"concurrency.floor.{level}"
        assert {"launches_per_s"} <= set(ours["extra"]) & set(floor["extra"])
        assert f"concurrency_rate_ratio_{level}" in smoke_report["derived"]
    for what, unit in (("rss", "KiB"), ("fds", "fds")):
        held = [rows[f"scale.held.{kind}.{what}"] for kind in HELD]
        assert {row["unit"] for row in held} == {unit}
        assert len({row["n"] for row in held}) == 1  # the kinds measured in the same rounds
    assert rows["scale.runner-files.10000"]["baseline"] == "scale.runner-files.0"
    refused = smoke_report["derived"]["runner_files_10000_refused"]
    assert refused is None or "plan-refused" in refused


@pytest.mark.confinement
def test_smoke_pool_shows_each_run_against_its_own_bare_spawn(
    smoke_report: dict[str, Any],
) -> None:
    """The pool section reports each of its runs as a warm launch against the bare spawns of
    the same run, 32 launches at once against 32 bare spawns at once, and judges its goal on
    all the runs."""
    rows = {row["name"]: row for row in smoke_report["rows"]}
    for run in range(1, POOL_RUNS + 1):
        assert rows[f"pool.launch.warm.run{run}"]["baseline"] == f"pool.process.run{run}"
        assert rows[f"pool.launch.warm.run{run}"]["ratio_p50"] is not None
    assert not any(name.startswith("pool.launch.warm.run6") for name in rows)
    in_flight = rows["pool.launch.warm.in-flight-32"]
    assert in_flight["baseline"] == "pool.process.in-flight-32"
    assert in_flight["n"] == rows["pool.process.in-flight-32"]["n"] >= 32
    targets = {target["name"]: target for target in smoke_report["targets"]}
    assert f"each of {POOL_RUNS} runs" in targets["pool-warm-vs-process"]["goal"]


def _processes_naming(token: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as file:
                if token.encode() in file.read():
                    found.append(int(name))
        except (OSError, ValueError):
            pass
    return found


def _clone_delay(floor: Launchers, argv: tuple[str, ...], devnull: int) -> float:
    """How long after its spawn returns a floor's bwrap has cloned its sandbox's init (s),
    here and now: the median of 9."""
    delays = []
    for _ in range(9):
        started = FloorSession(floor.floor_pid(argv, devnull))
        began = time.monotonic()
        while not children(started.pid):
            assert time.monotonic() < began + 5, "the floor's bwrap never started its sandbox"
        delays.append(time.monotonic() - began)
        started.kill()
        started.wait()
    return statistics.median(delays)


@pytest.mark.confinement
def test_a_floor_killed_as_it_starts_leaves_nothing_running(
    sandbox_ready: None, plan: nsconfine.Plan
) -> None:
    """The scale section kills a floor's bwrap as soon as it has started (its warm-up round).
    Killed after its sandbox's init had been looked for but before it was cloned, the init
    outlived it, pid 1 of its namespace, holding the bench's stderr: a smoke run's pipe never
    reached EOF. Here the kills are aimed around the moment of the clone."""
    floor = Launchers(proven_bwrap(), plan)
    # The sleep's length names this test's floors in /proc.
    argv = ("/bin/sleep", f"1000.{uuid.uuid4().int % 10**15:015}")
    with open(os.devnull, "wb") as devnull:
        clone = _clone_delay(floor, argv, devnull.fileno())
        for attempt in range(400):
            started = FloorSession(floor.floor_pid(argv, devnull.fileno()))
            time.sleep(clone * (0.8 + 0.4 * attempt / 400))
            started.kill()
            started.wait()
    deadline = time.monotonic() + 5  # a killed sandbox's processes end soon; a leaked one never
    while (leaked := _processes_naming(argv[1])) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    assert leaked == []


@pytest.mark.parametrize("planted", ["at the file", "at its directory"])
def test_the_bench_world_is_made_without_following_a_planted_symlink(
    tmp_path: Path, planted: str
) -> None:
    """The bench's world belongs to the sessions' account, which can plant a symlink in it
    at any moment; a bench run as root made its files and gave them away by path, so a
    symlink at a bind file (or at a directory above one) had root empty a file anywhere,
    write it and chown it to that account (attacker's pass on the root launcher, stop 32).
    The world is made without following one now: it refuses, and the target is untouched."""
    from nsconfine.bench._core import World

    root = tmp_path / "world"
    root.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    victim.chmod(0o600)
    if planted == "at the file":
        (root / "binds").mkdir()
        (root / "binds" / "f0001").symlink_to(victim)
    else:
        (root / "binds").symlink_to(tmp_path)
    owner = (65534, 65534) if os.geteuid() == 0 else None
    w = World(str(root), "", "", [], -1, "bwrap", owner)
    with pytest.raises(FileExistsError):  # (O_EXCL, or the directory's mkdir)
        w.make("binds/victim" if planted != "at the file" else "binds/f0001", "1\n")
    assert victim.read_text() == "root's own\n"
    assert victim.stat().st_uid == os.geteuid()
    assert not (tmp_path / "victim" / "x").exists()


def test_the_floors_mount_points_are_made_without_following_a_planted_symlink(
    tmp_path: Path,
) -> None:
    """The floor makes the empty protected files nsconfine makes at launch, in the bench's
    workspace (the sessions' account's): a symlink planted at a directory above one had root
    make a file where it led and chown it (the same pass). It refuses now."""
    from nsconfine._plan import model as p
    from nsconfine.bench._core import _make_stubs

    workspace = tmp_path / "ws"
    workspace.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workspace / ".claude").symlink_to(elsewhere)
    settings = str(workspace / ".claude" / "settings.json")
    with pytest.raises(OSError, match="no symlinks"):
        _make_stubs(nsconfine.Plan([p.ro_bind(settings, settings, "a stub", stub="file")]))
    assert os.listdir(elsewhere) == []


def test_the_bench_without_psutil_says_what_to_install() -> None:
    """`python -m nsconfine.bench` where psutil cannot be imported (a plain `pip install .`)
    says to install the bench's extra, in one line, and measures nothing (acceptance re-check:
    a traceback from the first section's import)."""
    finished = subprocess.run(
        [sys.executable, "-c", "import runpy, sys; sys.modules['psutil'] = None; "
         "runpy.run_module('nsconfine.bench', run_name='__main__')", "--smoke"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert finished.returncode == 69, finished.stderr
    assert finished.stderr == (
        "nsconfine bench: the bench needs psutil: pip install 'nsconfine[bench]'\n"
    )
    assert finished.stdout == ""
