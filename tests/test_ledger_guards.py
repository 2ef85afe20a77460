"""Guards in the ledger, within one run: intent (a repeat of a call held, reused, refused or sent)
and lineage (a call that replaces another), decided inside the reservation. Entity slots and budgets,
which hold across runs, are in tests/test_ledger_guards_entities.py."""

from __future__ import annotations

import pytest

from onceflow.ledger import (
    ConflictNotOpenError,
    FailureKind,
    Guard,
    GuardArgumentError,
    Ledger,
    OutcomeIgnoredError,
    Reservation,
    ReusedCallError,
    Status,
)
from tests.support.ledger_guards import CREDIT, reserve, run_id

# -- intent -----------------------------------------------------------------------------------------


async def test_same_call_of_a_run_is_held_while_the_first_is_unknown(ledger: Ledger) -> None:
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    assert first.outcome is Reservation.NEW
    await ledger.mark_indeterminate(first.record.key, actor="test", reason="timed out")

    second = await reserve(ledger, run, "c2", Guard())
    assert second.outcome is Reservation.HELD and not second.may_send
    assert second.record.status is Status.HELD
    assert second.record.held_by == first.record.key
    assert "c1" in (second.record.hold_reason or "")

    again = await reserve(ledger, run, "c2", Guard())  # asking again changes nothing while it waits
    assert again.outcome is Reservation.HELD
    events = (await ledger.get(second.record.key)).events
    assert [e.kind for e in events] == ["held"]


async def test_a_held_twin_gets_the_first_result_once_it_completed_nothing_is_sent(ledger: Ledger) -> None:
    """The model had not heard c1 when it asked for c2: the same intent, retried in disguise."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.mark_indeterminate(first.record.key, actor="test", reason="timed out")
    assert (await reserve(ledger, run, "c2", Guard())).outcome is Reservation.HELD
    await ledger.settle(
        first.record.key, status=Status.COMPLETED, actor="ops", reason="found it", result={"id": 1}
    )

    released = await reserve(ledger, run, "c2", Guard(), owner="owner-later")
    assert released.outcome is Reservation.REUSED and not released.may_send
    assert released.record.reused_from == first.record.key and released.record.result == {"id": 1}
    assert "nothing was sent again" in (released.record.reason or "")
    assert "make the call again" in (released.record.reason or "")
    kinds = [(e.kind, e.from_status) for e in (await ledger.get(released.record.key)).events]
    assert kinds == [("held", None), ("reused", Status.HELD)]


async def test_a_twin_the_model_had_heard_is_a_new_effect(ledger: Ledger) -> None:
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.complete(first.record.key, owner="owner-c1", result={"credit_id": "cr_1"})
    second = await reserve(ledger, run, "c2", Guard())  # the same answer as c1: not heard
    assert second.outcome is Reservation.REUSED

    third = await reserve(ledger, run, "c3", Guard(heard=frozenset({"c1", "c2"})))
    assert third.outcome is Reservation.NEW and third.may_send
    [reserved] = (await ledger.get(third.record.key)).events
    assert reserved.kind == "reserved"
    assert set(reserved.detail["heard_twins"]) == {first.record.key, second.record.key}
    # Hearing one twin is not hearing them all: c4 heard c1 only, so c3 (unheard) decides.
    fourth = await reserve(ledger, run, "c4", Guard(heard=frozenset({"c1"})))
    assert fourth.outcome is Reservation.HELD and fourth.record.held_by == third.record.key


async def test_a_twin_known_not_applied_lets_the_repeat_go(ledger: Ledger) -> None:
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.mark_indeterminate(first.record.key, actor="test", reason="timed out")
    assert (await reserve(ledger, run, "c2", Guard())).outcome is Reservation.HELD
    await ledger.settle(first.record.key, status=Status.FAILED, actor="ops", reason="not in billing")
    released = await reserve(ledger, run, "c2", Guard())
    assert released.outcome is Reservation.NEW and released.may_send


@pytest.mark.parametrize("intent", ["hold", "reuse"])
async def test_a_twin_failed_with_an_open_conflict_counts_as_possibly_applied(
    ledger: Ledger, intent: str
) -> None:
    """An operator said c1 did not apply, then its owner's answer said it completed: until someone
    looks, a repeat is held (even one that heard c1 fail), never sent."""
    run = run_id()
    guard = Guard(intent=intent)  # type: ignore[arg-type]
    first = await reserve(ledger, run, "c1", guard)
    await ledger.mark_indeterminate(first.record.key, actor="test", reason="timed out")
    await ledger.settle(first.record.key, status=Status.FAILED, actor="ops", reason="not there")
    with pytest.raises(OutcomeIgnoredError):
        await ledger.complete(first.record.key, owner=first.record.owner or "", result={"late": True})
    assert (await ledger.get(first.record.key)).has_conflict

    heard = await reserve(ledger, run, "c2", guard.model_copy(update={"heard": frozenset({"c1"})}))
    assert heard.outcome is Reservation.HELD and not heard.may_send
    assert heard.record.held_by == first.record.key
    assert "failed with an open conflict" in (heard.record.hold_reason or "")
    unheard = await reserve(ledger, run, "c3", guard)
    assert unheard.outcome is Reservation.HELD and not unheard.may_send


async def test_an_unheard_twin_an_operator_compensated_is_refused(ledger: Ledger) -> None:
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.complete(first.record.key, owner="owner-c1", result={"credit_id": "cr_1"})
    await ledger.mark_compensated(first.record.key, actor="operator:ann", reason="voided")
    again = await reserve(ledger, run, "c2", Guard())
    assert again.outcome is Reservation.REFUSED and "compensated" in (again.record.error or "")
    heard = await reserve(ledger, run, "c3", Guard(heard=frozenset({"c1"})))
    assert heard.outcome is Reservation.NEW


async def test_under_reuse_a_twin_an_operator_compensated_is_refused_heard_or_not(ledger: Ledger) -> None:
    """`reuse`: every twin is the same intent, so an intent an operator undid is not made again by
    a repeat, whatever the model heard (found by the property test: it was sent)."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard(intent="reuse"))
    await ledger.complete(first.record.key, owner="owner-c1", result={"credit_id": "cr_1"})
    await ledger.mark_compensated(first.record.key, actor="operator:ann", reason="voided")
    for call, heard in (("c2", frozenset()), ("c3", frozenset({"c1"}))):
        again = await reserve(ledger, run, call, Guard(intent="reuse", heard=heard))
        assert again.outcome is Reservation.REFUSED and not again.may_send
        assert "compensated" in (again.record.error or "") and "heard" not in (again.record.error or "")


