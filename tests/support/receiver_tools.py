"""Tools over the real example billing service for tests of what a receiver says back: refusals on
policy grounds, and resends inside its dedup window.

The credit tools send through `examples.billing.tools.send_credit` (the example's own mapping of
billing's answers). A test scripts how billing misbehaves for each request of one key with
`FAULTS_BY_KEY[key] = ["apply_then_hang", None, ...]`: the n-th request under the key meets the
n-th fault, set on its account for that one request (None: none). The worker runs in the test's process, so the
list is shared.

Besides billing's own fault modes, a request may meet one of these, played by the tool:
- `other_body`: sent with one cent more, so billing answers that the key was used with another body;
- `in_progress`: answered "request in progress" without reaching billing (what a receiver that locks
  a key while its first request runs says);
- `fenced`: the key is fenced at billing first (as a reconcile hook would), so billing answers that
  it has no credit for the key and never will;
- `on_the_wire`: the request never gets an answer (and never reaches billing) within the timeout.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from onceflow import (
    ReconcileOutcome,
    ToolContext,
    ToolRefusedError,
    ToolRejectedError,
    Toolset,
    external,
    read,
)
from onceflow.examples.billing.client import BillingClient
from onceflow.examples.billing.tools import send_credit
from onceflow.runtime.config import env

TOOL_TIMEOUT = timedelta(seconds=1)
# How long the billing service behind these tools honours a key (it keeps keys for good, so a day
# is an honest declaration).
DAY = timedelta(hours=24)
# Longer than the timeout (the contract), but shorter than timeout + the reconciler's 5 s margin
# plus the time the first send takes to go unknown: by the first reconcile round it has closed.
CLOSED_WINDOW = TOOL_TIMEOUT + timedelta(seconds=5.3)
HANG_SECONDS = 10.0  # longer than any test waits: the hung request never answers in time

FAULTS_BY_KEY: dict[str, list[str | None]] = {}
HOOK_ASKED: dict[str, int] = {}

toolset = Toolset("receiver-billing")


async def _credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    script = FAULTS_BY_KEY.get(context.idempotency_key)
    fault = script.pop(0) if script else None
    if fault == "in_progress":
        raise ToolRejectedError(f"a request with key {context.idempotency_key!r} is in progress")
    if fault == "on_the_wire":
        await asyncio.sleep(HANG_SECONDS)
    async with BillingClient(env("ONCEFLOW_BILLING_URL"), timeout=TOOL_TIMEOUT.total_seconds() + 1) as client:
        if fault == "other_body":
            await client.clear_account_fault(account_id)
            return await send_credit(client, account_id, amount_cents + 1, context.idempotency_key)
        if fault == "fenced":
            await client.fence_key(context.idempotency_key)
            fault = None
        # An account fault for exactly this request (each test uses an account of its own), so the
        # credit itself goes through the example's send_credit and its mapping of billing's answers.
        if fault is None:
            await client.clear_account_fault(account_id)
        else:
            await client.set_account_fault(account_id, fault, HANG_SECONDS, times=1)
        return await send_credit(client, account_id, amount_cents, context.idempotency_key)


async def cannot_tell(account_id: str, amount_cents: int, context: ToolContext) -> ReconcileOutcome:
    """A hook that never knows (like a lookup that cannot prove absence)."""
    HOOK_ASKED[context.idempotency_key] = HOOK_ASKED.get(context.idempotency_key, 0) + 1
    return ReconcileOutcome.unknown(source="a lookup that cannot tell")


@toolset.tool(external(timeout=TOOL_TIMEOUT), name="issue_credit")
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account, in cents, once."""
    return await _credit(account_id, amount_cents, context)


@toolset.tool(external(timeout=TOOL_TIMEOUT, dedup_window=DAY))
async def issue_credit_resendable(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account; billing honours the key for a day, and there is no reconcile hook."""
    return await _credit(account_id, amount_cents, context)


@toolset.tool(external(timeout=TOOL_TIMEOUT, dedup_window=DAY), reconcile=cannot_tell)
async def issue_credit_hooked(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account; the hook cannot tell, billing honours the key for a day."""
    return await _credit(account_id, amount_cents, context)


@toolset.tool(external(timeout=TOOL_TIMEOUT, dedup_window=CLOSED_WINDOW))
async def issue_credit_short_window(
    account_id: str, amount_cents: int, context: ToolContext
) -> dict[str, Any]:
    """Credit an account; its declared window is too short for any resend to arrive inside it."""
    return await _credit(account_id, amount_cents, context)


@toolset.tool(read(timeout=TOOL_TIMEOUT))
async def account_statement(account_id: str) -> dict[str, Any]:
    """The account's statement. Refused by policy for every account under review."""
    raise ToolRefusedError(f"{account_id} is under review: its statement may not be read")
