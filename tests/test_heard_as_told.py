"""The intent guard judges "heard" by what the model was told, and reuse by the effect it points to.

Against the real ledger (ledger/definitions/guarded_reserve.sql). Each test states what the model was
told of a call as the workflow passes it (`Heard`: the status and the settlement it came from) and
checks what the ledger decides for a repeat: a twin whose outcome changed since it was told (a
conflict acknowledged, a compensation) is not heard; a reused call is never itself a source of
reuse; two re-issues of two earlier effects are given one each.
"""

from __future__ import annotations

import pytest

from onceflow.ledger import (
    FailureKind,
    Guard,
    Heard,
    Ledger,
    OutcomeIgnoredError,
    Reservation,
    ReserveResult,
    Status,
    ToolExecutionRecord,
)
from tests.support.ledger_guards import reserve, run_id

EVIDENCE = {"checked": "the receiver's records"}


def told(record: ToolExecutionRecord) -> Heard:
    """What the model is told of a settled call: its status and the settlement it came from."""
    assert record.status.is_settled
    return Heard(tool_call_id=record.tool_call_id, status=record.status, settled_at=record.settled_at)


async def sent_and_completed(ledger: Ledger, run: str, call: str, guard: Guard) -> ToolExecutionRecord:
    reserved = await reserve(ledger, run, call, guard)
    assert reserved.may_send, f"{call} was not sent: {reserved.outcome}"
    return await ledger.complete(reserved.record.key, owner=reserved.record.owner or "", result={"id": call})


async def test_a_conflict_acknowledged_after_the_model_heard_failed_does_not_let_its_repeat_pay_twice(
    ledger: Ledger,
) -> None:
    """c1 settled failed; the model is told "failed" and asks again (c2, having heard c1). c1's owner
    then says it completed (a conflict): c2 is held. An operator acknowledges c1 as completed. The
    model heard "failed", not "completed": c2 is the same intent, given c1's result, never sent."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    key, owner = first.record.key, first.record.owner or ""
    await ledger.mark_indeterminate(key, actor="inspector", reason="timed out")
    failed = await ledger.settle(
        key, status=Status.FAILED, actor="operator:ann", reason="not in billing", evidence=EVIDENCE
    )
    heard_failed = told(failed)
    with pytest.raises(OutcomeIgnoredError, match="conflict"):  # the owner's late answer
        await ledger.complete(key, owner=owner, result={"id": "late"})
    assert (await ledger.get(key)).has_conflict

    second = await reserve(ledger, run, "c2", Guard(heard=frozenset({heard_failed})))
    assert second.outcome is Reservation.HELD and second.record.held_by == key

    await ledger.acknowledge_conflict(
        key, actor="operator:bob", status=Status.COMPLETED, reason="found it", evidence=EVIDENCE
    )
    woken = await reserve(ledger, run, "c2", Guard(heard=frozenset({heard_failed})))
    assert woken.outcome is Reservation.REUSED and not woken.may_send
    assert woken.record.reused_from == key and woken.record.result == {"id": "late"}


async def test_a_twin_still_standing_as_told_is_heard(ledger: Ledger) -> None:
    """The same conflict acknowledged as failed leaves c1 as the model was told it: c2 is sent."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    key, owner = first.record.key, first.record.owner or ""
    failed = await ledger.fail(key, owner=owner, kind=FailureKind.REJECTED, error="closed account")
    await ledger.record_late_outcome(key, actor="reconciler:hook", status=Status.COMPLETED)
    await ledger.acknowledge_conflict(
        key, actor="operator:bob", status=Status.FAILED, reason="not applied", evidence=EVIDENCE
    )
    again = await reserve(ledger, run, "c2", Guard(heard=frozenset({told(failed)})))
    assert again.outcome is Reservation.NEW


async def test_a_heard_twin_compensated_since_is_not_heard(ledger: Ledger) -> None:
    """Told "completed"; an operator undid it since. A repeat is not a new effect made knowingly: the
    model never heard of the undo, so it is refused, not sent."""
    run = run_id()
    first = await sent_and_completed(ledger, run, "c1", Guard())
    await ledger.mark_compensated(first.key, actor="operator:ann", reason="voided")
    again = await reserve(ledger, run, "c2", Guard(heard=frozenset({told(first)})))
    assert again.outcome is Reservation.REFUSED and "compensated" in (again.record.error or "")


async def test_a_call_reused_from_an_undone_effect_is_never_a_source_of_reuse(ledger: Ledger) -> None:
    """c1 completes, c2 (not heard) is reused from c1, an operator compensates c1. A later repeat that
    heard nothing, or heard only c2, is refused: it is never told "already took effect" with the
    result of an effect the ledger says was undone."""
    run = run_id()
    first = await sent_and_completed(ledger, run, "c1", Guard())
    reused = await reserve(ledger, run, "c2", Guard())
    assert reused.outcome is Reservation.REUSED and reused.record.reused_from == first.key
    await ledger.mark_compensated(first.key, actor="operator:ann", reason="voided")

    for call, heard in (("c3", frozenset[Heard]()), ("c4", frozenset({told(reused.record)}))):
        again = await reserve(ledger, run, call, Guard(heard=heard))
        assert again.outcome is Reservation.REFUSED, f"{call}: {again.outcome} {again.record.reused_from}"
        assert again.record.failure_kind is FailureKind.GUARD_REFUSED
        assert "compensated" in (again.record.error or "")


