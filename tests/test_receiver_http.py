"""The receiver kit over real HTTP (uvicorn on loopback) and a real PostgreSQL: the rules of
draft-ietf-httpapi-idempotency-key-header-07 in both forms, the reconcile protocol, scopes, races.

The service under test is tests/support/receiver_app.py, in a database of its own (no ledger). Each
test judges from what the service itself recorded (its rows per key, `GET /effects/{key}`) and
what it answered, never from the kit's table alone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import pytest

from onceflow.examples.billing.serving import BackgroundServer
from onceflow.local.postgres import create_database, drop_database
from onceflow.receiver import key_header_value
from tests.support.receiver_app import create_app

TENANT_A = {"Authorization": "Bearer acme-token"}
TENANT_B = {"Authorization": "Bearer globex-token"}


@pytest.fixture(scope="module")
async def service_database(postgres_dsn: str) -> AsyncIterator[str]:
    """An empty database of the service's own: the kit migrates its tables into it."""
    name = f"receiver_{uuid.uuid4().hex[:12]}"
    yield await create_database(postgres_dsn, name)
    await drop_database(postgres_dsn, name)


@pytest.fixture(scope="module")
def server(service_database: str) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(service_database), shutdown_grace=1.0) as running:
        yield running


@pytest.fixture
async def http(server: BackgroundServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10, headers=TENANT_A) as client:
        yield client


def new_key() -> str:
    return f"run-{uuid.uuid4().hex}:call_1_0"


def keyed(key: str, **headers: str) -> dict[str, str]:
    return {"Idempotency-Key": key_header_value(key), **headers}


async def effects(http: httpx.AsyncClient, key: str, headers: dict[str, str] | None = None) -> dict[str, int]:
    response = await http.get(f"/effects/{key}", headers=headers)
    response.raise_for_status()
    found: dict[str, int] = response.json()
    return found


async def lookup(http: httpx.AsyncClient, key: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await http.get(f"/idempotency-keys/{key}", headers=headers)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def fence(http: httpx.AsyncClient, key: str) -> dict[str, Any]:
    response = await http.post(f"/idempotency-keys/{key}/fence")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def assert_problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = response.json()
    assert problem["type"].endswith(slug), problem
    assert problem["status"] == status and problem["title"] and problem["detail"]
    return problem


# -- the draft's rules, transactional form ---------------------------------------------------------


async def test_a_keyed_route_without_a_key_is_refused_with_400_and_applies_nothing(
    http: httpx.AsyncClient,
) -> None:
    before = (await http.get("/effects/")).json()
    response = await http.post("/transfers", json={"account": "a1", "cents": 100})
    assert_problem(response, 400, "missing-key")
    assert (await http.get("/effects/")).json() == before


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('""', "empty"),
        ("unquoted-key", "double quotes"),
        ('"' + "k" * 256 + '"', "at most 255"),
        ('"tab\tinside"', "printable ASCII"),
        ('"bad\\escape"', "backslash"),
        ('"key";param=1', "parameters"),
        ('"key" trailing', "nothing may follow"),
        ('"no closing quote', "closing double quote"),
    ],
)
async def test_a_bad_key_is_refused_with_400_and_stores_nothing(
    http: httpx.AsyncClient, raw: str, why: str
) -> None:
    response = await http.post(
        "/transfers", json={"account": "a1", "cents": 100}, headers={"Idempotency-Key": raw}
    )
    problem = assert_problem(response, 400, "bad-key")
    assert why in problem["detail"]
    inner = raw.strip('"').split('"')[0]
    if inner and len(inner) <= 255 and inner.isprintable():
        assert (await lookup(http, inner))["state"] == "absent"
        assert (await effects(http, inner))["transfers"] == 0


async def test_two_header_lines_are_one_bad_key(http: httpx.AsyncClient) -> None:
    key = new_key()
    headers = [("Idempotency-Key", key_header_value(key)), ("Idempotency-Key", key_header_value(key))]
    response = await http.post("/transfers", json={"account": "a1", "cents": 100}, headers=headers)
    assert_problem(response, 400, "bad-key")
    assert (await lookup(http, key))["state"] == "absent"
    assert (await effects(http, key))["transfers"] == 0


