"""Servers taken away mid-run (issue #6, "more faults"), with real processes throughout.

Workers are `python worker.py` processes; the billing service runs in a process of its own, honours
no idempotency key (`--no-dedup`) and records every request it receives, per key; workers reach it
through a proxy in this process that can lose the answers to writes. Each test then takes a server
away:

- PostgreSQL (a cluster of the test's own) stopped and started again: nothing is sent without a
  reservation while it is away, and every run finishes after it returns;
- the Temporal dev server (one of the test's own) SIGKILLed and restarted from its file: the same
  runs resume and finish.

Invariants checked every time: one ledger row per tool call, each key's credit request received by
billing exactly once, and one effect for every call the ledger calls completed.

Workers killed and answers lost are in test_faults_workers. Covered elsewhere and not repeated
here: one worker SIGKILLed at one chosen instruction (test_worker_processes) and one database
refusing connections at reserve (test_agent_run_faults).
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, Status, migrate
from onceflow.local.postgres import create_database
from onceflow.runtime.constants import ERR_LEDGER_UNAVAILABLE, ERR_OUTCOME_NOT_RECORDED
from onceflow.sdk.payloads import Phase
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.fault_runs import account_of, new_order
from tests.support.fault_stack import (
    Stack,
    check_every_run_completed_once,
    processes,
    transitions,
    worker_env,
)
from tests.support.history import activity_runs, history_events
from tests.support.processes import ChildProcesses
from tests.support.proxy import DroppingProxy
from tests.support.servers import OwnPostgres, OwnTemporal

__all__ = ["processes"]  # the fixture, used by name


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
