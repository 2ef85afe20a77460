"""Nothing orphaned, nothing refilled: releasing a call that was never sent, acknowledging a conflict
with what the world is, and budgets that a retention purge does not empty. Real PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from onceflow.ledger import (
    AlreadySettledError,
    CallIdentity,
    EventSource,
    FailureKind,
    Guard,
    HeldCallError,
    InvalidTransitionError,
    Ledger,
    Reservation,
    ReserveResult,
    SideEffect,
    Status,
    purge_settled,
)
from onceflow.ledger.records import RepeatedDecision
from tests.test_ledger_retention import age

REFUND = {"order_id": "o1", "amount_cents": 1000}
BUDGET = Guard(entity="o1", amount=Decimal(1000), limit=Decimal(1500))


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


async def reserve(
    ledger: Ledger,
    run: str,
    call_id: str,
    guard: Guard = BUDGET,
    *,
    arguments: dict[str, Any] | None = None,
    approval: bool = False,
    owner: str | None = None,
) -> ReserveResult:
    return await ledger.reserve(
        CallIdentity(tenant="t1", run_id=run, tool_call_id=call_id),
        tool_name="refund_order",
        side_effect=SideEffect.EXTERNAL,
        arguments=REFUND if arguments is None else arguments,
        owner=owner or f"owner-{call_id}-{uuid.uuid4().hex[:4]}",
        approval=approval,
        lease=timedelta(minutes=5),
        guard=guard,
    )


async def held_call(ledger: Ledger) -> tuple[str, str]:
    """A call held behind a same-intent twin that is unknown: (held key, blocker key)."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.mark_indeterminate(first.record.key, actor="test", reason="timed out")
    second = await reserve(ledger, run, "c2", Guard())
    assert second.outcome is Reservation.HELD
    return second.record.key, first.record.key


# -- release ------------------------------------------------------------------------------------------


async def test_an_operator_releases_a_held_call_once_and_a_second_operator_is_told_who_won(
    ledger: Ledger,
) -> None:
    key, blocker = await held_call(ledger)
    with pytest.raises(HeldCallError):  # settling is still refused: it was never sent
        await ledger.settle(key, status=Status.FAILED, actor="operator:alice", reason="x")

    released = await ledger.release(key, actor="operator:alice", reason="the customer withdrew it")
    assert released.status is Status.FAILED and released.failure_kind is FailureKind.RELEASED
    assert (released.settled_by, released.reason, released.held_by) == (
        "operator:alice",
        "the customer withdrew it",
        None,
    )
    # The same request again (its answer was lost) is the same release, with no second event.
    repeated = await ledger.release(key, actor="operator:alice", reason="the customer withdrew it")
    assert isinstance(repeated, RepeatedDecision) and repeated.model_dump() == released.model_dump()
    with pytest.raises(AlreadySettledError) as lost:
        await ledger.release(key, actor="operator:bob", reason="me too")
    assert lost.value.settled_by == "operator:alice"

    events = (await ledger.get(key)).events
    assert [e.kind for e in events] == ["held", "released"]
    event = events[-1]
    assert (event.actor, event.source, event.from_status, event.to_status, event.reason) == (
        "operator:alice",
        EventSource.API,
        Status.HELD,
        Status.FAILED,
        "the customer withdrew it",
    )
    assert event.detail == {"held_by": blocker}
    # Asked again under its key (a nudge, a reset), it is final: never sent.
    again = await reserve(ledger, key.split(":")[0], "c2", Guard())
    assert again.outcome is Reservation.SETTLED and not again.may_send
    assert (await ledger.get(key)).attempt == 1


async def test_releasing_an_approved_but_unclaimed_call_frees_its_entity_slot_and_budget(
    ledger: Ledger,
) -> None:
    exclusive = BUDGET.model_copy(update={"exclusive": True, "on_busy": "refuse"})
    approved = await reserve(ledger, run_id(), "c1", exclusive, approval=True)
    key = approved.record.key
    await ledger.approve(key, actor="operator:alice")
    busy = await reserve(ledger, run_id(), "c1", exclusive, arguments={**REFUND, "amount_cents": 400})
    assert busy.outcome is Reservation.REFUSED and key in (busy.record.error or "")

    released = await ledger.release(key, actor="operator:bob", reason="its run is gone")
    assert released.status is Status.FAILED and released.failure_kind is FailureKind.RELEASED
    assert (await ledger.get(key)).events[-1].detail == {"approved_by": "operator:alice"}
    # The slot and the 1000 are free again: 1000 more fits the limit of 1500.
    fresh = await reserve(ledger, run_id(), "c1", exclusive)
    assert fresh.outcome is Reservation.NEW
    # The released call, asked again, is not claimed.
    claim = await reserve(ledger, key.split(":")[0], "c1", exclusive, approval=True)
    assert claim.outcome is Reservation.SETTLED and not claim.may_send


