"""Guarded calls through the operator API: held calls and what they wait for, the replacement chain,
budgets and the evidence that releases them. A real server over a real ledger."""

from __future__ import annotations

from onceflow.ledger import CallIdentity, Guard, Reservation, SideEffect, Status
from tests.support.guarded import REFUND, new_run, refund_arguments, unknown_refund_and_a_held_repeat
from tests.support.operator_api import OperatorApi
from tests.test_ledger_lineage_and_evidence import replacement_chain


async def test_a_held_call_shows_what_it_waits_for_and_its_blocker_lists_it(
    operator_api: OperatorApi,
) -> None:
    blocker, held = await unknown_refund_and_a_held_repeat(operator_api.ledger, order_id="ord_shown")
    async with await operator_api.as_operator() as acme:
        shown = (await acme.get(f"/v1/tool-executions/{held}")).json()
        waited_for = (await acme.get(f"/v1/tool-executions/{blocker}")).json()
    assert shown["status"] == "held"
    assert shown["held_by"] == blocker and "call_1_0" in shown["hold_reason"]
    assert (shown["entity"], shown["entity_exclusive"]) == ("ord_shown", True)
    assert (shown["amount"], shown["budget_limit"]) == ("2500", "5000")
    assert (shown["replaces"], shown["reused_from"], shown["lineage"], shown["held_calls"]) == (
        None,
        None,
        [],
        [],
    )
    assert [e["kind"] for e in shown["events"]] == ["held"]
    assert waited_for["status"] == "indeterminate" and waited_for["held_calls"] == [held]


async def test_held_calls_are_listed_when_asked_for_and_not_by_default(operator_api: OperatorApi) -> None:
    blocker, held = await unknown_refund_and_a_held_repeat(operator_api.ledger)
    async with await operator_api.as_operator() as acme:
        default = (await acme.get("/v1/tool-executions")).json()["items"]
        only_held = (await acme.get("/v1/tool-executions", params={"status": "held"})).json()["items"]
        both = await acme.get("/v1/tool-executions", params={"status": "indeterminate,held"})
    assert [i["key"] for i in default] == [blocker]
    assert [(i["key"], i["held_by"]) for i in only_held] == [(held, blocker)]
    assert [i["key"] for i in both.json()["items"]] == [blocker, held]
    assert "lineage" not in default[0] or default[0]["lineage"] is None


async def test_resolving_a_held_call_is_a_409_naming_its_blocker_and_changes_nothing(
    operator_api: OperatorApi,
) -> None:
    blocker, held = await unknown_refund_and_a_held_repeat(operator_api.ledger)
    before = await operator_api.ledger.get(held)
    async with await operator_api.as_operator() as acme:
        for body in (
            {"status": "failed", "reason": "never happened", "evidence": {"ticket": "T-9"}},
            {"status": "completed", "reason": "saw it"},
        ):
            response = await acme.post(f"/v1/tool-executions/{held}/resolve", json=body)
            assert response.status_code == 409, response.text
            problem = response.json()
            assert problem["type"] == "urn:onceflow:problem:held"
            assert (problem["current_status"], problem["held_by"]) == ("held", blocker)
            assert blocker in problem["detail"] and "Nothing was sent" in problem["detail"]
        approve = await acme.post(f"/v1/tool-executions/{held}/approve", json={})
        assert approve.status_code == 409 and approve.json()["held_by"] == blocker
    assert await operator_api.ledger.get(held) == before


async def test_settling_a_budgeted_call_as_failed_needs_evidence(operator_api: OperatorApi) -> None:
    blocker, _ = await unknown_refund_and_a_held_repeat(operator_api.ledger, order_id="ord_budget")
    before = await operator_api.ledger.get(blocker)
    async with await operator_api.as_operator(operator="alice") as alice:
        for body in (
            {"status": "failed", "reason": "not in the processor"},
            {"status": "failed", "reason": "not in the processor", "evidence": {}},
        ):
            refused = await alice.post(f"/v1/tool-executions/{blocker}/resolve", json=body)
            assert refused.status_code == 422, refused.text
            problem = refused.json()
            assert problem["type"] == "urn:onceflow:problem:evidence-required"
            assert "2500" in problem["detail"] and "ord_budget" in problem["detail"]
        assert await operator_api.ledger.get(blocker) == before
        settled = await alice.post(
            f"/v1/tool-executions/{blocker}/resolve",
            json={
                "status": "failed",
                "reason": "not in the processor",
                "evidence": {"processor_search": "order ord_budget", "refunds_found": 0},
            },
        )
    assert settled.status_code == 200, settled.text
    record = await operator_api.ledger.get(blocker)
    assert (record.status, record.settled_by, record.evidence) == (
        Status.FAILED,
        "operator:alice",
        {"processor_search": "order ord_budget", "refunds_found": 0},
    )


async def test_the_record_shows_its_replacement_chain_and_another_tenant_sees_none_of_it(
    operator_api: OperatorApi,
) -> None:
    keys = await replacement_chain(operator_api.ledger)
    async with await operator_api.as_operator() as acme:
        shown = (await acme.get(f"/v1/tool-executions/{keys[1]}")).json()
    assert shown["replaces"] == keys[0]
    chain = shown["lineage"]
    assert [(e["key"], e["replaces"], e["status"]) for e in chain] == [
        (keys[0], None, "completed"),
        (keys[1], keys[0], "completed"),
        (keys[2], keys[1], "failed"),
        (keys[3], keys[1], "started"),
    ]
    assert [e["amount"] for e in chain] == ["1000", "900", "800", "700"]
    async with await operator_api.as_operator(tenant="globex") as globex:
        assert (await globex.get(f"/v1/tool-executions/{keys[1]}")).status_code == 404


async def test_a_reused_call_names_the_call_whose_result_it_was_given(operator_api: OperatorApi) -> None:
    ledger = operator_api.ledger
    run_id = new_run()
    keys = []
    for tool_call_id in ("call_1_0", "call_2_0"):
        reserved = await ledger.reserve(
            CallIdentity(tenant="acme", run_id=run_id, tool_call_id=tool_call_id, agent="refunds"),
            tool_name=REFUND,
            side_effect=SideEffect.EXTERNAL,
            arguments=refund_arguments(),
            owner="worker-seed",
            guard=Guard(intent="reuse"),
        )
        if reserved.may_send:
            await ledger.complete(reserved.record.key, owner="worker-seed", result={"refund_id": "rf_9"})
        keys.append(reserved.record.key)
    assert reserved.outcome is Reservation.REUSED
    async with await operator_api.as_operator() as acme:
        shown = (await acme.get(f"/v1/tool-executions/{keys[1]}")).json()
    assert (shown["status"], shown["reused_from"], shown["result"]) == (
        "completed",
        keys[0],
        {"refund_id": "rf_9"},
    )
