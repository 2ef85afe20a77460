"""Guards in the ledger: intent, lineage, entity and budget, decided inside the reservation."""

from __future__ import annotations

import asyncio
import random
import uuid
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from onceflow.ledger import (
    CallIdentity,
    ConflictNotOpenError,
    FailureKind,
    Guard,
    GuardArgumentError,
    Ledger,
    OutcomeIgnoredError,
    Reservation,
    ReserveResult,
    ReusedCallError,
    SideEffect,
    Status,
)

CREDIT = {"account_id": "acct_1", "amount_cents": 2500}


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


async def reserve(
    ledger: Ledger,
    run: str,
    call_id: str,
    guard: Guard,
    *,
    arguments: dict[str, Any] | None = None,
    tenant: str = "t1",
    owner: str | None = None,
    approval: bool = False,
) -> ReserveResult:
    return await ledger.reserve(
        CallIdentity(tenant=tenant, run_id=run, tool_call_id=call_id),
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments=CREDIT if arguments is None else arguments,
        owner=owner or f"owner-{call_id}",
        approval=approval,
        guard=guard,
    )


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


# -- entity -----------------------------------------------------------------------------------------


def entity_guard(order: str, on_busy: str = "hold") -> Guard:
    return Guard(intent="allow", entity=order, exclusive=True, on_busy=on_busy)  # type: ignore[arg-type]


async def test_one_unresolved_call_per_entity_across_runs(ledger: Ledger) -> None:
    first = await reserve(ledger, run_id(), "c1", entity_guard("ord_1"))
    held = await reserve(ledger, run_id(), "c1", entity_guard("ord_1"))
    refused = await reserve(ledger, run_id(), "c1", entity_guard("ord_1", "refuse"))
    other_entity = await reserve(ledger, run_id(), "c1", entity_guard("ord_2"))
    other_tenant = await reserve(ledger, run_id(), "c1", entity_guard("ord_1"), tenant="t2")
    assert first.outcome is Reservation.NEW
    assert held.outcome is Reservation.HELD and held.record.held_by == first.record.key
    assert refused.outcome is Reservation.REFUSED and first.record.key in (refused.record.error or "")
    assert other_entity.outcome is Reservation.NEW
    assert other_tenant.outcome is Reservation.NEW

    await ledger.complete(first.record.key, owner=first.record.owner or "", result={"ok": 1})
    assert (await reserve(ledger, held.record.run_id, "c1", entity_guard("ord_1"))).outcome is Reservation.NEW


async def test_entity_slots_belong_to_one_toolsets_tool(ledger: Ledger) -> None:
    """Two servers' `refund` tools of the same name do not share an order's slot."""
    first = await reserve(ledger, run_id(), "c1", entity_guard("ord_ts").model_copy(update={"toolset": "a"}))
    other = await reserve(ledger, run_id(), "c1", entity_guard("ord_ts").model_copy(update={"toolset": "b"}))
    same = await reserve(ledger, run_id(), "c1", entity_guard("ord_ts").model_copy(update={"toolset": "a"}))
    # A caller that names no toolset (or a row from before toolsets were recorded) meets every one.
    unnamed = await reserve(ledger, run_id(), "c1", entity_guard("ord_ts"))
    assert first.outcome is Reservation.NEW and first.record.toolset == "a"
    assert other.outcome is Reservation.NEW and other.record.toolset == "b"
    assert same.outcome is Reservation.HELD and same.record.held_by == first.record.key
    assert unnamed.outcome is Reservation.HELD


async def test_fifty_racing_runs_on_one_entity_let_exactly_one_through(ledger: Ledger) -> None:
    results = await asyncio.gather(
        *(reserve(ledger, run_id(), "c1", entity_guard("ord_race")) for _ in range(50))
    )
    outcomes = [r.outcome for r in results]
    assert outcomes.count(Reservation.NEW) == 1
    assert outcomes.count(Reservation.HELD) == 49


async def test_the_database_refuses_a_second_unresolved_call_for_an_entity(
    database_url: str, ledger: Ledger
) -> None:
    """Even a write that skips the guards (here: by hand) cannot make an entity busy twice."""
    first = await reserve(ledger, run_id(), "c1", entity_guard("ord_db"))
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(
                "INSERT INTO tool_executions (key, tenant, run_id, tool_call_id, tool_name, side_effect,"
                " status, payload, payload_sha256, entity, entity_exclusive)"
                " SELECT 'r:x', tenant, 'r', 'x', tool_name, side_effect, 'started', payload,"
                " payload_sha256, entity, true FROM tool_executions WHERE key = $1",
                first.record.key,
            )
    finally:
        await conn.close()


# -- budgets ----------------------------------------------------------------------------------------


def budget(order: str, amount: int, limit: int = 10_000) -> Guard:
    return Guard(intent="allow", entity=order, amount=Decimal(amount), limit=Decimal(limit))


async def test_a_call_over_the_budget_is_refused_with_the_figures(ledger: Ledger) -> None:
    first = await reserve(ledger, run_id(), "c1", budget("ord_b", 6000))
    await ledger.complete(first.record.key, owner="owner-c1", result={"ok": 1})
    second = await reserve(ledger, run_id(), "c1", budget("ord_b", 3000))
    await ledger.mark_indeterminate(second.record.key, actor="test", reason="timed out")

    over = await reserve(ledger, run_id(), "c1", budget("ord_b", 2000))
    assert over.outcome is Reservation.REFUSED
    assert over.record.failure_kind is FailureKind.GUARD_REFUSED
    refused_event = (await ledger.get(over.record.key)).events[0]
    assert refused_event.kind == "guard_refused"
    assert refused_event.detail["completed"] == "6000"
    assert refused_event.detail["unresolved"] == "3000"
    fits = await reserve(ledger, run_id(), "c1", budget("ord_b", 1000))
    assert fits.outcome is Reservation.NEW

    # Only a settlement releases the unknown 3000: as not applied, it leaves the budget.
    await ledger.settle(
        second.record.key,
        status=Status.FAILED,
        actor="ops",
        reason="not applied",
        evidence={"provider_refunds": []},
    )
    now_fits = await reserve(ledger, run_id(), "c1", budget("ord_b", 2000))
    assert now_fits.outcome is Reservation.NEW