async def test_a_reused_result_cannot_be_compensated_only_the_call_that_took_effect(ledger: Ledger) -> None:
    """Nothing was sent under a reused call's key: compensating it would undo the original's effect
    while the original still reads completed, and compensating that too would undo it twice."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.complete(first.record.key, owner=first.record.owner or "", result={"credit_id": "cr_1"})
    reused = await reserve(ledger, run, "c2", Guard())
    assert reused.outcome is Reservation.REUSED
    before = await ledger.get(reused.record.key)
    with pytest.raises(ReusedCallError) as asked:
        await ledger.request_compensation(reused.record.key, actor="operator:ann", reason="undo it")
    assert asked.value.reused_from == first.record.key and first.record.key in str(asked.value)
    with pytest.raises(ReusedCallError):
        await ledger.mark_compensated(reused.record.key, actor="operator:ann", reason="undone")
    assert await ledger.get(reused.record.key) == before
    await ledger.request_compensation(first.record.key, actor="operator:ann", reason="undo it")


async def test_reuse_ignores_what_the_model_heard(ledger: Ledger) -> None:
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard(intent="reuse"))
    await ledger.complete(first.record.key, owner="owner-c1", result={"credit_id": "cr_1"})
    again = await reserve(ledger, run, "c2", Guard(intent="reuse", heard=frozenset({"c1"})))
    assert again.outcome is Reservation.REUSED


async def test_reuse_hands_back_the_completed_result_and_sends_nothing(ledger: Ledger) -> None:
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard(intent="reuse"))
    await ledger.complete(
        first.record.key, owner="owner-c1", result={"credit_id": "cr_1"}, result_reference="cr_1"
    )

    second = await reserve(ledger, run, "c2", Guard(intent="reuse"))
    assert second.outcome is Reservation.REUSED and not second.may_send
    assert second.record.status is Status.COMPLETED
    assert second.record.result == {"credit_id": "cr_1"}
    assert second.record.reused_from == first.record.key
    assert second.record.settled_by == "onceflow:guard"

    # A third points at the call that took effect, not at the copy.
    third = await reserve(ledger, run, "c3", Guard(intent="reuse"))
    assert third.record.reused_from == first.record.key
    # And a repeated reservation of a reused key says so again.
    assert (await reserve(ledger, run, "c2", Guard(intent="reuse"))).outcome is Reservation.REUSED


async def test_reuse_still_sends_when_the_first_did_not_take_effect(ledger: Ledger) -> None:
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard(intent="reuse"))
    await ledger.fail(first.record.key, owner="owner-c1", kind=FailureKind.NOT_ATTEMPTED, error="locked")
    second = await reserve(ledger, run, "c2", Guard(intent="reuse"))
    assert second.outcome is Reservation.NEW


async def test_allow_checks_nothing(ledger: Ledger) -> None:
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard(intent="allow"))
    await ledger.mark_indeterminate(first.record.key, actor="test", reason="timed out")
    second = await reserve(ledger, run, "c2", Guard(intent="allow"))
    assert second.outcome is Reservation.NEW


async def test_intent_is_per_run_and_per_payload(ledger: Ledger) -> None:
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.mark_indeterminate(first.record.key, actor="test", reason="timed out")
    other_amount = await reserve(ledger, run, "c2", Guard(), arguments={**CREDIT, "amount_cents": 100})
    other_run = await reserve(ledger, run_id(), "c1", Guard())
    assert other_amount.outcome is Reservation.NEW
    assert other_run.outcome is Reservation.NEW


async def test_a_policy_refusal_refuses_the_same_call_again(ledger: Ledger) -> None:
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.fail(
        first.record.key, owner="owner-c1", kind=FailureKind.POLICY_REFUSED, error="over the limit"
    )
    again = await reserve(ledger, run, "c1", Guard())  # the same key: final, not re-reserved
    assert again.outcome is Reservation.SETTLED and again.record.attempt == 1
    second = await reserve(ledger, run, "c2", Guard())  # the model asking again, under a new id
    assert second.outcome is Reservation.REFUSED
    assert second.record.failure_kind is FailureKind.GUARD_REFUSED
    assert "over the limit" in (second.record.error or "")


async def test_a_held_call_holds_no_other_and_the_first_to_ask_again_decides(ledger: Ledger) -> None:
    """c2 and c3 are both held behind c1, which was sent; neither waits for the other (migration
    0017). After c1 settles not applied, whichever asks first goes; the other is held behind it."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.mark_indeterminate(first.record.key, actor="test", reason="timed out")
    second = await reserve(ledger, run, "c2", Guard())
    third = await reserve(ledger, run, "c3", Guard())
    assert second.record.held_by == third.record.held_by == first.record.key
    marked = await ledger.get(first.record.key, with_events=False)
    assert marked.holds_calls and not (await ledger.get(second.record.key, with_events=False)).holds_calls
    await ledger.settle(first.record.key, status=Status.FAILED, actor="ops", reason="not there")
    went = await reserve(ledger, run, "c3", Guard())  # c3 asks first: it goes, though c2 is older
    assert went.outcome is Reservation.NEW and went.may_send
    waits = await reserve(ledger, run, "c2", Guard())
    assert waits.outcome is Reservation.HELD and waits.record.held_by == went.record.key
    await ledger.complete(went.record.key, owner="owner-c3", result={"credit_id": "cr_3"})
    reused = await reserve(ledger, run, "c2", Guard())
    assert reused.outcome is Reservation.REUSED and reused.record.reused_from == went.record.key


