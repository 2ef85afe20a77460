"""The example billing service, served for real by uvicorn on loopback and driven through its client.

Its credits and the receiver kit's keys live in a real PostgreSQL database of its own (a fresh one
per module, or per test where the test restarts the service or runs it in another mode)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from onceflow.examples.billing.client import (
    BillingBadRequest,
    BillingClient,
    BillingConflict,
    BillingError,
    BillingLocked,
    BillingNotFound,
    BillingPolicyRefused,
    BillingRejected,
    BillingUnavailable,
)
from onceflow.examples.billing.models import FaultMode
from onceflow.examples.billing.policy import DEFAULT_CREDIT_LIMIT_CENTS, POLICY_PROBLEM_PREFIX
from onceflow.examples.billing.service import create_app
from onceflow.examples.billing.serving import BackgroundServer
from onceflow.receiver import key_header_value
from tests.support.processes import billing_database


@pytest.fixture(scope="module")
async def module_database(postgres_dsn: str) -> AsyncIterator[str]:
    async with billing_database(postgres_dsn) as database_url:
        yield database_url


@pytest.fixture
async def own_database(postgres_dsn: str) -> AsyncIterator[str]:
    async with billing_database(postgres_dsn) as database_url:
        yield database_url


@pytest.fixture(scope="module")
def server(module_database: str) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(module_database), shutdown_grace=1.0) as running:
        yield running


@pytest.fixture
async def billing(server: BackgroundServer) -> AsyncIterator[BillingClient]:
    async with BillingClient(server.base_url, timeout=5.0) as client:
        await client.clear_faults()
        yield client


def new_key() -> str:
    # Shaped like onceflow's keys (<run_id>:<tool_call_id>), with a slash to exercise URL quoting.
    return f"run-{uuid.uuid4().hex[:8]}:call/{uuid.uuid4().hex[:8]}"


def new_account() -> str:
    return f"acct_{uuid.uuid4().hex[:10]}"


async def test_health_and_seeded_orders(billing: BillingClient) -> None:
    assert await billing.health()
    order = await billing.get_order("ord_42")
    assert order == await billing.get_order("ord_42")
    assert order.account_id == "acct_42"
    assert 1000 <= order.amount_cents < 10000
    assert order.currency == "USD"
    with pytest.raises(BillingNotFound):
        await billing.get_order("order-42")


async def test_same_key_replays_the_first_answer(billing: BillingClient, server: BackgroundServer) -> None:
    key, account = new_key(), new_account()
    first = await billing.credit(account, 1500, idempotency_key=key, memo="refund")
    again = await billing.credit(account, 1500, idempotency_key=key, memo="refund")
    assert again == first
    assert first.status == "applied" and first.idempotency_key == key

    async with httpx.AsyncClient(base_url=server.base_url) as http:
        body = {"account_id": account, "amount_cents": 1500, "currency": "USD", "memo": "refund"}
        response = await http.post("/credits", json=body, headers={"Idempotency-Key": key_header_value(key)})
    assert response.status_code == 201
    assert response.headers["Idempotent-Replayed"] == "true"
    assert response.json()["credit_id"] == first.credit_id

    effects = await billing.effects()
    assert effects.count(key) == 1
    assert effects.total == sum(effects.effects.values())


async def test_same_key_with_another_body_is_refused_with_422(billing: BillingClient) -> None:
    key, account = new_key(), new_account()
    await billing.credit(account, 1500, idempotency_key=key)
    with pytest.raises(BillingRejected) as caught:
        await billing.credit(account, 9999, idempotency_key=key)
    assert caught.value.status_code == 422
    assert caught.value.problem["type"] == "https://billing.example/problems/key-reused"
    assert {"type", "title", "detail"} <= caught.value.problem.keys()
    assert (await billing.effects()).count(key) == 1


async def test_find_credit_by_key(billing: BillingClient) -> None:
    key = new_key()
    assert await billing.find_credit(key) is None
    credit = await billing.credit(new_account(), 700, idempotency_key=key)
    found = await billing.find_credit(key)
    assert found is not None
    assert found["credit_id"] == credit.credit_id and found["status"] == "applied"


async def test_void_is_idempotent(billing: BillingClient) -> None:
    key = new_key()
    credit = await billing.credit(new_account(), 700, idempotency_key=key)
    voided = await billing.void_credit(credit.credit_id, idempotency_key=f"void:{key}")
    assert voided.status == "voided" and voided.voided_at is not None
    assert await billing.void_credit(credit.credit_id, idempotency_key=f"void:{key}") == voided
    found = await billing.find_credit(key)
    assert found is not None and found["status"] == "voided"
    effect = await billing.effect(key)
    assert (effect.applied, effect.voided) == (1, True)
    with pytest.raises(BillingNotFound):
        await billing.void_credit("cr_missing", idempotency_key="void:missing")


async def test_bad_requests_are_400_and_apply_nothing(
    server: BackgroundServer, billing: BillingClient
) -> None:
    account = new_account()
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        response = await http.post("/credits", json={"account_id": account, "amount_cents": 100})
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/problem+json"
    key = new_key()
    with pytest.raises(BillingBadRequest):
        await billing.credit(account, 0, idempotency_key=key)
    with pytest.raises(BillingBadRequest):
        await billing.credit(account, 100, idempotency_key=key, fault="no_such_mode")
    assert (await billing.effect(key)).applied == 0


async def test_apply_then_hang_times_out_after_the_effect(
    server: BackgroundServer, billing: BillingClient
) -> None:
    key, account = new_key(), new_account()
    async with BillingClient(server.base_url, timeout=0.2) as impatient:
        with pytest.raises(httpx.TimeoutException):
            await impatient.credit(
                account, 1200, idempotency_key=key, fault=FaultMode.APPLY_THEN_HANG, fault_delay=0.5
            )
    # The caller saw nothing, yet the money moved: exactly what a reconcile hook must find.
    assert (await billing.effects()).count(key) == 1
    found = await billing.find_credit(key)
    assert found is not None
    # A replay is answered from the record at once (no fault, no second effect).
    assert (await billing.credit(account, 1200, idempotency_key=key)).credit_id == found["credit_id"]
    assert (await billing.effects()).count(key) == 1


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        (FaultMode.REJECT, BillingRejected),
        (FaultMode.LOCKED, BillingLocked),
        (FaultMode.FAIL_BEFORE_APPLY, BillingUnavailable),
    ],
)
async def test_definite_failures_apply_nothing(
    billing: BillingClient, mode: FaultMode, error: type[BillingError]
) -> None:
    key, account = new_key(), new_account()
    with pytest.raises(error) as caught:
        await billing.credit(account, 300, idempotency_key=key, fault=mode)
    assert caught.value.status_code == {"reject": 422, "locked": 423, "fail_before_apply": 503}[mode]
    assert (await billing.effects()).count(key) == 0
    assert await billing.find_credit(key) is None
    # A refused key is not burnt: once healthy, the same key applies (once).
    await billing.credit(account, 300, idempotency_key=key)
    assert (await billing.effects()).count(key) == 1


async def test_reject_carries_its_detail(billing: BillingClient) -> None:
    account = new_account()
    await billing.set_account_fault(account, FaultMode.REJECT, detail="insufficient funds")
    with pytest.raises(BillingRejected) as caught:
        await billing.credit(account, 300, idempotency_key=new_key())
    assert caught.value.detail == "insufficient funds"
    assert caught.value.problem["type"].endswith("/rejected")


async def test_slow_answers_late_but_normally(billing: BillingClient) -> None:
    key = new_key()
    started = time.monotonic()
    credit = await billing.credit(new_account(), 400, idempotency_key=key, fault="slow", fault_delay=0.3)
    assert time.monotonic() - started >= 0.3
    assert credit.status == "applied"
    assert (await billing.effects()).count(key) == 1


async def test_drop_closes_the_connection_after_the_effect(billing: BillingClient) -> None:
    key = new_key()
    with pytest.raises(httpx.RemoteProtocolError):
        await billing.credit(new_account(), 400, idempotency_key=key, fault=FaultMode.DROP)
    assert (await billing.effects()).count(key) == 1
    assert await billing.find_credit(key) is not None


async def test_replay_ignores_faults(billing: BillingClient) -> None:
    key, account = new_key(), new_account()
    first = await billing.credit(account, 400, idempotency_key=key)
    await billing.set_account_fault(account, FaultMode.LOCKED)
    assert await billing.credit(account, 400, idempotency_key=key, fault="reject") == first
    assert await billing.credit(account, 400, idempotency_key=key) == first
    assert (await billing.effects()).count(key) == 1


async def test_account_fault_with_times_affects_only_the_first_request(billing: BillingClient) -> None:
    account, other = new_account(), new_account()
    await billing.set_account_fault(account, FaultMode.LOCKED, times=1)
    await billing.credit(other, 100, idempotency_key=new_key())  # other accounts are untouched
    with pytest.raises(BillingLocked):
        await billing.credit(account, 100, idempotency_key=new_key())
    key = new_key()
    await billing.credit(account, 100, idempotency_key=key)
    assert (await billing.effects()).count(key) == 1


async def test_clearing_account_faults(billing: BillingClient) -> None:
    account = new_account()
    await billing.set_account_fault(account, FaultMode.FAIL_BEFORE_APPLY)
    for _ in range(2):  # no `times`: it lasts until cleared
        with pytest.raises(BillingUnavailable):
            await billing.credit(account, 100, idempotency_key=new_key())
    await billing.clear_account_fault(account)
    await billing.credit(account, 100, idempotency_key=new_key())


async def test_credits_survive_a_restart(own_database: str) -> None:
    db = own_database
    key, account = new_key(), new_account()
    with BackgroundServer(create_app(db)) as first_run:
        async with BillingClient(first_run.base_url, timeout=5.0) as client:
            credit = await client.credit(account, 2500, idempotency_key=key)
    with BackgroundServer(create_app(db)) as second_run:
        async with BillingClient(second_run.base_url, timeout=5.0) as client:
            found = await client.find_credit(key)
            assert found is not None and found["credit_id"] == credit.credit_id
            assert await client.credit(account, 2500, idempotency_key=key) == credit
            assert (await client.effects()).count(key) == 1


async def test_fenced_key_can_never_apply_afterwards(billing: BillingClient) -> None:
    assert await billing.fence_key("run-f:call_1") is None
    with pytest.raises(BillingConflict):
        await billing.credit("acct_f", 100, idempotency_key="run-f:call_1")
    assert (await billing.effects()).count("run-f:call_1") == 0


async def test_fencing_a_key_that_applied_returns_the_credit(billing: BillingClient) -> None:
    credit = await billing.credit("acct_g", 100, idempotency_key="run-g:call_1")
    found = await billing.fence_key("run-g:call_1")
    assert found is not None and found["credit_id"] == credit.credit_id


# -- every request is recorded on arrival, before dedup, fencing or faults ------------------------------


async def test_a_replayed_key_is_received_twice_though_it_applied_once(billing: BillingClient) -> None:
    key, account = new_key(), new_account()
    await billing.credit(account, 300, idempotency_key=key)
    await billing.credit(account, 300, idempotency_key=key)
    received = await billing.received(key)
    assert received.received == 2
    assert [(r.method, r.path, r.outcome) for r in received.requests] == [
        ("POST", "/credits", "applied"),
        ("POST", "/credits", "answered"),
    ]
    assert [r.status_code for r in received.requests] == [201, 201]
    assert (await billing.effects()).count(key) == 1
    assert (await billing.received_counts()).count(key) == 2


async def test_refused_fenced_and_dropped_requests_are_received_too(billing: BillingClient) -> None:
    account = new_account()
    locked, fenced, dropped, conflicting = new_key(), new_key(), new_key(), new_key()
    await billing.set_account_fault(account, FaultMode.LOCKED, times=1)
    with pytest.raises(BillingLocked):
        await billing.credit(account, 100, idempotency_key=locked)
    await billing.fence_key(fenced)
    with pytest.raises(BillingConflict):
        await billing.credit(account, 100, idempotency_key=fenced)
    with pytest.raises(httpx.RemoteProtocolError):
        await billing.credit(account, 100, idempotency_key=dropped, fault=FaultMode.DROP)
    await billing.credit(account, 100, idempotency_key=conflicting)
    with pytest.raises(BillingRejected):
        await billing.credit(account, 200, idempotency_key=conflicting)

    outcomes = {
        key: [(r.outcome, r.status_code) for r in (await billing.received(key)).requests]
        for key in (locked, fenced, dropped, conflicting)
    }
    assert outcomes == {
        locked: [("refused", 423)],
        fenced: [("refused", 409)],
        dropped: [("applied", None)],
        conflicting: [("applied", 201), ("refused", 422)],
    }
    counts = await billing.received_counts()
    assert [counts.count(k) for k in (locked, fenced, dropped, conflicting)] == [1, 1, 1, 2]
    assert (await billing.received(new_key())).received == 0


async def test_keyless_and_malformed_requests_are_received_and_reads_are_counted(
    server: BackgroundServer, billing: BillingClient
) -> None:
    before = await billing.received_counts()
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        assert (
            await http.post("/credits", json={"account_id": "acct_x", "amount_cents": 1})
        ).status_code == 400
        response = await http.post(
            "/credits", content=b"{", headers={"Idempotency-Key": key_header_value("k-malformed")}
        )
        assert response.status_code == 400
    assert (await billing.received_counts()).keyless == before.keyless + 1
    assert [r.outcome for r in (await billing.received("k-malformed")).requests] == ["refused"]

    order = f"ord_{uuid.uuid4().hex[:8]}"
    await billing.get_order(order)
    reads = await billing.received_counts("GET", f"/orders/{order}")
    assert (reads.total, reads.keyless) == (1, 1)
    # The service's own introspection is not counted.
    await billing.effects()
    assert (await billing.received_counts(None, None, prefix="/effects")).total == 0


async def test_without_dedup_every_request_applies_a_new_credit(own_database: str) -> None:
    key, account = new_key(), new_account()
    with BackgroundServer(create_app(own_database, dedup=False)) as running:
        async with BillingClient(running.base_url, timeout=5.0) as client:
            assert not await client.dedups()
            first = await client.credit(account, 300, idempotency_key=key)
            second = await client.credit(account, 300, idempotency_key=key)
            other_body = await client.credit(account, 999, idempotency_key=key)
            assert len({first.credit_id, second.credit_id, other_body.credit_id}) == 3
            assert (await client.effects()).count(key) == 3
            received = await client.received(key)
            assert [r.outcome for r in received.requests] == ["applied"] * 3
            # The reconcile question still finds the (first) credit, and a fence still holds.
            found = await client.find_credit(key)
            assert found is not None and found["credit_id"] == first.credit_id
            fenced = new_key()
            assert await client.fence_key(fenced) is None
            with pytest.raises(BillingConflict):
                await client.credit(account, 100, idempotency_key=fenced)
            assert (await client.received_counts()).count(fenced) == 1


async def test_the_default_service_dedups(billing: BillingClient) -> None:
    assert await billing.dedups()


async def test_a_credit_above_the_authorization_limit_is_refused_on_policy_grounds(
    billing: BillingClient,
) -> None:
    key, account = new_key(), new_account()
    await billing.set_account_fault(account, FaultMode.LOCKED, times=1)
    # Policy comes before faults, and a repeat under the same key is refused the same way.
    for _ in range(2):
        with pytest.raises(BillingPolicyRefused) as refused:
            await billing.credit(account, DEFAULT_CREDIT_LIMIT_CENTS + 1, idempotency_key=key)
        assert refused.value.status_code == 403
        assert refused.value.problem["type"] == POLICY_PROBLEM_PREFIX + "credit-limit"
        assert refused.value.problem["limit_cents"] == DEFAULT_CREDIT_LIMIT_CENTS
        assert "authorization limit" in refused.value.detail
    assert (await billing.effect(key)).applied == 0
    assert [r.outcome for r in (await billing.received(key)).requests] == ["refused", "refused"]
    with pytest.raises(BillingLocked):  # the refusals did not spend the account's one fault
        await billing.credit(account, 100, idempotency_key=new_key())
    at_the_limit = await billing.credit(account, DEFAULT_CREDIT_LIMIT_CENTS, idempotency_key=new_key())
    assert at_the_limit.status == "applied"


async def test_the_limit_is_configurable_and_applies_without_dedup(own_database: str) -> None:
    app = create_app(own_database, dedup=False, credit_limit_cents=1000)
    with BackgroundServer(app) as running:
        async with BillingClient(running.base_url) as client:
            key = new_key()
            with pytest.raises(BillingPolicyRefused):
                await client.credit(new_account(), 1001, idempotency_key=key)
            assert (await client.effect(key)).applied == 0
            assert (await client.credit(new_account(), 1000, idempotency_key=new_key())).status == "applied"


async def test_credits_lists_what_was_paid_per_account_whatever_the_keys(billing: BillingClient) -> None:
    account, other = new_account(), new_account()
    first = await billing.credit(account, 300, idempotency_key=new_key())
    again = await billing.credit(account, 300, idempotency_key=new_key())  # same credit, new key
    with pytest.raises(BillingLocked):
        await billing.credit(other, 100, idempotency_key=new_key(), fault=FaultMode.LOCKED)
    await billing.void_credit(first.credit_id, idempotency_key=new_key())

    listed = await billing.credits(account)
    assert [(c.credit_id, c.amount_cents, c.status) for c in listed] == [
        (first.credit_id, 300, "voided"),
        (again.credit_id, 300, "applied"),
    ]
    assert await billing.credits(other) == []  # refused at the door: nothing paid
    everything = {c.credit_id for c in await billing.credits()}
    assert {first.credit_id, again.credit_id} <= everything
