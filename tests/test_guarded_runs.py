"""Guards in agent runs: a model that asks for the same effect again, under a new id or from another
run, gets what the tool declared, on a real Temporal dev server and a real PostgreSQL ledger.

Effects are counted at the downstream, which honours no idempotency key (tests/support/downstream.py).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.activities.held import WAKE_ACTOR
from onceflow.ledger import FailureKind, Ledger, Status
from onceflow.models import ScriptedModel
from onceflow.models.config import ScriptedConfig
from onceflow.runtime.agents import Agent, AgentRegistry
from onceflow.runtime.constants import HELD_KEYS, UNRESOLVED_KEYS
from onceflow.sdk.payloads import (
    AgentRunResult,
    ModelCallInput,
    ModelTurn,
    Phase,
    ResolveSignal,
    ToolCallInput,
    ToolOutcome,
)
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.agents import credit_agent, refund_agent, twins_agent
from tests.support.downstream import DOWNSTREAM
from tests.support.history import (
    activity_runs,
    history_events,
    reset_run,
    resolve_signals,
    workflow_task_completed_after,
)
from tests.support.operator_api import serving_api
from tests.support.waiting import eventually
from tests.test_replay import replayer
from tests.workflow_harness import Harness, running_worker

ORDER = json.dumps({"order_id": "o1"})
CREDIT_TOOLS = {
    "hold": "issue_credit_unreconciled",
    "reuse": "issue_credit_reusing",
    "allow": "issue_credit_allowing",
}


class FreshIdModel:
    """The scripted conversation, with a new tool call id on every answer, as real providers give:
    asked again after a reset, it makes the same call under an id the run has not seen."""

    def __init__(self, agent: Agent) -> None:
        assert isinstance(agent.config.model, ScriptedConfig)
        self._scripted = ScriptedModel(agent.config.model.script)

    async def respond(self, request: ModelCallInput) -> ModelTurn:
        turn = await self._scripted.respond(request)
        calls = [call.model_copy(update={"id": f"call_{uuid.uuid4().hex[:8]}"}) for call in turn.tool_calls]
        return turn.model_copy(update={"tool_calls": calls})


def fresh_id_agent(name: str, tool: str) -> Agent:
    scripted = credit_agent(name, tool, "pause")
    return Agent(name, scripted.config, scripted.tools, model=FreshIdModel(scripted))


@pytest.fixture
async def harness(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[Harness]:
    DOWNSTREAM.reset()
    agents = [fresh_id_agent(f"fresh-{intent}", tool) for intent, tool in CREDIT_TOOLS.items()]
    agents.append(fresh_id_agent("fresh-reuse-reconciled", "issue_credit_reusing_reconciled"))
    agents += [refund_agent("refund", "refund_order"), refund_agent("refund-strict", "refund_order_strict")]
    async with running_worker(temporal_env.client, ledger, AgentRegistry({a.name: a for a in agents})) as h:
        yield h


async def attribute(handle: WorkflowHandle[Any, Any], key: Any) -> Any:
    return (await handle.describe()).typed_search_attributes.get(key)


async def phase(handle: WorkflowHandle[Any, Any]) -> Phase:
    return (await handle.query(AgentRunWorkflow.status)).phase


async def write_keys(ledger: Ledger, run_id: str) -> list[str]:
    async with ledger.connection("test") as conn:
        rows = await conn.fetch(
            "SELECT key FROM tool_executions WHERE run_id = $1 ORDER BY created_at", run_id
        )
    return [row["key"] for row in rows]


async def reset_before_the_credit(
    client: Client, handle: WorkflowHandle[Any, Any], run_id: str
) -> WorkflowHandle[AgentRunWorkflow, AgentRunResult]:
    """Reset the run to just after its first model turn: the model is asked for the credit again."""
    events = await history_events(client, handle.id, run_id)
    first_model = next(r for r in activity_runs(events) if r.activity_type == "call_model")
    assert first_model.closed is not None
    point = workflow_task_completed_after(events, first_model.closed.event_id)
    new_run = await reset_run(client, handle.id, run_id, point, "test: the model is asked again")
    return client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id, run_id=new_run)


# -- the same call again, after a reset ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("intent", "effects", "reused"), [("hold", 1, True), ("reuse", 1, True), ("allow", 2, False)]
)
async def test_a_reset_that_makes_the_model_reissue_a_completed_call(
    harness: Harness, intent: str, effects: int, reused: bool
) -> None:
    handle = await harness.start(f"fresh-{intent}", ORDER)
    first = await asyncio.wait_for(handle.result(), 30)
    assert handle.result_run_id is not None
    again = await reset_before_the_credit(harness.client, handle, handle.result_run_id)
    second = await asyncio.wait_for(again.result(), 30)

    first_key, second_key = await write_keys(harness.ledger, handle.id)
    assert first_key != second_key, "the model re-issued the call under a new id"
    assert sum(DOWNSTREAM.effects.values()) == effects
    record = await harness.ledger.get(second_key)
    assert record.status is Status.COMPLETED
    if reused:
        assert DOWNSTREAM.received == {first_key: 1}
        assert (
            record.reused_from == first_key and record.result == (await harness.ledger.get(first_key)).result
        )
        told = (await _write_outcome(harness.client, again)).for_model()
        assert told["ok"] is True and told["reused_from"] == first_key.rpartition(":")[2]
        assert "nothing was sent again" in told["note"]
        if intent == "hold":  # the model is told it may ask again, now that it knows
            assert "make the call again" in told["settlement_reason"]
            history = await again.fetch_history()
            replayed = await replayer().replay_workflow(history, raise_on_replay_failure=False)
            assert replayed.replay_failure is None
        assert "cr_1" in second.final
    else:
        assert DOWNSTREAM.received == {first_key: 1, second_key: 1}
        assert "cr_2" in second.final
    assert "cr_1" in first.final


async def _write_outcome(client: Client, handle: WorkflowHandle[Any, Any]) -> ToolOutcome:
    """What the run's (last) write activity answered: the outcome the model was told."""
    events = await history_events(client, handle.id, handle.run_id)
    write = [r for r in activity_runs(events) if r.activity_type == "run_write_tool"][-1]
    assert write.closed is not None
    payload = write.closed.activity_task_completed_event_attributes.result.payloads[0]
    return client.data_converter.payload_converter.from_payload(payload, ToolOutcome)


