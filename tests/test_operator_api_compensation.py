"""Compensation through the operator API: undoing a completed call runs once through the ledger, is
refused for calls that cannot be undone, and a compensation that times out is itself unknown until an
operator settles it. A real server, real runs on Temporal, a real ledger."""

from __future__ import annotations

import asyncio

from onceflow.ledger import Status
from tests.support.downstream import DOWNSTREAM
from tests.support.operator_api import OperatorApi, order, unknown_call


async def _completed_undoable(operator_api: OperatorApi) -> str:
    payload, _ = order()
    handle = await operator_api.runs.start("credit-undoable", payload)
    await asyncio.wait_for(handle.result(), 20)
    return f"{handle.id}:call_1_0"


async def test_compensation_runs_once_through_the_ledger_and_marks_the_call(
    operator_api: OperatorApi,
) -> None:
    key = await _completed_undoable(operator_api)
    async with await operator_api.as_operator(operator="alice") as alice:
        asked = await asyncio.gather(
            *(
                alice.post(f"/v1/tool-executions/{key}/compensate", json={"reason": "duplicate order"})
                for _ in range(3)
            )
        )
        assert {a.status_code for a in asked} == {202}
        started = asked[0].json()
        assert started["compensation_key"] == f"{key}:compensation"
        handle = operator_api.runs.client.get_workflow_handle(started["workflow_id"])
        outcome = await asyncio.wait_for(handle.result(), 20)
        assert outcome["original_status"] == "compensated"
        again = await alice.post(f"/v1/tool-executions/{key}/compensate", json={"reason": "again"})
        assert again.status_code == 409 and again.json()["current_status"] == "compensated"

    assert DOWNSTREAM.voids == {f"{key}:compensation": 1}
    original = await operator_api.ledger.get(key)
    assert original.status is Status.COMPENSATED
    assert [(e.kind, e.actor, e.reason) for e in original.events][-1] == (
        "compensated",
        "operator:alice",
        "duplicate order",
    )
    compensation = await operator_api.ledger.get(f"{key}:compensation")
    assert (compensation.status, compensation.tool_name, compensation.attempt) == (
        Status.COMPLETED,
        "void_credit",
        1,
    )


async def test_compensation_is_refused_for_calls_that_cannot_be_undone(operator_api: OperatorApi) -> None:
    unknown = await unknown_call(operator_api.ledger)
    payload, _ = order()
    handle = await operator_api.runs.start("credit-reconciled", payload)  # issue_credit: no compensation
    await asyncio.wait_for(handle.result(), 20)
    async with await operator_api.as_operator() as acme:
        not_done = await acme.post(f"/v1/tool-executions/{unknown}/compensate", json={"reason": "undo"})
        assert not_done.status_code == 409 and not_done.json()["current_status"] == "indeterminate"
        no_hook = await acme.post(
            f"/v1/tool-executions/{handle.id}:call_1_0/compensate", json={"reason": "undo"}
        )
        assert no_hook.status_code == 422
        assert no_hook.json()["type"] == "urn:onceflow:problem:no-compensation"
        no_reason = await acme.post(
            f"/v1/tool-executions/{handle.id}:call_1_0/compensate", json={"reason": ""}
        )
        assert no_reason.status_code == 400
    assert DOWNSTREAM.voids == {}


async def test_a_compensation_that_times_out_is_itself_unknown_until_an_operator_settles_it(
    operator_api: OperatorApi,
) -> None:
    key = await _completed_undoable(operator_api)
    account = (await operator_api.ledger.get(key)).payload["arguments"]["account_id"]
    DOWNSTREAM.modes[account] = "hang_void"
    async with await operator_api.as_operator(operator="alice") as alice:
        started = (
            await alice.post(f"/v1/tool-executions/{key}/compensate", json={"reason": "refund"})
        ).json()
        compensation_key = started["compensation_key"]

        async def unknown() -> bool:
            record = await operator_api.ledger.find(compensation_key)
            return record is not None and record.status is Status.INDETERMINATE

        for _ in range(100):
            if await unknown():
                break
            await asyncio.sleep(0.1)
        assert await unknown()
        assert (await operator_api.ledger.get(key)).status is Status.COMPLETED
        listed = await alice.get("/v1/tool-executions")
        assert compensation_key in [i["key"] for i in listed.json()["items"]]

        resolved = await alice.post(
            f"/v1/tool-executions/{compensation_key}/resolve",
            json={"status": "completed", "reason": "void visible in billing console"},
        )
        assert resolved.status_code == 200 and resolved.json()["run_signalled"] is True
    handle = operator_api.runs.client.get_workflow_handle(started["workflow_id"])
    outcome = await asyncio.wait_for(handle.result(), 20)
    assert (outcome["status"], outcome["original_status"]) == ("completed", "compensated")
    assert (await operator_api.ledger.get(key)).status is Status.COMPENSATED
    assert DOWNSTREAM.voids == {compensation_key: 1}