async def test_a_retried_call_waits_for_a_younger_twin_that_was_sent(ledger: Ledger) -> None:
    """c1 failed without effect; the model, not having heard it, asked c2, which was sent. When c1's
    key is reserved again (a retry), c2 may be taking effect: c1 is held behind it, though c2 is the
    younger. A held twin holds no call at all (migration 0017)."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.fail(first.record.key, owner="owner-c1", kind=FailureKind.NOT_ATTEMPTED, error="no route")
    second = await reserve(ledger, run, "c2", Guard())
    assert second.outcome is Reservation.NEW

    retried = await reserve(ledger, run, "c1", Guard(), owner="owner-c1-again")
    assert retried.outcome is Reservation.HELD and not retried.may_send
    assert retried.record.held_by == second.record.key

    await ledger.complete(second.record.key, owner="owner-c2", result={"credit_id": "cr_2"})
    after = await reserve(ledger, run, "c1", Guard(), owner="owner-c1-again")
    assert after.outcome is Reservation.REUSED and after.record.reused_from == second.record.key


# -- lineage ----------------------------------------------------------------------------------------


async def test_a_replacement_is_refused_while_the_original_is_unresolved(ledger: Ledger) -> None:
    run = run_id()
    original = await reserve(ledger, run, "c1", Guard())
    await ledger.mark_indeterminate(original.record.key, actor="test", reason="timed out")
    changed = {**CREDIT, "amount_cents": 2000}

    refused = await reserve(ledger, run, "c2", Guard(replaces=original.record.key), arguments=changed)
    assert refused.outcome is Reservation.REFUSED
    assert refused.record.replaces == original.record.key
    assert "still indeterminate" in (refused.record.error or "")

    await ledger.settle(original.record.key, status=Status.COMPLETED, actor="ops", reason="found it")
    accepted = await reserve(ledger, run, "c3", Guard(replaces=original.record.key), arguments=changed)
    assert accepted.outcome is Reservation.NEW
    assert accepted.record.replaces == original.record.key
    reserved = (await ledger.get(accepted.record.key)).events[0]
    assert reserved.detail["replaces"] == original.record.key

    # The chain stays linear: a second replacement of the same call is refused.
    other = await reserve(
        ledger, run, "c4", Guard(replaces=original.record.key), arguments={**CREDIT, "amount_cents": 1}
    )
    assert other.outcome is Reservation.REFUSED and f"{run}:c3" in (other.record.error or "")


async def test_a_replacement_of_nothing_is_bad_input_and_records_nothing(ledger: Ledger) -> None:
    run = run_id()
    with pytest.raises(GuardArgumentError, match="no call of this run"):
        await reserve(ledger, run, "c2", Guard(replaces=f"{run}:c9"))
    assert await ledger.find(f"{run}:c2") is None
    elsewhere = await reserve(ledger, run_id(), "c1", Guard())
    with pytest.raises(GuardArgumentError, match="no call of this run"):
        await reserve(ledger, run, "c3", Guard(replaces=elsewhere.record.key))


# -- reports about reused calls --------------------------------------------------------------------


async def test_a_late_report_about_a_reused_call_changes_nothing(ledger: Ledger) -> None:
    """A reused call was never sent under its key: a reconciler's report about it contradicts
    nothing, so it raises no conflict (found by tests/test_ledger_properties.py: acknowledging such a
    conflict as failed broke the reused-is-completed constraint with a raw database error)."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.complete(first.record.key, owner="owner-c1", result={"credit_id": "cr_1"})
    reused = await reserve(ledger, run, "c2", Guard())
    assert reused.outcome is Reservation.REUSED

    after = await ledger.record_late_outcome(reused.record.key, actor="reconciler", status=Status.FAILED)
    assert (after.status, after.has_conflict) == (Status.COMPLETED, False)
    [*_, last] = (await ledger.get(reused.record.key)).events
    assert (last.kind, last.to_status) == ("outcome_ignored", Status.FAILED)
    assert "never sent" in (last.reason or "")
    with pytest.raises(ConflictNotOpenError):
        await ledger.acknowledge_conflict(
            reused.record.key, actor="operator:ops", status=Status.FAILED, reason="x", evidence={"a": 1}
        )


