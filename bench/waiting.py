"""Waiting is cheap: a worker's memory with many runs paused on unknown calls, and how fast they resume.

Each run makes one `issue_credit` call of the `billing-manual` toolset (no reconcile hook, no dedup
window: nothing to poll) against the example billing service with the `drop` fault (the credit is
committed, the connection cut): the call is unknown and its run pauses. The worker is a separate
process; paused runs beyond its workflow cache are evicted and cost no memory; its RSS (VmRSS) is
read at each checkpoint once every run so far is paused, and its peak (VmHWM) at the end. Also printed: open workflows per waiting call (a call with nothing to poll waits on
its run alone: 1), and the time for all runs to finish once every call is settled in bulk (a ledger
settlement and a `resolve` nudge per run, as the operator API sends).

The worker is started as users start it, `python worker.py`, with only where Temporal, the ledger,
the agents file and the task queue are: its workflow cache is onceflow's default (runtime/config.py,
`default_max_cached_workflows`) unless --cache sets ONCEFLOW_MAX_CACHED_WORKFLOWS.

    .venv/bin/python bench/waiting.py [--checkpoints 1000 10000] [--cache N] [--concurrency 64]

Quick check: --checkpoints 20 100. TEMPORAL_ADDRESS or ONCEFLOW_DATABASE_URL, when set, replace the
embedded parts (see onceflow.cli.dev).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from e2e_stack import dev_stack  # bench/e2e_stack.py, beside this file
from temporalio.client import Client

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, Status
from onceflow.ledger.status import EventSource
from onceflow.runtime.client import new_run_id, start_run
from onceflow.runtime.config import Settings, default_max_cached_workflows
from onceflow.sdk.payloads import AgentRunInput, ResolveSignal

TASK_QUEUE = "onceflow-bench-waiting"
WORKER_SCRIPT = Path(__file__).resolve().parents[1] / "worker.py"
AGENT = "bench-wait"
ACCOUNT = "acct_wait"
# Long intervals: a paused run wakes for nothing while it is measured.
AGENTS = {
    "toolsets": {"billing-manual": "onceflow.examples.billing.tools:billing_manual"},
    "agents": {
        AGENT: {
            "model": {
                "provider": "scripted",
                "script": [
                    {
                        "tool_calls": [
                            {
                                "name": "issue_credit",
                                "arguments": {"account_id": ACCOUNT, "amount_cents": 100},
                            }
                        ]
                    },
                    {"final": "done"},
                ],
            },
            "toolsets": ["billing-manual"],
            "tool_policy": {
                "on_indeterminate": "pause",
                "reconcile_deadline": "2h",
                "reconcile_initial_interval": "1h",
                "reconcile_max_interval": "1h",
                "recheck_interval": "1h",
            },
        }
    },
}


def rss_mb(pid: int, field: str = "VmRSS:") -> float:
    """A process's resident memory (VmRSS), or its peak so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


async def count_waiting(ledger: Ledger) -> int:
    async with ledger.connection("bench") as conn:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM tool_executions WHERE agent = $1 AND status = 'indeterminate'", AGENT
            )
        )


