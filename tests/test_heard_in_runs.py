"""What the model heard, in real agent runs: a repeat is judged by the outcome the model was told, and
a reused call by the effect it points to. On a real Temporal dev server and a real PostgreSQL ledger.

Effects are counted at the downstream, which honours no idempotency key (tests/support/downstream.py):
a repeat that was sent shows as a second effect. The model gets a new tool call id on every answer, as
real providers give, so a reset makes it re-issue calls under new ids.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, OutcomeIgnoredError, Status
from onceflow.models.config import ScriptedConfig
from onceflow.runtime.agents import Agent, AgentRegistry
from onceflow.sdk.payloads import Phase, ResolveSignal
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.agents import credit_agent
from tests.support.downstream import DOWNSTREAM
from tests.support.guarded_runs import ORDER, FreshIdModel, _phase_is, reset_before_the_credit, write_keys
from tests.support.history import activity_runs, history_events, reset_run, workflow_task_completed_after
from tests.support.waiting import eventually
from tests.workflow_harness import running_worker

EVIDENCE = {"checked": "billing's credit list"}
TOOL = "issue_credit_unreconciled"  # default guards; no reconcile hook: an unknown call waits for a person


def _agent(name: str, credit_turns: list[int]) -> Agent:
    """The credit conversation with its credit turn replaced by `credit_turns`: one answer per item,
    each with that many identical credits, then the final answer. A new tool call id every answer."""
    base = credit_agent(name, TOOL, "pause", recheck_interval="1s")
    assert isinstance(base.config.model, ScriptedConfig)
    script = base.config.model.model_dump()["script"]
    credit = script[1]["tool_calls"][0]
    script[1:2] = [{"tool_calls": [credit] * n} for n in credit_turns]
    config = base.config.model_copy(
        update={"model": ScriptedConfig.model_validate({"provider": "scripted", "script": script})}
    )
    scripted = Agent(name, config, base.tools)
    return Agent(name, config, base.tools, model=FreshIdModel(scripted))


def _registry(*agents: Agent) -> AgentRegistry:
    return AgentRegistry({a.name: a for a in agents})


async def _outcome_told(handle: WorkflowHandle[Any, Any], tool_call_id: str) -> dict[str, Any]:
    """What the run's conversation says of a call: the summary the run keeps (status and detail)."""
    calls = (await handle.query(AgentRunWorkflow.status)).calls
    [call] = [c for c in calls if c.tool_call_id == tool_call_id]
    return call.model_dump()


