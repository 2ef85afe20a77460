"""What bench/e2e.py shares with its siblings (bench/concurrency.py, bench/queue_at_scale.py): the
agent both sides call through, the plain side (a workflow whose single-attempt activity makes the
same HTTP request, no ledger), the worker hosting both with the timing that splits each write's
latency, and the dev stack on free ports. bench/e2e.py is the measurement.

Run nothing here: `.venv/bin/python bench/e2e.py --help`.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor, Worker

with workflow.unsafe.imports_passed_through():
    import httpx

    from onceflow.activities import all_activities, default_identity
    from onceflow.cli.dev import DevStack, StackConfig, StackInfo
    from onceflow.examples.billing.client import BillingClient
    from onceflow.examples.billing.tools import CREDIT_TIMEOUT
    from onceflow.ledger import Ledger
    from onceflow.runtime.agents import AgentRegistry
    from onceflow.runtime.config import Settings, env
    from onceflow.runtime.constants import ACTIVITY_MARGIN, LEDGER_STEP_TIMEOUT
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
    writes: int = 1  # requests one after another, each its own activity and key (bench/peers.py)


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
        for n in range(request.writes):
            each = (
                request
                if n == 0
                else request.model_copy(
                    update={
                        "account_id": f"{request.account_id}_{n}",
                        "idempotency_key": f"{request.idempotency_key}_{n}",
                    }
                )
            )
            credit = await workflow.execute_activity(
                plain_credit,
                each,
                start_to_close_timeout=CREDIT_TIMEOUT + ACTIVITY_MARGIN,
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        for _ in range(request.steps_after):
            await workflow.execute_activity(plain_step, start_to_close_timeout=LEDGER_STEP_TIMEOUT)
        return credit


# -- timing and the worker --------------------------------------------------------------------------


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


def dev_stack(data_dir: Path) -> DevStack:
    """Temporal dev server, embedded PostgreSQL, billing service and operator API on free ports, and
    no worker: the bench hosts its own (bench_worker), or starts one (bench/waiting.py)."""
    temporal_port, ui_port, billing_port, api_port = free_ports(4)
    return DevStack(
        StackConfig(
            data_dir=data_dir,
            temporal_port=temporal_port,
            ui_port=ui_port,
            billing_port=billing_port,
            api_port=api_port,
            worker=False,
        )
    )


def bench_settings(info: StackInfo) -> Settings:
    """The settings the bench's client connects with, on the stack it started."""
    return Settings(
        temporal_address=info.temporal_address,
        temporal_namespace=info.namespace,
        task_queue=TASK_QUEUE,
        database_url=info.database_url,
        agents_path="bench/e2e.py",
    )
