"""The drill agent's tools and model wrapper: the billing tools, with a place to stop at each kill point.

Workers load these through the drill's agents.yaml (see scenario.py). Nothing here stops unless the
runner armed a point for the run (points.py); unarmed, the tools behave like the example billing tools.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from onceflow import (
    Guards,
    ReconcileOutcome,
    ToolContext,
    Toolset,
    external,
    read,
)
from onceflow.drill.points import KillPoint, claim, hold
from onceflow.drill.scenario import OPERATOR_ACCOUNTS
from onceflow.examples.billing.client import BillingClient
from onceflow.examples.billing.tools import send_credit
from onceflow.models import Model
from onceflow.runtime.config import env
from onceflow.sdk.payloads import ModelCallInput, ModelTurn

# Short, so that a killed attempt is declared lost soon (activity timeout = tool timeout + 5 s), yet
# long enough for the runner to see billing holding a request and kill before the tool gives up.
CREDIT_TIMEOUT = timedelta(seconds=3)
LOOKUP_TIMEOUT = timedelta(seconds=5)

# Tests of the drill only (`onceflow drill --sabotage-intent allow|reuse` sets it for the workers):
# declare the credit with an intent other than the default, so that the drill must fail: `allow`
# pays an unheard twin again, `reuse` answers the repeat the model asked after hearing with the
# twin's result, so an owed credit is never paid.
SABOTAGE_INTENT_ENV = "ONCEFLOW_DRILL_SABOTAGE_INTENT"

toolset = Toolset("drill-billing")


def credit_guards() -> Guards:
    """The default intent rule (`hold`): an unheard twin is the same intent, a heard repeat is new."""
    sabotage = os.environ.get(SABOTAGE_INTENT_ENV)
    if not sabotage:
        return Guards()
    if sabotage not in ("allow", "reuse"):
        raise ValueError(f"{SABOTAGE_INTENT_ENV} must be allow or reuse, not {sabotage!r}")
    return Guards(intent="allow" if sabotage == "allow" else "reuse")


def _billing(timeout: float) -> BillingClient:
    return BillingClient(env("ONCEFLOW_BILLING_URL"), timeout=timeout)


@toolset.tool(read(timeout=LOOKUP_TIMEOUT))
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order: its account and amount."""
    async with _billing(LOOKUP_TIMEOUT.total_seconds()) as client:
        order = await client.get_order(order_id)
    return order.model_dump(mode="json")


async def find_credit(account_id: str, amount_cents: int, context: ToolContext) -> ReconcileOutcome:
    """Reconcile hook: fence the key, so that "no credit" stays true, or return the credit found.

    Accounts the infrastructure drills reserve for operators (OPERATOR_ACCOUNTS): it cannot tell,
    and only an operator settles the call."""
    if account_id.startswith(OPERATOR_ACCOUNTS):
        return ReconcileOutcome.unknown(note="only an operator can tell (a drill account)")
    async with _billing(CREDIT_TIMEOUT.total_seconds()) as client:
        credit = await client.fence_key(context.idempotency_key)
    # Kill point: the hook knows the answer, the ledger does not yet.
    await hold(context.run_id, KillPoint.RECONCILE, context.idempotency_key)
    if credit is None:
        return ReconcileOutcome.failed(source="billing fence", idempotency_key=context.idempotency_key)
    return ReconcileOutcome.completed(credit, result_reference=credit["credit_id"], source="billing by key")


@toolset.tool(external(timeout=CREDIT_TIMEOUT), reconcile=find_credit, guards=credit_guards())
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account, in cents, once, with the call's idempotency key."""
    key = context.idempotency_key
    # Kill point: reserved in the ledger (this runs only after the reservation), nothing sent yet.
    await hold(context.run_id, KillPoint.BEFORE_SEND, key, tool_call_id=context.tool_call_id)
    # Kill point: billing holds the request (the runner set a fault on the account). Announce only;
    # the runner kills once billing has the request.
    claim(context.run_id, KillPoint.DOWNSTREAM, key)
    async with _billing(CREDIT_TIMEOUT.total_seconds() + 1) as client:
        credit = await send_credit(client, account_id, amount_cents, key)
    # Kill point: billing answered, the outcome is not recorded yet.
    await hold(context.run_id, KillPoint.AFTER_ANSWER, key, tool_call_id=context.tool_call_id)
    return credit


class HoldingModel:
    """A model that stops inside the model call of the turn the runner armed (condition `turn`)."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner

    async def respond(self, request: ModelCallInput) -> ModelTurn:
        turn = sum(1 for message in request.messages if message.role == "assistant")
        await hold(request.run_id, KillPoint.MODEL, turn=turn)
        return await self.inner.respond(request)


def holding_model(inner: Model) -> Model:
    """The `model.wrapper` the drill's agents.yaml names."""
    return HoldingModel(inner)
