"""What operators read and decide about guarded calls: the replacement chain, the calls held behind
another, settling a held call (refused, naming the blocker), and the evidence a budget's release
needs. Real PostgreSQL."""

from __future__ import annotations

import asyncpg
import pytest

from onceflow.ledger import (
    EventSource,
    EvidenceRequiredError,
    FailureKind,
    HeldCallError,
    Ledger,
    OwnerLeaseLiveError,
    ReasonRequiredError,
    Reservation,
    Status,
)
from tests.support.guarded import new_run, reserve_refund, unknown_refund_and_a_held_repeat


async def replacement_chain(ledger: Ledger, tenant: str = "acme") -> list[str]:
    """A completed refund; a replacement of it (completed); two replacements of that one, the first
    refused by the receiver, the second in flight. Returns their keys, oldest first."""
    run_id = new_run()
    first = await reserve_refund(ledger, run_id, "call_1_0", tenant=tenant, amount=1000, limit=100_000)
    await ledger.complete(first.record.key, owner="worker-seed", result={"refund_id": "rf_1"})
    second = await reserve_refund(
        ledger, run_id, "call_2_0", tenant=tenant, amount=900, limit=100_000, replaces=first.record.key
    )
    await ledger.complete(second.record.key, owner="worker-seed", result={"refund_id": "rf_2"})
    third = await reserve_refund(
        ledger, run_id, "call_3_0", tenant=tenant, amount=800, limit=100_000, replaces=second.record.key
    )
    await ledger.fail(third.record.key, owner="worker-seed", kind=FailureKind.REJECTED, error="no")
    fourth = await reserve_refund(
        ledger, run_id, "call_4_0", tenant=tenant, amount=700, limit=100_000, replaces=second.record.key
    )
    assert fourth.outcome is Reservation.NEW, fourth
    return [r.record.key for r in (first, second, third, fourth)]


async def test_the_lineage_of_any_call_in_a_chain_is_the_whole_chain_oldest_first(ledger: Ledger) -> None:
    keys = await replacement_chain(ledger)
    for key in keys:
        chain = await ledger.lineage(key, tenant="acme")
        assert [r.key for r in chain] == keys
    chain = await ledger.lineage(keys[0], tenant="acme")
    assert [r.replaces for r in chain] == [None, keys[0], keys[1], keys[1]]
    assert [r.status for r in chain] == [Status.COMPLETED, Status.COMPLETED, Status.FAILED, Status.STARTED]


async def test_a_call_that_replaces_nothing_and_was_not_replaced_has_no_lineage(ledger: Ledger) -> None:
    alone = await reserve_refund(ledger, new_run(), "call_1_0")
    assert await ledger.lineage(alone.record.key, tenant="acme") == []


async def test_lineage_is_scoped_to_the_tenant(ledger: Ledger) -> None:
    keys = await replacement_chain(ledger, tenant="globex")
    assert await ledger.lineage(keys[1], tenant="acme") == []
    assert len(await ledger.lineage(keys[1], tenant="globex")) == 4


async def test_the_calls_held_behind_a_call_are_listed_for_it(ledger: Ledger) -> None:
    blocker, held = await unknown_refund_and_a_held_repeat(ledger)
    record = await ledger.get(held)
    assert (record.status, record.held_by) == (Status.HELD, blocker)
    assert record.hold_reason and "call_1_0" in record.hold_reason
    assert await ledger.held_behind(blocker, tenant="acme") == [held]
    assert await ledger.held_behind(blocker, tenant="globex") == []
    assert await ledger.held_behind(held, tenant="acme") == []


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED])
async def test_settling_a_held_call_is_refused_naming_the_call_it_waits_for(
    ledger: Ledger, status: Status
) -> None:
    blocker, held = await unknown_refund_and_a_held_repeat(ledger)
    before = await ledger.get(held)
    with pytest.raises(HeldCallError) as refused:
        await ledger.settle(
            held, status=status, actor="operator:alice", reason="looked", evidence={"ticket": "T-1"}
        )
    assert refused.value.held_by == blocker
    assert refused.value.current_status == "held"
    assert blocker in str(refused.value) and "nothing was sent" in str(refused.value).lower()
    assert await ledger.get(held) == before


async def test_approving_or_denying_a_held_call_is_refused_the_same_way(ledger: Ledger) -> None:
    blocker, held = await unknown_refund_and_a_held_repeat(ledger)
    with pytest.raises(HeldCallError, match=blocker):
        await ledger.approve(held, actor="operator:alice")
    with pytest.raises(HeldCallError, match=blocker):
        await ledger.deny(held, actor="operator:alice", reason="no")


