"""Approvals through the operator API: an approved call is sent once, a denied one never, a deadline
denies a call nobody decided, and an approval that arrives early is kept. A real server, real runs
on Temporal, a real ledger."""

from __future__ import annotations

import asyncio

from onceflow.ledger import Status
from onceflow.sdk.payloads import Phase
from tests.support.downstream import DOWNSTREAM
from tests.support.operator_api import OperatorApi, order
from tests.test_agent_run import wait_for_phase


async def test_an_approved_call_is_sent_once_and_a_denied_one_never(operator_api: OperatorApi) -> None:
    approved_payload, _ = order()
    denied_payload, _ = order()
    approved = await operator_api.runs.start("credit-approval", approved_payload)
    denied = await operator_api.runs.start("credit-approval", denied_payload)
    for handle in (approved, denied):
        await wait_for_phase(handle, Phase.AWAITING_APPROVAL)
    approved_key, denied_key = f"{approved.id}:call_1_0", f"{denied.id}:call_1_0"
    assert DOWNSTREAM.send_attempts == 0

    async with (
        await operator_api.as_operator(operator="alice") as alice,
        await operator_api.as_operator(operator="bob") as bob,
    ):
        listed = await alice.get("/v1/tool-executions", params={"status": "awaiting_approval"})
        assert {i["key"] for i in listed.json()["items"]} == {approved_key, denied_key}
        # Both operators approve at once: the approval is recorded once and consumed once.
        answers = await asyncio.gather(
            alice.post(f"/v1/tool-executions/{approved_key}/approve", json={"reason": "customer called"}),
            bob.post(f"/v1/tool-executions/{approved_key}/approve", json={}),
        )
        assert sorted(a.status_code for a in answers) == [200, 409]
        deny = await bob.post(f"/v1/tool-executions/{denied_key}/deny", json={"reason": "amount looks wrong"})
        assert deny.status_code == 200 and deny.json()["execution"]["status"] == "denied"
        late = await alice.post(f"/v1/tool-executions/{denied_key}/approve", json={})
        assert late.status_code == 409 and late.json()["decided_by"] == "operator:bob"
        no_reason = await alice.post(f"/v1/tool-executions/{denied_key}/deny", json={})
        assert no_reason.status_code == 400

    approved_result = await asyncio.wait_for(approved.result(), 20)
    denied_result = await asyncio.wait_for(denied.result(), 20)
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {approved_key: 1}
    assert DOWNSTREAM.send_attempts == 1
    record = await operator_api.ledger.get(approved_key)
    assert record.status is Status.COMPLETED
    assert [e.kind for e in record.events] == ["reserved", "approved", "dispatched", "completed"]
    assert "cr_" in approved_result.final
    assert (await operator_api.ledger.get(denied_key)).status is Status.DENIED
    assert denied_result.calls[-1].status == "denied"
    assert "denied" in denied_result.final


async def test_the_approval_deadline_denies_a_call_nobody_decided(operator_api: OperatorApi) -> None:
    payload, _ = order()
    handle = await operator_api.runs.start("credit-approval-short", payload)
    result = await asyncio.wait_for(handle.result(), 20)
    record = await operator_api.ledger.get(f"{handle.id}:call_1_0")
    assert (record.status, record.settled_by) == (Status.DENIED, "onceflow:approval-deadline")
    assert "approval deadline" in (record.reason or "")
    assert result.calls[-1].status == "denied"
    assert DOWNSTREAM.send_attempts == 0


async def test_an_approval_that_lands_before_the_run_starts_waiting_is_not_lost(
    operator_api: OperatorApi,
) -> None:
    # Approve the moment the row exists: the signal often reaches the run before it waits.
    async with await operator_api.as_operator() as acme:
        for _ in range(5):
            payload, _ = order()
            handle = await operator_api.runs.start("credit-approval", payload)
            key = f"{handle.id}:call_1_0"
            while (await operator_api.ledger.find(key)) is None:
                await asyncio.sleep(0.005)
            assert (await acme.post(f"/v1/tool-executions/{key}/approve", json={})).status_code == 200
            result = await asyncio.wait_for(handle.result(), 20)  # the deadline is a day away
            assert result.calls[-1].status == "completed"
            assert DOWNSTREAM.received[key] == DOWNSTREAM.effects[key] == 1