async def test_after_completion_the_stored_answer_is_replayed_and_applied_once(
    http: httpx.AsyncClient,
) -> None:
    key = new_key()
    first = await http.post("/transfers", json={"account": "a1", "cents": 250}, headers=keyed(key))
    assert first.status_code == 201, first.text
    assert "Idempotent-Replayed" not in first.headers
    expires = parsedate_to_datetime(first.headers["Idempotency-Key-Expires"])
    assert timedelta(hours=23) < expires - datetime.now(UTC) <= timedelta(hours=24, minutes=1)

    # The same request, its JSON written another way: the same fingerprint.
    again = await http.post(
        "/transfers",
        content=b'{ "cents": 250,\n  "account": "a1" }',
        headers=keyed(key, **{"Content-Type": "application/json"}),
    )
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert again.headers["Idempotency-Key-Expires"] == first.headers["Idempotency-Key-Expires"]
    assert (await effects(http, key))["transfers"] == 1


async def test_a_key_reused_for_another_request_is_refused_with_422(http: httpx.AsyncClient) -> None:
    key = new_key()
    assert (await http.post("/transfers", json={"account": "a1", "cents": 1}, headers=keyed(key))).is_success
    other_body = await http.post("/transfers", json={"account": "a1", "cents": 2}, headers=keyed(key))
    assert_problem(other_body, 422, "key-reused")
    other_route = await http.post("/notes", json={"text": "hello"}, headers=keyed(key))
    assert_problem(other_route, 422, "key-reused")
    assert await effects(http, key) == {"transfers": 1, "notes": 0}


async def test_a_repeat_while_the_first_is_in_progress_gets_409_with_retry_after(
    http: httpx.AsyncClient,
) -> None:
    key = new_key()
    body = {"account": "a1", "cents": 300}
    first = asyncio.create_task(
        http.post("/transfers", json=body, headers=keyed(key, **{"X-Hold-Seconds": "1"}))
    )
    await asyncio.sleep(0.3)
    second = await http.post("/transfers", json=body, headers=keyed(key))
    assert_problem(second, 409, "key-in-progress")
    assert int(second.headers["Retry-After"]) >= 1
    # The first is in flight inside its transaction: a lookup says so, and never "absent".
    assert (await lookup(http, key))["state"] == "in_progress"
    assert (await first).status_code == 201
    replay = await http.post("/transfers", json=body, headers=keyed(key))
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert (await effects(http, key))["transfers"] == 1


async def test_identical_requests_at_once_take_effect_once(http: httpx.AsyncClient) -> None:
    key = new_key()
    body = {"account": "a2", "cents": 700}
    answers = await asyncio.gather(
        *(http.post("/transfers", json=body, headers=keyed(key)) for _ in range(12))
    )
    statuses = sorted(a.status_code for a in answers)
    assert set(statuses) <= {201, 409}, statuses
    applied = [a for a in answers if a.status_code == 201 and "Idempotent-Replayed" not in a.headers]
    assert len(applied) == 1
    assert all(a.json() == applied[0].json() for a in answers if a.status_code == 201)
    assert (await effects(http, key))["transfers"] == 1


async def test_repeats_of_a_completed_key_at_once_are_all_replayed(http: httpx.AsyncClient) -> None:
    key = new_key()
    body = {"account": "a2", "cents": 701}
    first = await http.post("/transfers", json=body, headers=keyed(key))
    answers = await asyncio.gather(
        *(http.post("/transfers", json=body, headers=keyed(key)) for _ in range(12))
    )
    # A completed answer needs no lock to be given again: no repeat is told "in progress".
    assert [a.status_code for a in answers] == [201] * 12
    assert all(a.headers["Idempotent-Replayed"] == "true" and a.json() == first.json() for a in answers)
    assert (await effects(http, key))["transfers"] == 1


async def test_a_refusal_the_handler_raises_records_nothing(http: httpx.AsyncClient) -> None:
    key = new_key()
    refused = await http.post("/transfers", json={"account": "closed", "cents": 5}, headers=keyed(key))
    assert refused.status_code == 422
    assert (await lookup(http, key))["state"] == "absent"
    # Nothing is bound to the key: a corrected request with it applies.
    applied = await http.post("/transfers", json={"account": "open", "cents": 5}, headers=keyed(key))
    assert applied.status_code == 201 and "Idempotent-Replayed" not in applied.headers
    assert (await effects(http, key))["transfers"] == 1


# -- scope: the service's own authentication --------------------------------------------------------


async def test_keys_live_in_the_callers_scope(http: httpx.AsyncClient) -> None:
    key = new_key()
    assert (await http.post("/transfers", json={"account": "a", "cents": 1}, headers=keyed(key))).is_success
    assert (await lookup(http, key, TENANT_B))["state"] == "absent"
    other = await http.post(
        "/transfers", json={"account": "a", "cents": 1}, headers={**keyed(key), **TENANT_B}
    )
    assert other.status_code == 201 and "Idempotent-Replayed" not in other.headers
    assert (await effects(http, key))["transfers"] == 1
    assert (await effects(http, key, TENANT_B))["transfers"] == 1


