"""Guards in the ledger across runs: one unresolved call per entity, and budgets per entity, toolset
and currency, decided inside the reservation (the guards within one run: tests/test_ledger_guards.py)."""

from __future__ import annotations

import asyncio
import random
from decimal import Decimal

import asyncpg
import pytest

from onceflow.ledger import (
    FailureKind,
    Guard,
    Ledger,
    OutcomeIgnoredError,
    Reservation,
    ReserveResult,
    Status,
)
from tests.support.ledger_guards import reserve, run_id

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
