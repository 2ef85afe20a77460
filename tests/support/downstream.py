"""An in-process downstream for workflow tests: it counts requests and effects per idempotency key and
misbehaves on cue. It is the *tool's* far side, not a stand-in for Temporal or PostgreSQL (those are
real). Like many real APIs it honours no idempotency key: every credit request that is not refused
applies again, so a key sent twice shows as two effects as well as two requests received."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from onceflow import (
    Guards,
    ReconcileOutcome,
    ToolContext,
    ToolNotAttemptedError,
    ToolRejectedError,
    Toolset,
    external,
    read,
)
from onceflow.ledger import ToolExecutionRecord


@dataclass
class Downstream:
    received: Counter[str] = field(default_factory=Counter)  # credit requests per key, refused or not
    effects: Counter[str] = field(default_factory=Counter)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Per account: "ok", "hang_after_apply", "reject", "locked"
    modes: dict[str, str] = field(default_factory=dict)
    read_failures_left: int = 0
    limit_failures_left: int = 0  # order_refundable fails this many times before it answers
    limit_reads: int = 0
    read_attempts: int = 0
    send_attempts: int = 0
    reconcile_calls: int = 0
    # Voids (compensations) applied, per compensation key.
    voids: Counter[str] = field(default_factory=Counter)

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    async def credit(self, account_id: str, amount_cents: int, key: str) -> dict[str, Any]:
        self.send_attempts += 1
        self.received[key] += 1
        mode = self.modes.get(account_id, "ok")
        if mode == "locked":
            raise ToolNotAttemptedError(f"account {account_id} is locked")
        if mode == "reject":
            raise ToolRejectedError(f"account {account_id} is closed")
        self.effects[key] += 1  # no dedup: a repeated key applies again
        if key not in self.results:  # what the reconcile hook finds: the first credit for the key
            self.results[key] = {
                "credit_id": f"cr_{len(self.results) + 1}",
                "account_id": account_id,
                "amount_cents": amount_cents,
            }
        if mode == "hang_after_apply":
            await asyncio.sleep(3600)
        return self.results[key]

    async def void(self, credit_key: str, key: str) -> dict[str, Any]:
        credit = self.results.get(credit_key)
        if credit is None:
            raise ToolRejectedError(f"no credit under {credit_key}")
        if key not in self.voids:
            self.voids[key] += 1
        if self.modes.get(credit["account_id"]) == "hang_void":
            await asyncio.sleep(3600)
        return {"voided": credit["credit_id"]}


DOWNSTREAM = Downstream()
toolset = Toolset("test-billing")


@toolset.tool(read(timeout=timedelta(seconds=2)))
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order."""
    DOWNSTREAM.read_attempts += 1
    if DOWNSTREAM.read_failures_left > 0:
        DOWNSTREAM.read_failures_left -= 1
        raise ConnectionError("transient: connection reset")
    return {"order_id": order_id, "account_id": f"acct_{order_id}", "amount_cents": 1250}


async def find_credit(account_id: str, amount_cents: int, context: ToolContext) -> ReconcileOutcome:
    DOWNSTREAM.reconcile_calls += 1
    found = DOWNSTREAM.results.get(context.idempotency_key)
    if found is None:
        return ReconcileOutcome.failed(looked_up=context.idempotency_key)
    return ReconcileOutcome.completed(
        found, result_reference=found["credit_id"], looked_up=context.idempotency_key
    )