async def test_budgets_are_kept_per_toolset_and_per_currency(ledger: Ledger) -> None:
    def spend(toolset: str, amount: int, currency: str | None = None) -> Guard:
        fields = budget("ord_fx", amount, limit=1000).model_dump()
        return Guard(**{**fields, "toolset": toolset, "currency": currency})

    assert (await reserve(ledger, run_id(), "c1", spend("a", 800, "EUR"))).outcome is Reservation.NEW
    # Another toolset's tool of the same name, and another currency, are budgets of their own.
    assert (await reserve(ledger, run_id(), "c1", spend("b", 800, "EUR"))).outcome is Reservation.NEW
    assert (await reserve(ledger, run_id(), "c1", spend("a", 800, "USD"))).outcome is Reservation.NEW
    assert (await reserve(ledger, run_id(), "c1", spend("a", 800))).outcome is Reservation.NEW
    over = await reserve(ledger, run_id(), "c1", spend("a", 300, "EUR"))
    assert over.outcome is Reservation.REFUSED
    assert "300 EUR would exceed the limit of 1000 EUR" in (over.record.error or "")
    assert over.record.currency == "EUR"
    fits = await reserve(ledger, run_id(), "c1", spend("a", 200, "eur"))  # codes are upper-cased
    assert fits.outcome is Reservation.NEW and fits.record.currency == "EUR"


def test_a_currency_is_a_code_and_belongs_to_an_amount() -> None:
    with pytest.raises(ValueError, match="currency"):
        Guard(entity="o", amount=Decimal(1), limit=Decimal(2), currency="euro dollars")
    with pytest.raises(ValueError, match="currency"):
        Guard(entity="o", currency="EUR")


async def test_fifty_concurrent_calls_never_overdraw_one_balance(ledger: Ledger, database_url: str) -> None:
    """50 calls race for one balance while others settle; at no point do completed plus reserved
    amounts exceed the limit, and every amount the ledger let through fits."""
    limit = 10_000
    rng = random.Random(7)
    amounts = [rng.choice((300, 500, 800, 1200)) for _ in range(50)]
    stop = asyncio.Event()
    worst = 0

    async def watch() -> None:
        nonlocal worst
        conn = await asyncpg.connect(database_url)
        try:
            while not stop.is_set():
                used = await conn.fetchval(
                    "SELECT coalesce(sum(amount), 0) FROM tool_executions WHERE entity = 'ord_bal'"
                    " AND status IN ('started', 'indeterminate', 'completed', 'awaiting_approval')"
                )
                worst = max(worst, int(used))
                await asyncio.sleep(0)
        finally:
            await conn.close()

    async def one(i: int, amount: int) -> ReserveResult:
        await asyncio.sleep(rng.random() / 50)
        result = await reserve(ledger, run_id(), f"c{i}", budget("ord_bal", amount, limit))
        if result.may_send:
            owner = result.record.owner or ""
            match i % 3:  # a third complete, a third fail without effect, a third stay unknown
                case 0:
                    await ledger.complete(result.record.key, owner=owner, result={"i": i})
                case 1:
                    await ledger.fail(result.record.key, owner=owner, kind=FailureKind.REJECTED, error="no")
                case _:
                    await ledger.mark_indeterminate(result.record.key, actor="test", reason="lost")
        return result

    watcher = asyncio.create_task(watch())
    results = await asyncio.gather(*(one(i, a) for i, a in enumerate(amounts)))
    stop.set()
    await watcher

    assert worst <= limit
    passed = [r for r in results if r.may_send]
    refused = [r for r in results if r.outcome is Reservation.REFUSED]
    assert len(passed) + len(refused) == 50
    assert refused, "the amounts add up to more than the limit, so some must be refused"
    final = await ledger_used(database_url)
    assert final <= limit
    for r in refused:
        assert "would exceed the limit" in (r.record.error or "")


async def ledger_used(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(
            await conn.fetchval(
                "SELECT coalesce(sum(amount), 0) FROM tool_executions WHERE entity = 'ord_bal'"
                " AND status IN ('started', 'indeterminate', 'completed', 'awaiting_approval')"
            )
        )
    finally:
        await conn.close()


async def test_a_conflicted_failure_still_counts_against_the_budget(ledger: Ledger) -> None:
    """An operator said 'not applied', then the owner's answer said it completed: until someone looks,
    the amount stays reserved."""
    first = await reserve(ledger, run_id(), "c1", budget("ord_c", 8000))
    await ledger.mark_indeterminate(first.record.key, actor="test", reason="timed out")
    await ledger.settle(
        first.record.key,
        status=Status.FAILED,
        actor="ops",
        reason="not there",
        evidence={"looked": "billing"},
    )
    with pytest.raises(OutcomeIgnoredError):  # the owner's late answer is ignored, and flagged
        await ledger.complete(first.record.key, owner=first.record.owner or "", result={"late": True})
    assert (await ledger.get(first.record.key)).has_conflict
    over = await reserve(ledger, run_id(), "c1", budget("ord_c", 4000))
    assert over.outcome is Reservation.REFUSED


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
