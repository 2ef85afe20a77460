"""Credit reservations with guards, put straight into the ledger: the calls the ledger's guard tests
make (tests/test_ledger_guards.py, tests/test_ledger_guards_entities.py)."""

from __future__ import annotations

import uuid
from typing import Any

from onceflow.ledger import CallIdentity, Guard, Ledger, ReserveResult, SideEffect

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