async def test_only_a_held_or_approved_unclaimed_call_can_be_released(ledger: Ledger) -> None:
    waiting = await reserve(ledger, run_id(), "c1", approval=True)
    with pytest.raises(InvalidTransitionError, match="deny it instead"):
        await ledger.release(waiting.record.key, actor="operator:alice", reason="no")
    started = await reserve(ledger, run_id(), "c1")
    with pytest.raises(InvalidTransitionError, match="cannot release"):
        await ledger.release(started.record.key, actor="operator:alice", reason="no")
    with pytest.raises(ValueError, match="reason"):
        await ledger.release(started.record.key, actor="operator:alice", reason="  ")
    for record in (waiting.record, started.record):
        assert (await ledger.get(record.key)).status is record.status


# -- acknowledging a conflict sets what the world is ---------------------------------------------------


async def conflicted(ledger: Ledger, run: str) -> str:
    """A budgeted refund an operator settled failed, whose owner then said it completed."""
    reserved = await reserve(ledger, run, "c1", owner="worker-1")
    key = reserved.record.key
    await ledger.mark_indeterminate(key, actor="inspector", reason="timed out")
    await ledger.settle(
        key, status=Status.FAILED, actor="operator:alice", reason="not seen", evidence={"billing": "none"}
    )
    await ledger.record_late_outcome(key, actor="reconciler", status=Status.COMPLETED, evidence={"r": 1})
    assert (await ledger.get(key)).has_conflict
    return key


async def test_acknowledging_a_conflict_as_completed_keeps_it_in_the_budget_and_never_resends(
    ledger: Ledger,
) -> None:
    run = run_id()
    key = await conflicted(ledger, run)
    with pytest.raises(ValueError, match="evidence"):
        await ledger.acknowledge_conflict(key, actor="operator:bob", status=Status.COMPLETED, reason="seen")
    with pytest.raises(ValueError, match="completed, failed or compensated"):
        await ledger.acknowledge_conflict(
            key, actor="operator:bob", status=Status.HELD, reason="seen", evidence={"t": 1}
        )

    record = await ledger.acknowledge_conflict(
        key,
        actor="operator:bob",
        status=Status.COMPLETED,
        reason="billing shows the refund after all",
        evidence={"refund": "re_9"},
    )
    assert record.status is Status.COMPLETED and not record.has_conflict
    assert (record.settled_by, record.failure_kind, record.evidence) == (
        "operator:bob",
        None,
        {"refund": "re_9"},
    )
    event = (await ledger.get(key)).events[-1]
    assert (event.kind, event.from_status, event.to_status) == (
        "conflict_acknowledged",
        Status.FAILED,
        Status.COMPLETED,
    )
    # Reserved again under its key: the recorded outcome, nothing sent.
    again = await reserve(ledger, run, "c1")
    assert again.outcome is Reservation.COMPLETED and not again.may_send
    # And it counts: 1000 of 1500 used, so another 1000 is refused.
    other = await reserve(ledger, run_id(), "c9")
    assert other.outcome is Reservation.REFUSED and "1000 completed" in (other.record.error or "")


async def test_acknowledging_a_conflict_as_failed_is_final(ledger: Ledger) -> None:
    run = run_id()
    key = await conflicted(ledger, run)
    record = await ledger.acknowledge_conflict(
        key, actor="operator:bob", status=Status.FAILED, reason="a bad hook", evidence={"billing": "none"}
    )
    assert record.status is Status.FAILED and not record.has_conflict
    # Before, an acknowledged failed call was reserved (and sent) again under its key.
    again = await reserve(ledger, run, "c1")
    assert again.outcome is Reservation.SETTLED and not again.may_send
    assert (await ledger.get(key)).attempt == 1
    # Retried by the same operator with the same status: the same answer. Another status: refused.
    assert (
        await ledger.acknowledge_conflict(
            key, actor="operator:bob", status=Status.FAILED, reason="a bad hook", evidence={"billing": "none"}
        )
    ).status is Status.FAILED


async def test_acknowledging_a_conflict_as_compensated(ledger: Ledger) -> None:
    run = run_id()
    key = await conflicted(ledger, run)
    record = await ledger.acknowledge_conflict(
        key, actor="operator:bob", status=Status.COMPENSATED, reason="voided", evidence={"void": "v_1"}
    )
    assert record.status is Status.COMPENSATED
    again = await reserve(ledger, run, "c1")
    assert again.outcome is Reservation.SETTLED and not again.may_send


# -- a purge never refills a budget -------------------------------------------------------------------


async def test_a_purge_does_not_refill_a_budget(ledger: Ledger, database_url: str) -> None:
    first = await reserve(ledger, run_id(), "c1")
    await ledger.complete(first.record.key, owner=first.record.owner or "", result={"refund": "re_1"})
    await age(database_url, first.record.key)
    report = await purge_settled(ledger, older_than=timedelta(days=90))
    assert report.calls == 1 and await ledger.find(first.record.key) is None

    # 1000 of 1500 were refunded; the purge removed the row, not the usage.
    second = await reserve(ledger, run_id(), "c1")
    assert second.outcome is Reservation.REFUSED
    assert "1000 completed" in (second.record.error or "")
    half = BUDGET.model_copy(update={"amount": Decimal(500)})
    small = await reserve(ledger, run_id(), "c1", half, arguments={**REFUND, "amount_cents": 500})
    assert small.outcome is Reservation.NEW
