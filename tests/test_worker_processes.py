"""Crash drills: real worker processes (`python worker.py`) SIGKILLed at chosen instructions.

The billing service runs in a process of its own, honours no idempotency key and records every
request it receives, so its count of requests per key survives every kill and hides no second send.
After each kill a fresh worker process takes over; the run finishes, no key is sent twice, and the
ledger agrees with the billing service.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient, BillingConflict
from onceflow.ledger import FailureKind, Ledger, Status
from onceflow.runtime.client import start_run
from onceflow.sdk.payloads import AgentRunInput, AgentRunResult
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.billing_tools import (
    HELD_BEFORE_SEND,
    HELD_IN_LOOKUP,
    HOLD_BEFORE_SEND,
    HOLD_LOOKUP,
    MARKERS_ENV,
    PROCESS_AGENTS_YAML,
)
from tests.support.processes import ChildProcesses

# Enough for: the activity timeout of the killed attempt (tool 2 s + margin), the killed worker's
# sticky workflow task timing out (10 s), a new worker starting, and reconciling.
RUN_TIMEOUT = 60


@dataclass
class Drill:
    """One test's workers, all on a fresh task queue, over the session's Temporal and a fresh ledger."""

    client: Client
    ledger: Ledger
    billing: BillingClient
    processes: ChildProcesses
    env: dict[str, str]
    markers: Path
    order: str = field(default_factory=lambda: f"ord_{uuid.uuid4().hex[:10]}")
    _workers: int = 0

    @property
    def account(self) -> str:
        return "acct_" + self.order.removeprefix("ord_")

    def start_worker(self) -> subprocess.Popen[bytes]:
        self._workers += 1
        return self.processes.start(f"worker-{self._workers}", ["worker.py"], self.env)

    def kill(self, worker: subprocess.Popen[bytes]) -> None:
        self.processes.kill(worker)

    def hold(self, marker: str) -> None:
        (self.markers / marker).touch()

    def release(self, marker: str) -> None:
        (self.markers / marker).unlink()

    def held(self, marker: str) -> bool:
        return (self.markers / marker).exists()

    async def start_run(self) -> tuple[WorkflowHandle[AgentRunWorkflow, AgentRunResult], str]:
        handle = await start_run(
            self.client,
            AgentRunInput(agent="credit-billing", tenant="acme", input=json.dumps({"order_id": self.order})),
            run_id=f"run-{uuid.uuid4().hex[:12]}",
            task_queue=self.env["ONCEFLOW_TASK_QUEUE"],
        )
        return handle, f"{handle.id}:call_1_0"

    async def wait_for(self, check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20) -> None:
        async def poll() -> None:
            while not await check():
                await asyncio.sleep(0.02)

        try:
            await asyncio.wait_for(poll(), timeout)
        except TimeoutError:
            pytest.fail(f"gave up after {timeout}s waiting for {what}\n{self.processes.logs_text()}")

    async def result(self, handle: WorkflowHandle[AgentRunWorkflow, AgentRunResult]) -> AgentRunResult:
        try:
            return await asyncio.wait_for(handle.result(), RUN_TIMEOUT)
        except TimeoutError:
            status = await handle.query(AgentRunWorkflow.status)
            pytest.fail(f"run {handle.id} did not finish: {status}\n{self.processes.logs_text()}")

    async def sent(self, key: str) -> int:
        """Credit requests billing received with `key`, counted on arrival."""
        return (await self.billing.received(key)).received

    async def row_is(self, key: str, status: Status) -> bool:
        record = await self.ledger.find(key)
        return record is not None and record.status is status


@pytest.fixture
async def drill(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    database_url: str,
    billing_url: str,
    tmp_path: Path,
) -> AsyncIterator[Drill]:
    client = temporal_env.client
    agents = tmp_path / "agents.yaml"
    agents.write_text(PROCESS_AGENTS_YAML)
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": client.namespace,
        "ONCEFLOW_TASK_QUEUE": f"tq-{uuid.uuid4().hex[:10]}",
        "ONCEFLOW_DATABASE_URL": database_url,
        "ONCEFLOW_AGENTS": str(agents),
        "ONCEFLOW_BILLING_URL": billing_url,
        MARKERS_ENV: str(markers),
    }
    processes = ChildProcesses(tmp_path / "logs")
    try:
        async with BillingClient(billing_url) as billing:
            yield Drill(client, ledger, billing, processes, env, markers)
    finally:
        processes.close()


async def test_killed_before_reserving_leaves_no_row_and_the_next_worker_sends_once(drill: Drill) -> None:
    drill.hold(HOLD_LOOKUP)
    first = drill.start_worker()
    handle, key = await drill.start_run()

    async def held_in_lookup() -> bool:
        return drill.held(HELD_IN_LOOKUP)

    await drill.wait_for(held_in_lookup, "the lookup to be held")
    drill.kill(first)
    assert await drill.ledger.find(key) is None
    assert await drill.sent(key) == 0

    drill.release(HOLD_LOOKUP)
    second = drill.start_worker()
    result = await drill.result(handle)

    record = await drill.ledger.get(key)
    credit = await drill.billing.find_credit(key)
    assert await drill.sent(key) == 1
    assert (await drill.billing.effects()).count(key) == 1
    assert record.status is Status.COMPLETED
    assert record.attempt == 1
    assert record.owner is not None and record.owner.endswith(f":{second.pid}")
    assert [e.kind for e in record.events] == ["reserved", "completed"]
    assert credit is not None and record.result == credit
    assert credit["credit_id"] in result.final


async def test_killed_after_reserving_before_sending_is_reconciled_as_not_applied(drill: Drill) -> None:
    drill.hold(HOLD_BEFORE_SEND)
    first = drill.start_worker()
    handle, key = await drill.start_run()

    async def reserved_and_held() -> bool:
        return drill.held(HELD_BEFORE_SEND) and await drill.row_is(key, Status.STARTED)

    await drill.wait_for(reserved_and_held, "the call to be reserved and held before sending")
    drill.kill(first)
    drill.release(HOLD_BEFORE_SEND)
    drill.start_worker()
    result = await drill.result(handle)

    record = await drill.ledger.get(key)
    assert record.status is Status.FAILED
    assert record.failure_kind is FailureKind.NOT_APPLIED
    assert record.settled_by == "reconciler"
    assert [e.to_status for e in record.events if e.to_status] == [
        Status.STARTED,
        Status.INDETERMINATE,
        Status.FAILED,
    ]
    assert result.calls[-1].key == key
    assert result.calls[-1].status == "failed"
    # Nothing was sent, the service agrees nothing landed, and its fence keeps it that way.
    assert await drill.sent(key) == 0
    assert (await drill.billing.effects()).count(key) == 0
    assert await drill.billing.find_credit(key) is None
    with pytest.raises(BillingConflict):
        await drill.billing.credit(drill.account, 1000, idempotency_key=key)
    assert (await drill.billing.effects()).count(key) == 0
    assert [r.outcome for r in (await drill.billing.received(key)).requests] == ["refused"]


async def test_killed_after_the_downstream_applied_is_reconciled_as_completed_once(drill: Drill) -> None:
    # The service commits the credit, then holds the answer; the worker dies waiting for it.
    await drill.billing.set_account_fault(drill.account, "apply_then_hang", delay_seconds=30, times=1)
    first = drill.start_worker()
    handle, key = await drill.start_run()

    async def applied() -> bool:
        return (await drill.billing.effects()).count(key) == 1

    await drill.wait_for(applied, "the billing service to apply the credit")
    drill.kill(first)
    assert await drill.row_is(key, Status.STARTED)
    drill.start_worker()
    result = await drill.result(handle)

    record = await drill.ledger.get(key)
    credit = await drill.billing.find_credit(key)
    assert await drill.sent(key) == 1
    assert (await drill.billing.effects()).count(key) == 1
    assert record.status is Status.COMPLETED
    assert record.settled_by == "reconciler"
    assert [e.to_status for e in record.events if e.to_status] == [
        Status.STARTED,
        Status.INDETERMINATE,
        Status.COMPLETED,
    ]
    assert credit is not None and record.result == credit
    assert record.result_reference == credit["credit_id"]
    assert credit["credit_id"] in result.final
