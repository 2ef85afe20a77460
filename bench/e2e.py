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

    .venv/bin/python bench/e2e.py [--runs 50] [--warmup 5] [--plain-shape mirrored|single]
                                  [--shared-ssl-context]

TEMPORAL_ADDRESS or ONCEFLOW_DATABASE_URL, when set, replace the embedded parts (see onceflow.cli.dev).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import platform
import socket
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ConfigDict
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor, Worker

with workflow.unsafe.imports_passed_through():
    import httpx

    from onceflow.activities import all_activities, default_identity
    from onceflow.cli.dev import DevStack, StackConfig
    from onceflow.examples.billing.client import BillingClient
    from onceflow.examples.billing.tools import CREDIT_TIMEOUT
    from onceflow.ledger import Ledger
    from onceflow.runtime.agents import AgentRegistry, build_registry
    from onceflow.runtime.client import connect, new_run_id, start_run
    from onceflow.runtime.config import Settings, env
    from onceflow.runtime.constants import ACTIVITY_MARGIN, LEDGER_STEP_TIMEOUT
    from onceflow.sdk.payloads import AgentRunInput
    from onceflow.workflows import ALL_WORKFLOWS

TASK_QUEUE = "onceflow-bench-e2e"
AGENT = "bench-credit"
AMOUNT_CENTS = 500
ONCEFLOW_ACTIVITY = "run_write_tool"
PLAIN_ACTIVITY = "bench_plain_credit"
PLAIN_STEP = "bench_plain_step"
# No-op activities before and after the plain write: where onceflow has describe_agent and a model
# turn before its write, and the final model turn after it.
PLAIN_SHAPES = {"mirrored": (2, 1), "single": (0, 0)}

# One agent whose scripted model makes exactly one write call, then answers.
AGENTS: dict[str, Any] = {
    "toolsets": {"billing": "onceflow.examples.billing.tools:billing"},
    "agents": {
        AGENT: {
            "model": {
                "provider": "scripted",
                "script": [
                    {
                        "tool_calls": [
                            {
                                "name": "issue_credit",
                                "arguments": {
                                    "account_id": "{{ input.account_id }}",
                                    "amount_cents": AMOUNT_CENTS,
                                },
                            }
                        ]
                    },
                    {"final": "credited {{ results.issue_credit.credit_id }}"},
                ],
            },
            "toolsets": ["billing"],
            # Anything unexpected fails the run rather than parking it for reconciliation.
            "tool_policy": {"on_indeterminate": "fail"},
        }
    },
}


# -- the plain side: the same HTTP call from a single-attempt activity, no ledger -----------------------


class PlainCreditInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    account_id: str
    amount_cents: int
    idempotency_key: str
    steps_before: int = 0
    steps_after: int = 0


@activity.defn(name=PLAIN_ACTIVITY)
async def plain_credit(request: PlainCreditInput) -> dict[str, Any]:
    """POST /credits once, exactly as `issue_credit` does it (a new client per call, same timeout)."""
    async with BillingClient(
        env("ONCEFLOW_BILLING_URL"), timeout=CREDIT_TIMEOUT.total_seconds() + 1
    ) as client:
        credit = await client.credit(
            request.account_id, request.amount_cents, idempotency_key=request.idempotency_key
        )
    return credit.model_dump(mode="json")


@activity.defn(name=PLAIN_STEP)
async def plain_step() -> None:
    """Nothing: stands where onceflow has describe_agent or a model turn (--plain-shape mirrored)."""


@workflow.defn(name="BenchPlainCredit")
class PlainCreditWorkflow:
    @workflow.run
    async def run(self, request: PlainCreditInput) -> dict[str, Any]:
        for _ in range(request.steps_before):
            await workflow.execute_activity(plain_step, start_to_close_timeout=LEDGER_STEP_TIMEOUT)
        credit = await workflow.execute_activity(
            plain_credit,
            request,
            start_to_close_timeout=CREDIT_TIMEOUT + ACTIVITY_MARGIN,
            retry_policy=RetryPolicy(maximum_attempts=1),
        )
        for _ in range(request.steps_after):
            await workflow.execute_activity(plain_step, start_to_close_timeout=LEDGER_STEP_TIMEOUT)
        return credit


# -- measuring --------------------------------------------------------------------------------------


@dataclass
class Sample:
    activity_ms: float  # ActivityTaskScheduled -> ActivityTaskCompleted, from history
    worker_ms: float  # inside the worker: the activity function, interceptors included
    run_ms: float  # start_workflow -> result, as the client sees it
    reserve_ms: float = 0.0  # onceflow only: Ledger.reserve
    complete_ms: float = 0.0  # onceflow only: Ledger.complete


# Where the time goes, written down as the activities run: (workflow id, activity or step) -> ms.
TIMINGS: dict[tuple[str, str], float] = {}


