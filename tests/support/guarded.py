"""Guarded calls put straight into the ledger (no run waits on them): held, budgeted, replacing."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

from onceflow.ledger import CallIdentity, Guard, Ledger, ReserveResult, SideEffect

REFUND = "issue_refund"


def new_run() -> str:
    return f"run-{uuid.uuid4().hex[:10]}"


def refund_arguments(order_id: str = "ord_1001", amount: int = 2500) -> dict[str, Any]:
    return {"order_id": order_id, "amount_cents": amount}


def budget(order_id: str, amount: int, limit: int = 5000, *, replaces: str | None = None) -> Guard:
    """A refund's guard: one unresolved refund per order, within the order's captured amount."""
    return Guard(
        entity=order_id,
        exclusive=True,
        amount=Decimal(amount),
        limit=Decimal(limit),
        replaces=replaces,
    )


async def reserve_refund(
    ledger: Ledger,
    run_id: str,
    tool_call_id: str,
    *,
    tenant: str = "acme",
    order_id: str = "ord_1001",
    amount: int = 2500,
    limit: int = 5000,
    replaces: str | None = None,
    agent: str = "refunds",
    tool: str = REFUND,
    arguments: dict[str, Any] | None = None,
) -> ReserveResult:
    """`arguments` (default: a refund of `amount` for `order_id`) may name another tool's; the
    guard's entity and amount are still `order_id` and `amount`."""
    call = CallIdentity(tenant=tenant, run_id=run_id, tool_call_id=tool_call_id, agent=agent)
    return await ledger.reserve(
        call,
        tool_name=tool,
        side_effect=SideEffect.EXTERNAL,
        arguments=arguments or refund_arguments(order_id, amount),
        owner="worker-seed",
        lease=timedelta(minutes=5),
        guard=budget(order_id, amount, limit, replaces=replaces),
    )


async def unknown_refund_and_a_held_repeat(
    ledger: Ledger, *, tenant: str = "acme", order_id: str | None = None, **call: Any
) -> tuple[str, str]:
    """A budgeted refund whose answer was lost (indeterminate), and the model's repeat of it under a
    new tool call id, held behind it. Returns (blocker, held)."""
    run_id = new_run()
    order_id = order_id or f"ord_{uuid.uuid4().hex[:6]}"
    first = await reserve_refund(ledger, run_id, "call_1_0", tenant=tenant, order_id=order_id, **call)
    await ledger.mark_indeterminate(first.record.key, actor="inspector", reason="timed out")
    again = await reserve_refund(ledger, run_id, "call_2_0", tenant=tenant, order_id=order_id, **call)
    assert again.record.status == "held", again
    return first.record.key, again.record.key
