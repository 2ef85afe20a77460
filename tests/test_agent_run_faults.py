"""Agent runs under faults, on a real Temporal dev server and a real PostgreSQL ledger:
a reset that replays the run, a model that fails, a ledger database that goes away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

import asyncpg
import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import Agent, AgentRegistry
from onceflow.runtime.constants import ERR_LEDGER_UNAVAILABLE
from onceflow.sdk.payloads import ModelCallInput, ModelTurn, ToolOutcome
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.agents import credit_agent, flaky_model_agent
from tests.support.downstream import DOWNSTREAM
from tests.support.history import (
    ActivityRun,
    activity_runs,
    history_events,
    reset_run,
    workflow_task_completed_after,
)
from tests.support.waiting import eventually
from tests.workflow_harness import Harness, running_worker

ORDER = json.dumps({"order_id": "o1"})


@pytest.fixture
def registry() -> AgentRegistry:
    agent = credit_agent("credit-reconciled", "issue_credit", "pause")
    return AgentRegistry({agent.name: agent})


@pytest.fixture
async def harness(
    temporal_env: WorkflowEnvironment, ledger: Ledger, registry: AgentRegistry
) -> AsyncIterator[Harness]:
    DOWNSTREAM.reset()
    async with running_worker(temporal_env.client, ledger, registry) as h:
        yield h


def outcome_of(client: Client, run: ActivityRun) -> ToolOutcome:
    assert run.closed is not None
    payloads = run.closed.activity_task_completed_event_attributes.result.payloads
    outcome: ToolOutcome = client.data_converter.payload_converter.from_payload(payloads[0], ToolOutcome)
    return outcome


# -- replay safety --------------------------------------------------------------------------------


async def test_reset_before_the_write_replays_under_the_same_key_without_calling_the_tool(
    harness: Harness,
) -> None:
    client = harness.client
    handle = await harness.start("credit-reconciled", ORDER)
    first = await handle.result()
    first_run_id = handle.result_run_id
    assert first_run_id is not None
    key = f"{handle.id}:call_1_0"
    recorded = await harness.ledger.get(key)
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {key: 1}
    assert DOWNSTREAM.send_attempts == 1

    # Reset to the workflow task that handled the first model answer: before the lookup and the write.
    events = await history_events(client, handle.id, first_run_id)
    runs = activity_runs(events)
    first_model = next(r for r in runs if r.activity_type == "call_model")
    lookup = next(r for r in runs if r.activity_type == "run_read_tool")
    write = next(r for r in runs if r.activity_type == "run_write_tool")
    assert first_model.closed is not None
    reset_point = workflow_task_completed_after(events, first_model.closed.event_id)
    assert reset_point < lookup.scheduled_event_id < write.scheduled_event_id
    new_run_id = await reset_run(
        client, handle.id, first_run_id, reset_point, "test: replay the run from before its write"
    )
    assert new_run_id != first_run_id
    reset_handle = client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id, run_id=new_run_id)
    second = await asyncio.wait_for(reset_handle.result(), 20)

    # Same workflow id, so the same run id and the same key; the ledger answered, the tool did not run.
    assert second.run_id == first.run_id == handle.id
    assert second.calls[-1].key == key
    assert second.final == first.final
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {key: 1}
    assert DOWNSTREAM.send_attempts == 1
    assert DOWNSTREAM.read_attempts == 2  # the read did run again: reads may, writes may not
    after = await harness.ledger.get(key)
    assert after.model_dump(exclude={"events"}) == recorded.model_dump(exclude={"events"})
    assert after.events[: len(recorded.events)] == recorded.events
    assert all(e.to_status is None for e in after.events[len(recorded.events) :])
    new_runs = activity_runs(await history_events(client, handle.id, new_run_id))
    replayed_write = next(r for r in new_runs if r.activity_type == "run_write_tool")
    outcome = outcome_of(client, replayed_write)
    assert outcome.key == key
    assert outcome.status is Status.COMPLETED
    assert outcome.replayed
    assert outcome.value == recorded.result


# -- the model --------------------------------------------------------------------------------------


async def test_model_errors_are_retried_and_the_run_succeeds(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    DOWNSTREAM.reset()
    agent, model = flaky_model_agent("credit-flaky-model", failures=2)
    async with running_worker(temporal_env.client, ledger, AgentRegistry({agent.name: agent})) as harness:
        handle = await harness.start(agent.name, ORDER)
        result = await asyncio.wait_for(handle.result(), 20)
    key = f"{handle.id}:call_1_0"
    assert model.calls == {1: 3, 2: 1, 3: 1}  # two failures and one answer for the first turn
    assert "cr_1" in result.final
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {key: 1}
    runs = activity_runs(await history_events(temporal_env.client, handle.id))
    first_model = next(r for r in runs if r.activity_type == "call_model")
    assert first_model.closed is not None
    assert first_model.closed.activity_task_completed_event_attributes.result.payloads


# -- the ledger database goes away ---------------------------------------------------------------------


class _DatabaseAwayOnWrite:
    """The credit agent's model; as it answers the write turn, the test's database goes away (the
    model turn itself stored its conversation first), so the next thing to need it is the reserve."""

    def __init__(self, agent: Agent, take_down: Callable[[], Awaitable[None]]) -> None:
        self._scripted = agent.build_model()
        self._take_down = take_down

    async def respond(self, request: ModelCallInput) -> ModelTurn:
        turn = await self._scripted.respond(request)
        if any(call.name == "issue_credit" for call in turn.tool_calls):
            await self._take_down()
        return turn


async def test_ledger_down_at_reserve_sends_nothing_and_retries_the_reservation(
    temporal_env: WorkflowEnvironment, ledger: Ledger, postgres_dsn: str, database_url: str
) -> None:
    DOWNSTREAM.reset()
    database = urlsplit(database_url).path.lstrip("/")
    admin = await asyncpg.connect(postgres_dsn)

    async def take_down() -> None:
        # Only this test's database goes away; the server and everyone else's databases stay up.
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", database
        )

    base = credit_agent("credit-reconciled", "issue_credit", "pause")
    agent = Agent(base.name, base.config, base.tools, model=_DatabaseAwayOnWrite(base, take_down))
    async with running_worker(temporal_env.client, ledger, AgentRegistry({agent.name: agent})) as harness:
        await _ledger_down_at_reserve(harness, admin, database)


async def _ledger_down_at_reserve(harness: Harness, admin: asyncpg.Connection, database: str) -> None:
    try:
        handle = await harness.start("credit-reconciled", ORDER)

        async def refused_writes() -> list[ActivityRun]:
            runs = activity_runs(await history_events(harness.client, handle.id))
            return [r for r in runs if r.activity_type == "run_write_tool" and r.closed is not None]

        async def refused_twice() -> bool:
            return len(await refused_writes()) >= 2

        await eventually(refused_twice, "two refused reservations", timeout=20)
        failures = [r.failure for r in await refused_writes()]
        assert all(f is not None for f in failures)
        assert {f.application_failure_info.type for f in failures if f} == {ERR_LEDGER_UNAVAILABLE}
        assert DOWNSTREAM.send_attempts == 0
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()

    result = await asyncio.wait_for(handle.result(), 20)
    key = f"{handle.id}:call_1_0"
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {key: 1}
    assert DOWNSTREAM.send_attempts == 1
    record = await harness.ledger.get(key)
    assert record.status is Status.COMPLETED
    assert record.attempt == 1
    assert [e.kind for e in record.events] == ["reserved", "completed"]
    assert "cr_1" in result.final
