"""Guards in agent runs, within one run: a model that asks for the same effect again under a new id
(twins in one answer, a re-issue after a reset) gets what the tool declared, and a replacement names
the call it replaces. On a real Temporal dev server and a real PostgreSQL ledger. Entities and budgets
across runs are in tests/test_guarded_runs_entities.py.

Effects are counted at the downstream, which honours no idempotency key (tests/support/downstream.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, Status
from onceflow.models.config import ScriptedConfig
from onceflow.runtime.agents import Agent, AgentRegistry
from onceflow.runtime.constants import HELD_KEYS, UNRESOLVED_KEYS
from onceflow.sdk.payloads import Phase, ResolveSignal, ToolCallInput, ToolOutcome
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.agents import credit_agent, twins_agent
from tests.support.downstream import DOWNSTREAM
from tests.support.guarded_runs import (
    ORDER,
    _phase_is,
    attribute,
    harness,
    reset_before_the_credit,
    write_keys,
)
from tests.support.history import activity_runs, history_events
from tests.support.waiting import eventually
from tests.test_replay import replayer
from tests.workflow_harness import Harness, running_worker

__all__ = ["harness"]  # the fixture, used by name


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
    assert [[h.tool_call_id for h in one] for one in heard] == [
        [],
        [],
        [first.rpartition(":")[2], twin.rpartition(":")[2]],
    ]
    # Each heard call carries what the model was told of it: the status and the settlement.
    told = {(await ledger.get(key)).tool_call_id: await ledger.get(key) for key in (first, twin)}
    for h in heard[-1]:
        assert (h.status, h.settled_at) == (Status.COMPLETED, told[h.tool_call_id].settled_at)
    replayed = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None


async def test_a_reset_while_the_first_credit_is_in_flight_reconciles_it_and_reuses_its_result(
    harness: Harness,
) -> None:
    """The reset ends the run whose activity was sending the credit, so nobody would look after
    that call. The new run, held behind it, adopts it: unknown, reconciled, and its result reused."""
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start("fresh-slow-reconciled", ORDER)
    await eventually(lambda: _received(1), "the first credit to reach the downstream")
    first_run = (await handle.describe()).run_id
    assert first_run is not None
    again = await reset_before_the_credit(harness.client, handle, first_run)
    result = await asyncio.wait_for(again.result(), 30)

    first_key, second_key = await write_keys(harness.ledger, handle.id)
    first = await harness.ledger.get(first_key)
    assert first.status is Status.COMPLETED and first.settled_by == "reconciler"
    # The new run asked about it at once, while its first attempt was on the wire (its owner's lease
    # live for 9 s): nobody but that owner may call it unknown (or settle it) before the lease ends.
    [unknown] = [e for e in first.events if e.kind == "indeterminate"]
    assert first.lease_expires_at is not None
    assert unknown.actor == first.owner or unknown.at >= first.lease_expires_at, (
        f"made unknown by {unknown.actor} at {unknown.at}, inside the owner's lease ({first.lease_expires_at})"
    )
    second = await harness.ledger.get(second_key)
    assert second.reused_from == first_key and [e.kind for e in second.events] == ["held", "reused"]
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {first_key: 1}
    assert "cr_1" in result.final


async def _received(count: int) -> bool:
    return sum(DOWNSTREAM.received.values()) >= count


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
