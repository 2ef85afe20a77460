"""Plain calls put straight into the ledger for the settle and queue tests (tests/test_ledger_settle.py,
tests/test_ledger_reads.py): one started (its owner holding it for `lease`), one indeterminate."""

from __future__ import annotations

import uuid
from datetime import timedelta

from onceflow.ledger import CallIdentity, Ledger, SideEffect


async def started(
    ledger: Ledger, *, tenant: str = "t1", owner: str = "worker-1", lease: timedelta | None = None
) -> str:
    call = CallIdentity(tenant=tenant, run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1")
    await ledger.reserve(
        call,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments={"account_id": "acct_1", "amount_cents": 500},
        owner=owner,
        lease=lease,
    )
    return call.key


async def indeterminate(ledger: Ledger, *, tenant: str = "t1", owner: str = "worker-1") -> str:
    key = await started(ledger, tenant=tenant, owner=owner)
    await ledger.mark_indeterminate(key, actor="ledger-check", reason="activity timed out")
    return key
