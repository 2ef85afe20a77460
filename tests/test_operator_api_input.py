"""Hostile input to the operator API: whatever the body or the query, a 4xx problem and nothing stored.

Found by a review with 168 hostile requests: NaN, Infinity or 1e999 in a resolve's `result` or
`evidence` passed validation, PostgreSQL refused it, and the API answered 500 and dropped the
connection; unknown query parameters were ignored with a 200.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.support.operator_api import OperatorApi
from tests.test_operator_api_fuzz import seed, snapshot

UNREADABLE = "urn:onceflow:problem:unreadable-body"


def _problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = response.json()
    return body


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/resolve", '{"status": "completed", "reason": "ok", "result": NaN}'),
        ("/resolve", '{"status": "completed", "reason": "ok", "result": {"total": Infinity}}'),
        ("/resolve", '{"status": "completed", "reason": "ok", "result": [-Infinity]}'),
        ("/resolve", '{"status": "completed", "reason": "ok", "result": 1e999}'),
        ("/resolve", '{"status": "completed", "reason": "ok", "evidence": {"paid": NaN}}'),
        ("/resolve", '{"status": "failed", "reason": "ok", "evidence": {"n": -1e999}}'),
        ("/acknowledge-conflict", '{"reason": "ok", "evidence": {"n": NaN}}'),
        ("/deny", '{"reason": "no", "x": Infinity}'),
    ],
)
async def test_non_finite_numbers_in_a_body_are_a_400_problem_and_nothing_is_stored(
    operator_api: OperatorApi, path: str, raw: str
) -> None:
    ledger = operator_api.ledger
    keys = await seed(ledger, "acme")
    before = await snapshot(ledger)
    async with await operator_api.as_operator() as acme:
        response = await acme.post(
            f"/v1/tool-executions/{keys[0]}{path}", content=raw, headers={"content-type": "application/json"}
        )
    problem = _problem(response, 400)
    assert problem["type"] == UNREADABLE
    assert "not a JSON number" in str(problem["detail"]) or "infinity" in str(problem["detail"])
    assert await snapshot(ledger) == before


def _streamed(chunks: list[bytes]) -> AsyncIterator[bytes]:
    async def stream() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return stream()


@pytest.mark.parametrize(
    ("case", "status"),
    [
        ("truncated", 400),
        ("too_deep", 400),
        ("not_utf8", 400),
        ("streamed_too_long", 413),
        ("declared_too_long", 413),
    ],
)
async def test_a_body_that_cannot_be_read_gets_one_problem_type_however_it_is_broken(
    operator_api: OperatorApi, case: str, status: int
) -> None:
    ledger = operator_api.ledger
    keys = await seed(ledger, "acme")
    before = await snapshot(ledger)
    target = f"/v1/tool-executions/{keys[0]}/resolve"
    json_header = {"content-type": "application/json"}
    async with await operator_api.as_operator() as acme:
        if case == "truncated":
            response = await acme.post(target, content=b'{"status": "failed", "reas', headers=json_header)
        elif case == "too_deep":
            deep = b'{"status": "completed", "reason": "ok", "result": ' + b"[" * 5000 + b"]" * 5000 + b"}"
            response = await acme.post(target, content=deep, headers=json_header)
        elif case == "not_utf8":
            raw = b'{"status": "failed", "reason": "\xff\xfe caf\xe9"}'
            response = await acme.post(target, content=raw, headers=json_header)
        elif case == "streamed_too_long":
            # No Content-Length: chunked, so only reading it finds that it is too long.
            chunks = [b'{"status": "failed", "reason": "'] + [b"x" * 8192] * 10 + [b'"}']
            response = await acme.post(target, content=_streamed(chunks), headers=json_header)
        else:
            response = await acme.post(target, content=b"{" + b" " * 70_000 + b"}", headers=json_header)
    problem = _problem(response, status)
    assert problem["type"] == UNREADABLE, problem
    assert await snapshot(ledger) == before


@pytest.mark.parametrize(
    "query",
    ["?stauts=held", "?tenant=other", "?status=held&tenant=other", "?limit=5&Status=held"],
)
async def test_unknown_query_parameters_are_refused_not_ignored(
    operator_api: OperatorApi, query: str
) -> None:
    await seed(operator_api.ledger, "acme")
    async with await operator_api.as_operator() as acme:
        listed = await acme.get("/v1/tool-executions" + query)
        keyed = await acme.get("/v1/tool-executions/run-x:call_1" + query)
    for response in (listed, keyed):
        problem = _problem(response, 400)
        assert problem["type"] == "urn:onceflow:problem:invalid-request"
        assert "unknown query parameter" in str(problem["detail"])


async def test_known_query_parameters_and_finite_bodies_still_work(operator_api: OperatorApi) -> None:
    ledger = operator_api.ledger
    keys = await seed(ledger, "acme")
    async with await operator_api.as_operator() as acme:
        listed = await acme.get("/v1/tool-executions?status=indeterminate&limit=5")
        resolved = await acme.post(
            f"/v1/tool-executions/{keys[0]}/resolve",
            json={"status": "completed", "reason": "checked", "result": {"amount": 1.5, "big": 10**30}},
        )
    assert listed.status_code == 200, listed.text
    assert keys[0] in [item["key"] for item in listed.json()["items"]]
    assert resolved.status_code == 200, resolved.text
    record = await ledger.get(keys[0], with_events=False)
    assert record.result == {"amount": 1.5, "big": 10**30}


async def test_an_identical_repeat_of_a_decision_gets_200_and_no_new_event_a_different_one_409(
    operator_api: OperatorApi,
) -> None:
    """What README promises beside "a late one gets 409": a retry of a lost answer is answered again."""
    ledger = operator_api.ledger
    keys = await seed(ledger, "acme")
    body = {"status": "completed", "reason": "seen in billing", "result": {"credit_id": "cr_9"}}
    async with await operator_api.as_operator() as acme:
        first = await acme.post(f"/v1/tool-executions/{keys[0]}/resolve", json=body)
        events = len((await ledger.get(keys[0])).events)
        again = await acme.post(f"/v1/tool-executions/{keys[0]}/resolve", json=body)
        other = await acme.post(
            f"/v1/tool-executions/{keys[0]}/resolve", json={**body, "status": "failed", "evidence": {"x": 1}}
        )
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert len((await ledger.get(keys[0])).events) == events
    assert again.json()["execution"]["status"] == "completed"
    assert (first.json()["repeated"], again.json()["repeated"]) == (False, True)
    assert _problem(other, 409)["type"] == "urn:onceflow:problem:conflict"
