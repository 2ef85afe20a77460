"""The drill agents' tools and model wrappers: the billing tools, with a place to stop at each kill
point, and models that write down what they were told (told.py), wait at a gate the drill closed
(gates.py) and, for the reset runs, mint a new tool call id on every answer.

Workers load these through the drill's agents.yaml (see scenario.py). Nothing here stops unless the
runner armed a point for the run (points.py) or closed a gate (gates.py); unarmed, the tools behave
like the example billing tools.
"""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from typing import Any

from onceflow import (
    Guards,
    ReconcileOutcome,
    ToolContext,
    Toolset,
    external,
    kit_receiver,
    read,
)
from onceflow.drill.gates import left_to_operator, wait_at_turn
from onceflow.drill.points import KillPoint, claim, hold
from onceflow.drill.told import write_down
from onceflow.examples.billing.client import BillingClient, BillingKeyInProgress
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

    A call the drill left to its operator (a conflict run's first credit, gates.py) gets "unknown":
    nobody but the operator settles it, as with a receiver that cannot be searched."""
    if left_to_operator(context.run_id, context.tool_call_id):
        return ReconcileOutcome.unknown(source="drill: left to the operator")
    async with _billing(CREDIT_TIMEOUT.total_seconds()) as client:
        try:
            credit = await client.fence_key(context.idempotency_key)
        except BillingKeyInProgress:
            return ReconcileOutcome.unknown(source="billing fence", in_progress=True)
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


# The receiver drill (onceflow/drill/kit.py): the credit as an application declares it when its
# receiver is on onceflow's receiver kit: one line, and no reconcile hook of its own.
kit_toolset = Toolset("drill-kit")


@kit_toolset.tool(
    external(timeout=CREDIT_TIMEOUT),
    name="issue_credit",
    receiver=kit_receiver(url_env="ONCEFLOW_BILLING_URL", timeout=CREDIT_TIMEOUT.total_seconds()),
)
async def kit_issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account, in cents, once, with the call's idempotency key."""
    async with _billing(CREDIT_TIMEOUT.total_seconds() + 1) as client:
        return await send_credit(client, account_id, amount_cents, context.idempotency_key)


class HoldingModel:
    """The drill's model wrapper: it writes down the conversation it was given (told.py), stops
    inside the model call of the turn the runner armed (kill point `model`, condition `turn`),
    waits at a turn the runner gated (gates.py), and with `fresh_ids` gives every tool call of its
    answer a new id, as real providers do (so a reset makes it re-issue calls under new ids)."""

    def __init__(self, inner: Model, *, fresh_ids: bool = False) -> None:
        self.inner = inner
        self.fresh_ids = fresh_ids

    async def respond(self, request: ModelCallInput) -> ModelTurn:
        turn = sum(1 for message in request.messages if message.role == "assistant")
        write_down(request)
        await hold(request.run_id, KillPoint.MODEL, turn=turn)
        await wait_at_turn(request.run_id, turn)
        answer = await self.inner.respond(request)
        if not self.fresh_ids:
            return answer
        calls = [
            call.model_copy(update={"id": f"call_{uuid.uuid4().hex[:10]}"}) for call in answer.tool_calls
        ]
        return answer.model_copy(update={"tool_calls": calls})


def holding_model(inner: Model) -> Model:
    """The `model.wrapper` of the drill's agents with the script's own ids (scenario.py)."""
    return HoldingModel(inner)


def fresh_id_model(inner: Model) -> Model:
    """The `model.wrapper` of the reset runs' agent: a new tool call id on every answer."""
    return HoldingModel(inner, fresh_ids=True)