async def test_a_conflict_acknowledged_after_the_model_heard_failed_pays_once(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    """c1 applies at billing but its answer is lost; an operator settles it failed and the model is
    told so; c1's owner then reports it completed (a conflict). The model asks again (c2, having heard
    "failed"): held while the conflict is open. An operator acknowledges c1 as completed. c2 is woken:
    it heard "failed", c1 now stands "completed", so c2 is given c1's result. One credit at billing."""
    DOWNSTREAM.reset()
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    agent = _agent("conflicted", [1, 1])
    async with running_worker(temporal_env.client, ledger, _registry(agent)) as harness:
        handle = await harness.start(agent.name, ORDER)
        await eventually(lambda: _phase_is(handle, Phase.AWAITING_RECONCILIATION), "c1 to be unknown")
        [first] = await write_keys(ledger, handle.id)
        owner = (await ledger.get(first)).owner or ""
        DOWNSTREAM.modes["acct_o1"] = "ok"
        await ledger.settle(first, status=Status.FAILED, actor="operator:ann", reason="not in billing")
        with pytest.raises(OutcomeIgnoredError):
            await ledger.complete(first, owner=owner, result={"credit_id": "cr_1"})  # the late answer
        await handle.signal(AgentRunWorkflow.resolve, ResolveSignal(key=first, actor="test"))

        await eventually(lambda: _phase_is(handle, Phase.HELD), "the model's retry to be held")
        _, second = await write_keys(ledger, handle.id)
        assert (await ledger.get(second)).held_by == first
        acknowledged = await ledger.acknowledge_conflict(
            first, actor="operator:bob", status=Status.COMPLETED, reason="found it", evidence=EVIDENCE
        )
        assert acknowledged.status is Status.COMPLETED
        await handle.signal(AgentRunWorkflow.resolve, ResolveSignal(key=second, actor="test"))
        await asyncio.wait_for(handle.result(), 30)

    assert DOWNSTREAM.received == {first: 1}, "the retry was sent"
    assert sum(DOWNSTREAM.effects.values()) == 1
    reused = await ledger.get(second)
    assert (reused.status, reused.reused_from) == (Status.COMPLETED, first)


async def test_a_reissue_after_an_undone_effect_is_refused_not_told_it_took_effect(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    """Two identical credits in one answer: c1 is sent, c2 given its result. An operator undoes c1.
    A reset makes the model ask for both again (r1, r2): each is refused, none is told "already took
    effect" with the result of the credit that was undone, and nothing more is sent."""
    DOWNSTREAM.reset()
    agent = _agent("undone", [2])
    async with running_worker(temporal_env.client, ledger, _registry(agent)) as harness:
        handle = await harness.start(agent.name, ORDER)
        await asyncio.wait_for(handle.result(), 30)
        first, twin = await write_keys(ledger, handle.id)
        assert (await ledger.get(twin)).reused_from == first
        await ledger.mark_compensated(first, actor="operator:ann", reason="voided in billing")
        assert handle.result_run_id is not None
        again = await reset_before_the_credit(harness.client, handle, handle.result_run_id)
        await asyncio.wait_for(again.result(), 30)
        reissues = (await write_keys(ledger, handle.id))[2:]
        told = [await _outcome_told(again, key.rpartition(":")[2]) for key in reissues]

    assert len(reissues) == 2
    for key, summary in zip(reissues, told, strict=True):
        record = await ledger.get(key)
        assert record.status is Status.FAILED and record.reused_from is None, key
        assert summary["status"] == "failed" and "compensated" in (summary["detail"] or ""), summary
    assert DOWNSTREAM.received == {first: 1}


async def test_reissues_after_a_reset_are_each_given_their_own_earlier_effect(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    """The model credits (c1), hears it, credits again (c2): two credits owed and paid. A reset makes
    it re-issue both (r1, then r2 after hearing r1). r1 gets c1's credit, r2 c2's: the model is never
    told one credit id twice, and nothing more is sent."""
    DOWNSTREAM.reset()
    agent = _agent("paired", [1, 1])
    async with running_worker(temporal_env.client, ledger, _registry(agent)) as harness:
        handle = await harness.start(agent.name, ORDER)
        first_result = await asyncio.wait_for(handle.result(), 30)
        first, second = await write_keys(ledger, handle.id)
        assert handle.result_run_id is not None
        again = await reset_before_the_credit(harness.client, handle, handle.result_run_id)
        second_result = await asyncio.wait_for(again.result(), 30)
        r1, r2 = (await write_keys(ledger, handle.id))[2:]

    assert DOWNSTREAM.received == {first: 1, second: 1}
    records = [await ledger.get(key) for key in (first, second, r1, r2)]
    assert [r.reused_from for r in records[2:]] == [first, second]
    assert records[2].result == records[0].result and records[3].result == records[1].result
    assert records[2].result != records[3].result
    assert first_result.final == second_result.final, "told the same two credits, in the same order"


async def test_a_reused_call_replayed_after_its_effect_was_undone_is_told_it_was_undone(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    """c1 is sent, c2 (same answer) given its result; an operator undoes c1. A reset to just after the
    model's answer runs both writes again under their own keys: the ledger answers from its records,
    and c2, whose effect was undone, is told so (compensated), not that it took effect."""
    DOWNSTREAM.reset()
    agent = _agent("replayed", [2])
    async with running_worker(temporal_env.client, ledger, _registry(agent)) as harness:
        handle = await harness.start(agent.name, ORDER)
        await asyncio.wait_for(handle.result(), 30)
        first, twin = await write_keys(ledger, handle.id)
        await ledger.mark_compensated(first, actor="operator:ann", reason="voided in billing")
        assert handle.result_run_id is not None
        again = await reset_after_model_turn(harness.client, handle, handle.result_run_id, turn=2)
        await asyncio.wait_for(again.result(), 30)
        told = {key: await _outcome_told(again, key.rpartition(":")[2]) for key in (first, twin)}

    assert await write_keys(ledger, handle.id) == [first, twin], "no new call: the same two keys"
    assert told[first]["status"] == told[twin]["status"] == "compensated", told
    assert DOWNSTREAM.received == {first: 1}


async def reset_after_model_turn(
    client: Any, handle: WorkflowHandle[Any, Any], run_id: str, *, turn: int
) -> WorkflowHandle[Any, Any]:
    """Reset the run to just after model turn `turn` answered: its tool calls run again, same ids."""
    events = await history_events(client, handle.id, run_id)
    model_turn = [r for r in activity_runs(events) if r.activity_type == "call_model"][turn - 1]
    assert model_turn.closed is not None
    point = workflow_task_completed_after(events, model_turn.closed.event_id)
    new_run = await reset_run(client, handle.id, run_id, point, "test: the writes run again")
    return client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id, run_id=new_run)
