"""Settling what nobody knew, outcomes from owners and others, and the events that record them. The
operator's queue (the unresolved calls by page) is in tests/test_ledger_reads.py."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from onceflow.ledger import (
    AlreadySettledError,
    FailureKind,
    InvalidTransitionError,
    Ledger,
    OutcomeIgnoredError,
    ReasonRequiredError,
    RecordNotFoundError,
    Status,
    ToolExecutionRecord,
    queries,
)
from tests.support.ledger_calls import indeterminate, started

# -- settle -----------------------------------------------------------------------------------------


async def test_started_call_becomes_indeterminate_with_an_event(ledger: Ledger) -> None:
    key = await started(ledger)

    record = await ledger.mark_indeterminate(key, actor="ledger-check", reason="activity timed out")

    assert record.status is Status.INDETERMINATE
    event = (await ledger.get(key)).events[-1]
    assert (event.kind, event.from_status, event.to_status) == (
        "indeterminate",
        Status.STARTED,
        Status.INDETERMINATE,
    )
    assert (event.actor, event.reason) == ("ledger-check", "activity timed out")


async def test_mark_indeterminate_leaves_a_completed_call_alone(ledger: Ledger) -> None:
    key = await started(ledger)
    done = await ledger.complete(key, owner="worker-1", result={"ok": True})

    record = await ledger.mark_indeterminate(key, actor="ledger-check", reason="activity timed out")

    assert record == done
    assert [e.kind for e in (await ledger.get(key)).events] == ["reserved", "completed"]


async def test_operator_settles_indeterminate_call_with_reason_and_evidence(ledger: Ledger) -> None:
    key = await indeterminate(ledger)

    record = await ledger.settle(
        key,
        status=Status.COMPLETED,
        actor="op-alice",
        reason="credit cr_9 found in billing",
        evidence={"credit_id": "cr_9"},
        result={"credit_id": "cr_9"},
        result_reference="cr_9",
    )

    assert record.status is Status.COMPLETED
    assert (record.settled_by, record.reason) == ("op-alice", "credit cr_9 found in billing")
    assert record.evidence == {"credit_id": "cr_9"}
    assert record.result == {"credit_id": "cr_9"}
    event = (await ledger.get(key)).events[-1]
    assert (event.kind, event.actor, event.from_status, event.to_status) == (
        "settled",
        "op-alice",
        Status.INDETERMINATE,
        Status.COMPLETED,
    )
    assert event.evidence == {"credit_id": "cr_9"}


async def test_of_two_concurrent_settles_exactly_one_wins_and_the_loser_names_the_winner(
    ledger: Ledger,
) -> None:
    for _ in range(50):
        key = await indeterminate(ledger)

        outcomes = await asyncio.gather(
            ledger.settle(key, status=Status.COMPLETED, actor="op-alice", reason="found the credit"),
            ledger.settle(key, status=Status.FAILED, actor="op-bob", reason="no credit in billing"),
            return_exceptions=True,
        )

        won = [o for o in outcomes if isinstance(o, ToolExecutionRecord)]
        lost = [o for o in outcomes if isinstance(o, AlreadySettledError)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        winner, loser = won[0], lost[0]
        assert winner.settled_by in ("op-alice", "op-bob")
        assert winner.settled_at is not None
        assert loser.settled_by == winner.settled_by
        assert loser.settled_at == winner.settled_at
        assert loser.current_status == winner.status.value
        assert winner.settled_by in str(loser)
        assert winner.settled_at.isoformat() in str(loser)
        record = await ledger.get(key)
        assert record.status is winner.status
        assert [e.actor for e in record.events if e.kind == "settled"] == [winner.settled_by]


async def test_settle_needs_a_reason(ledger: Ledger) -> None:
    key = await indeterminate(ledger)
    before = await ledger.find(key)

    for reason in ("", "   "):
        with pytest.raises(ReasonRequiredError, match="non-empty reason"):
            await ledger.settle(key, status=Status.FAILED, actor="op-alice", reason=reason)

    assert await ledger.find(key) == before


@pytest.mark.parametrize(
    "status",
    [Status.STARTED, Status.INDETERMINATE, Status.AWAITING_APPROVAL, Status.DENIED, Status.COMPENSATED],
)
async def test_settle_accepts_only_completed_or_failed(ledger: Ledger, status: Status) -> None:
    key = await indeterminate(ledger)
    before = await ledger.find(key)

    with pytest.raises(ValueError, match="completed or failed"):
        await ledger.settle(key, status=status, actor="op-alice", reason="because")

    assert await ledger.find(key) == before


async def test_settle_of_another_tenants_key_is_not_found(ledger: Ledger) -> None:
    key = await indeterminate(ledger, tenant="acme")
    before = await ledger.get(key)

    with pytest.raises(RecordNotFoundError) as caught:
        await ledger.settle(key, status=Status.FAILED, actor="op-mallory", reason="x", tenant="globex")
    with pytest.raises(RecordNotFoundError):
        await ledger.get(key, tenant="globex")

    assert caught.value.key == key
    assert await ledger.get(key) == before


async def test_settle_of_an_unknown_key_is_not_found(ledger: Ledger) -> None:
    with pytest.raises(RecordNotFoundError):
        await ledger.settle("run-x:call-1", status=Status.FAILED, actor="op-alice", reason="x")


async def test_a_started_call_cannot_be_settled_by_an_operator_while_its_owner_holds_it(
    ledger: Ledger,
) -> None:
    key = await started(ledger, lease=timedelta(minutes=5))
    before = await ledger.find(key)

    with pytest.raises(InvalidTransitionError) as caught:
        await ledger.settle(key, status=Status.FAILED, actor="op-alice", reason="looks stuck")

    assert not isinstance(caught.value, AlreadySettledError)
    assert caught.value.current_status == "started"
    assert await ledger.find(key) == before


# -- outcomes from the owner and from others ---------------------------------------------------------


async def test_non_owner_outcome_changes_nothing_but_is_recorded(ledger: Ledger) -> None:
    key = await started(ledger, owner="worker-1")
    before = await ledger.find(key)

    with pytest.raises(OutcomeIgnoredError, match="not the owner"):
        await ledger.complete(key, owner="worker-2", result={"credit_id": "cr_2"})
    with pytest.raises(OutcomeIgnoredError, match="not the owner"):
        await ledger.fail(key, owner="worker-3", kind=FailureKind.REJECTED, error="declined")

    assert await ledger.find(key) == before
    ignored = [e for e in (await ledger.get(key)).events if e.kind == "outcome_ignored"]
    assert [(e.actor, e.detail["reported"]) for e in ignored] == [
        ("worker-2", "completed"),
        ("worker-3", "failed"),
    ]
    assert ignored[0].detail["result"] == {"credit_id": "cr_2"}
    assert all(e.from_status is Status.STARTED and e.to_status is None for e in ignored)


async def test_outcome_after_settling_changes_nothing_but_is_recorded(ledger: Ledger) -> None:
    # The late outcomes agree with the decision (a contradicting one is a conflict:
    # tests/test_ledger_conflicts.py).
    key = await indeterminate(ledger, owner="worker-1")
    await ledger.settle(key, status=Status.COMPLETED, actor="op-alice", reason="credit in billing")
    before = await ledger.find(key)

    with pytest.raises(OutcomeIgnoredError) as caught:
        await ledger.complete(key, owner="worker-1", result={"credit_id": "cr_late"})
    await ledger.record_late_outcome(
        key, actor="reconcile-hook", status=Status.COMPLETED, evidence={"credit_id": "cr_late"}
    )

    assert caught.value.settled_by == "op-alice"
    assert "op-alice" in str(caught.value)
    assert await ledger.find(key) == before
    events = (await ledger.get(key)).events
    assert [e.kind for e in events[-2:]] == ["outcome_ignored", "late_outcome"]
    assert events[-2].detail["result"] == {"credit_id": "cr_late"}
    assert (events[-1].actor, events[-1].to_status) == ("reconcile-hook", Status.COMPLETED)
    assert events[-1].evidence == {"credit_id": "cr_late"}


async def test_owners_late_outcome_settles_an_indeterminate_call(ledger: Ledger) -> None:
    completed_key = await indeterminate(ledger, owner="worker-1")
    failed_key = await indeterminate(ledger, owner="worker-1")

    completed = await ledger.complete(completed_key, owner="worker-1", result={"credit_id": "cr_1"})
    failed = await ledger.fail(failed_key, owner="worker-1", kind=FailureKind.REJECTED, error="declined")

    assert completed.status is Status.COMPLETED
    assert completed.result == {"credit_id": "cr_1"}
    assert completed.settled_by == "worker-1"
    assert (failed.status, failed.failure_kind, failed.error) == (
        Status.FAILED,
        FailureKind.REJECTED,
        "declined",
    )
    for key, to in ((completed_key, Status.COMPLETED), (failed_key, Status.FAILED)):
        event = (await ledger.get(key)).events[-1]
        assert (event.kind, event.from_status, event.to_status) == (
            f"late_{to.value}",
            Status.INDETERMINATE,
            to,
        )


async def test_non_owners_outcome_does_not_settle_an_indeterminate_call(ledger: Ledger) -> None:
    key = await indeterminate(ledger, owner="worker-1")
    before = await ledger.find(key)

    with pytest.raises(OutcomeIgnoredError):
        await ledger.complete(key, owner="worker-2", result={"credit_id": "cr_2"})

    assert await ledger.find(key) == before


async def test_outcomes_for_an_unknown_key_are_not_found(ledger: Ledger) -> None:
    with pytest.raises(RecordNotFoundError):
        await ledger.complete("run-x:call-1", owner="worker-1", result={"ok": True})
    with pytest.raises(RecordNotFoundError):
        await ledger.mark_indeterminate("run-x:call-1", actor="ledger-check", reason="timed out")
    with pytest.raises(RecordNotFoundError):
        await ledger.record_late_outcome("run-x:call-1", actor="reconcile-hook", status=Status.COMPLETED)


# -- events ------------------------------------------------------------------------------------------


async def test_events_cannot_be_updated_deleted_or_truncated(ledger: Ledger, database_url: str) -> None:
    key = await started(ledger)
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("UPDATE tool_execution_events SET actor = 'someone else' WHERE key = $1", key)
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("DELETE FROM tool_execution_events WHERE key = $1", key)
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("TRUNCATE tool_execution_events CASCADE")
        assert [r["actor"] for r in await conn.fetch(queries.SELECT_EVENTS, key)] == ["worker-1"]
    finally:
        await conn.close()