@pytest.mark.parametrize("evidence", [None, {}, [], "   "])
async def test_settling_a_budgeted_unknown_call_as_failed_needs_evidence(
    ledger: Ledger, evidence: object
) -> None:
    blocker, _ = await unknown_refund_and_a_held_repeat(ledger, order_id="ord_ev")
    before = await ledger.get(blocker)
    for source in (EventSource.API, EventSource.SIGNAL):
        with pytest.raises(EvidenceRequiredError) as refused:
            await ledger.settle(
                blocker,
                status=Status.FAILED,
                actor="operator:alice" if source is EventSource.API else "signal:alice",
                reason="nothing in the billing console",
                evidence=evidence,
                source=source,
            )
        assert isinstance(refused.value, ReasonRequiredError)  # handled wherever a reason is missing
        assert "2500" in str(refused.value) and "ord_ev" in str(refused.value)
    assert await ledger.get(blocker) == before


async def test_settling_it_as_completed_needs_no_evidence_because_nothing_is_released(
    ledger: Ledger,
) -> None:
    blocker, _ = await unknown_refund_and_a_held_repeat(ledger)
    record = await ledger.settle(blocker, status=Status.COMPLETED, actor="operator:alice", reason="seen")
    assert record.status is Status.COMPLETED


async def test_a_reconcile_hooks_verdict_is_evidence_enough(ledger: Ledger) -> None:
    blocker, _ = await unknown_refund_and_a_held_repeat(ledger)
    record = await ledger.settle(
        blocker,
        status=Status.FAILED,
        actor="reconciler",
        reason="reconcile hook proved the effect absent",
        source=EventSource.RECONCILER,
    )
    assert record.status is Status.FAILED


async def test_unbudgeted_calls_settle_as_failed_on_a_reason_alone(ledger: Ledger) -> None:
    from tests.support.ledger_calls import indeterminate

    key = await indeterminate(ledger, tenant="acme")
    record = await ledger.settle(key, status=Status.FAILED, actor="operator:alice", reason="not there")
    assert record.status is Status.FAILED


async def test_only_a_settlement_with_evidence_releases_the_amount_for_a_new_call(ledger: Ledger) -> None:
    run_id = new_run()
    first = await reserve_refund(ledger, run_id, "call_1_0", order_id="ord_cap", amount=4000, limit=5000)
    await ledger.mark_indeterminate(first.record.key, actor="inspector", reason="timed out")
    # Another run's refund of the same order: the order is busy, so it waits.
    other = await reserve_refund(ledger, new_run(), "call_1_0", order_id="ord_cap", amount=2000, limit=5000)
    assert other.outcome is Reservation.HELD
    with pytest.raises(EvidenceRequiredError):
        await ledger.settle(first.record.key, status=Status.FAILED, actor="operator:alice", reason="gone")
    again = await reserve_refund(ledger, other.record.run_id, "call_1_0", order_id="ord_cap", amount=2000)
    assert again.outcome is Reservation.HELD  # still unknown, still counted
    await ledger.settle(
        first.record.key,
        status=Status.FAILED,
        actor="operator:alice",
        reason="no refund in the processor",
        evidence={"processor_query": "refunds?order=ord_cap", "found": 0},
    )
    released = await reserve_refund(ledger, other.record.run_id, "call_1_0", order_id="ord_cap", amount=2000)
    assert released.may_send and released.record.status is Status.STARTED, released
    settled = (await ledger.get(first.record.key)).events[-1]
    assert settled.evidence == {"processor_query": "refunds?order=ord_cap", "found": 0}


async def lease_ended(database_url: str, key: str) -> None:
    """End the owner's lease on `key`, in this test's own database (no API sets a time)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE tool_executions SET lease_expires_at = clock_timestamp() - interval '1 second'"
            " WHERE key = $1",
            key,
        )
    finally:
        await conn.close()


async def test_the_reconciler_may_not_say_not_there_while_the_owners_request_may_still_land(
    ledger: Ledger, database_url: str
) -> None:
    """The owner timed out and said "unknown" within its lease: its request may still land. A lookup
    that finds nothing then proves nothing, so the reconciler's `failed` is refused until the lease
    ends; its `completed` (the effect is there) is not. (Found by the model of issue 40, F1.)"""
    blocker, _ = await unknown_refund_and_a_held_repeat(ledger)
    settle = {
        "actor": "reconciler",
        "reason": "lookup",
        "source": EventSource.RECONCILER,
        "after_owner_lease": True,
    }
    with pytest.raises(OwnerLeaseLiveError):
        await ledger.settle(blocker, status=Status.FAILED, **settle)  # type: ignore[arg-type]
    assert (await ledger.get(blocker)).status is Status.INDETERMINATE
    await lease_ended(database_url, blocker)
    assert (await ledger.settle(blocker, status=Status.FAILED, **settle)).status is Status.FAILED  # type: ignore[arg-type]