class _TimingInterceptor(Interceptor):
    """Times each activity inside the worker: the rest of the history latency is Temporal's."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _TimedActivity(next)


class _TimedActivity(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        begun = time.perf_counter()
        try:
            return await super().execute_activity(input)
        finally:
            info = activity.info()
            TIMINGS[info.workflow_id or "", info.activity_type] = (time.perf_counter() - begun) * 1000


class TimedLedger:
    """The ledger, with reserve and complete timed (a perf_counter pair each); all else passes through."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        begun = time.perf_counter()
        try:
            return await self._ledger.reserve(*args, **kwargs)
        finally:
            TIMINGS[activity.info().workflow_id or "", "reserve"] = (time.perf_counter() - begun) * 1000

    async def complete(self, *args: Any, **kwargs: Any) -> Any:
        begun = time.perf_counter()
        try:
            return await self._ledger.complete(*args, **kwargs)
        finally:
            TIMINGS[activity.info().workflow_id or "", "complete"] = (time.perf_counter() - begun) * 1000


def _seconds(event: Any) -> float:
    return float(event.event_time.seconds) + event.event_time.nanos / 1e9


async def activity_latency(handle: WorkflowHandle[Any, Any], activity_name: str) -> float:
    """ActivityTaskScheduled -> ActivityTaskCompleted, in ms, for the one activity of that name."""
    history = await handle.fetch_history()
    scheduled: dict[int, float] = {}
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == activity_name:
                scheduled[event.event_id] = _seconds(event)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            scheduled_id = event.activity_task_completed_event_attributes.scheduled_event_id
            if scheduled_id in scheduled:
                return (_seconds(event) - scheduled[scheduled_id]) * 1000
    raise RuntimeError(f"{handle.id}: no completed {activity_name} activity in its history")


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


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def share_ssl_context() -> None:
    """--shared-ssl-context: every BillingClient (both kinds alike) reuses one SSL context.

    httpx builds a new SSL context (loading the CA bundle, ~20 ms) for each AsyncClient it makes, even
    for plain http; BillingClient makes one per instance and the billing tools one per call. This patches
    BillingClient, in this process only, to pass one context made once, as a fix in
    examples/billing/client.py would. Clients and connections stay per call.
    """
    context = httpx.create_ssl_context()

    def init(self: BillingClient, base_url: str, timeout: float = 10.0) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, verify=context)

    BillingClient.__init__ = init  # type: ignore[method-assign]


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def bench_worker(client: Client, ledger: Ledger, registry: AgentRegistry) -> Worker:
    """onceflow's worker as onceflow.runtime.worker.build_worker makes it, plus the plain workflow and
    activity and the timing interceptor (which times both kinds alike).

    (build_worker's Worker registers itself with the client as it is made, so it cannot be copied
    with extra registrations: this repeats its arguments instead.)
    """
    identity = default_identity()
    return Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[*ALL_WORKFLOWS, PlainCreditWorkflow],
        activities=[*all_activities(ledger, registry, identity), plain_credit, plain_step],
        identity=identity,
        interceptors=[_TimingInterceptor()],
    )


def report(samples: dict[str, list[Sample]]) -> None:
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
    print(f"p50 ratio: {percentile(once_ms, 0.5) / percentile(plain_ms, 0.5):.2f}")
    print(f"p95 ratio: {percentile(once_ms, 0.95) / percentile(plain_ms, 0.95):.2f}")
    print(f"runs/s ratio: {rates['onceflow'] / rates['plain']:.2f}")


async def bench(runs: int, warmup: int, shape: str, shared_ssl_context: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="onceflow-e2e-") as tmp:
        temporal_port, ui_port, billing_port = free_ports(3)
        stack = DevStack(
            StackConfig(
                data_dir=Path(tmp) / "stack",
                temporal_port=temporal_port,
                ui_port=ui_port,
                billing_port=billing_port,
                worker=False,
            )
        )
        try:
            info = await stack.start()
            os.environ.update(info.environment())  # issue_credit reads ONCEFLOW_BILLING_URL
            registry = build_registry(AGENTS, "bench/e2e.py")
            settings = Settings(
                temporal_address=info.temporal_address,
                temporal_namespace=info.namespace,
                task_queue=TASK_QUEUE,
                database_url=info.database_url,
                agents_path="bench/e2e.py",
            )
            client = await connect(settings)
            ledger = await Ledger.connect(info.database_url)
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
                    samples: dict[str, list[Sample]] = {kind: [] for kind in kinds}
                    for n in range(runs):
                        order = list(kinds) if n % 2 == 0 else list(reversed(kinds))
                        for kind in order:
                            samples[kind].append(await kinds[kind](client, n))
            finally:
                await ledger.close()
            async with BillingClient(info.billing_url) as billing:
                effects = await billing.effects()
            applied = effects.total - before
            expected = 2 * (runs + warmup)
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
            report(samples)
        finally:
            await stack.stop()


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50, help="measured runs of each kind")
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
