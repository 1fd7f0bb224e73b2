"""The examples run as written: examples/systemd/'s broker starts real role sessions, refuses
when the host cannot confine, and its unit passes `systemd-analyze verify`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import MUST_WORK, open_up, session_dirs, session_uid, user_options

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "systemd"
BROKER = EXAMPLE / "broker.py"
UNIT = EXAMPLE / "nsconfine-broker.service"


class Broker:
    """The example broker as a process of its own, in a stand-in state directory."""

    def __init__(
        self, root: Path, env: dict[str, str] | None = None, make_sessions: bool = True
    ) -> None:
        self.state, self.socket = root / "state", root / "broker.sock"
        self.credential = root / "credential.env"
        self.credential.write_text("ANTHROPIC_API_KEY=sk-stand-in\n")
        self.credential.chmod(0o600)
        self.state.mkdir()
        open_up(self.state)
        self.workspace = self.state / "sessions" / "coder" / "ws"
        if make_sessions:  # else the broker makes them
            session_dirs(self.state / "sessions" / "coder", "ws", "run")
            session_dirs(self.state / "sessions" / "reviewer", "ws", "run")
        argv = [sys.executable, str(BROKER), "--socket", str(self.socket)]
        argv += ["--state", str(self.state), "--credential", str(self.credential)]
        self.process = subprocess.Popen(
            [*argv, *user_options()],
            cwd="/",  # the installed package, not the source tree
            env={**os.environ, **(env or {})},
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        self.log = ""
        while "listening on" not in self.log:
            line = self.process.stderr.readline()
            if not line:  # it ended without listening
                break
            self.log += line

    def request(self, role: str, argv: list[str]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(self.socket))
            client.sendall(json.dumps({"role": role, "argv": argv}).encode() + b"\n")
            reply: dict[str, Any] = json.loads(client.makefile("rb").readline())
            return reply

    def stop(self) -> int:
        """SIGTERM, as `systemctl stop` sends; the exit status, and the whole log kept."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        _, rest = self.process.communicate(timeout=60)
        self.log += rest
        return self.process.returncode


@pytest.fixture
def broker_root(tmp_path: Path) -> Path:
    open_up(tmp_path)
    return tmp_path


# What a coder session reports: its uid, the credential it was given, whether it sees the
# credential file or the broker's logs, and a file written in its workspace.
PROBE = """id -u; echo "key=$ANTHROPIC_API_KEY"
test -e "$1" && echo credential-file-visible
test -e "$2" && echo broker-logs-visible
echo made > made"""


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_the_broker_runs_role_sessions_and_logs_their_manifest(broker_root: Path) -> None:
    """The broker runs a request in its role's confined session, with the credential in the
    session's environment only, and logs the manifest's digest and the launch's timings."""
    broker = Broker(broker_root)
    try:
        logs = broker.state / "logs"
        probe = ["sh", "-c", PROBE, "probe", str(broker.credential), str(logs)]
        reply = broker.request("coder", probe)
        assert reply["status"] == 0, reply
        output = Path(reply["output"]).read_text().split()
        assert output == [str(session_uid()), "key=sk-stand-in"]
        assert (broker.workspace / "made").read_text() == "made\n"  # the host's own file
        # The same probe outside any sandbox sees both: the check above could fail.
        (outside := broker_root / "outside").mkdir()
        host = subprocess.run(probe, cwd=outside, capture_output=True, text=True, check=True)
        assert host.stdout.split()[-2:] == ["credential-file-visible", "broker-logs-visible"]
        digest = reply["manifest"]
        manifest = (broker.state / "manifests" / f"{digest}.json").read_bytes()
        assert hashlib.sha256(manifest).hexdigest() == digest
        assert str(broker.workspace) in {e["dest"] for e in json.loads(manifest)["entries"]}
        reviewer = broker.request("reviewer", ["sh", "-c", "echo x > written"])
        assert reviewer["status"] != 0  # the reviewer role's workspace is read-only
        assert reviewer["manifest"] != digest
    finally:
        status = broker.stop()
    assert status == 0, broker.log
    started = [line for line in broker.log.splitlines() if "session" in line and "started" in line]
    assert len(started) == 2, broker.log
    assert f"manifest sha256 {digest}, timings (ms) " in started[0]
    assert '"exec": ' in started[0]


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_the_broker_makes_its_sessions_directories_for_their_account(broker_root: Path) -> None:
    """Started on an empty state directory, the broker makes each role's workspace and run
    directory for the account its sessions run as (as root, `--user`), and starts."""
    broker = Broker(broker_root, make_sessions=False)
    try:
        assert "listening on" in broker.log, broker.log
        reply = broker.request("coder", ["sh", "-c", "echo made > made"])
        assert reply["status"] == 0, reply
        assert (broker.workspace / "made").read_text() == "made\n"
        for role in ("coder", "reviewer"):
            for name in ("ws", "run"):
                made = broker.state / "sessions" / role / name
                assert made.stat().st_uid == session_uid(), made
    finally:
        broker.stop()


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_the_broker_refuses_to_start_when_the_host_cannot_confine(broker_root: Path) -> None:
    """With no usable bwrap the broker refuses to start, with exit 69 and one log line, and
    listens for nothing."""
    broker = Broker(broker_root, env={"NSCONFINE_BWRAP": str(broker_root / "no-such-bwrap")})
    status = broker.stop()
    assert status == 69, broker.log
    assert "refusing to start, nothing was run: sandbox-unavailable" in broker.log
    assert not broker.socket.exists()


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_the_broker_refuses_a_request_once_bwrap_breaks(broker_root: Path) -> None:
    """A bwrap that breaks while the broker runs makes it refuse the next request that needs
    a new sandbox (sandbox-unavailable), running nothing; the staged one still served."""
    bins = broker_root / "bins"
    bins.mkdir()
    open_up(bins)
    bwrap = bins / "bwrap"
    shutil.copy(shutil.which("bwrap") or "/usr/bin/bwrap", bwrap)
    broker = Broker(broker_root, env={"NSCONFINE_BWRAP": str(bwrap)})
    try:
        broken = bins / "broken"
        broken.write_text("#!/bin/sh\nexit 1\n")
        broken.chmod(0o755)
        broken.replace(bwrap)
        first = broker.request("coder", ["sh", "-c", "echo > first"])
        assert first["status"] == 0, first  # staged before bwrap broke
        second = broker.request("coder", ["sh", "-c", "echo > second"])
        assert second["refused"] == "sandbox-unavailable", second
    finally:
        status = broker.stop()
    assert status == 0, broker.log
    assert (broker.workspace / "first").exists()
    assert not (broker.workspace / "second").exists()
    assert "role coder: refused, nothing was run: sandbox-unavailable" in broker.log


