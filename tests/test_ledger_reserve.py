"""Reserve: the one atomic statement that decides who may send a call."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from onceflow.ledger import (
    CallIdentity,
    FailureKind,
    Guard,
    Ledger,
    PayloadMismatchError,
    Reservation,
    ReserveResult,
    SideEffect,
    Status,
    TenantMismatchError,
    canonical_payload,
    queries,
)

ARGUMENTS = {"account_id": "acct_1", "amount_cents": 500}


def new_call(tenant: str = "t1") -> CallIdentity:
    return CallIdentity(tenant=tenant, run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1")


async def reserve(
    ledger: Ledger,
    call: CallIdentity,
    *,
    owner: str = "worker-1",
    arguments: dict[str, Any] | None = None,
    approval: bool = False,
) -> ReserveResult:
    return await ledger.reserve(
        call,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments=ARGUMENTS if arguments is None else arguments,
        owner=owner,
        approval=approval,
    )


async def test_fifty_concurrent_reservations_of_one_key_hand_out_exactly_one(ledger: Ledger) -> None:
    for _ in range(100):
        call = new_call()
        results = await asyncio.gather(*(reserve(ledger, call, owner=f"worker-{i}") for i in range(50)))
        outcomes = [r.outcome for r in results]
        assert outcomes.count(Reservation.NEW) == 1
        assert outcomes.count(Reservation.IN_FLIGHT) == 49
        assert sum(r.may_send for r in results) == 1
        winner = next(r for r in results if r.outcome is Reservation.NEW)
        assert all(r.record.owner == winner.record.owner for r in results)
        assert all(r.record.attempt == 1 for r in results)


async def test_key_is_run_id_and_tool_call_id(ledger: Ledger) -> None:
    call = CallIdentity(tenant="t1", run_id="run-7", tool_call_id="call-3")
    result = await reserve(ledger, call)
    assert result.record.key == "run-7:call-3"
    assert result.record.payload == canonical_payload("issue_credit", ARGUMENTS).value
    assert result.record.payload_sha256 == canonical_payload("issue_credit", ARGUMENTS).sha256


async def test_completed_key_returns_recorded_result_without_calling_tool(ledger: Ledger) -> None:
    call = new_call()
    first = await reserve(ledger, call, owner="worker-1")
    assert first.outcome is Reservation.NEW
    assert first.may_send
    await ledger.complete(call.key, owner="worker-1", result={"credit_id": "cr_1"}, result_reference="cr_1")

    again = await reserve(ledger, call, owner="worker-2")

    assert again.outcome is Reservation.COMPLETED
    assert not again.may_send
    assert again.record.result == {"credit_id": "cr_1"}
    assert again.record.result_reference == "cr_1"
    assert again.record.owner == "worker-1"
    record = await ledger.get(call.key)
    assert [e.kind for e in record.events] == ["reserved", "completed"]


async def test_failed_call_is_re_reserved_as_retry_with_next_attempt(ledger: Ledger) -> None:
    call = new_call()
    await reserve(ledger, call, owner="worker-1")
    failed = await ledger.fail(call.key, owner="worker-1", kind=FailureKind.NOT_ATTEMPTED, error="no network")
    assert failed.status is Status.FAILED

    retry = await reserve(ledger, call, owner="worker-2")

    assert retry.outcome is Reservation.RETRY
    assert retry.may_send
    assert retry.record.status is Status.STARTED
    assert retry.record.attempt == 2
    assert retry.record.owner == "worker-2"
    # The failed attempt's outcome is cleared, not carried into the new attempt.
    assert retry.record.failure_kind is None
    assert retry.record.error is None
    assert retry.record.settled_at is None
    record = await ledger.get(call.key)
    assert [(e.kind, e.from_status, e.to_status) for e in record.events] == [
        ("reserved", None, Status.STARTED),
        ("failed", Status.STARTED, Status.FAILED),
        ("reserved", Status.FAILED, Status.STARTED),
    ]
    assert record.events[-1].detail == {"attempt": 2}


async def test_only_the_new_owner_may_complete_a_retried_call(ledger: Ledger) -> None:
    call = new_call()
    await reserve(ledger, call, owner="worker-1")
    await ledger.fail(call.key, owner="worker-1", kind=FailureKind.REJECTED, error="card declined")
    await reserve(ledger, call, owner="worker-2")

    done = await ledger.complete(call.key, owner="worker-2", result={"ok": True})

    assert done.status is Status.COMPLETED
    assert done.attempt == 2


async def test_started_call_is_never_handed_out_again(ledger: Ledger) -> None:
    call = new_call()
    await reserve(ledger, call, owner="worker-1")
    before = await ledger.find(call.key)

    again = await reserve(ledger, call, owner="worker-2")

    assert again.outcome is Reservation.IN_FLIGHT
    assert not again.may_send
    assert await ledger.find(call.key) == before


async def test_indeterminate_call_stays_indeterminate_when_reserved_again(ledger: Ledger) -> None:
    call = new_call()
    await reserve(ledger, call, owner="worker-1")
    await ledger.mark_indeterminate(call.key, actor="ledger-check", reason="activity timed out")
    before = await ledger.find(call.key)

    for owner in ("worker-1", "worker-2"):
        again = await reserve(ledger, call, owner=owner)
        assert again.outcome is Reservation.IN_FLIGHT
        assert not again.may_send
        assert again.record.status is Status.INDETERMINATE

    assert await ledger.find(call.key) == before


async def test_call_needing_approval_is_recorded_but_not_sent(ledger: Ledger) -> None:
    call = new_call()
    first = await reserve(ledger, call, approval=True)
    again = await reserve(ledger, call, approval=True, owner="worker-2")

    assert first.outcome is Reservation.AWAITING_APPROVAL
    assert first.record.status is Status.AWAITING_APPROVAL
    assert not first.may_send
    assert again.outcome is Reservation.AWAITING_APPROVAL
    assert not again.may_send


async def _insert_row(conn: asyncpg.Connection, key: str, status: Status) -> None:
    payload = canonical_payload("issue_credit", ARGUMENTS)
    run_id, tool_call_id = key.split(":")
    await conn.execute(
        "INSERT INTO tool_executions (key, tenant, run_id, tool_call_id, tool_name, side_effect, status,"
        " payload, payload_sha256, owner, held_by) VALUES ($1, 't1', $2, $3, 'issue_credit', 'external',"
        " $4, $5::jsonb, $6, 'worker-1', $7)",
        key,
        run_id,
        tool_call_id,
        status.value,
        payload.text,
        payload.sha256,
        "run-other:call-0" if status is Status.HELD else None,
    )


async def test_reserve_statement_updates_only_failed_rows(database_url: str) -> None:
    """At the SQL level: with the same payload, only a `failed` row is taken over by RESERVE."""
    payload = canonical_payload("issue_credit", ARGUMENTS)
    conn = await asyncpg.connect(database_url)
    try:
        for status in Status:
            key = f"run-{status.value}:call-1"
            await _insert_row(conn, key, status)
            before = await conn.fetchrow(queries.SELECT_RECORD, key)
            run_id, tool_call_id = key.split(":")

            row = await conn.fetchrow(
                queries.RESERVE,
                key,
                "t1",
                run_id,
                tool_call_id,
                "",
                "issue_credit",
                "external",
                Status.STARTED.value,
                payload.text,
                payload.sha256,
                "worker-2",
                None,
                None,  # no deadline
                None,  # no attempt start
            )

            after = await conn.fetchrow(queries.SELECT_RECORD, key)
            assert before is not None and after is not None
            if status is Status.FAILED:
                assert row is not None
                assert (row["status"], row["attempt"], row["owner"]) == ("started", 2, "worker-2")
                assert row["inserted"] is False
            else:
                assert row is None, f"RESERVE took over a {status} row"
                assert dict(after) == dict(before), f"RESERVE changed a {status} row"
    finally:
        await conn.close()


async def test_changed_payload_under_a_key_is_refused_and_recorded(ledger: Ledger) -> None:
    call = new_call()
    await reserve(ledger, call, owner="worker-1")
    before = await ledger.find(call.key)
    recorded = canonical_payload("issue_credit", ARGUMENTS).sha256
    offered = canonical_payload("issue_credit", {**ARGUMENTS, "amount_cents": 50_000}).sha256

    with pytest.raises(PayloadMismatchError) as caught:
        await reserve(ledger, call, owner="worker-2", arguments={**ARGUMENTS, "amount_cents": 50_000})

    assert caught.value.key == call.key
    assert caught.value.recorded_sha256 == recorded
    assert caught.value.offered_sha256 == offered
    assert recorded in str(caught.value)
    assert offered in str(caught.value)
    assert await ledger.find(call.key) == before
    refusal = (await ledger.get(call.key)).events[-1]
    assert refusal.kind == "payload_mismatch_refused"
    assert refusal.actor == "worker-2"
    assert refusal.detail["offered_sha256"] == offered
    assert refusal.detail["offered"]["arguments"]["amount_cents"] == 50_000


async def test_a_guarded_reservation_refuses_a_changed_payload_as_the_plain_one_does(ledger: Ledger) -> None:
    """One payload-mismatch path: with or without a guard, the same error and the same event."""
    changed = {**ARGUMENTS, "amount_cents": 50_000}
    seen = []
    for guard in (None, Guard(intent="reuse")):
        call = new_call()
        await reserve(ledger, call, owner="worker-1")
        before = await ledger.find(call.key)
        with pytest.raises(PayloadMismatchError) as caught:
            await ledger.reserve(
                call,
                tool_name="issue_credit",
                side_effect=SideEffect.EXTERNAL,
                arguments=changed,
                owner="worker-2",
                guard=guard,
            )
        assert await ledger.find(call.key) == before
        refusal = (await ledger.get(call.key)).events[-1]
        error = caught.value
        seen.append(
            (
                str(error).replace(call.key, "<key>"),
                error.recorded_sha256,
                error.offered_sha256,
                refusal.kind,
                refusal.actor,
                refusal.source,
                refusal.detail,
            )
        )
    assert seen[0] == seen[1]
    assert seen[0][3] == "payload_mismatch_refused"
    assert seen[0][2] == canonical_payload("issue_credit", changed).sha256


async def test_changed_payload_under_a_failed_key_is_refused_not_retried(ledger: Ledger) -> None:
    call = new_call()
    await reserve(ledger, call, owner="worker-1")
    await ledger.fail(call.key, owner="worker-1", kind=FailureKind.REJECTED, error="declined")
    before = await ledger.find(call.key)

    with pytest.raises(PayloadMismatchError):
        await reserve(ledger, call, owner="worker-2", arguments={**ARGUMENTS, "account_id": "acct_2"})

    assert await ledger.find(call.key) == before


async def test_argument_order_does_not_count_as_a_changed_payload(ledger: Ledger) -> None:
    call = new_call()
    await reserve(ledger, call, arguments={"account_id": "acct_1", "amount_cents": 500})
    again = await reserve(ledger, call, arguments={"amount_cents": 500.0, "account_id": "acct_1"})
    assert again.outcome is Reservation.IN_FLIGHT


async def test_another_tenants_key_is_refused_and_nothing_changes(ledger: Ledger) -> None:
    call = new_call(tenant="t1")
    await reserve(ledger, call, owner="worker-1")
    before = await ledger.get(call.key)
    intruder = call.model_copy(update={"tenant": "t2"})

    with pytest.raises(TenantMismatchError) as refused:
        await reserve(ledger, intruder, owner="worker-9")

    assert "another tenant" in str(refused.value)
    assert before.payload_sha256 not in str(refused.value)
    assert await ledger.get(call.key) == before


async def test_another_tenant_cannot_re_reserve_a_failed_key(ledger: Ledger) -> None:
    call = new_call(tenant="t1")
    await reserve(ledger, call, owner="worker-1")
    await ledger.fail(call.key, owner="worker-1", kind=FailureKind.NOT_ATTEMPTED, error="no network")
    intruder = call.model_copy(update={"tenant": "t2"})

    with pytest.raises(TenantMismatchError):
        await reserve(ledger, intruder, owner="worker-9")

    record = await ledger.get(call.key, with_events=False)
    assert record.status is Status.FAILED
    assert record.attempt == 1
    assert record.owner == "worker-1"