@pytest.mark.parametrize("intent", ["hold", "reuse"])
async def test_the_same_call_is_held_while_the_first_is_unknown_then_goes_as_declared(
    harness: Harness, intent: str
) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start(f"fresh-{intent}", ORDER)
    await eventually(
        lambda: _phase_is(handle, Phase.AWAITING_RECONCILIATION), "the first credit to be unknown"
    )
    [first_key] = await write_keys(harness.ledger, handle.id)
    first_run = (await handle.describe()).run_id
    assert first_run is not None

    again = await reset_before_the_credit(harness.client, handle, first_run)
    await eventually(lambda: _phase_is(again, Phase.HELD), "the re-issued credit to be held")
    _, second_key = await write_keys(harness.ledger, handle.id)
    held = await harness.ledger.get(second_key)
    assert held.status is Status.HELD and held.held_by == first_key
    assert await attribute(again, HELD_KEYS) == [second_key]
    assert second_key in await attribute(again, UNRESOLVED_KEYS)
    [pending] = (await again.query(AgentRunWorkflow.status)).pending
    assert pending.status == "held" and "still indeterminate" in (pending.detail or "")
    assert DOWNSTREAM.received == {first_key: 1}, "a held call is not sent"

    # An operator finds the first credit applied; the held run is nudged and acts as declared.
    DOWNSTREAM.modes["acct_o1"] = "ok"
    await harness.ledger.settle(
        first_key,
        status=Status.COMPLETED,
        actor="ops",
        reason="found in billing",
        result={"credit_id": "cr_1"},
    )
    await again.signal(AgentRunWorkflow.resolve, ResolveSignal(key=second_key, actor="ops"))
    result = await asyncio.wait_for(again.result(), 30)

    # The reset took the first credit out of the conversation: the model never heard of it, so the
    # re-issue is the same intent, for `hold` as for `reuse`. It gets the first's result.
    record = await harness.ledger.get(second_key)
    assert record.status is Status.COMPLETED and record.reused_from == first_key
    assert DOWNSTREAM.received == {first_key: 1}
    assert [e.kind for e in record.events] == ["held", "reused"]
    assert await attribute(again, HELD_KEYS) is None
    assert result.final


async def test_a_held_reissue_is_sent_once_its_twin_is_known_not_applied(harness: Harness) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start("fresh-hold", ORDER)
    await eventually(
        lambda: _phase_is(handle, Phase.AWAITING_RECONCILIATION), "the first credit to be unknown"
    )
    [first_key] = await write_keys(harness.ledger, handle.id)
    first_run = (await handle.describe()).run_id
    assert first_run is not None
    again = await reset_before_the_credit(harness.client, handle, first_run)
    await eventually(lambda: _phase_is(again, Phase.HELD), "the re-issued credit to be held")
    _, second_key = await write_keys(harness.ledger, handle.id)

    DOWNSTREAM.modes["acct_o1"] = "ok"
    await harness.ledger.settle(
        first_key, status=Status.FAILED, actor="ops", reason="billing has no such credit"
    )
    await again.signal(AgentRunWorkflow.resolve, ResolveSignal(key=second_key, actor="ops"))
    await asyncio.wait_for(again.result(), 30)
    record = await harness.ledger.get(second_key)
    assert record.status is Status.COMPLETED and record.reused_from is None
    assert [e.kind for e in record.events] == ["held", "reserved", "completed"]
    assert DOWNSTREAM.received[second_key] == 1


