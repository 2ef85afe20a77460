"""The ledger's part of two terminal-or-not questions: a refusal on policy grounds is final for its
key, and a resend inside a receiver's dedup window is decided (and recorded) by the database clock.

Real PostgreSQL, one fresh database per test."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta

import pytest

from onceflow.ledger import (
    CallIdentity,
    EventSource,
    FailureKind,
    Guard,
    Ledger,
    RecordNotFoundError,
    ResendInFlightError,
    Reservation,
    SideEffect,
    Status,
    ToolExecutionRecord,
)

ARGUMENTS = {"account_id": "acct_1", "amount_cents": 90_000}
DAY = timedelta(hours=24)
LEAD = timedelta(seconds=6)  # a tool timeout of 1 s plus the 5 s margin


def new_call() -> CallIdentity:
    return CallIdentity(tenant="t1", run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1")


async def reserve(
    ledger: Ledger, call: CallIdentity, *, owner: str, guard: Guard | None = None
) -> Reservation:
    result = await ledger.reserve(
        call,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments=ARGUMENTS,
        owner=owner,
        guard=guard,
    )
    return result.outcome


async def unknown_call(ledger: Ledger) -> str:
    call = new_call()
    assert await reserve(ledger, call, owner="worker-1") is Reservation.NEW
    await ledger.mark_indeterminate(call.key, actor="worker-1", reason="no answer within 1s")
    return call.key


# -- a refusal on policy grounds is final ---------------------------------------------------------


@pytest.mark.parametrize("guarded", [False, True], ids=["plain-reserve", "guarded-reserve"])
async def test_policy_refused_key_is_never_reserved_again(ledger: Ledger, guarded: bool) -> None:
    call = new_call()
    guard = Guard() if guarded else None
    assert await reserve(ledger, call, owner="worker-1", guard=guard) is Reservation.NEW
    await ledger.fail(
        call.key, owner="worker-1", kind=FailureKind.POLICY_REFUSED, error="above the authorization limit"
    )

    # A replay, a reset or another worker asks again, with and without guards: nobody may send it.
    for owner in ("worker-2", "worker-3"):
        for again in (None, Guard()):
            outcome = await reserve(ledger, call, owner=owner, guard=again)
            assert outcome is Reservation.SETTLED
    record = await ledger.get(call.key)
    assert (record.status, record.failure_kind, record.attempt) == (
        Status.FAILED,
        FailureKind.POLICY_REFUSED,
        1,
    )
    assert record.owner == "worker-1"
    assert [e.kind for e in record.events] == ["reserved", "failed"]


async def test_rejected_key_is_still_reserved_again(ledger: Ledger) -> None:
    """The contrast: an ordinary rejection may run again (attempt 2); only a policy refusal is final."""
    call = new_call()
    await reserve(ledger, call, owner="worker-1")
    await ledger.fail(call.key, owner="worker-1", kind=FailureKind.REJECTED, error="account closed")
    assert await reserve(ledger, call, owner="worker-2") is Reservation.RETRY
    assert (await ledger.get(call.key, with_events=False)).attempt == 2


async def test_settling_an_unknown_call_as_policy_refused_makes_it_final(ledger: Ledger) -> None:
    key = await unknown_call(ledger)
    await ledger.settle(
        key,
        status=Status.FAILED,
        actor="reconciler",
        reason="the receiver refused the resend on policy grounds",
        failure_kind=FailureKind.POLICY_REFUSED,
    )
    run_id, _, tool_call_id = key.rpartition(":")
    again = CallIdentity(tenant="t1", run_id=run_id, tool_call_id=tool_call_id)
    assert await reserve(ledger, again, owner="worker-2") is Reservation.SETTLED
    assert await reserve(ledger, again, owner="worker-3", guard=Guard()) is Reservation.SETTLED
    record = await ledger.get(key, with_events=False)
    assert (record.failure_kind, record.attempt) == (FailureKind.POLICY_REFUSED, 1)


async def test_a_settlement_names_no_other_failure_kind(ledger: Ledger) -> None:
    key = await unknown_call(ledger)
    with pytest.raises(ValueError, match="not_applied or policy_refused"):
        await ledger.settle(
            key, status=Status.FAILED, actor="reconciler", reason="x", failure_kind=FailureKind.NOT_ATTEMPTED
        )
    assert (await ledger.get(key)).status is Status.INDETERMINATE


# -- resends inside the receiver's dedup window ---------------------------------------------------


async def test_resend_inside_the_window_is_allowed_and_recorded(ledger: Ledger) -> None:
    key = await unknown_call(ledger)
    lead = timedelta(seconds=0.3)
    first = await ledger.begin_resend(key, window=DAY, lead=lead)
    await answered(ledger, key, first.resends)
    quiet = await ledger.begin_resend(key, window=DAY, lead=lead)  # a person's turn, for a lead
    await asyncio.sleep(lead.total_seconds() + 0.1)
    second = await ledger.begin_resend(key, window=DAY, lead=lead)

    assert first.allowed and second.allowed
    assert not quiet.allowed and "a person may decide" in quiet.reason
    assert (first.resends, second.resends) == (1, 2)
    record = await ledger.get(key)
    assert first.window_ends_at == record.created_at + DAY
    assert first.send_by == record.created_at + DAY - lead
    assert record.created_at < first.checked_at < first.send_by
    resends = [e for e in record.events if e.kind == "resend"]
    assert [e.detail["resend"] for e in resends] == [1, 2]
    assert all(e.source == "reconciler" and e.actor == "reconciler" for e in resends)
    assert resends[0].detail["dedup_window_seconds"] == DAY.total_seconds()
    assert resends[0].detail["lead_seconds"] == lead.total_seconds()
    until = datetime.fromisoformat(resends[0].detail["on_the_wire_until"])
    assert until - first.checked_at == lead  # both read from the database's clock, in one statement
    assert record.status is Status.INDETERMINATE  # asking to resend settles nothing


async def answered(ledger: Ledger, key: str, resend: int) -> None:
    """What the reconciler appends when the receiver answered a resend without settling anything."""
    await ledger.append_event(
        key,
        actor="reconciler",
        kind="resend_inconclusive",
        source=EventSource.RECONCILER,
        reason="the resend told nothing: request in progress",
        detail={"resend": resend, "answer_kind": "rejected", "answered": True},
    )


# -- a resend on the wire is leased ---------------------------------------------------------------


async def test_no_operator_decision_lands_while_a_resend_is_on_the_wire(ledger: Ledger) -> None:
    key = await unknown_call(ledger)
    resend = await ledger.begin_resend(key, window=DAY, lead=LEAD)
    assert resend.allowed
    for source in (EventSource.API, EventSource.SIGNAL):
        with pytest.raises(ResendInFlightError) as refused:
            await ledger.settle(
                key,
                status=Status.FAILED,
                actor="operator:ann" if source is EventSource.API else "signal:ann",
                reason="not in billing",
                evidence={"checked": "billing console"},
                source=source,
            )
        assert (refused.value.resend, refused.value.resend_actor) == (1, "reconciler")
        assert refused.value.until == resend.checked_at + LEAD
        assert refused.value.quiet_until == resend.checked_at + 2 * LEAD
        assert "on the wire until" in str(refused.value)
    record = await ledger.get(key)
    assert record.status is Status.INDETERMINATE
    assert [e.kind for e in record.events] == ["reserved", "indeterminate", "resend"]
    # Nor does a second resend leave while the first may still arrive.
    again = await ledger.begin_resend(key, window=DAY, lead=LEAD)
    assert not again.allowed and "still on the wire" in again.reason
    # The reconciler settles by the resend's own answer.
    settled = await ledger.settle(
        key,
        status=Status.COMPLETED,
        actor="reconciler",
        reason="the receiver answered the resend",
        result={"credit_id": "cr_1"},
        source=EventSource.RECONCILER,
    )
    assert settled.status is Status.COMPLETED


async def test_a_decision_lands_once_the_resend_is_answered_or_its_lease_runs_out(ledger: Ledger) -> None:
    answered_key, lapsed_key = await unknown_call(ledger), await unknown_call(ledger)
    first = await ledger.begin_resend(answered_key, window=DAY, lead=LEAD)
    await answered(ledger, answered_key, first.resends)
    lease = timedelta(seconds=0.5)
    await ledger.begin_resend(lapsed_key, window=DAY, lead=lease)
    await ledger.append_event(  # a timeout: the request may still be on the wire, so no `answered`
        lapsed_key,
        actor="reconciler",
        kind="resend_inconclusive",
        source=EventSource.RECONCILER,
        reason="the resend told nothing: no answer within 1s",
        detail={"resend": 1, "answer_kind": "indeterminate", "answered": False},
    )
    with pytest.raises(ResendInFlightError):
        await settle_failed(ledger, lapsed_key)
    await asyncio.sleep(lease.total_seconds() + 0.1)
    # The lease is over; for as long again no resend leaves, so the person told to wait gets a turn.
    assert not (await ledger.begin_resend(lapsed_key, window=DAY, lead=lease)).allowed
    for key in (answered_key, lapsed_key):
        record = await settle_failed(ledger, key)
        assert (record.status, record.settled_by) == (Status.FAILED, "operator:ann")


async def settle_failed(ledger: Ledger, key: str) -> ToolExecutionRecord:
    return await ledger.settle(
        key,
        status=Status.FAILED,
        actor="operator:ann",
        reason="not in billing",
        evidence={"checked": "billing console"},
        source=EventSource.API,
    )


async def test_resend_after_the_window_is_refused_and_noted_once(ledger: Ledger) -> None:
    key = await unknown_call(ledger)
    await asyncio.sleep(0.3)
    # The window is 6.2 s and a resend needs 6 s of it: by the database's clock it closed 0.2 s
    # after the first reservation.
    window = LEAD + timedelta(seconds=0.2)
    refusals = [await ledger.begin_resend(key, window=window, lead=LEAD) for _ in range(3)]

    assert not any(r.allowed for r in refusals)
    assert all(r.checked_at >= r.send_by for r in refusals)
    assert "never re-sent" in refusals[0].reason
    record = await ledger.get(key)
    kinds = [e.kind for e in record.events]
    assert "resend" not in kinds
    assert kinds.count("resend_window_closed") == 1
    assert record.status is Status.INDETERMINATE


async def test_a_settled_call_is_never_re_sent(ledger: Ledger) -> None:
    key = await unknown_call(ledger)
    await ledger.settle(key, status=Status.COMPLETED, actor="operator:ann", reason="seen in billing")
    decision = await ledger.begin_resend(key, window=DAY, lead=LEAD)
    assert not decision.allowed
    assert decision.reason == "the call is completed"
    assert all(e.kind not in ("resend", "resend_window_closed") for e in (await ledger.get(key)).events)


async def test_a_started_call_is_not_re_sent(ledger: Ledger) -> None:
    """Only unknown calls: a started call's owner may still be waiting for its answer."""
    call = new_call()
    await reserve(ledger, call, owner="worker-1")
    assert not (await ledger.begin_resend(call.key, window=DAY, lead=LEAD)).allowed


async def test_of_concurrent_resend_checks_one_is_allowed(ledger: Ledger) -> None:
    key = await unknown_call(ledger)
    decisions = await asyncio.gather(*(ledger.begin_resend(key, window=DAY, lead=LEAD) for _ in range(20)))
    assert [d.resends for d in decisions if d.allowed] == [1]
    assert [e.kind for e in (await ledger.get(key)).events].count("resend") == 1


async def test_bad_resend_requests_are_refused_and_change_nothing(ledger: Ledger) -> None:
    key = await unknown_call(ledger)
    with pytest.raises(ValueError, match="positive"):
        await ledger.begin_resend(key, window=timedelta(0), lead=LEAD)
    with pytest.raises(ValueError, match="negative"):
        await ledger.begin_resend(key, window=DAY, lead=timedelta(seconds=-1))
    with pytest.raises(RecordNotFoundError):
        await ledger.begin_resend("run-nope:call-1", window=DAY, lead=LEAD)
    assert [e.kind for e in (await ledger.get(key)).events] == ["reserved", "indeterminate"]