async def test_an_owner_report_about_a_reused_call_changes_nothing(ledger: Ledger) -> None:
    """The owner a reused call was handed to sent nothing under its key: its report (here a failure)
    contradicts nothing, raises no conflict and is ignored (found by tests/test_ledger_properties.py:
    acknowledging such a conflict as compensated broke the reused-is-completed constraint)."""
    run = run_id()
    first = await reserve(ledger, run, "c1", Guard())
    await ledger.complete(first.record.key, owner="owner-c1", result={"credit_id": "cr_1"})
    reused = await reserve(ledger, run, "c2", Guard())
    assert reused.outcome is Reservation.REUSED
    owner = reused.record.owner
    assert owner is not None

    with pytest.raises(OutcomeIgnoredError):
        await ledger.fail(reused.record.key, owner=owner, kind=FailureKind.NOT_ATTEMPTED, error="no")
    after = await ledger.get(reused.record.key)
    assert (after.status, after.has_conflict) == (Status.COMPLETED, False)
    [*_, last] = after.events
    assert last.kind == "outcome_ignored" and "never sent" in (last.reason or "")
    with pytest.raises(ConflictNotOpenError):
        await ledger.acknowledge_conflict(
            reused.record.key, actor="operator:ops", status=Status.COMPENSATED, reason="x", evidence={"a": 1}
        )