def systemd_tool(name: str) -> str:
    """The path of a systemd tool; skip without it (fail with NSCONFINE_MUST_WORK=1)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/bin")
    if found is None:
        message = f"{name} is not installed (apt-get install systemd)"
        if MUST_WORK:
            pytest.fail(message)
        pytest.skip(message)
    return found


def verify(root: Path, unit_text: str) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` on unit_text installed in a stand-in root that has systemd's
    own units and the ExecStart program."""
    analyze = systemd_tool("systemd-analyze")
    if not (root / "usr").exists():
        shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
        (root / "opt/nsconfine/bin").mkdir(parents=True)
        shutil.copy("/bin/true", root / "opt/nsconfine/bin/python3")
    units = root / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    (units / UNIT.name).write_text(unit_text)
    return subprocess.run(
        [analyze, "verify", f"--root={root}", "--man=no", "--generators=no", UNIT.name],
        capture_output=True,
        text=True,
    )


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """The unit verifies with no error and no warning; a unit with a mistake does not."""
    unit = UNIT.read_text()
    clean = verify(tmp_path, unit)
    assert (clean.returncode, clean.stdout + clean.stderr) == (0, "")
    mistaken = verify(tmp_path, unit.replace("ProtectHome=yes", "ProtectHome=maybe"))
    assert "Failed to parse protect home value, ignoring: maybe" in mistaken.stderr


@pytest.mark.root  # tmpfiles gives the file to the account it made: chown
def test_sysusers_and_tmpfiles_make_the_account_and_the_credential_file(tmp_path: Path) -> None:
    """In a stand-in root, the sysusers snippet makes the broker's account and the tmpfiles
    snippet its credential file, the account's own with mode 0600 as nsconfine requires."""
    sysusers, tmpfiles = systemd_tool("systemd-sysusers"), systemd_tool("systemd-tmpfiles")
    (tmp_path / "etc").mkdir()
    root = f"--root={tmp_path}"
    subprocess.run([sysusers, root, str(EXAMPLE / "nsconfine-broker.sysusers")], check=True)
    tmpfiles_conf = str(EXAMPLE / "nsconfine-broker.tmpfiles")
    subprocess.run([tmpfiles, root, "--create", tmpfiles_conf], check=True)
    account = next(
        line.split(":")
        for line in (tmp_path / "etc/passwd").read_text().splitlines()
        if line.startswith("nsconfine-broker:")
    )
    assert account[5] == "/var/lib/nsconfine-broker"  # the unit's StateDirectory
    credential = (tmp_path / "etc/nsconfine-broker/credential.env").stat()
    assert (credential.st_uid, credential.st_mode & 0o7777) == (int(account[2]), 0o600)
