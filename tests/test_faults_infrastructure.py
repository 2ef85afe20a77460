"""Infrastructure taken away mid-run (issue #6, "more faults"), with real processes throughout.

Workers are `python worker.py` processes; the billing service runs in a process of its own, honours
no idempotency key (`--no-dedup`) and records every request it receives, per key; workers reach it
through a proxy in this process that can lose the answers to writes. Each test then takes something
away:

- PostgreSQL (a cluster of the test's own) stopped and started again: nothing is sent without a
  reservation while it is away, and every run finishes after it returns;
- the Temporal dev server (one of the test's own) SIGKILLed and restarted from its file: the same
  runs resume and finish;
- both worker processes on a task queue SIGKILLed at once: fresh workers finish every run;
- the billing service's answers to writes lost for a while: calls go unknown, and the reconcile
  hook settles each one truthfully once answers come back.

Invariants checked every time: one ledger row per tool call, each key's credit request received by
billing exactly once, and one effect for every call the ledger calls completed.

Covered elsewhere and not repeated here: one worker SIGKILLed at one chosen instruction
(test_worker_processes) and one database refusing connections at reserve (test_agent_run_faults).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import FailureKind, Ledger, Status, ToolExecutionRecord, migrate
from onceflow.local.postgres import create_database
from onceflow.runtime.client import start_run
from onceflow.runtime.constants import ERR_LEDGER_UNAVAILABLE, ERR_OUTCOME_NOT_RECORDED
from onceflow.sdk.payloads import AgentRunInput, AgentRunResult, Phase
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.billing_tools import PROCESS_AGENTS_YAML
from tests.support.history import activity_runs, history_events
from tests.support.processes import ChildProcesses, kill_together
from tests.support.proxy import DroppingProxy
from tests.support.servers import OwnPostgres, OwnTemporal

RunHandle = WorkflowHandle[AgentRunWorkflow, AgentRunResult]


# Enough for a killed attempt's activity timeout (tool 2 s + 5 s), a dead worker's sticky workflow
# task timing out (10 s), a fresh worker starting, and reconciling.
RUN_TIMEOUT = 60


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ChildProcesses]:
    children = ChildProcesses(tmp_path / "logs")
    yield children
    children.close()


@dataclass
class Stack:
    """One test's workers on a fresh task queue, its Temporal client and its view of the world."""

    client: Client
    billing: BillingClient
    proxy: DroppingProxy
    processes: ChildProcesses
    env: dict[str, str]
    runs: list[tuple[RunHandle, str]] = field(default_factory=list)
    _workers: int = 0

    def start_worker(self) -> subprocess.Popen[bytes]:
        self._workers += 1
        return self.processes.start(f"worker-{self._workers}", ["worker.py"], self.env)

    async def start_run(self, order: str | None = None) -> tuple[RunHandle, str]:
        order = order or new_order()
        handle = await start_run(
            self.client,
            AgentRunInput(agent="credit-billing", tenant="acme", input=json.dumps({"order_id": order})),
            run_id=f"run-{uuid.uuid4().hex[:12]}",
            task_queue=self.env["ONCEFLOW_TASK_QUEUE"],
        )
        run = (handle, f"{handle.id}:call_1_0")
        self.runs.append(run)
        return run

    async def wait_for(self, check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30) -> None:
        async def poll() -> None:
            while not await check():
                await asyncio.sleep(0.05)

        try:
            await asyncio.wait_for(poll(), timeout)
        except TimeoutError:
            pytest.fail(f"gave up after {timeout}s waiting for {what}\n{self.processes.logs_text()}")

    async def results(self, client: Client | None = None) -> list[AgentRunResult]:
        """Every run's result, through `client` (default: the stack's own)."""
        client = client or self.client

        async def one(handle: RunHandle) -> AgentRunResult:
            again = client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id)
            try:
                return await asyncio.wait_for(again.result(), RUN_TIMEOUT)
            except TimeoutError:
                status = await again.query(AgentRunWorkflow.status)
                pytest.fail(f"run {handle.id} did not finish: {status}\n{self.processes.logs_text()}")

        return list(await asyncio.gather(*(one(h) for h, _ in self.runs)))

    async def effects(self) -> dict[str, int]:
        counted = await self.billing.effects()
        return {key: counted.count(key) for _, key in self.runs}

    async def sends(self) -> dict[str, int]:
        """Credit requests billing received per run's key, counted on arrival (before anything else)."""
        received = await self.billing.received_counts()
        return {key: received.count(key) for _, key in self.runs}


def new_order() -> str:
    return f"ord_{uuid.uuid4().hex[:10]}"


def account_of(order: str) -> str:
    return "acct_" + order.removeprefix("ord_")


