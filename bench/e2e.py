"""End to end: one write call through onceflow against the same call from a plain Temporal activity.

onceflow: an AgentRunWorkflow whose scripted agent makes exactly one `issue_credit` call (describe
the agent, a model turn, the write activity `run_write_tool`: reserve in the ledger, POST /credits,
record the outcome; then a final model turn).
plain: a workflow whose single-attempt activity makes the same HTTP request (POST /credits to the
example billing service with an Idempotency-Key, through a new BillingClient per call, as
`issue_credit` does) and writes nothing anywhere else. With --plain-shape mirrored (the default) no-op
activities stand where onceflow has describe_agent and its two model turns, so that the write is the
third activity of its run on both sides; with --plain-shape single it is the workflow's only activity.
(An activity scheduled by a workflow's first task measures ~3 ms slower on the dev server, from start
bookkeeping the server is still doing then; that gap would hide most of the ledger's cost.)

Both run on one dev stack (Temporal dev server, embedded PostgreSQL, billing service) and one
in-process worker hosting both, one run at a time, alternating onceflow / plain (the order flips
every pair), after a few warm-up runs of each. Per call: the write activity's latency from history
(ActivityTaskScheduled -> ActivityTaskCompleted event times), which isolates the per-call cost, split
into the time inside the worker (a timing interceptor, on both kinds) and the rest (Temporal's), and
for onceflow the ledger's reserve and complete. Per run: wall time from start to result, as runs/s.

The floor: after each pair of runs, the two ledger statements a write call cannot do without (its
guarded reservation with the default intent guard, claiming the run id as a run's first write does,
then its completion: the two durable commits the design requires), sent bare on one asyncpg
connection with the same values a write call sends, and with the write's send between them
(untimed), as a write call makes them; each is also printed alone. The
`floor ratio p50` line is (onceflow's write latency - plain's) / that pair, at the p50 of each: how
many times its own two commits onceflow adds on top of a plain activity (goal <= 1.25), with a 95%
bootstrap interval (the ratio of two medians of a noisy latency: about +-0.25 at 200 runs). The
`above the floor p50` line is the same three medians as a difference in ms: what a write call adds
besides its two commits, which, unlike the ratio, does not grow when the disk commits faster.

    .venv/bin/python bench/e2e.py [--runs 200] [--warmup 5] [--plain-shape mirrored|single]
                                  [--shared-ssl-context]

TEMPORAL_ADDRESS or ONCEFLOW_DATABASE_URL, when set, replace the embedded parts (see onceflow.cli.dev).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import platform
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import asyncpg
from e2e_stack import (  # bench/e2e_stack.py, beside this file
    AGENT,
    AGENTS,
    AMOUNT_CENTS,
    ONCEFLOW_ACTIVITY,
    PLAIN_ACTIVITY,
    PLAIN_SHAPES,
    TASK_QUEUE,
    TIMINGS,
    PlainCreditInput,
    PlainCreditWorkflow,
    TimedLedger,
    activity_latency,
    bench_settings,
    bench_worker,
    dev_stack,
    percentile,
    plain_credit,
    share_ssl_context,
)
from temporalio.client import Client

from onceflow.examples.billing.client import BillingClient
from onceflow.examples.billing.tools import CREDIT_TIMEOUT
from onceflow.ledger import Guard, Ledger, queries
from onceflow.ledger.base import to_json
from onceflow.ledger.canonical import canonical_payload
from onceflow.runtime.agents import build_registry
from onceflow.runtime.client import connect, new_run_id, start_run
from onceflow.runtime.constants import ACTIVITY_MARGIN
from onceflow.sdk.payloads import AgentRunInput

# -- measuring --------------------------------------------------------------------------------------


@dataclass
class Sample:
    activity_ms: float  # ActivityTaskScheduled -> ActivityTaskCompleted, from history
    worker_ms: float  # inside the worker: the activity function, interceptors included
    run_ms: float  # start_workflow -> result, as the client sees it
    reserve_ms: float = 0.0  # onceflow only: Ledger.reserve
    complete_ms: float = 0.0  # onceflow only: Ledger.complete


async def onceflow_run(client: Client, n: int) -> Sample:
    run_input = AgentRunInput(
        agent=AGENT, tenant="bench", input=f'{{"account_id": "acct_e2e_once_{n}"}}', max_turns=3
    )
    begun = time.perf_counter()
    handle = await start_run(client, run_input, run_id=new_run_id(), task_queue=TASK_QUEUE)
    result = await handle.result()
    run_ms = (time.perf_counter() - begun) * 1000
    statuses = [call.status for call in result.calls]
    if statuses != ["completed"]:
        raise RuntimeError(f"{handle.id}: expected one completed call, got {statuses}")
    return Sample(
        activity_ms=await activity_latency(handle, ONCEFLOW_ACTIVITY),
        worker_ms=TIMINGS.pop((handle.id, ONCEFLOW_ACTIVITY)),
        run_ms=run_ms,
        reserve_ms=TIMINGS.pop((handle.id, "reserve")),
        complete_ms=TIMINGS.pop((handle.id, "complete")),
    )


async def plain_run(client: Client, n: int, shape: str) -> Sample:
    run_id = f"plain-{uuid.uuid4().hex[:16]}"
    before, after = PLAIN_SHAPES[shape]
    # The same key shape as onceflow's ("<run id>:<tool call id>").
    request = PlainCreditInput(
        account_id=f"acct_e2e_plain_{n}",
        amount_cents=AMOUNT_CENTS,
        idempotency_key=f"{run_id}:call_0_0",
        steps_before=before,
        steps_after=after,
    )
    begun = time.perf_counter()
    handle = await client.start_workflow(PlainCreditWorkflow.run, request, id=run_id, task_queue=TASK_QUEUE)
    credit = await handle.result()
    run_ms = (time.perf_counter() - begun) * 1000
    if credit.get("account_id") != request.account_id:
        raise RuntimeError(f"{run_id}: unexpected answer {credit}")
    return Sample(
        activity_ms=await activity_latency(handle, PLAIN_ACTIVITY),
        worker_ms=TIMINGS.pop((handle.id, PLAIN_ACTIVITY)),
        run_ms=run_ms,
    )


async def floor_pair(conn: asyncpg.Connection, n: int) -> tuple[float, float]:
    """The write call's two statements, bare: the guarded reservation (default guard) that a run's
    first write sends, claiming the run id in it, and the completion, as ledger.guarded and
    ledger.calls send them, with the credit sent between them (untimed). Returns each statement's
    wall time in ms."""
    run_id = f"floor-{uuid.uuid4().hex[:16]}"
    key = f"{run_id}:call_0_0"
    account = f"acct_e2e_floor_{n}"
    arguments = {"account_id": account, "amount_cents": AMOUNT_CENTS}
    payload = canonical_payload("issue_credit", arguments)
    guard = Guard()
    owner = "bench-floor"
    begun = time.perf_counter()
    await conn.fetchrow(
        queries.GUARDED_RESERVE_CLAIMING,
        guard.locks(tenant="bench", run_id=run_id, tool_name="issue_credit", payload_sha256=payload.sha256),
        key, "bench", run_id, "call_0_0", AGENT, "issue_credit", "external",
        payload.text, payload.sha256, owner, False, CREDIT_TIMEOUT + ACTIVITY_MARGIN,
        guard.intent, None, False, guard.on_busy, None, None, None, None, "billing", None,
        None, None, None, None,  # what the model heard, the attempt's deadline and start: none
        f"execution-{uuid.uuid4().hex}",
    )  # fmt: skip
    reserved = time.perf_counter()
    # The send between them, untimed, as a write call makes it: statements sent back to back find
    # the database's backend and caches warm, and measured about half a millisecond cheaper.
    credit = await plain_credit(
        PlainCreditInput(account_id=account, amount_cents=AMOUNT_CENTS, idempotency_key=key)
    )
    sent = time.perf_counter()
    await conn.fetchrow(queries.COMPLETE_STARTED, key, owner, to_json(credit), None)
    return (reserved - begun) * 1000, (time.perf_counter() - sent) * 1000


def bootstrap_interval(
    once_ms: list[float], plain_ms: list[float], pairs: list[float], resamples: int = 2000
) -> tuple[float, float]:
    """A 95% interval for the floor ratio p50: each sample drawn again with replacement, `resamples`
    times (a fixed seed, so one run's figures print the same interval). The write's latency carries the
    HTTP call's spread on both sides, several ms; at 50 runs the ratio's interval is about +-0.3."""
    rng = random.Random(22)

    def p50(values: list[float]) -> float:
        return percentile(rng.choices(values, k=len(values)), 0.5)

    ratios = sorted((p50(once_ms) - p50(plain_ms)) / p50(pairs) for _ in range(resamples))
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def report(samples: dict[str, list[Sample]], floor: list[tuple[float, float]]) -> None:
    def row(name: str, values: list[float]) -> str:
        return (
            f"  {name:<9}{percentile(values, 0.5):>9.1f}{percentile(values, 0.95):>9.1f}"
            f"{statistics.fmean(values):>9.1f}{min(values):>9.1f}{max(values):>9.1f}"
        )

    header = f"  {'':<9}{'p50':>9}{'p95':>9}{'mean':>9}{'min':>9}{'max':>9}"
    print("write activity, ActivityTaskScheduled -> ActivityTaskCompleted (ms):")
    print(header)
    for kind in samples:
        print(row(kind, [s.activity_ms for s in samples[kind]]))
    print("  of which inside the worker (the activity function):")
    for kind in samples:
        print(row(kind, [s.worker_ms for s in samples[kind]]))
    print("  of which outside it (Temporal: dispatch, completion, history):")
    for kind in samples:
        print(row(kind, [s.activity_ms - s.worker_ms for s in samples[kind]]))
    once = samples["onceflow"]
    print("  onceflow inside the worker:")
    print(row("reserve", [s.reserve_ms for s in once]))
    print(row("complete", [s.complete_ms for s in once]))
    print(row("rest", [s.worker_ms - s.reserve_ms - s.complete_ms for s in once]))
    print("whole run, start_workflow -> result (ms):")
    print(header)
    for kind in samples:
        print(row(kind, [s.run_ms for s in samples[kind]]))
    rates = {kind: len(runs) / (sum(s.run_ms for s in runs) / 1000) for kind, runs in samples.items()}
    for kind, rate in rates.items():
        print(f"{kind} runs/s: {rate:.1f}")
    once_ms = [s.activity_ms for s in once]
    plain_ms = [s.activity_ms for s in samples["plain"]]
    pairs = [reserve + complete for reserve, complete in floor]
    print(row("2 stmts", pairs) + "  (the floor: reserve + complete, bare)")
    print(row("reserve", [reserve for reserve, _ in floor]) + "  (bare, claiming the run id)")
    print(row("complete", [complete for _, complete in floor]) + "  (bare)")
    once_p50, plain_p50, floor_p50 = (percentile(v, 0.5) for v in (once_ms, plain_ms, pairs))
    low, high = bootstrap_interval(once_ms, plain_ms, pairs)
    print(
        f"floor ratio p50: {(once_p50 - plain_p50) / floor_p50:.2f}"
        f"  (onceflow {once_p50:.1f} ms - plain {plain_p50:.1f} ms = {once_p50 - plain_p50:.1f} ms"
        f" over the two bare statements' {floor_p50:.1f} ms; goal <= 1.25;"
        f" 95% bootstrap interval {low:.2f} to {high:.2f})"
    )
    # The same p50s as a difference: what a write call adds besides its two commits. Unlike the
    # ratio, it does not move with the disk's commit latency.
    print(
        f"above the floor p50: {once_p50 - plain_p50 - floor_p50:.2f} ms"
        "  (onceflow - plain - the two bare statements)"
    )
    once_p95, plain_p95, floor_p95 = (percentile(v, 0.95) for v in (once_ms, plain_ms, pairs))
    print(f"floor ratio p95: {(once_p95 - plain_p95) / floor_p95:.2f}")
    print(f"p50 ratio: {percentile(once_ms, 0.5) / percentile(plain_ms, 0.5):.2f}  (onceflow / plain)")
    print(f"p95 ratio: {percentile(once_ms, 0.95) / percentile(plain_ms, 0.95):.2f}")
    print(f"runs/s ratio: {rates['onceflow'] / rates['plain']:.2f}")


async def bench(runs: int, warmup: int, shape: str, shared_ssl_context: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="onceflow-e2e-") as tmp:
        stack = dev_stack(Path(tmp) / "stack")
        try:
            info = await stack.start()
            os.environ.update(info.environment())  # issue_credit reads ONCEFLOW_BILLING_URL
            registry = build_registry(AGENTS, "bench/e2e.py")
            client = await connect(bench_settings(info))
            ledger = await Ledger.connect(info.database_url)
            bare = await asyncpg.connect(info.database_url)
            floor: list[tuple[float, float]] = []
            timed = cast(Ledger, TimedLedger(ledger))
            async with BillingClient(info.billing_url) as billing:
                await billing.clear_faults()
                before = (await billing.effects()).total
            try:
                async with bench_worker(client, timed, registry):
                    kinds: dict[str, Callable[[Client, int], Awaitable[Sample]]] = {
                        "onceflow": onceflow_run,
                        "plain": functools.partial(plain_run, shape=shape),
                    }
                    for n in range(warmup):
                        for run in kinds.values():
                            await run(client, -1 - n)
                        await floor_pair(bare, -1 - n)
                    samples: dict[str, list[Sample]] = {kind: [] for kind in kinds}
                    for n in range(runs):
                        order = list(kinds) if n % 2 == 0 else list(reversed(kinds))
                        for kind in order:
                            samples[kind].append(await kinds[kind](client, n))
                        floor.append(await floor_pair(bare, n))
            finally:
                await bare.close()
                await ledger.close()
            async with BillingClient(info.billing_url) as billing:
                effects = await billing.effects()
            applied = effects.total - before
            expected = 3 * (runs + warmup)  # onceflow, plain and the floor's own send
            if applied != expected or any(count != 1 for count in effects.effects.values()):
                raise RuntimeError(f"billing applied {applied} credits for {expected} calls")
            http = "one SSL context shared" if shared_ssl_context else "as shipped"
            print(
                f"{runs} runs of each kind, alternating, after {warmup} warm-up runs of each; "
                f"one in-process worker; plain shape {shape}; a new BillingClient per call ({http}); "
                f"{applied} credits applied, each key once"
            )
            print(
                f"Python {platform.python_version()}; temporalio "
                f"{_version('temporalio')}; {os.cpu_count()} CPUs; {platform.platform()}"
            )
            report(samples, floor)
        finally:
            await stack.stop()


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200, help="measured runs of each kind")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up runs of each kind, not counted")
    parser.add_argument(
        "--plain-shape",
        choices=sorted(PLAIN_SHAPES),
        default="mirrored",
        help="mirrored: the plain write is its run's third activity, as onceflow's; single: the only one",
    )
    parser.add_argument(
        "--shared-ssl-context",
        action="store_true",
        help="make every BillingClient reuse one SSL context (see share_ssl_context)",
    )
    args = parser.parse_args()
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be at least 1 and --warmup at least 0")
    if args.shared_ssl_context:
        share_ssl_context()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    asyncio.run(bench(args.runs, args.warmup, args.plain_shape, args.shared_ssl_context))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
