"""Nothing orphaned, in agent runs: a held or approved call asked again reads the ledger first, a failed
`limit_from` read is retried rather than turned into a refusal of a recorded call, and an operator can
release a call that was never sent (API and CLI). A real Temporal dev server, a real PostgreSQL
ledger, the operator API served for real; effects counted at a downstream that honours no key."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import FailureKind, Ledger, Status
from onceflow.runtime.agents import AgentRegistry
from onceflow.sdk.payloads import Phase
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.agents import refund_agent
from tests.support.downstream import DOWNSTREAM
from tests.support.history import activity_runs, history_events, reset_run, workflow_task_completed_after
from tests.support.operator_api import OperatorApi, serving_api
from tests.support.waiting import eventually
from tests.test_executions_cli import cli, put_call

ORDER = json.dumps({"order_id": "o1"})


@pytest.fixture
async def api(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[OperatorApi]:
    DOWNSTREAM.reset()
    agents = [
        refund_agent("refund", "refund_order"),
        refund_agent("refund-approved", "refund_order_approved"),
    ]
    async with serving_api(temporal_env.client, ledger, AgentRegistry({a.name: a for a in agents})) as served:
        yield served


async def _phase_is(handle: WorkflowHandle[Any, Any], wanted: Phase) -> bool:
    try:
        return (await handle.query(AgentRunWorkflow.status)).phase == wanted
    except Exception:  # not answering queries yet
        return False


async def write_keys(ledger: Ledger, run_id: str) -> list[str]:
    async with ledger.connection("test") as conn:
        rows = await conn.fetch(
            "SELECT key FROM tool_executions WHERE run_id = $1 ORDER BY created_at", run_id
        )
    return [row["key"] for row in rows]


async def held_refund(
    api: OperatorApi,
) -> tuple[WorkflowHandle[Any, Any], str, WorkflowHandle[Any, Any], str]:
    """A first refund of o1 that is unknown (applied, no answer), and a second one held behind it."""
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    first = await api.runs.start("refund", ORDER)
    await eventually(
        lambda: _phase_is(first, Phase.AWAITING_RECONCILIATION), "the first refund to be unknown"
    )
    [first_key] = await write_keys(api.ledger, first.id)
    second = await api.runs.start("refund", ORDER)
    await eventually(lambda: _phase_is(second, Phase.HELD), "the second refund to be held")
    [second_key] = await write_keys(api.ledger, second.id)
    return first, first_key, second, second_key


async def test_a_held_refund_whose_limit_read_fails_when_woken_is_retried_not_orphaned(
    api: OperatorApi,
) -> None:
    first, first_key, second, second_key = await held_refund(api)
    DOWNSTREAM.modes["acct_o1"] = "ok"
    DOWNSTREAM.limit_failures_left = 3  # the order service is down when the held call is woken
    reads = DOWNSTREAM.limit_reads
    async with await api.as_operator() as operator:
        settled = await operator.post(
            f"/v1/tool-executions/{first_key}/resolve",
            json={"status": "failed", "reason": "billing has no refund", "evidence": {"billing": "none"}},
        )
        assert settled.status_code == 200, settled.text
    result = await asyncio.wait_for(second.result(), 60)

    # Before: the first failed read came back "not sent, try again" with no key, and the row stayed
    # held for good. Now the read is retried until it answers, and the ledger decides.
    assert DOWNSTREAM.limit_reads - reads >= 4 and DOWNSTREAM.limit_failures_left == 0
    record = await api.ledger.get(second_key)
    assert record.status is Status.COMPLETED
    assert result.calls[-1].status == "completed" and result.calls[-1].key == second_key
    assert DOWNSTREAM.received == {first_key: 1, second_key: 1}
    await asyncio.wait_for(first.result(), 30)


async def test_a_reset_that_replays_a_held_key_while_its_limit_cannot_be_read_keeps_it_held(
    api: OperatorApi,
) -> None:
    first, first_key, second, second_key = await held_refund(api)
    described = await second.describe()
    events = await history_events(api.runs.client, second.id, described.run_id)
    first_model = next(r for r in activity_runs(events) if r.activity_type == "call_model")
    assert first_model.closed is not None
    point = workflow_task_completed_after(events, first_model.closed.event_id)
    DOWNSTREAM.limit_failures_left = 2  # down while the reset run asks about the held key again
    new_run = await reset_run(api.runs.client, second.id, described.run_id, point, "test: replay the key")
    again = api.runs.client.get_workflow_handle_for(AgentRunWorkflow.run, second.id, run_id=new_run)
    await eventually(lambda: _phase_is(again, Phase.HELD), "the replayed key to be held again")
    assert DOWNSTREAM.limit_failures_left == 0
    assert (await api.ledger.get(second_key)).status is Status.HELD

    DOWNSTREAM.modes["acct_o1"] = "ok"
    async with await api.as_operator() as operator:
        settled = await operator.post(
            f"/v1/tool-executions/{first_key}/resolve",
            json={"status": "failed", "reason": "billing has no refund", "evidence": {"billing": "none"}},
        )
        assert settled.status_code == 200, settled.text
    result = await asyncio.wait_for(again.result(), 60)
    assert result.calls[-1].status == "completed"
    assert (await api.ledger.get(second_key)).status is Status.COMPLETED
    assert DOWNSTREAM.received == {first_key: 1, second_key: 1}
    await asyncio.wait_for(first.result(), 30)


async def test_an_approved_refund_is_claimed_from_the_ledger_even_while_its_limit_cannot_be_read(
    api: OperatorApi,
) -> None:
    run = await api.runs.start("refund-approved", ORDER)
    await eventually(lambda: _phase_is(run, Phase.AWAITING_APPROVAL), "the refund to await approval")
    [key] = await write_keys(api.ledger, run.id)
    DOWNSTREAM.limit_failures_left = 1000  # down for good: the approved call must not need it
    async with await api.as_operator() as operator:
        approved = await operator.post(f"/v1/tool-executions/{key}/approve", json={})
        assert approved.status_code == 200, approved.text
    result = await asyncio.wait_for(run.result(), 30)
    record = await api.ledger.get(key)
    assert record.status is Status.COMPLETED and record.approved_by == "operator:alice"
    assert result.calls[-1].status == "completed"
    assert DOWNSTREAM.received == {key: 1}


async def test_an_operator_releases_a_held_call_and_its_run_is_told_it_was_not_sent(api: OperatorApi) -> None:
    first, first_key, second, second_key = await held_refund(api)
    path = f"/v1/tool-executions/{second_key}/release"
    async with await api.as_operator() as alice, await api.as_operator(operator="bob") as bob:
        refused = await alice.post(path, json={})
        assert refused.status_code == 400, refused.text  # a release needs a reason
        released, late = await alice.post(path, json={"reason": "duplicate of the first refund"}), None
        assert released.status_code == 200, released.text
        body = released.json()
        assert body["execution"]["status"] == "failed" and body["execution"]["failure_kind"] == "released"
        assert body["run_signalled"] is True
        late = await bob.post(path, json={"reason": "me too"})
        assert late.status_code == 409, late.text
        assert late.json()["decided_by"] == "operator:alice"
        blocker = await alice.get(f"/v1/tool-executions/{first_key}")
        assert blocker.json()["held_calls"] == []

    result = await asyncio.wait_for(second.result(), 30)
    told = result.calls[-1]
    assert (told.key, told.status) == (second_key, "failed")
    record = await api.ledger.get(second_key)
    event = record.events[-1]
    assert (event.kind, event.actor, event.source, event.reason) == (
        "released",
        "operator:alice",
        "api",
        "duplicate of the first refund",
    )
    assert record.failure_kind is FailureKind.RELEASED
    assert DOWNSTREAM.received == {first_key: 1}, "the released call was never sent"
    await first.terminate("test over")


async def test_the_cli_releases_an_approved_call_whose_run_is_gone(api: OperatorApi) -> None:
    key = await put_call(api.ledger, approval=True)
    await api.ledger.approve(key, actor="operator:carol")
    alice, bob = await api.token(), await api.token(operator="bob")

    done = await cli(api, "release", key, "--reason", "its run was terminated", token=alice)
    assert done.code == 0, done.err
    assert f"{key} released: now failed" in done.out
    late = await cli(api, "release", key, "--reason", "me too", token=bob)
    assert late.code == 4, late.err
    assert "decided by operator:alice" in late.err

    record = await api.ledger.get(key)
    assert (record.status, record.failure_kind, record.settled_by) == (
        Status.FAILED,
        FailureKind.RELEASED,
        "operator:alice",
    )
    assert [e.kind for e in record.events].count("released") == 1


async def test_a_new_refund_whose_limit_cannot_be_read_is_not_recorded_and_the_model_is_told(
    api: OperatorApi,
) -> None:
    DOWNSTREAM.limit_failures_left = 1
    run = await api.runs.start("refund", ORDER)
    result = await asyncio.wait_for(run.result(), 30)
    told = result.calls[-1]
    assert (told.status, told.key) == ("error", None)
    assert "budget limit comes from order_refundable, which failed" in (told.detail or "")
    assert await write_keys(api.ledger, run.id) == [] and DOWNSTREAM.received == {}
