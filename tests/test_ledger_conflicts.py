"""Late outcomes that contradict a decision: flagged, listed, kept until an operator acknowledges."""

from __future__ import annotations

import uuid

import pytest

from onceflow.ledger import (
    CallIdentity,
    ConflictNotOpenError,
    EventSource,
    FailureKind,
    Ledger,
    OutcomeIgnoredError,
    Reservation,
    SideEffect,
    Status,
)

ARGUMENTS = {"account_id": "acct_1", "amount_cents": 500}


async def indeterminate(ledger: Ledger, *, tenant: str = "t1", owner: str = "worker-1") -> str:
    call = CallIdentity(tenant=tenant, run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1")
    await ledger.reserve(
        call, tool_name="issue_credit", side_effect=SideEffect.EXTERNAL, arguments=ARGUMENTS, owner=owner
    )
    await ledger.mark_indeterminate(call.key, actor="inspector", reason="activity timed out")
    return call.key


async def test_owner_reporting_completed_after_an_operator_said_failed_flags_a_conflict(
    ledger: Ledger,
) -> None:
    key = await indeterminate(ledger)
    decided = await ledger.settle(key, status=Status.FAILED, actor="operator:alice", reason="not in billing")
    assert not decided.has_conflict

    with pytest.raises(OutcomeIgnoredError) as caught:
        await ledger.complete(key, owner="worker-1", result={"credit_id": "cr_late"})

    assert "conflict" in str(caught.value)
    record = await ledger.get(key)
    # The decision stands: status, who and when are as the operator left them.
    assert (record.status, record.settled_by, record.settled_at) == (
        Status.FAILED,
        "operator:alice",
        decided.settled_at,
    )
    assert record.has_conflict and record.conflict_at is not None
    assert record.conflict_detail["reported"] == "completed"
    assert record.conflict_detail["reported_by"] == "worker-1"
    assert record.conflict_detail["decided_by"] == "operator:alice"
    assert record.conflict_detail["result"] == {"credit_id": "cr_late"}
    event = record.events[-1]
    assert (event.kind, event.actor, event.source, event.from_status, event.to_status) == (
        "outcome_conflict",
        "worker-1",
        EventSource.OWNER,
        Status.FAILED,
        None,
    )


async def test_owner_reporting_failed_after_an_operator_said_completed_flags_a_conflict(
    ledger: Ledger,
) -> None:
    key = await indeterminate(ledger)
    await ledger.settle(key, status=Status.COMPLETED, actor="operator:bob", reason="saw it", result={"c": 1})

    with pytest.raises(OutcomeIgnoredError):
        await ledger.fail(key, owner="worker-1", kind=FailureKind.REJECTED, error="card declined")

    record = await ledger.find(key)
    assert record is not None and record.status is Status.COMPLETED and record.has_conflict
    assert record.conflict_detail["reported"] == "failed"
    assert record.conflict_detail["failure_kind"] == "rejected"


async def test_an_agreeing_late_outcome_is_not_a_conflict(ledger: Ledger) -> None:
    key = await indeterminate(ledger)
    await ledger.settle(key, status=Status.COMPLETED, actor="operator:bob", reason="saw it")

    with pytest.raises(OutcomeIgnoredError):
        await ledger.complete(key, owner="worker-1", result={"credit_id": "cr_1"})
    record = await ledger.record_late_outcome(key, actor="reconciler", status=Status.COMPLETED)

    assert not record.has_conflict and record.conflict_at is None
    assert [e.kind for e in (await ledger.get(key)).events][-2:] == ["outcome_ignored", "late_outcome"]


async def test_a_stranger_cannot_raise_a_conflict(ledger: Ledger) -> None:
    key = await indeterminate(ledger, owner="worker-1")
    await ledger.settle(key, status=Status.FAILED, actor="operator:alice", reason="not in billing")

    with pytest.raises(OutcomeIgnoredError):
        await ledger.complete(key, owner="worker-9", result={"credit_id": "cr_forged"})

    record = await ledger.get(key)
    assert not record.has_conflict
    assert (record.events[-1].kind, record.events[-1].reason) == ("outcome_ignored", "not the owner")


async def test_reconcile_hook_contradicting_the_decision_flags_a_conflict_once(ledger: Ledger) -> None:
    key = await indeterminate(ledger)
    await ledger.settle(key, status=Status.FAILED, actor="operator:alice", reason="not in billing")

    first = await ledger.record_late_outcome(
        key, actor="reconciler", status=Status.COMPLETED, evidence={"credit_id": "cr_9"}
    )
    again = await ledger.record_late_outcome(
        key, actor="reconciler", status=Status.COMPLETED, evidence={"credit_id": "cr_9"}
    )

    assert first.has_conflict and first.conflict_detail["source"] == "reconciler"
    assert again.conflict_at == first.conflict_at
    events = (await ledger.get(key)).events
    assert [e.kind for e in events].count("outcome_conflict") == 1


async def test_acknowledging_closes_the_conflict_and_leaves_the_decision(ledger: Ledger) -> None:
    key = await indeterminate(ledger)
    await ledger.settle(key, status=Status.FAILED, actor="operator:alice", reason="not in billing")
    await ledger.record_late_outcome(key, actor="reconciler", status=Status.COMPLETED)

    with pytest.raises(ValueError, match="reason"):
        await ledger.acknowledge_conflict(
            key, actor="operator:bob", status=Status.FAILED, reason=" ", evidence={"ticket": "OPS-7"}
        )
    acknowledged = await ledger.acknowledge_conflict(
        key,
        actor="operator:bob",
        status=Status.FAILED,
        reason="voided the credit by hand",
        evidence={"ticket": "OPS-7"},
    )
    retried = await ledger.acknowledge_conflict(
        key,
        actor="operator:bob",
        status=Status.FAILED,
        reason="voided the credit by hand",
        evidence={"ticket": "OPS-7"},
    )

    assert (acknowledged.status, acknowledged.settled_by) == (Status.FAILED, "operator:alice")
    assert not acknowledged.has_conflict and acknowledged.conflict_cleared_by == "operator:bob"
    assert retried == acknowledged
    with pytest.raises(ConflictNotOpenError, match="operator:bob"):
        await ledger.acknowledge_conflict(
            key, actor="operator:carol", status=Status.FAILED, reason="me too", evidence={"t": 1}
        )
    events = (await ledger.get(key)).events
    assert [e.kind for e in events].count("conflict_acknowledged") == 1
    assert events[-1].evidence == {"ticket": "OPS-7"} and events[-1].source is EventSource.API


async def test_a_hooks_result_reported_late_is_the_calls_result_once_acknowledged_completed(
    ledger: Ledger,
) -> None:
    """An operator said "failed"; the reconcile hook then found the credit. Acknowledged as
    `completed`, the call carries the credit the hook found, so a repeat handed its result is told
    the credit id, not a null."""
    key = await indeterminate(ledger)
    await ledger.settle(key, status=Status.FAILED, actor="operator:alice", reason="not in billing")
    flagged = await ledger.record_late_outcome(
        key,
        actor="reconciler",
        status=Status.COMPLETED,
        evidence={"found": "cr_9"},
        result={"credit_id": "cr_9"},
        result_reference="billing:cr_9",
    )
    assert flagged.conflict_detail["result"] == {"credit_id": "cr_9"}
    acknowledged = await ledger.acknowledge_conflict(
        key, actor="operator:bob", status=Status.COMPLETED, reason="billing has it", evidence={"t": 1}
    )
    assert (acknowledged.status, acknowledged.result) == (Status.COMPLETED, {"credit_id": "cr_9"})


async def test_acknowledging_a_call_without_a_conflict_is_refused(ledger: Ledger) -> None:
    key = await indeterminate(ledger)
    with pytest.raises(ConflictNotOpenError, match="none was flagged"):
        await ledger.acknowledge_conflict(
            key, actor="operator:bob", status=Status.FAILED, reason="looks fine", evidence={"t": 1}
        )


async def test_a_failed_call_in_conflict_is_not_sent_again_open_or_acknowledged(ledger: Ledger) -> None:
    call = CallIdentity(tenant="t1", run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1")

    async def reserve(owner: str) -> Reservation:
        result = await ledger.reserve(
            call, tool_name="issue_credit", side_effect=SideEffect.EXTERNAL, arguments=ARGUMENTS, owner=owner
        )
        return result.outcome

    await reserve("worker-1")
    await ledger.mark_indeterminate(call.key, actor="inspector", reason="timed out")
    await ledger.settle(call.key, status=Status.FAILED, actor="operator:alice", reason="not in billing")
    await ledger.record_late_outcome(call.key, actor="reconciler", status=Status.COMPLETED)

    # `failed` may normally run again; not while its owner's hook says it took effect, and not
    # once an operator has said what the world is: that status is final for the key.
    assert await reserve("worker-2") is Reservation.SETTLED
    await ledger.acknowledge_conflict(
        call.key,
        actor="operator:bob",
        status=Status.FAILED,
        reason="checked: it did not",
        evidence={"billing": "no credit"},
    )
    assert await reserve("worker-3") is Reservation.SETTLED
    record = await ledger.find(call.key)
    assert record is not None and record.conflict_cleared_by == "operator:bob" and record.attempt == 1


async def test_conflicts_are_listed_beside_unresolved_calls_and_alone(ledger: Ledger) -> None:
    unresolved = await indeterminate(ledger, tenant="acme")
    conflicted = await indeterminate(ledger, tenant="acme")
    await ledger.settle(conflicted, status=Status.FAILED, actor="operator:alice", reason="not seen")
    await ledger.record_late_outcome(conflicted, actor="reconciler", status=Status.COMPLETED)
    elsewhere = await indeterminate(ledger, tenant="globex")
    await ledger.settle(elsewhere, status=Status.FAILED, actor="operator:zed", reason="not seen")
    await ledger.record_late_outcome(elsewhere, actor="reconciler", status=Status.COMPLETED)

    both = await ledger.list_unresolved("acme", conflicts=True)
    only = await ledger.list_unresolved("acme", statuses=(), conflicts=True)
    plain = await ledger.list_unresolved("acme")
    paged = await ledger.list_unresolved("acme", conflicts=True, limit=1)
    rest = await ledger.list_unresolved("acme", conflicts=True, cursor=paged.next_cursor)

    assert [r.key for r in both.records] == [unresolved, conflicted]
    assert [r.key for r in only.records] == [conflicted]
    assert [r.key for r in plain.records] == [unresolved]
    assert [r.key for r in paged.records + rest.records] == [unresolved, conflicted]
    with pytest.raises(ValueError):
        await ledger.list_unresolved("acme", statuses=())