async def test_hearing_a_reused_call_is_hearing_the_effect_it_was_given(ledger: Ledger) -> None:
    """c2 was given c1's result and the model heard it: the effect is known, so c3 is sent."""
    run = run_id()
    first = await sent_and_completed(ledger, run, "c1", Guard())
    reused = await reserve(ledger, run, "c2", Guard())
    again = await reserve(ledger, run, "c3", Guard(heard=frozenset({told(reused.record)})))
    assert again.outcome is Reservation.NEW
    reserved = (await ledger.get(again.record.key)).events[0]
    assert set(reserved.detail["heard_twins"]) == {first.key, reused.record.key}


async def test_reissues_after_a_reset_are_paired_one_to_one_with_the_earlier_effects(ledger: Ledger) -> None:
    """The model credited (c1), heard it, credited again (c2): two effects. A reset takes both out of
    the conversation; the model re-issues them (r1, then r2 having heard r1). Each re-issue is given
    one original's result, r1 the first's and r2 the second's: never one credit id twice."""
    run = run_id()
    first = await sent_and_completed(ledger, run, "c1", Guard())
    second = await sent_and_completed(ledger, run, "c2", Guard(heard=frozenset({told(first)})))

    r1 = await reserve(ledger, run, "r1", Guard())
    assert r1.outcome is Reservation.REUSED and r1.record.reused_from == first.key
    r2 = await reserve(ledger, run, "r2", Guard(heard=frozenset({told(r1.record)})))
    assert r2.outcome is Reservation.REUSED and r2.record.reused_from == second.key
    assert r1.record.result != r2.record.result
    # Having heard both re-issues, a third is owed: sent.
    r3 = await reserve(ledger, run, "r3", Guard(heard=frozenset({told(r1.record), told(r2.record)})))
    assert r3.outcome is Reservation.NEW


async def test_twins_in_one_answer_beyond_the_effects_are_given_a_result_not_sent(ledger: Ledger) -> None:
    """Three identical calls at once: one is sent, the other two are given its result (one-to-one
    pairing never turns a repeat nobody heard into a send)."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    held = [await reserve(ledger, run, call, Guard()) for call in ("c2", "c3")]
    assert [h.outcome for h in held] == [Reservation.HELD, Reservation.HELD]
    await ledger.complete(first.record.key, owner=first.record.owner or "", result={"id": "c1"})
    woken: list[ReserveResult] = [await reserve(ledger, run, call, Guard()) for call in ("c2", "c3")]
    assert [w.outcome for w in woken] == [Reservation.REUSED, Reservation.REUSED]
    assert {w.record.reused_from for w in woken} == {first.record.key}


async def test_an_operator_settlement_after_the_model_was_told_is_a_new_outcome(ledger: Ledger) -> None:
    """Told "failed" by its owner, then re-sent under its own key (a reset replaying it) and
    completed: the model heard "failed", the call now stands "completed", so a repeat is reused."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    key = first.record.key
    failed = await ledger.fail(
        key, owner=first.record.owner or "", kind=FailureKind.NOT_ATTEMPTED, error="503"
    )
    retried = await reserve(ledger, run, "c1", Guard(), owner="owner-retry")
    assert retried.outcome is Reservation.RETRY
    await ledger.complete(key, owner="owner-retry", result={"id": "c1-again"})
    again = await reserve(ledger, run, "c2", Guard(heard=frozenset({told(failed)})))
    assert again.outcome is Reservation.REUSED and again.record.reused_from == key


async def test_a_told_status_is_what_counts_not_the_status_now_for_bare_ids_too(ledger: Ledger) -> None:
    """Inputs recorded before outcomes were passed (a bare tool call id) keep the old reading: the
    twin's status as it stands. A told outcome is held to what it said."""
    run = run_id()
    first = await sent_and_completed(ledger, run, "c1", Guard())
    bare = await reserve(ledger, run, "c2", Guard(heard=frozenset({"c1"})))
    assert bare.outcome is Reservation.NEW
    await ledger.complete(bare.record.key, owner=bare.record.owner or "", result={"id": "c2"})
    wrong = Heard(tool_call_id="c1", status=Status.FAILED, settled_at=first.settled_at)
    told_otherwise = await reserve(ledger, run, "c3", Guard(heard=frozenset({wrong, "c2"})))
    assert told_otherwise.outcome is Reservation.REUSED, "heard failed, it stands completed: not heard"
