"""How long an event loop stalls while it launches sessions: nsconfine.spawn called on the
loop itself, against nsconfine.aio.spawn and aio.Pool.launch (each launch's blocking part in
the loop's executor, each session's end awaited on its sentinel).

    python benchmarks/bench_aio.py [--launches 64] [--at-once 8] [--user NAME]

A ticker task sleeps 1 ms at a time and records how late each wake-up is; for each way of
launching, `launches` sessions of `/bin/true` are started, `at-once` at a time, and waited for.
It reports the ticker's worst and 99th-percentile lateness and the launches per second. As
root, sessions run as --user (default nobody). A program that measures and reports: nothing
checks its numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable

import nsconfine
import nsconfine.aio

TICK = 0.001


async def measure(launch: Callable[[], Awaitable[None]], launches: int, at_once: int) -> str:
    """Run launches `at_once` at a time while a ticker notes how late the loop wakes it."""
    lateness: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(TICK)
            lateness.append(time.perf_counter() - before - TICK)

    async def worker(count: int) -> None:
        for _ in range(count):
            await launch()
            await asyncio.sleep(0)  # the loop runs between launches, whichever way they block

    ticking = asyncio.ensure_future(ticker())
    started = time.perf_counter()
    shares = [launches // at_once + (n < launches % at_once) for n in range(at_once)]
    await asyncio.gather(*(worker(share) for share in shares))
    elapsed = time.perf_counter() - started
    done.set()
    await ticking
    lateness.sort()
    p99 = lateness[int(len(lateness) * 0.99)]
    return (
        f"worst stall {lateness[-1] * 1000:7.1f} ms   p99 {p99 * 1000:6.1f} ms   "
        f"{launches / elapsed:6.1f} launches/s"
    )


async def main(plan: nsconfine.Plan, launches: int, at_once: int) -> None:
    argv = ["/bin/true"]

    async def on_the_loop() -> None:
        nsconfine.spawn(plan, argv).wait()  # blocks the loop: the way not to

    async def aio_spawn() -> None:
        await (await nsconfine.aio.spawn(plan, argv)).wait()

    async with nsconfine.aio.Pool(plan, size=at_once) as pool:
        await pool.wait_staged(120)

        async def aio_pool() -> None:
            await (await pool.launch(argv)).wait()

        for name, launch in [
            ("nsconfine.spawn on the loop", on_the_loop),
            ("nsconfine.aio.spawn", aio_spawn),
            ("nsconfine.aio.Pool.launch", aio_pool),
        ]:
            await launch()  # warm: the proof of bwrap, the executor's threads
            print(f"{name:<30}{await measure(launch, launches, at_once)}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=64)
    parser.add_argument("--at-once", type=int, default=8)
    parser.add_argument("--user", default="nobody" if os.geteuid() == 0 else None)
    options = parser.parse_args()
    root = tempfile.mkdtemp(prefix="nsconfine-bench-aio-")
    try:
        os.chmod(root, 0o755)
        workspace, run_dir = os.path.join(root, "ws"), os.path.join(root, "run")
        for directory in (workspace, run_dir):
            os.mkdir(directory)
            if options.user is not None:
                account = pwd.getpwnam(options.user)
                os.chown(directory, account.pw_uid, account.pw_gid)
        session = nsconfine.Session(workspace=workspace, run_dir=run_dir, user=options.user)
        asyncio.run(main(session.plan(), options.launches, options.at_once))
    finally:
        shutil.rmtree(root, ignore_errors=True)
