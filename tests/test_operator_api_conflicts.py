"""Conflicts and event sources through the operator API: listed, shown, acknowledged."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from onceflow.activities.held import WAKE_ACTOR
from onceflow.ledger import CallIdentity, Guard, Reservation, SideEffect, Status
from onceflow.runtime.constants import CONFLICT_KEYS
from onceflow.sdk.payloads import ConflictSignal
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.history import resolve_signals
from tests.support.operator_api import ARGUMENTS, OperatorApi, unknown_call
from tests.test_run_conflicts_and_provenance import open_run_with_a_decided_call


async def conflicted_call(api: OperatorApi, tenant: str = "acme") -> str:
    key = await unknown_call(api.ledger, tenant=tenant)
    await api.ledger.settle(key, status=Status.FAILED, actor="operator:alice", reason="not in billing")
    await api.ledger.record_late_outcome(
        key, actor="reconciler", status=Status.COMPLETED, evidence={"credit_id": "cr_9"}
    )
    return key


async def test_conflicts_are_in_the_default_queue_and_can_be_listed_alone(operator_api: OperatorApi) -> None:
    unknown = await unknown_call(operator_api.ledger)
    conflicted = await conflicted_call(operator_api)
    await conflicted_call(operator_api, tenant="globex")
    async with await operator_api.as_operator() as acme:
        queue = (await acme.get("/v1/tool-executions")).json()["items"]
        only = (await acme.get("/v1/tool-executions", params={"conflict": "true"})).json()["items"]
        none = (await acme.get("/v1/tool-executions", params={"conflict": "false"})).json()["items"]
        mixed = await acme.get("/v1/tool-executions", params={"conflict": "true", "status": "indeterminate"})

    assert [i["key"] for i in queue] == [unknown, conflicted]
    assert [i["key"] for i in only] == [conflicted]
    assert [i["key"] for i in none] == [unknown]
    assert mixed.status_code == 200 and mixed.json()["items"] == []  # conflicts are never unresolved
    view = only[0]
    assert view["status"] == "failed" and view["settled_by"] == "operator:alice"
    assert view["conflict"]["open"] is True
    assert view["conflict"]["detail"]["reported"] == "completed"
    assert view["conflict"]["detail"]["evidence"] == {"credit_id": "cr_9"}
    assert queue[0]["conflict"] is None


async def test_the_record_shows_the_conflict_and_where_each_event_came_from(
    operator_api: OperatorApi,
) -> None:
    key = await conflicted_call(operator_api)
    async with await operator_api.as_operator() as acme:
        shown = (await acme.get(f"/v1/tool-executions/{key}")).json()
    assert [(e["kind"], e["source"]) for e in shown["events"]] == [
        ("reserved", "owner"),
        ("indeterminate", "inspector"),
        ("settled", "api"),
        ("outcome_conflict", "reconciler"),
    ]
    assert shown["conflict"]["open"] is True


async def test_acknowledging_a_conflict_keeps_the_decision_and_clears_the_runs_attribute(
    operator_api: OperatorApi,
) -> None:
    # A run that stays open (waiting for an approval); its other call was decided "failed" and then
    # the reconcile hook found it completed.
    handle, key = await open_run_with_a_decided_call(operator_api.runs)
    await operator_api.ledger.record_late_outcome(key, actor="reconciler", status=Status.COMPLETED)
    # What the reconcile activity does after flagging (tested through Temporal elsewhere).
    await handle.signal(
        AgentRunWorkflow.conflict, ConflictSignal(key=key, detail="reconciler says completed")
    )

    async def attribute() -> Sequence[str] | None:
        return (await handle.describe()).typed_search_attributes.get(CONFLICT_KEYS)

    for _ in range(100):
        if await attribute() == [key]:
            break
        await asyncio.sleep(0.05)
    assert await attribute() == [key]

    async with (
        await operator_api.as_operator(operator="bob") as bob,
        await operator_api.as_operator(operator="carol") as carol,
        await operator_api.as_operator(tenant="globex") as globex,
    ):
        path = f"/v1/tool-executions/{key}/acknowledge-conflict"
        acknowledged = {"status": "failed", "reason": "voided by hand", "evidence": {"ticket": "OPS-3"}}
        assert (await bob.post(path, json={})).status_code == 400
        # What the world is, and evidence, are required: the status is final for the key.
        for partial in ("status", "evidence"):
            body = {k: v for k, v in acknowledged.items() if k != partial}
            assert (await bob.post(path, json=body)).status_code == 400, partial
        assert (await bob.post(path, json={**acknowledged, "evidence": {}})).status_code == 400
        assert (await bob.post(path, json={**acknowledged, "status": "held"})).status_code == 400
        assert (await globex.post(path, json=acknowledged)).status_code == 404
        answer = await bob.post(path, json=acknowledged)
        assert answer.status_code == 200, answer.text
        assert answer.json()["run_signalled"] is True
        view = answer.json()["execution"]
        assert (view["status"], view["settled_by"]) == ("failed", "operator:alice")
        assert view["conflict"]["open"] is False and view["conflict"]["acknowledged_by"] == "operator:bob"
        assert (await bob.post(path, json=acknowledged)).status_code == 200
        late = await carol.post(path, json={**acknowledged, "reason": "me too"})
        assert late.status_code == 409 and late.json()["decided_by"] == "operator:bob"
        listed = (await bob.get("/v1/tool-executions", params={"conflict": "true"})).json()["items"]
        assert listed == []

    for _ in range(100):
        if await attribute() is None:
            break
        await asyncio.sleep(0.05)
    assert await attribute() is None
    record = await operator_api.ledger.get(key)
    assert [e.kind for e in record.events].count("conflict_acknowledged") == 1


async def test_acknowledging_a_conflict_wakes_the_twin_held_behind_it(operator_api: OperatorApi) -> None:
    # A call decided "failed" and then reported completed (an open conflict), and its twin in the same
    # run, which the intent guard holds behind it: a call that may have applied.
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    ledger = operator_api.ledger

    async def reserve(tool_call_id: str) -> Reservation:
        reserved = await ledger.reserve(
            CallIdentity(tenant="acme", run_id=run_id, tool_call_id=tool_call_id),
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments=ARGUMENTS,
            owner="worker-1",
            guard=Guard(),
        )
        return reserved.outcome

    assert await reserve("call_1_0") is Reservation.NEW
    blocker = f"{run_id}:call_1_0"
    await ledger.mark_indeterminate(blocker, actor="inspector", reason="timed out")
    await ledger.settle(blocker, status=Status.FAILED, actor="operator:alice", reason="not in billing")
    await ledger.record_late_outcome(blocker, actor="reconciler", status=Status.COMPLETED)
    assert await reserve("call_2_0") is Reservation.HELD
    held = f"{run_id}:call_2_0"
    assert (await ledger.get(held)).held_by == blocker
    assert (await ledger.get(blocker)).holds_calls
    # The run, as far as signals go: a workflow under the run id that no worker picks up.
    client = operator_api.runs.client
    run = await client.start_workflow("NobodyRunsThis", id=run_id, task_queue=f"none-{uuid.uuid4().hex[:8]}")
    try:
        async with await operator_api.as_operator() as acme:
            acknowledged = await acme.post(
                f"/v1/tool-executions/{blocker}/acknowledge-conflict",
                json={
                    "status": "failed",
                    "reason": "billing shows no credit",
                    "evidence": {"billing": "none"},
                },
            )
        assert acknowledged.status_code == 200, acknowledged.text
        woken = [(signal.key, signal.actor) for signal in await resolve_signals(client, run_id)]
        assert woken == [(held, WAKE_ACTOR)]
    finally:
        await run.terminate("test over")
