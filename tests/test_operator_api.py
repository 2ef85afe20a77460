"""The operator API over HTTP: who may ask, reading the queue, resolving unknown calls and escalating
those left unknown. A real server, real runs on Temporal, a real ledger. Approvals are in
test_operator_api_approvals, compensation in test_operator_api_compensation."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from datetime import timedelta
from typing import Any

import pytest

from onceflow.ledger import CallIdentity, OperatorTokens, SideEffect, Status
from onceflow.sdk.payloads import Phase
from tests.support.downstream import DOWNSTREAM
from tests.support.operator_api import ARGUMENTS, OperatorApi, order, unknown_call
from tests.test_agent_run import wait_for_phase

# -- who may ask ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/tool-executions"),
        ("GET", "/v1/tool-executions/run-x:call_1_0"),
        ("POST", "/v1/tool-executions/run-x:call_1_0/resolve"),
        ("POST", "/v1/tool-executions/run-x:call_1_0/approve"),
        ("POST", "/v1/tool-executions/run-x:call_1_0/deny"),
        ("POST", "/v1/tool-executions/run-x:call_1_0/compensate"),
    ],
)
async def test_every_route_needs_a_live_token(operator_api: OperatorApi, method: str, path: str) -> None:
    tokens = OperatorTokens(operator_api.ledger)
    revoked, revoked_secret = await tokens.create(tenant="acme", operator="mallory")
    await tokens.revoke(revoked.id)
    body = {"status": "failed", "reason": "x"} if path.endswith("resolve") else {"reason": "x"}
    for headers in (
        {},
        {"Authorization": "Bearer oft_not-a-real-token"},
        {"Authorization": f"Bearer {revoked_secret}"},
        {"Authorization": "Basic YWxpY2U6c2VjcmV0"},
    ):
        response = await operator_api.http.request(
            method, path, headers=headers, json=body if method == "POST" else None
        )
        assert response.status_code == 401, (headers, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["type"] == "urn:onceflow:problem:unauthorized"


async def test_another_tenants_key_is_exactly_as_absent_as_a_missing_one(operator_api: OperatorApi) -> None:
    theirs = await unknown_call(operator_api.ledger, tenant="globex")
    missing = theirs.replace("run-", "run-missing")
    async with await operator_api.as_operator("acme") as acme:
        for path in ("", "/resolve"):
            body = {"status": "failed", "reason": "mine now"}
            method = "POST" if path else "GET"
            found = await acme.request(
                method, f"/v1/tool-executions/{theirs}{path}", json=body if path else None
            )
            absent = await acme.request(
                method, f"/v1/tool-executions/{missing}{path}", json=body if path else None
            )
            assert found.status_code == absent.status_code == 404
            assert found.json() | {"key": "", "detail": ""} == absent.json() | {"key": "", "detail": ""}
            assert found.json()["detail"].replace(theirs, "K") == absent.json()["detail"].replace(
                missing, "K"
            )
        listed = await acme.get("/v1/tool-executions")
        assert listed.json()["items"] == []
    record = await operator_api.ledger.get(theirs)
    assert record.status is Status.INDETERMINATE
    assert [e.kind for e in record.events] == ["reserved", "indeterminate"]


# -- reading -----------------------------------------------------------------------------------------


async def test_list_shows_unknown_calls_longest_waiting_first_with_filters_and_cursor(
    operator_api: OperatorApi,
) -> None:
    ledger = operator_api.ledger
    keys = [await unknown_call(ledger) for _ in range(5)]
    refund = await unknown_call(ledger, tool="issue_refund")
    await ledger.escalate(keys[0], owner="billing-oncall", actor="reconciler", reason="deadline")
    async with await operator_api.as_operator() as acme:
        page = await acme.get("/v1/tool-executions", params={"limit": 4})
        assert page.status_code == 200
        first = page.json()
        assert [i["key"] for i in first["items"]] == keys[:4]
        rest = await acme.get("/v1/tool-executions", params={"limit": 4, "cursor": first["next_cursor"]})
        assert [i["key"] for i in rest.json()["items"]] == [keys[4], refund]
        assert rest.json()["next_cursor"] is None

        by_tool = await acme.get("/v1/tool-executions", params={"tool": "issue_refund"})
        assert [i["key"] for i in by_tool.json()["items"]] == [refund]
        escalated = await acme.get("/v1/tool-executions", params={"escalated": "true"})
        assert [(i["key"], i["escalated_to"]) for i in escalated.json()["items"]] == [
            (keys[0], "billing-oncall")
        ]
        waiting = await acme.get("/v1/tool-executions", params={"status": "awaiting_approval"})
        assert waiting.json()["items"] == []

        forged = base64.urlsafe_b64encode(json.dumps(["2026-11-30T10:00:00+00:00", "run\u0000x:c"]).encode())
        for params in (
            {"status": "completed"},
            {"status": "bogus"},
            {"limit": 0},
            {"cursor": "%%%"},
            {"cursor": forged.decode()},
        ):
            bad = await acme.get("/v1/tool-executions", params=params)
            assert bad.status_code == 400, (params, bad.text)
            assert bad.headers["content-type"] == "application/problem+json"


async def test_show_returns_the_record_and_its_events_and_refuses_malformed_keys(
    operator_api: OperatorApi,
) -> None:
    key = await unknown_call(operator_api.ledger)
    async with await operator_api.as_operator() as acme:
        shown = (await acme.get(f"/v1/tool-executions/{key}")).json()
        assert (shown["key"], shown["status"], shown["tool"]) == (key, "indeterminate", "issue_credit")
        assert [e["kind"] for e in shown["events"]] == ["reserved", "indeterminate"]
        assert "tenant" not in shown
        for bad in ("no-colon-here", ":call", "run%20x:call", "a" * 600 + ":b"):
            response = await acme.get(f"/v1/tool-executions/{bad}")
            assert response.status_code == 400, (bad, response.text)


# -- resolve ----------------------------------------------------------------------------------------


async def test_resolve_settles_a_paused_run_with_the_operator_on_record(operator_api: OperatorApi) -> None:
    payload, account = order()
    DOWNSTREAM.modes[account] = "hang_after_apply"
    handle = await operator_api.runs.start("credit-pause", payload)
    key = f"{handle.id}:call_1_0"
    await wait_for_phase(handle, Phase.AWAITING_RECONCILIATION)

    async with await operator_api.as_operator(operator="alice") as alice:
        response = await alice.post(
            f"/v1/tool-executions/{key}/resolve",
            json={
                "status": "completed",
                "reason": "found in the billing console",
                "evidence": {"ticket": "OPS-12"},
                "result": {"credit_id": "cr_found"},
            },
        )
    assert response.status_code == 200, response.text
    assert response.json()["run_signalled"] is True
    assert response.json()["execution"]["settled_by"] == "operator:alice"

    result = await asyncio.wait_for(handle.result(), 20)
    assert "cr_found" in result.final
    record = await operator_api.ledger.get(key)
    assert (record.status, record.settled_by, record.evidence) == (
        Status.COMPLETED,
        "operator:alice",
        {"ticket": "OPS-12"},
    )
    settled = [e for e in record.events if e.kind == "settled"]
    assert [(e.actor, e.reason) for e in settled] == [("operator:alice", "found in the billing console")]
    assert DOWNSTREAM.received[key] == DOWNSTREAM.effects[key] == 1


async def test_two_operators_racing_to_resolve_one_wins_and_the_other_is_told_who(
    operator_api: OperatorApi,
) -> None:
    async with (
        await operator_api.as_operator(operator="alice") as alice,
        await operator_api.as_operator(operator="bob") as bob,
    ):
        for _ in range(25):
            key = await unknown_call(operator_api.ledger)
            answers = await asyncio.gather(
                alice.post(
                    f"/v1/tool-executions/{key}/resolve", json={"status": "completed", "reason": "seen"}
                ),
                bob.post(
                    f"/v1/tool-executions/{key}/resolve", json={"status": "failed", "reason": "not seen"}
                ),
            )
            codes = sorted(a.status_code for a in answers)
            assert codes == [200, 409], [a.text for a in answers]
            winner = next(a for a in answers if a.status_code == 200).json()["execution"]["settled_by"]
            loser = next(a for a in answers if a.status_code == 409).json()
            assert loser["type"] == "urn:onceflow:problem:conflict"
            assert loser["decided_by"] == winner and loser["decided_at"]
            assert winner in loser["detail"]
            record = await operator_api.ledger.get(key)
            assert [e.actor for e in record.events if e.kind == "settled"] == [winner]


async def test_resolve_after_the_run_ended_is_recorded_and_fine(operator_api: OperatorApi) -> None:
    # No run waits on this call: signalling it fails, which is fine.
    key = await unknown_call(operator_api.ledger)
    async with await operator_api.as_operator() as acme:
        response = await acme.post(
            f"/v1/tool-executions/{key}/resolve", json={"status": "failed", "reason": "nothing in billing"}
        )
    assert response.status_code == 200
    assert response.json()["run_signalled"] is False
    assert (await operator_api.ledger.get(key)).status is Status.FAILED


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        ({"status": "completed"}, "application/json", 400),  # no reason
        ({"status": "completed", "reason": "   "}, "application/json", 400),
        ({"status": "completed", "reason": "x" * 2001}, "application/json", 400),
        ({"status": "compensated", "reason": "why not"}, "application/json", 400),
        ({"status": "failed", "reason": "ok", "actor": "someone-else"}, "application/json", 400),
        ({"status": "failed", "reason": "ok", "tenant": "globex"}, "application/json", 400),
        ({"status": "failed", "reason": "ok"}, "text/plain", 415),
        ({"status": "failed", "reason": "ok", "evidence": {"blob": "x" * 70_000}}, "application/json", 413),
        ("not json at all", "application/json", 400),
        ([1, 2, 3], "application/json", 400),
    ],
)
async def test_bad_resolve_requests_get_a_clear_4xx_and_change_nothing(
    operator_api: OperatorApi, body: Any, content_type: str, status: int
) -> None:
    key = await unknown_call(operator_api.ledger)
    before = await operator_api.ledger.get(key)
    raw = body if isinstance(body, str) else json.dumps(body)
    async with await operator_api.as_operator() as acme:
        response = await acme.post(
            f"/v1/tool-executions/{key}/resolve", content=raw, headers={"Content-Type": content_type}
        )
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"].startswith("urn:onceflow:problem:") and problem["detail"]
    assert await operator_api.ledger.get(key) == before


# -- escalation ---------------------------------------------------------------------------------------


async def test_at_the_reconcile_deadline_the_call_is_escalated_and_stays_unknown(
    operator_api: OperatorApi,
) -> None:
    payload, account = order()
    DOWNSTREAM.modes[account] = "hang_after_apply"
    handle = await operator_api.runs.start("credit-escalating", payload)
    key = f"{handle.id}:call_1_0"

    async def escalated() -> bool:
        record = await operator_api.ledger.find(key)
        return record is not None and record.escalated_to is not None

    for _ in range(200):
        if await escalated():
            break
        await asyncio.sleep(0.1)
    record = await operator_api.ledger.get(key)
    assert (record.status, record.escalated_to) == (Status.INDETERMINATE, "billing-oncall")
    assert [e.detail for e in record.events if e.kind == "escalated"] == [{"owner": "billing-oncall"}]

    async def run_attribute() -> Any:
        described = await handle.describe()
        return described.typed_search_attributes

    for _ in range(100):
        attributes = await run_attribute()
        if any(p.key.name == "OnceflowEscalatedTo" for p in attributes):
            break
        await asyncio.sleep(0.1)
    assert {p.key.name: p.value for p in attributes}["OnceflowEscalatedTo"] == "billing-oncall"
    async with await operator_api.as_operator() as acme:
        listed = await acme.get("/v1/tool-executions", params={"escalated": "true"})
        assert [i["key"] for i in listed.json()["items"]] == [key]
    await handle.terminate("test over")


async def test_timeouts_are_measured_against_a_real_clock(operator_api: OperatorApi) -> None:
    # Guard for the lease arithmetic the list relies on: a started call with a live owner is hidden.
    call = CallIdentity(tenant="acme", run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call_1_0")
    await operator_api.ledger.reserve(
        call,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments=ARGUMENTS,
        owner="w",
        lease=timedelta(minutes=1),
    )
    async with await operator_api.as_operator() as acme:
        assert (await acme.get("/v1/tool-executions")).json()["items"] == []
        busy = await acme.post(
            f"/v1/tool-executions/{call.key}/resolve", json={"status": "failed", "reason": "x"}
        )
        assert busy.status_code == 409 and busy.json()["current_status"] == "started"