async def test_two_twins_in_one_answer_pay_once_and_a_repeat_after_hearing_both_pays_again(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    DOWNSTREAM.reset()
    agent = twins_agent("twins", "issue_credit_unreconciled")  # the default guards
    async with running_worker(temporal_env.client, ledger, AgentRegistry({agent.name: agent})) as harness:
        handle = await harness.start("twins", ORDER)
        result = await asyncio.wait_for(handle.result(), 30)
    first, twin, owed = await write_keys(ledger, handle.id)
    assert sum(DOWNSTREAM.effects.values()) == 2
    assert DOWNSTREAM.received == {first: 1, owed: 1}
    assert (await ledger.get(twin)).reused_from == first
    sent = await ledger.get(owed)
    assert sent.reused_from is None and sent.status is Status.COMPLETED
    assert set(sent.events[0].detail["heard_twins"]) == {first, twin}
    assert [c.status for c in result.calls] == ["ok", "completed", "completed", "completed"]

    # The run's own history replays: what each call was told it had heard is rebuilt the same way.
    history = await handle.fetch_history()
    heard = [
        ToolCallInput.model_validate_json(
            e.activity_task_scheduled_event_attributes.input.payloads[0].data
        ).heard
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "run_write_tool"
    ]
    assert heard == [[], [], [first.rpartition(":")[2], twin.rpartition(":")[2]]]
    replayed = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None


async def test_a_reset_while_the_first_credit_is_in_flight_reconciles_it_and_reuses_its_result(
    harness: Harness,
) -> None:
    """The reset ends the run whose activity was sending the credit, so nobody would look after
    that call. The new run, held behind it, adopts it: unknown, reconciled, and its result reused."""
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start("fresh-reuse-reconciled", ORDER)
    await eventually(lambda: _received(1), "the first credit to reach the downstream")
    first_run = (await handle.describe()).run_id
    assert first_run is not None
    again = await reset_before_the_credit(harness.client, handle, first_run)
    result = await asyncio.wait_for(again.result(), 30)

    first_key, second_key = await write_keys(harness.ledger, handle.id)
    first = await harness.ledger.get(first_key)
    assert first.status is Status.COMPLETED and first.settled_by == "reconciler"
    second = await harness.ledger.get(second_key)
    assert second.reused_from == first_key and [e.kind for e in second.events] == ["held", "reused"]
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {first_key: 1}
    assert "cr_1" in result.final


async def _received(count: int) -> bool:
    return sum(DOWNSTREAM.received.values()) >= count


async def _woken(client: Client, handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The keys a `resolve` signal from the guard's wake-up (activities/held.py) named, in order."""
    return [signal.key for signal in await resolve_signals(client, handle.id) if signal.actor == WAKE_ACTOR]


async def _phase_is(handle: WorkflowHandle[Any, Any], wanted: Phase) -> bool:
    try:
        return await phase(handle) == wanted
    except Exception:  # the new run of a reset may not have answered its first query yet
        return False


# -- entities and budgets across runs -----------------------------------------------------------------


async def test_a_second_refund_of_an_order_waits_for_the_first_then_the_budget_refuses_it(
    harness: Harness,
) -> None:
    """Two runs refund the same order in full. The second is held while the first is unknown; once the
    first is found applied, the order's refundable amount is spent and the second is refused, final."""
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    first = await harness.start("refund", ORDER)
    await eventually(
        lambda: _phase_is(first, Phase.AWAITING_RECONCILIATION), "the first refund to be unknown"
    )
    [first_key] = await write_keys(harness.ledger, first.id)

    second = await harness.start("refund", ORDER)
    await eventually(lambda: _phase_is(second, Phase.HELD), "the second refund to be held")
    [second_key] = await write_keys(harness.ledger, second.id)
    assert (await harness.ledger.get(second_key)).held_by == first_key
    assert await attribute(second, HELD_KEYS) == [second_key]

    await first.signal(
        AgentRunWorkflow.resolve,
        ResolveSignal(key=first_key, status="completed", reason="found in billing", actor="ops"),
    )
    await asyncio.wait_for(first.result(), 30)
    # Nobody nudges the second run: settling the first woke it.
    result = await asyncio.wait_for(second.result(), 30)
    assert await _woken(harness.client, second) == [second_key]

    record = await harness.ledger.get(second_key)
    assert record.status is Status.FAILED and record.failure_kind is FailureKind.GUARD_REFUSED
    assert "would exceed the limit of 1250" in (record.error or "")
    assert [c.status for c in result.calls] == ["ok", "failed"]
    assert DOWNSTREAM.received == {first_key: 1}


async def test_a_strict_refund_is_refused_while_another_is_unknown(harness: Harness) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    first = await harness.start("refund-strict", ORDER)
    await eventually(
        lambda: _phase_is(first, Phase.AWAITING_RECONCILIATION), "the first refund to be unknown"
    )
    [first_key] = await write_keys(harness.ledger, first.id)
    second = await harness.start("refund-strict", ORDER)
    result = await asyncio.wait_for(second.result(), 30)
    [second_key] = await write_keys(harness.ledger, second.id)
    record = await harness.ledger.get(second_key)
    assert record.failure_kind is FailureKind.GUARD_REFUSED and first_key in (record.error or "")
    assert DOWNSTREAM.received == {first_key: 1}
    assert result.calls[-1].status == "failed"


# -- lineage --------------------------------------------------------------------------------------------


def lineage_agent() -> Agent:
    credit = {"account_id": "acct_o1", "amount_cents": 1250}
    config = credit_agent("lineage", "issue_credit_replaceable").config
    script = [
        {"tool_calls": [{"name": "issue_credit_replaceable", "arguments": credit}]},
        # The model corrects the amount of its first credit, naming it.
        {
            "tool_calls": [
                {
                    "name": "issue_credit_replaceable",
                    "arguments": {**credit, "amount_cents": 1000, "replaces": "call_0_0"},
                }
            ]
        },
        # And names a call that never was: bad input, nothing reserved.
        {
            "tool_calls": [
                {
                    "name": "issue_credit_replaceable",
                    "arguments": {**credit, "amount_cents": 900, "replaces": "call_9_9"},
                }
            ]
        },
        {"final": "done"},
    ]
    model = ScriptedConfig.model_validate({"provider": "scripted", "script": script})
    return Agent(
        "lineage", config.model_copy(update={"model": model}), credit_agent("x", "issue_credit").tools
    )


async def test_a_replacement_names_the_call_it_replaces_and_the_ledger_keeps_the_chain(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    DOWNSTREAM.reset()
    agent = lineage_agent()
    async with running_worker(temporal_env.client, ledger, AgentRegistry({agent.name: agent})) as harness:
        handle = await harness.start("lineage", ORDER)
        result = await asyncio.wait_for(handle.result(), 30)
    original, replacement = f"{handle.id}:call_0_0", f"{handle.id}:call_1_0"
    assert await write_keys(ledger, handle.id) == [original, replacement]
    record = await ledger.get(replacement)
    assert record.status is Status.COMPLETED and record.replaces == original
    assert record.payload["arguments"] == {"account_id": "acct_o1", "amount_cents": 1000}
    assert [c.status for c in result.calls] == ["completed", "completed", "error"]
    assert "no call of this run" in (result.calls[2].detail or "")
    assert DOWNSTREAM.received == {original: 1, replacement: 1}


async def test_an_operator_settling_the_blocker_over_the_api_wakes_the_held_run(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    DOWNSTREAM.reset()
    agent = refund_agent("refund", "refund_order")
    registry = AgentRegistry({agent.name: agent})
    async with serving_api(temporal_env.client, ledger, registry) as api:
        DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
        first = await api.runs.start("refund", ORDER)
        await eventually(
            lambda: _phase_is(first, Phase.AWAITING_RECONCILIATION), "the first refund to be unknown"
        )
        [first_key] = await write_keys(ledger, first.id)
        second = await api.runs.start("refund", ORDER)
        await eventually(lambda: _phase_is(second, Phase.HELD), "the second refund to be held")
        [second_key] = await write_keys(ledger, second.id)

        async with await api.as_operator() as operator:
            held = await operator.get(f"/v1/tool-executions/{second_key}")
            assert held.json()["status"] == "held" and held.json()["held_by"] == first_key
            blocker = await operator.get(f"/v1/tool-executions/{first_key}")
            assert blocker.json()["held_calls"] == [second_key]
            settled = await operator.post(
                f"/v1/tool-executions/{first_key}/resolve",
                json={"status": "failed", "reason": "billing has no refund", "evidence": {"billing": "none"}},
            )
            assert settled.status_code == 200, settled.text
        DOWNSTREAM.modes["acct_o1"] = "ok"
        await asyncio.wait_for(second.result(), 30)
    # Woken by the API, and again by the first run when it read the decision: a nudge is idempotent.
    assert set(await _woken(temporal_env.client, second)) == {second_key}
    record = await ledger.get(second_key)
    assert record.status is Status.COMPLETED, "the first refund did not apply, so the second fits the budget"
    assert DOWNSTREAM.received == {first_key: 1, second_key: 1}