async def test_without_credentials_the_routes_and_the_protocol_answer_401(server: BackgroundServer) -> None:
    key = new_key()
    async with httpx.AsyncClient(base_url=server.base_url) as anonymous:
        assert (
            await anonymous.post("/transfers", json={"account": "a", "cents": 1}, headers=keyed(key))
        ).status_code == 401
        assert (await anonymous.get(f"/idempotency-keys/{key}")).status_code == 401
        assert (await anonymous.post(f"/idempotency-keys/{key}/fence")).status_code == 401
        assert (await anonymous.post("/notes", json={"text": "x"}, headers=keyed(key))).status_code == 401


# -- the reconcile protocol ------------------------------------------------------------------------


async def test_lookup_answers_the_stored_outcome_or_no_record(http: httpx.AsyncClient) -> None:
    key = new_key()
    assert await lookup(http, key) == {"key": key, "state": "absent"}
    created = await http.post("/transfers", json={"account": "a3", "cents": 42}, headers=keyed(key))
    found = await lookup(http, key)
    assert found["state"] == "completed"
    assert found["response"]["status"] == 201
    assert found["response"]["body"] == created.json()
    assert ["content-type", "application/json"] in found["response"]["headers"]
    assert found["expires_at"] and found["created_at"]
    # Looking twice changes nothing: the key is still usable as it was.
    assert await lookup(http, key) == found


async def test_fence_returns_a_completed_key_and_makes_an_absent_one_never(http: httpx.AsyncClient) -> None:
    done, missing = new_key(), new_key()
    created = await http.post("/transfers", json={"account": "a4", "cents": 9}, headers=keyed(done))
    kept = await fence(http, done)
    assert kept["state"] == "completed" and kept["fenced_now"] is False
    assert kept["response"]["body"] == created.json()

    fenced = await fence(http, missing)
    assert fenced["state"] == "fenced" and fenced["fenced_now"] is True
    assert (await fence(http, missing))["fenced_now"] is False
    late = await http.post("/transfers", json={"account": "a4", "cents": 9}, headers=keyed(missing))
    assert_problem(late, 409, "key-fenced")
    late_note = await http.post("/notes", json={"text": "late"}, headers=keyed(missing))
    assert_problem(late_note, 409, "key-fenced")
    assert await effects(http, missing) == {"transfers": 0, "notes": 0}
    assert (await lookup(http, missing))["state"] == "fenced"


async def test_a_fence_while_the_request_is_in_flight_says_so_and_writes_nothing(
    http: httpx.AsyncClient,
) -> None:
    key = new_key()
    body = {"account": "a5", "cents": 77}
    flying = asyncio.create_task(
        http.post("/transfers", json=body, headers=keyed(key, **{"X-Hold-Seconds": "1"}))
    )
    await asyncio.sleep(0.3)
    assert (await fence(http, key))["state"] == "in_progress"
    assert (await flying).status_code == 201
    assert (await fence(http, key))["state"] == "completed"
    assert (await effects(http, key))["transfers"] == 1


async def test_a_fence_racing_the_late_original_exactly_one_wins(http: httpx.AsyncClient) -> None:
    """Many keys, each sent and fenced at the same moment: a key either took effect once and the
    fence returned it, or was fenced and never applied; never both, never neither."""

    async def race(index: int) -> tuple[str, httpx.Response, dict[str, Any]]:
        key = new_key()
        body = {"account": f"race{index}", "cents": 10 + index}
        if index % 2:
            sent, fenced = await asyncio.gather(
                http.post("/transfers", json=body, headers=keyed(key)), fence(http, key)
            )
        else:
            fenced, sent = await asyncio.gather(
                fence(http, key), http.post("/transfers", json=body, headers=keyed(key))
            )
        return key, sent, fenced

    outcomes = await asyncio.gather(*(race(i) for i in range(24)))
    winners = {"request": 0, "fence": 0}
    for key, sent, fenced in outcomes:
        if fenced["state"] == "in_progress":
            fenced = await fence(http, key)  # the request held the key: ask again once it is done
        applied = (await effects(http, key))["transfers"]
        if fenced["state"] == "fenced":
            assert fenced["fenced_now"] is True
            assert sent.status_code == 409 and applied == 0, (sent.status_code, sent.text)
            winners["fence"] += 1
        else:
            assert fenced["state"] == "completed", fenced
            assert sent.status_code == 201 and applied == 1
            winners["request"] += 1
    assert sum(winners.values()) == 24