def worker_env(*, temporal: Client, database_url: str, billing_url: str, tmp_path: Path) -> dict[str, str]:
    agents = tmp_path / "agents.yaml"
    agents.write_text(PROCESS_AGENTS_YAML)
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": temporal.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": temporal.namespace,
        "ONCEFLOW_TASK_QUEUE": f"tq-{uuid.uuid4().hex[:10]}",
        "ONCEFLOW_DATABASE_URL": database_url,
        "ONCEFLOW_AGENTS": str(agents),
        "ONCEFLOW_BILLING_URL": billing_url,
    }


async def write_failures(client: Client, workflow_id: str) -> list[str]:
    """The error types of the run's write activities that failed, in order."""
    runs = activity_runs(await history_events(client, workflow_id))
    return [
        r.failure.application_failure_info.type
        for r in runs
        if r.activity_type == "run_write_tool" and r.failure is not None
    ]


async def model_turn_waits_for_the_ledger(client: Client, workflow_id: str) -> bool:
    """The run's model turn is being retried because its conversation cannot be stored or read."""
    description = await client.get_workflow_handle(workflow_id).describe()
    return any(
        a.activity_type.name == "call_model"
        and a.attempt >= 2
        and a.last_failure.application_failure_info.type == ERR_LEDGER_UNAVAILABLE
        for a in description.raw_description.pending_activities
    )