async def until(check: object, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


async def open_workflows(client: Client) -> int:
    return (await client.count_workflows(f"ExecutionStatus = 'Running' AND TaskQueue = '{TASK_QUEUE}'")).count


async def start_runs(client: Client, first: int, count: int, concurrency: int) -> list[str]:
    gate = asyncio.Semaphore(concurrency)
    run_ids: list[str] = []

    async def one(n: int) -> None:
        async with gate:
            run_id = new_run_id()
            await start_run(
                client,
                AgentRunInput(agent=AGENT, tenant="bench", input=json.dumps({"n": n}), max_turns=3),
                run_id=run_id,
                task_queue=TASK_QUEUE,
            )
            run_ids.append(run_id)

    await asyncio.gather(*(one(n) for n in range(first, first + count)))
    return run_ids


async def settle_all(client: Client, ledger: Ledger, run_ids: list[str], concurrency: int) -> float:
    """Settle every call (completed, as an operator who found the credit would) and nudge its run,
    then wait for every run to finish. Returns seconds from the first settlement to the last result."""
    gate = asyncio.Semaphore(concurrency)
    async with ledger.connection("bench") as conn:
        rows = await conn.fetch(
            "SELECT run_id, key FROM tool_executions WHERE run_id = ANY($1::text[])", run_ids
        )
    keys = {row["run_id"]: row["key"] for row in rows}
    began = time.perf_counter()

    async def one(run_id: str) -> None:
        async with gate:
            key = keys[run_id]
            await ledger.settle(
                key,
                status=Status.COMPLETED,
                actor="operator:bench",
                reason="found in the billing console (bench)",
                result={"credit_id": f"cr_{run_id}"},
                source=EventSource.API,
            )
            handle = client.get_workflow_handle(run_id)
            await handle.signal("resolve", ResolveSignal(key=key, actor="operator:bench"))

    await asyncio.gather(*(one(run_id) for run_id in run_ids))

    async def finished(run_id: str) -> None:
        async with gate:
            await client.get_workflow_handle(run_id).result()

    await asyncio.gather(*(finished(run_id) for run_id in run_ids))
    return time.perf_counter() - began


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="onceflow-waiting-") as tmp:
        stack = dev_stack(Path(tmp) / "stack")
        worker: asyncio.subprocess.Process | None = None
        try:
            info = await stack.start()
            agents_file = Path(tmp) / "agents.yaml"
            agents_file.write_text(json.dumps(AGENTS))  # JSON is YAML
            # As users start it: where things are, nothing else of onceflow's (or OpenTelemetry's).
            environment = {
                name: value
                for name, value in os.environ.items()
                if not name.startswith(("ONCEFLOW_", "OTEL_", "TEMPORAL_"))
            }
            environment.update(info.environment())
            environment.update({"ONCEFLOW_TASK_QUEUE": TASK_QUEUE, "ONCEFLOW_AGENTS": str(agents_file)})
            if args.cache is not None:
                environment["ONCEFLOW_MAX_CACHED_WORKFLOWS"] = str(args.cache)
            log = (Path(tmp) / "worker.log").open("wb")
            worker = await asyncio.create_subprocess_exec(
                sys.executable, str(WORKER_SCRIPT), env=environment, stdout=log, stderr=log
            )
            settings = Settings(
                temporal_address=info.temporal_address,
                temporal_namespace=info.namespace,
                task_queue=TASK_QUEUE,
                database_url=info.database_url,
                agents_path=str(agents_file),
            )
            from onceflow.runtime.client import connect

            client = await connect(settings)
            ledger = await Ledger.connect(info.database_url)
            async with BillingClient(info.billing_url) as billing:
                await billing.clear_faults()
                await billing.set_account_fault(ACCOUNT, "drop")
            await asyncio.sleep(5)  # the worker starts polling
            if worker.returncode is not None:
                raise RuntimeError(f"the worker exited: {(Path(tmp) / 'worker.log').read_text()[-2000:]}")
            cache = (
                f"ONCEFLOW_MAX_CACHED_WORKFLOWS={args.cache}"
                if args.cache is not None
                else f"the default workflow cache ({default_max_cached_workflows()} runs on this machine)"
            )
            print(
                f"one `python worker.py` process, {cache}; "
                f"Python {platform.python_version()}; {os.cpu_count()} CPUs; {platform.platform()}"
            )
            print(f"worker RSS before any run: {rss_mb(worker.pid):.0f} MB")
            run_ids: list[str] = []
            try:
                for checkpoint in args.checkpoints:
                    run_ids += await start_runs(
                        client, len(run_ids), checkpoint - len(run_ids), args.concurrency
                    )

                    async def all_paused(expected: int = checkpoint) -> bool:
                        return await count_waiting(ledger) >= expected

                    try:
                        await until(all_paused, f"{checkpoint} paused runs", timeout=60 + checkpoint * 0.5)
                    except RuntimeError:
                        print((Path(tmp) / "worker.log").read_text()[-3000:])
                        raise
                    await asyncio.sleep(args.settle_seconds)  # the last workflow tasks complete
                    opened = await open_workflows(client)
                    print(
                        f"{checkpoint:>6} runs paused on unknown calls: worker RSS {rss_mb(worker.pid):6.0f} MB"
                        f"  open workflows {opened} ({opened / checkpoint:.2f} per waiting call)"
                    )
                print(f"worker peak RSS until now: {rss_mb(worker.pid, 'VmHWM:'):.0f} MB")
                seconds = await settle_all(client, ledger, run_ids, args.concurrency)
                print(
                    f"all {len(run_ids)} settled in bulk and resumed in {seconds:.1f} s "
                    f"({len(run_ids) / seconds:.0f} runs/s); worker RSS after {rss_mb(worker.pid):.0f} MB"
                )
            finally:
                await ledger.close()
        finally:
            if worker is not None:
                worker.terminate()
                try:
                    await asyncio.wait_for(worker.wait(), 30)
                except TimeoutError:
                    worker.kill()
            await stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument(
        "--cache",
        type=int,
        default=None,
        help="ONCEFLOW_MAX_CACHED_WORKFLOWS for the worker (default: unset)",
    )
    parser.add_argument("--concurrency", type=int, default=64, help="starts and settlements in flight")
    parser.add_argument("--settle-seconds", type=float, default=5.0, help="pause before each reading")
    args = parser.parse_args()
    if sorted(args.checkpoints) != args.checkpoints or args.checkpoints[0] < 1:
        parser.error("--checkpoints must be increasing positive counts")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    asyncio.run(bench(args))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