# -- the published policy ----------------------------------------------------------------------------


async def test_the_expiry_policy_is_published_in_openapi(http: httpx.AsyncClient) -> None:
    schema = (await http.get("/openapi.json")).json()
    operation = schema["paths"]["/transfers"]["post"]
    assert operation["x-idempotency-key"]["expires_after_seconds"] == 86400
    assert operation["x-idempotency-key"]["required"] is True
    header = next(p for p in operation["parameters"] if p["name"] == "Idempotency-Key")
    assert "expire 24 hours after their first use" in header["description"]
    assert "x-idempotency-key" not in schema["paths"]["/idempotency-keys/{key}"]["get"]


# -- the middleware form -----------------------------------------------------------------------------


async def test_the_middleware_form_follows_the_same_rules(http: httpx.AsyncClient) -> None:
    assert_problem(await http.post("/notes", json={"text": "x"}), 400, "missing-key")
    assert_problem(
        await http.post("/notes", json={"text": "x"}, headers={"Idempotency-Key": "bare"}), 400, "bad-key"
    )
    key = new_key()
    first = await http.post("/notes", json={"text": "hi"}, headers=keyed(key))
    assert first.status_code == 201 and "Idempotency-Key-Expires" in first.headers
    replay = await http.post("/notes", json={"text": "hi"}, headers=keyed(key))
    assert replay.headers["Idempotent-Replayed"] == "true" and replay.json() == first.json()
    assert_problem(await http.post("/notes", json={"text": "other"}, headers=keyed(key)), 422, "key-reused")
    assert (await effects(http, key))["notes"] == 1
    found = await lookup(http, key)
    assert found["state"] == "completed" and found["response"]["body"] == first.json()


async def test_the_middleware_refuses_a_repeat_while_its_handler_runs(http: httpx.AsyncClient) -> None:
    key = new_key()
    flying = asyncio.create_task(
        http.post("/notes", json={"text": "slow"}, headers=keyed(key, **{"X-Hold-Seconds": "1"}))
    )
    await asyncio.sleep(0.3)
    assert_problem(
        await http.post("/notes", json={"text": "slow"}, headers=keyed(key)), 409, "key-in-progress"
    )
    # The note is already written and the answer not yet recorded: unknown, never absent.
    assert (await lookup(http, key))["state"] == "in_progress"
    assert (await fence(http, key))["state"] == "in_progress"
    assert (await flying).status_code == 201
    assert (await lookup(http, key))["state"] == "completed"
    assert (await effects(http, key))["notes"] == 1


async def test_a_release_status_frees_the_key(http: httpx.AsyncClient) -> None:
    key = new_key()
    unavailable = await http.post("/notes", json={"text": "unavailable"}, headers=keyed(key))
    assert unavailable.status_code == 503
    assert (await lookup(http, key))["state"] == "absent"
    later = await http.post("/notes", json={"text": "now"}, headers=keyed(key))
    assert later.status_code == 201 and "Idempotent-Replayed" not in later.headers


# -- expiry -------------------------------------------------------------------------------------------


async def test_an_expired_key_is_a_new_request_and_a_fence_never_expires(service_database: str) -> None:
    with BackgroundServer(create_app(service_database, short_lived=True), shutdown_grace=1.0) as short:
        async with httpx.AsyncClient(base_url=short.base_url, timeout=10, headers=TENANT_A) as http:
            key, fenced = new_key(), new_key()
            body = {"account": "exp", "cents": 3}
            first = await http.post("/transfers", json=body, headers=keyed(key))
            expires = parsedate_to_datetime(first.headers["Idempotency-Key-Expires"])
            assert expires - datetime.now(UTC) <= timedelta(seconds=2)
            assert (await http.post("/transfers", json=body, headers=keyed(key))).headers.get(
                "Idempotent-Replayed"
            )
            assert (await fence(http, fenced))["fenced_now"] is True
            await asyncio.sleep(1.5)

            expired = await lookup(http, key)
            assert expired["state"] == "completed" and expired["expired"] is True
            # Past its expiry the key is not honoured: the same request is new, another body no conflict.
            again = await http.post("/transfers", json={"account": "exp", "cents": 4}, headers=keyed(key))
            assert again.status_code == 201 and "Idempotent-Replayed" not in again.headers
            assert (await effects(http, key))["transfers"] == 2
            assert_problem(await http.post("/transfers", json=body, headers=keyed(fenced)), 409, "key-fenced")
