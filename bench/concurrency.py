"""Many runs in flight on one worker: write calls per second and their latency, onceflow against plain.

For each N (default 1, 16, 64, 256): N runs started at once, each making one write call, on one
in-process worker (build_worker's settings: the SDK's default slots) hosting both kinds, the same
stack as bench/e2e.py (Temporal dev server, embedded PostgreSQL, the example billing service).
onceflow: AgentRunWorkflow whose scripted agent makes one `issue_credit` call; plain: bench/e2e.py's
plain workflow (the same POST /credits from a single-attempt activity, with no-op activities where
onceflow has describe_agent and its model turns). Per kind and N: write calls per second (N over
the wall time from the first start to the last result) and the write activity's latency
(ActivityTaskScheduled -> ActivityTaskCompleted, from history) at p50 and p95; then onceflow/plain.
Kinds alternate per round, the order flipping each round.

    .venv/bin/python bench/concurrency.py [--in-flight 1 16 64 256] [--rounds 2]

Quick check: --in-flight 1 8. TEMPORAL_ADDRESS or ONCEFLOW_DATABASE_URL, when set, replace the
embedded parts (see onceflow.cli.dev).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from e2e_stack import (  # bench/e2e_stack.py, beside this file
    AGENT,
    AGENTS,
    AMOUNT_CENTS,
    ONCEFLOW_ACTIVITY,
    PLAIN_ACTIVITY,
    PLAIN_SHAPES,
    TASK_QUEUE,
    PlainCreditInput,
    PlainCreditWorkflow,
    activity_latency,
    bench_worker,
    dev_stack,
    percentile,
)
from temporalio.client import Client, WorkflowHandle

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger
from onceflow.runtime.agents import build_registry
from onceflow.runtime.client import connect, new_run_id, start_run
from onceflow.runtime.config import Settings
from onceflow.sdk.payloads import AgentRunInput


async def start_onceflow(client: Client, n: int) -> WorkflowHandle[Any, Any]:
    run_input = AgentRunInput(
        agent=AGENT, tenant="bench", input=f'{{"account_id": "acct_conc_once_{n}"}}', max_turns=3
    )
    return await start_run(client, run_input, run_id=new_run_id(), task_queue=TASK_QUEUE)


async def start_plain(client: Client, n: int) -> WorkflowHandle[Any, Any]:
    run_id = f"plain-{uuid.uuid4().hex[:16]}"
    before, after = PLAIN_SHAPES["mirrored"]
    request = PlainCreditInput(
        account_id=f"acct_conc_plain_{n}",
        amount_cents=AMOUNT_CENTS,
        idempotency_key=f"{run_id}:call_0_0",
        steps_before=before,
        steps_after=after,
    )
    return await client.start_workflow(PlainCreditWorkflow.run, request, id=run_id, task_queue=TASK_QUEUE)


KINDS = {"onceflow": (start_onceflow, ONCEFLOW_ACTIVITY), "plain": (start_plain, PLAIN_ACTIVITY)}


async def batch(client: Client, kind: str, in_flight: int, first: int) -> tuple[float, list[float]]:
    """`in_flight` runs of `kind` at once: (write calls per second, write latencies in ms)."""
    start, activity_name = KINDS[kind]
    began = time.perf_counter()
    handles = await asyncio.gather(*(start(client, first + i) for i in range(in_flight)))
    await asyncio.gather(*(handle.result() for handle in handles))
    rate = in_flight / (time.perf_counter() - began)
    gate = asyncio.Semaphore(32)

    async def latency(handle: WorkflowHandle[Any, Any]) -> float:
        async with gate:
            return await activity_latency(handle, activity_name)

    return rate, list(await asyncio.gather(*(latency(h) for h in handles)))


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="onceflow-concurrency-") as tmp:
        stack = dev_stack(Path(tmp) / "stack")
        try:
            info = await stack.start()
            os.environ.update(info.environment())  # issue_credit reads ONCEFLOW_BILLING_URL
            registry = build_registry(AGENTS, "bench/concurrency.py")
            settings = Settings(
                temporal_address=info.temporal_address,
                temporal_namespace=info.namespace,
                task_queue=TASK_QUEUE,
                database_url=info.database_url,
                agents_path="bench/concurrency.py",
            )
            client = await connect(settings)
            ledger = await Ledger.connect(info.database_url)
            async with BillingClient(info.billing_url) as billing:
                await billing.clear_faults()
            print(
                f"one in-process worker (SDK default slots); Python {platform.python_version()}; "
                f"{os.cpu_count()} CPUs; {platform.platform()}"
            )
            print(f"{'in flight':>9}  {'kind':<8}  {'calls/s':>8}  {'p50 ms':>8}  {'p95 ms':>8}")
            counter = 0
            try:
                async with bench_worker(client, ledger, registry):
                    for kind in KINDS:  # warm-up
                        await batch(client, kind, 4, -100)
                    for in_flight in args.in_flight:
                        rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
                        latencies: dict[str, list[float]] = {kind: [] for kind in KINDS}
                        for round_ in range(args.rounds):
                            order = list(KINDS) if round_ % 2 == 0 else list(reversed(KINDS))
                            for kind in order:
                                rate, ms = await batch(client, kind, in_flight, counter)
                                counter += in_flight
                                rates[kind].append(rate)
                                latencies[kind] += ms
                        for kind in KINDS:
                            rate = sum(rates[kind]) / len(rates[kind])
                            ms = latencies[kind]
                            print(
                                f"{in_flight:>9}  {kind:<8}  {rate:>8.1f}  {percentile(ms, 0.5):>8.1f}"
                                f"  {percentile(ms, 0.95):>8.1f}"
                            )
                        ratio = (sum(rates["onceflow"]) / sum(rates["plain"])) if rates["plain"] else 0.0
                        print(f"{in_flight:>9}  onceflow/plain calls/s: {ratio:.2f}")
            finally:
                await ledger.close()
        finally:
            await stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="batches of each kind per N (one alone is noisy: see docs/benchmarks.md)",
    )
    args = parser.parse_args()
    if min(args.in_flight) < 1 or args.rounds < 1:
        parser.error("--in-flight and --rounds must be at least 1")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    asyncio.run(bench(args))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