@toolset.tool(external(timeout=timedelta(seconds=1)), reconcile=find_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account."""
    return await DOWNSTREAM.credit(account_id, amount_cents, context.idempotency_key)


@toolset.tool(external(timeout=timedelta(seconds=1)))
async def issue_credit_unreconciled(
    account_id: str, amount_cents: int, context: ToolContext
) -> dict[str, Any]:
    """Credit an account; no reconcile hook."""
    return await DOWNSTREAM.credit(account_id, amount_cents, context.idempotency_key)


async def void_credit(record: ToolExecutionRecord, context: ToolContext) -> dict[str, Any]:
    return await DOWNSTREAM.void(record.key, context.idempotency_key)


@toolset.tool(external(timeout=timedelta(seconds=1)), reconcile=find_credit, compensation=void_credit)
async def issue_credit_undoable(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account; an operator may void it."""
    return await DOWNSTREAM.credit(account_id, amount_cents, context.idempotency_key)


@toolset.tool(external(timeout=timedelta(seconds=1), approval=True), compensation=void_credit)
async def issue_credit_approved(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account once an operator approved it."""
    return await DOWNSTREAM.credit(account_id, amount_cents, context.idempotency_key)


# -- guarded tools (tests/test_guarded_runs*.py) ------------------------------------------------------
# No reconcile hooks: an unknown call stays unknown until the test settles it.


@toolset.tool(external(timeout=timedelta(seconds=1)), guards=Guards(intent="reuse"))
async def issue_credit_reusing(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account; the same credit asked again in one run is the same intent."""
    return await DOWNSTREAM.credit(account_id, amount_cents, context.idempotency_key)


@toolset.tool(external(timeout=timedelta(seconds=1)), guards=Guards(intent="allow"))
async def issue_credit_allowing(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account; every call is its own effect, unchecked."""
    return await DOWNSTREAM.credit(account_id, amount_cents, context.idempotency_key)


@toolset.tool(external(timeout=timedelta(seconds=1)), guards=Guards(replaceable=True))
async def issue_credit_replaceable(
    account_id: str, amount_cents: int, context: ToolContext
) -> dict[str, Any]:
    """Credit an account; a later call may correct an earlier one by naming it in `replaces`."""
    return await DOWNSTREAM.credit(account_id, amount_cents, context.idempotency_key)


# What an order may be refunded in total: its captured amount.
REFUNDABLE_CENTS = 1250


@toolset.tool(read(timeout=timedelta(seconds=2)))
async def order_refundable(order_id: str) -> dict[str, Any]:
    """How much an order may be refunded in total."""
    DOWNSTREAM.limit_reads += 1
    if DOWNSTREAM.limit_failures_left > 0:
        DOWNSTREAM.limit_failures_left -= 1
        raise ConnectionError("transient: the order service is unreachable")
    return {"order_id": order_id, "limit": REFUNDABLE_CENTS}


@toolset.tool(
    external(timeout=timedelta(seconds=1)),
    guards=Guards(entity="order_id", amount="amount_cents", limit_from="order_refundable"),
)
async def refund_order(order_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Refund an order; one refund per order at a time, within what the order may be refunded."""
    return await DOWNSTREAM.credit(f"acct_{order_id}", amount_cents, context.idempotency_key)


@toolset.tool(
    external(timeout=timedelta(seconds=1)),
    guards=Guards(entity="order_id", on_busy="refuse", amount="amount_cents", limit_from="order_refundable"),
)
async def refund_order_strict(order_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Refund an order; refused while another refund of it is unresolved."""
    return await DOWNSTREAM.credit(f"acct_{order_id}", amount_cents, context.idempotency_key)


@toolset.tool(
    external(timeout=timedelta(seconds=1), approval=True),
    guards=Guards(entity="order_id", amount="amount_cents", limit_from="order_refundable"),
)
async def refund_order_approved(order_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Refund an order once an operator approved it, within what the order may be refunded."""
    return await DOWNSTREAM.credit(f"acct_{order_id}", amount_cents, context.idempotency_key)


@toolset.tool(external(timeout=timedelta(seconds=1)), reconcile=find_credit, guards=Guards(intent="reuse"))
async def issue_credit_reusing_reconciled(
    account_id: str, amount_cents: int, context: ToolContext
) -> dict[str, Any]:
    """Credit an account; one intent per run, and a reconcile hook for a lost answer."""
    return await DOWNSTREAM.credit(account_id, amount_cents, context.idempotency_key)


@toolset.tool(external(timeout=timedelta(seconds=4)), reconcile=find_credit, guards=Guards(intent="reuse"))
async def issue_credit_slow_reconciled(
    account_id: str, amount_cents: int, context: ToolContext
) -> dict[str, Any]:
    """Credit an account; one intent per run, a reconcile hook, and a 4 s timeout: a call on the wire
    stays inside its owner's lease for 9 s (tests/test_guarded_runs.py)."""
    return await DOWNSTREAM.credit(account_id, amount_cents, context.idempotency_key)
