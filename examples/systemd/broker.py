"""An example broker: starts confined role sessions on request, and nothing else.

A client connects to the broker's unix socket and sends one JSON line,
`{"role": "coder", "argv": ["make", "test"]}`; the broker runs argv in that role's session
and answers with one JSON line once it has ended: `{"status": 0, "output": PATH, ...}` (the
session's stdout and stderr are in PATH, a file of the broker's that no session sees), or
`{"refused": CODE, "message": ...}`. Nothing is ever run outside a sandbox: a host that cannot
confine (bwrap missing or broken) is refused at start with exit 69, and a request that meets
one later is refused; no request is retried or run any other way.

Each role's session is planned once at start; its manifest is written to STATE/manifests/
under its digest (the sha256 of `plan.manifest_json()`; nsconfine has no digest of its own),
and every launch logs that digest with its timings. A `Pool` per role keeps one sandbox
staged, so a request waits only for the hand-off.

It is one asyncio loop (nsconfine.aio): each request is a task, each launch runs in the
loop's executor, and a running session holds no thread of the broker's, however many run.

    python3 broker.py --socket /run/nsconfine-broker/broker.sock \
        --state /var/lib/nsconfine-broker --credential /etc/nsconfine-broker/credential.env

See README.md beside this file for the systemd unit that runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import pwd
import signal
import subprocess
import sys
import tempfile
from typing import Any

import nsconfine
import nsconfine.aio

# Each role and the built-in profiles its sessions get (see `nsconfine profiles`).
ROLES = {"coder": ["coder"], "reviewer": ["reviewer"]}

log = logging.getLogger("nsconfine-broker")


class Role:
    """One role's plan, its digest, and the pool of sandboxes staged for it."""

    def __init__(self, name: str, plan: nsconfine.Plan, state: str) -> None:
        self.name = name
        manifest = plan.manifest_json()
        self.digest = hashlib.sha256(manifest.encode()).hexdigest()
        manifests = os.path.join(state, "manifests")
        os.makedirs(manifests, mode=0o700, exist_ok=True)
        with open(os.path.join(manifests, f"{self.digest}.json"), "w") as file:
            file.write(manifest)
        # The pool's own thread stages a sandbox again after each launch, while the launched
        # command runs.
        self.pool = nsconfine.aio.Pool(plan, size=1)

    async def start(self) -> None:
        """Stage the role's first sandbox: a host that cannot confine is refused here."""
        if await self.pool.wait_staged(120):
            log.info("role %s: manifest sha256 %s, one sandbox staged", self.name, self.digest)
        else:  # the first request says why
            log.warning("role %s: manifest sha256 %s, no sandbox staged", self.name, self.digest)

    async def run(self, argv: list[str], logs: str) -> dict[str, Any]:
        """Run argv in a session of this role; its output goes to a new file in logs."""
        descriptor, output = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log", dir=logs)
        with open(descriptor, "wb") as out:
            process = await self.pool.launch(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        sandbox = process.sandbox
        # Milliseconds to each stage, counted from when this sandbox began to be staged.
        timings = {stage: round(seconds * 1000, 2) for stage, seconds in sandbox.timings.items()}
        log.info(
            "role %s: session %d started, manifest sha256 %s, timings (ms) %s",
            self.name,
            sandbox.child_pid,
            self.digest,
            json.dumps(timings),
        )
        status = await process.wait()
        log.info("role %s: session %d ended with status %d", self.name, sandbox.child_pid, status)
        return {"role": self.name, "status": status, "output": output, "manifest": self.digest}


async def start_roles(
    options: argparse.Namespace, pools: contextlib.AsyncExitStack
) -> dict[str, Role]:
    """Plan every role's session and stage its pool (closed with pools); NsconfineError if
    any is refused."""
    roles: dict[str, Role] = {}
    for name, profiles in ROLES.items():
        home = os.path.join(options.state, "sessions", name)
        workspace, run_dir = os.path.join(home, "ws"), os.path.join(home, "run")
        os.makedirs(home, exist_ok=True)
        for directory in (workspace, run_dir):
            make_for_session(directory, options.user)
        session = nsconfine.Session(
            workspace=workspace,
            run_dir=run_dir,
            profile=profiles,
            credential=options.credential,
            user=options.user,  # only when the broker runs as root (not under its unit)
        )
        role = roles[name] = Role(name, session.plan(), options.state)
        pools.push_async_callback(role.pool.aclose)
        await role.start()
    return roles


def make_for_session(directory: str, user: str | None) -> None:
    """Make a session's directory, if missing, for the account the session runs as: a broker
    run as root gives it to --user (nsconfine refuses a workspace that account cannot write);
    one that exists is left as it is."""
    try:
        os.mkdir(directory, 0o755)
    except FileExistsError:
        return
    if user is not None and os.geteuid() == 0:
        try:
            account = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        except KeyError:
            return  # no such account: the session's plan refuses it, by name
        os.chown(directory, account.pw_uid, account.pw_gid, follow_symlinks=False)


async def answer(roles: dict[str, Role], logs: str, line: bytes) -> dict[str, Any]:
    """The reply to one request line."""
    try:
        request = json.loads(line)
        role, argv = roles[request["role"]], request["argv"]
    except (ValueError, KeyError, TypeError):
        return refusal("usage", f'send one line: {{"role": one of {list(ROLES)}, "argv": [...]}}')
    if not isinstance(argv, list) or not all(isinstance(arg, str) for arg in argv):
        return refusal("usage", "argv must be a list of strings")
    try:
        return await role.run(argv, logs)
    except nsconfine.SandboxUnavailable as error:
        log.error("role %s: refused, nothing was run: %s", role.name, error)
        return refusal(error.code, error.message)
    except nsconfine.NsconfineError as error:
        log.warning("role %s: refused: %s", role.name, error)
        return refusal(error.code, error.message)
    except OSError as error:  # the command could not be executed in the sandbox
        log.warning("role %s: exec-failed: %s", role.name, error)
        return refusal("exec-failed", str(error))


def refusal(code: str, message: str) -> dict[str, Any]:
    return {"refused": code, "message": message}


async def serve(options: argparse.Namespace, logs: str) -> int:
    """Stage the roles' pools, then answer requests until SIGTERM."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)  # systemctl stop: close the pools
    async with contextlib.AsyncExitStack() as pools:
        try:
            roles = await start_roles(options, pools)
        except nsconfine.NsconfineError as error:
            log.error("refusing to start, nothing was run: %s", error)
            return error.exit_status

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.closing(writer):
                try:
                    line = await reader.readline()
                except ValueError:  # longer than the limit: no request is
                    line = b""
                reply = await answer(roles, logs, line)
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()

        server = await asyncio.start_unix_server(handle, options.socket, limit=65536)
        log.info("listening on %s for roles %s", options.socket, ", ".join(roles))
        await stopping.wait()
        server.close()  # not waiting for requests still running: their sessions end with us
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start confined role sessions on request.")
    parser.add_argument("--socket", required=True, help="the unix socket to listen on")
    parser.add_argument("--state", required=True, help="sessions, manifests and output logs")
    parser.add_argument("--credential", help="KEY=VALUE file for the sessions (mode 0600)")
    parser.add_argument("--user", help="the account sessions run as (only when run as root)")
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    logs = os.path.join(options.state, "logs")
    os.makedirs(logs, mode=0o700, exist_ok=True)
    return asyncio.run(serve(options, logs))


if __name__ == "__main__":
    sys.exit(main())