async def ledger_keys(database_url: str, run_ids: list[str]) -> list[str]:
    """Every ledger row these runs have, straight from the table: one per write call, no more."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT key FROM tool_executions WHERE run_id = ANY($1::text[]) ORDER BY key", run_ids
        )
    finally:
        await conn.close()
    return [r["key"] for r in rows]


async def check_every_run_completed_once(
    stack: Stack, ledger: Ledger, database_url: str, results: list[AgentRunResult]
) -> dict[str, ToolExecutionRecord]:
    """One row per call, each key sent once and applied once, the ledger's result is the service's
    credit, the run saw it."""
    keys = [key for _, key in stack.runs]
    assert await ledger_keys(database_url, [h.id for h, _ in stack.runs]) == sorted(keys)
    assert await stack.sends() == dict.fromkeys(keys, 1)
    assert await stack.effects() == dict.fromkeys(keys, 1)
    records = {}
    for (_, key), result in zip(stack.runs, results, strict=True):
        record = await ledger.get(key)
        credit = await stack.billing.find_credit(key)
        assert record.status is Status.COMPLETED, record
        assert credit is not None and record.result == credit
        assert credit["credit_id"] in result.final
        assert [c.status for c in result.calls] == ["ok", "completed"]
        records[key] = record
    return records


def transitions(record: ToolExecutionRecord) -> list[Status]:
    return [e.to_status for e in record.events if e.to_status]


# -- 1. PostgreSQL stopped and started again mid-run ------------------------------------------------------


async def test_postgres_stopped_mid_run_sends_nothing_unreserved_and_runs_finish_when_it_returns(
    temporal_env: WorkflowEnvironment,
    billing: BillingClient,
    proxy: DroppingProxy,
    processes: ChildProcesses,
    tmp_path: Path,
) -> None:
    postgres = OwnPostgres(tmp_path / "postgres")
    database_url = await create_database(await postgres.start(), "onceflow")
    await migrate(database_url)
    try:
        env = worker_env(
            temporal=temporal_env.client, database_url=database_url, billing_url=proxy.url, tmp_path=tmp_path
        )
        stack = Stack(temporal_env.client, billing, proxy, processes, env)
        stack.start_worker()

        # Run A's credit is on the wire when the database goes: applied, its answer held past the
        # tool's timeout, so the worker has an outcome ("unknown") and nowhere to write it.
        order_a = new_order()
        await billing.set_account_fault(account_of(order_a), "apply_then_hang", delay_seconds=30, times=1)
        run_a, key_a = await stack.start_run(order_a)

        async def a_applied() -> bool:
            return (await billing.effects()).count(key_a) == 1

        await stack.wait_for(a_applied, "run A's credit to be applied")
        await postgres.stop()
        assert await stack.sends() == {key_a: 1}

        # Runs B and C start while the ledger is away: their conversations live beside it, so their
        # model turns are retried until it is back, and they never reach a write.
        (run_b, key_b), (run_c, key_c) = [await stack.start_run() for _ in range(2)]

        async def refused_while_down() -> bool:
            return await write_failures(stack.client, run_a.id) == [ERR_OUTCOME_NOT_RECORDED] and all(
                [await model_turn_waits_for_the_ledger(stack.client, h.id) for h in (run_b, run_c)]
            )

        await stack.wait_for(refused_while_down, "writes to be refused while PostgreSQL is down")
        # Nothing was sent without a reservation: no request, no effect.
        assert await stack.sends() == {key_a: 1, key_b: 0, key_c: 0}
        assert await stack.effects() == {key_a: 1, key_b: 0, key_c: 0}
        for handle, _ in stack.runs:
            assert (await handle.query(AgentRunWorkflow.status)).phase is Phase.RUNNING

        await postgres.start()
        results = await stack.results()
        ledger = await Ledger.connect(database_url)
        try:
            records = await check_every_run_completed_once(stack, ledger, database_url, results)
        finally:
            await ledger.close()
        # A's unknown outcome was written once the database was back, then reconciled.
        assert transitions(records[key_a]) == [Status.STARTED, Status.INDETERMINATE, Status.COMPLETED]
        assert records[key_a].settled_by == "reconciler"
        # B and C reserved once the database was back and sent once; A was never sent again.
        for key in (key_b, key_c):
            assert [e.kind for e in records[key].events] == ["reserved", "completed"]
            assert records[key].attempt == 1
        assert await stack.sends() == {key_a: 1, key_b: 1, key_c: 1}
    finally:
        await postgres.stop()


# -- 2. the Temporal dev server SIGKILLed and restarted from its file -------------------------------------


async def test_temporal_killed_and_restarted_from_its_file_resumes_every_run_with_one_effect_per_key(
    billing: BillingClient,
    proxy: DroppingProxy,
    processes: ChildProcesses,
    ledger: Ledger,
    database_url: str,
    tmp_path: Path,
) -> None:
    temporal = OwnTemporal(tmp_path / "temporal")
    await temporal.start()
    try:
        client = await Client.connect(temporal.address, data_converter=pydantic_data_converter)
        env = worker_env(temporal=client, database_url=database_url, billing_url=proxy.url, tmp_path=tmp_path)
        stack = Stack(client, billing, proxy, processes, env)
        worker = stack.start_worker()

        # Two runs have a credit applied and its answer held: the answers come back while Temporal
        # is dead, so the worker records them in the ledger and cannot report to Temporal.
        held = [new_order() for _ in range(2)]
        for order in held:
            await billing.set_account_fault(account_of(order), "apply_then_hang", delay_seconds=1.0, times=1)
        held_runs = [await stack.start_run(order) for order in held]

        async def held_applied() -> bool:
            effects = await billing.effects()
            return all(effects.count(key) == 1 for _, key in held_runs)

        await stack.wait_for(held_applied, "the held credits to be applied")
        # Two more runs, just started.
        for _ in range(2):
            await stack.start_run()
        first_runs = {h.id: h.first_execution_run_id for h, _ in stack.runs}

        temporal.kill()
        for _, key in held_runs:
            record = await ledger.find(key)
            assert record is not None and record.status is Status.STARTED

        async def answers_recorded() -> bool:
            records = [await ledger.find(key) for _, key in held_runs]
            return all(r is not None and r.status is Status.COMPLETED for r in records)

        await stack.wait_for(answers_recorded, "the held answers to be recorded while Temporal is dead")
        await temporal.start()
        client = await Client.connect(temporal.address, data_converter=pydantic_data_converter)
        results = await stack.results(client)

        await check_every_run_completed_once(stack, ledger, database_url, results)
        for handle, key in stack.runs:
            # The same executions, carried on from the file, not new ones.
            described = await client.get_workflow_handle(handle.id).describe()
            assert described.run_id == first_runs[handle.id]
            assert [e.kind for e in (await ledger.get(key)).events] == ["reserved", "completed"]
        assert await stack.sends() == {key: 1 for _, key in stack.runs}
        assert worker.poll() is None, "the worker should ride out the server's restart"
    finally:
        temporal.kill()


# -- 3. both workers SIGKILLed at once --------------------------------------------------------------------


async def test_both_workers_killed_at_once_and_fresh_workers_finish_every_run(
    temporal_env: WorkflowEnvironment,
    billing: BillingClient,
    proxy: DroppingProxy,
    processes: ChildProcesses,
    ledger: Ledger,
    database_url: str,
    tmp_path: Path,
) -> None:
    env = worker_env(
        temporal=temporal_env.client, database_url=database_url, billing_url=proxy.url, tmp_path=tmp_path
    )
    stack = Stack(temporal_env.client, billing, proxy, processes, env)
    first, second = stack.start_worker(), stack.start_worker()

    # Caught at different points: two credits applied with their answers held past the kill, two
    # credits held by the service before applying (they land after the kill), two runs just started.
    applied_first = [new_order() for _ in range(2)]
    applied_later = [new_order() for _ in range(2)]
    for order in applied_first:
        await billing.set_account_fault(account_of(order), "apply_then_hang", delay_seconds=30, times=1)
    for order in applied_later:
        await billing.set_account_fault(account_of(order), "slow", delay_seconds=3, times=1)
    held_keys = [(await stack.start_run(order))[1] for order in applied_first + applied_later]

    async def all_on_the_wire() -> bool:
        effects, sends = await billing.effects(), await stack.sends()
        return [sends[key] for key in held_keys] == [1] * 4 and all(
            effects.count(key) == 1 for key in held_keys[:2]
        )

    await stack.wait_for(all_on_the_wire, "four credits to be on the wire")
    for _ in range(2):
        await stack.start_run()

    kill_together([first, second])
    for key in held_keys:
        record = await ledger.find(key)
        assert record is not None and record.status is Status.STARTED
    assert [(await billing.effects()).count(key) for key in held_keys] == [1, 1, 0, 0]
    assert [(await stack.sends())[key] for key in held_keys] == [1, 1, 1, 1]
    for handle, _ in stack.runs:
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    stack.start_worker()
    stack.start_worker()
    results = await stack.results()

    records = await check_every_run_completed_once(stack, ledger, database_url, results)
    for key in held_keys:
        # Nobody knew whether the held credits landed; the reconcile hook found them.
        assert transitions(records[key]) == [Status.STARTED, Status.INDETERMINATE, Status.COMPLETED]
        assert records[key].settled_by == "reconciler"
    for key, record in records.items():
        if key not in held_keys:
            assert transitions(record)[-1] is Status.COMPLETED
            assert record.attempt == 1
    # Killed in flight or not, every call reached billing exactly once (checked above as well).
    assert await stack.sends() == {key: 1 for _, key in stack.runs}


# -- 4. the downstream loses every answer to a write for a while ------------------------------------------


async def test_lost_answers_leave_calls_unknown_until_reconcile_can_hear_the_truth(
    temporal_env: WorkflowEnvironment,
    billing: BillingClient,
    proxy: DroppingProxy,
    processes: ChildProcesses,
    ledger: Ledger,
    database_url: str,
    tmp_path: Path,
) -> None:
    env = worker_env(
        temporal=temporal_env.client, database_url=database_url, billing_url=proxy.url, tmp_path=tmp_path
    )
    stack = Stack(temporal_env.client, billing, proxy, processes, env)
    stack.start_worker()

    # Every answer to a write is lost from now on: credits and the reconcile hook's fences alike.
    proxy.dropping = True
    applied = {(await stack.start_run())[1] for _ in range(4)}
    refused_orders = [new_order() for _ in range(2)]
    for order in refused_orders:
        # The service says no (nothing applied), and that answer is lost too.
        await billing.set_account_fault(account_of(order), "reject", times=1)
    refused = {(await stack.start_run(order))[1] for order in refused_orders}

    async def all_unknown_and_paused() -> bool:
        for handle, key in stack.runs:
            record = await ledger.find(key)
            if record is None or record.status is not Status.INDETERMINATE:
                return False
            if (await handle.query(AgentRunWorkflow.status)).phase is not Phase.AWAITING_RECONCILIATION:
                return False
        return True

    await stack.wait_for(all_unknown_and_paused, "every call to be unknown and every run paused")

    async def reconcile_kept_trying() -> bool:
        # Every POST's answer is lost now, so each fence request billing received was one lost answer.
        fences = [
            (await billing.received_counts("POST", f"/credits/by-key/{key}/fence")).total
            for _, key in stack.runs
        ]
        return all(n >= 2 for n in fences)

    await stack.wait_for(reconcile_kept_trying, "the reconcile hook to lose two answers per call")
    for _, key in stack.runs:
        record = await ledger.find(key)
        assert record is not None and record.status is Status.INDETERMINATE
    assert await stack.effects() == {**dict.fromkeys(applied, 1), **dict.fromkeys(refused, 0)}
    assert await stack.sends() == {key: 1 for _, key in stack.runs}

    proxy.dropping = False
    results = await stack.results()

    assert await ledger_keys(database_url, [h.id for h, _ in stack.runs]) == sorted(k for _, k in stack.runs)
    assert await stack.effects() == {**dict.fromkeys(applied, 1), **dict.fromkeys(refused, 0)}
    for (_, key), result in zip(stack.runs, results, strict=True):
        record = await ledger.get(key)
        credit = await billing.find_credit(key)
        assert record.settled_by == "reconciler"
        assert transitions(record)[:2] == [Status.STARTED, Status.INDETERMINATE]
        assert result.calls[-1].status == record.status.value
        if key in applied:
            assert record.status is Status.COMPLETED
            assert credit is not None and record.result == credit
            assert credit["credit_id"] in result.final
        else:
            assert (record.status, record.failure_kind) == (Status.FAILED, FailureKind.NOT_APPLIED)
            assert credit is None
    # One credit request per call: the truth came from the hook, never from sending again.
    assert await stack.sends() == {key: 1 for _, key in stack.runs}
