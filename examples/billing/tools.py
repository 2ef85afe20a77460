"""The billing toolset: what the `billing-assistant` agent may do, declared with its side effects.

- `lookup_order` reads; it is retried.
- `issue_credit` moves money: one attempt, the ledger key sent as the Idempotency-Key, and a
  compensation (`void_credit`) that runs only when an operator asks. Billing is built on onceflow's
  receiver kit, and the tool says so in one line (`receiver=BILLING_RECEIVER`): when the answer is
  lost, onceflow asks billing's own record of the key (lookup, then fence) and settles the call
  without anyone.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from onceflow import (
    Guards,
    ReconcileOutcome,
    ToolContext,
    ToolExecutionRecord,
    ToolKeyNotFoundError,
    ToolNotAttemptedError,
    ToolRefusedError,
    ToolRejectedError,
    Toolset,
    external,
    kit_receiver,
    read,
)
from onceflow.examples.billing.client import (
    BillingClient,
    BillingConflict,
    BillingKeyInProgress,
    BillingLocked,
    BillingPolicyRefused,
    BillingRejected,
)
from onceflow.receiver import BadKeyError
from onceflow.runtime.config import env
from onceflow.sdk.tools import kit_problem_error

CREDIT_TIMEOUT = timedelta(seconds=3)
# Billing serves the receiver kit's reconcile protocol (GET/POST /idempotency-keys/...).
BILLING_RECEIVER = kit_receiver(url_env="ONCEFLOW_BILLING_URL")

billing = Toolset("billing")


def _client(timeout: float = 10.0) -> BillingClient:
    return BillingClient(env("ONCEFLOW_BILLING_URL"), timeout=timeout)


@billing.tool(read(timeout=timedelta(seconds=5)))
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order: its account, amount and status."""
    async with _client() as client:
        order = await client.get_order(order_id)
    return order.model_dump(mode="json")


async def find_credit(account_id: str, amount_cents: int, context: ToolContext) -> ReconcileOutcome:
    """A hand-written reconcile hook over billing's fence (what `receiver=BILLING_RECEIVER` does for
    the example tools by itself). Fencing the key makes a "no" permanent, hence trustworthy: billing
    then has no credit for the key and never will, which is what `ToolKeyNotFoundError` says."""
    async with _client() as client:
        try:
            credit = await client.fence_key(context.idempotency_key)
        except BillingKeyInProgress:
            return ReconcileOutcome.unknown(source="billing fence", in_progress=True)
    if credit is None:
        raise ToolKeyNotFoundError(
            f"billing has no credit for key {context.idempotency_key!r} and has fenced it (billing fence)"
        )
    return ReconcileOutcome.completed(
        credit, result_reference=credit["credit_id"], source="billing lookup by idempotency key"
    )


async def void_credit(record: ToolExecutionRecord, context: ToolContext) -> dict[str, Any]:
    """Undo a credit. Runs only when an operator asks for compensation."""
    credit_id = (record.result or {}).get("credit_id")
    if not credit_id:
        raise ToolNotAttemptedError(f"{record.key} has no credit id to void")
    async with _client() as client:
        voided = await client.void_credit(credit_id, idempotency_key=context.idempotency_key)
    return voided.model_dump(mode="json")


@billing.tool(external(timeout=CREDIT_TIMEOUT), receiver=BILLING_RECEIVER, compensation=void_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account, in cents. Sent once, with the call's idempotency key."""
    if amount_cents <= 0:
        raise ToolNotAttemptedError("a credit must be a positive number of cents")
    # The HTTP timeout is a little longer than the tool's: onceflow's own timeout decides.
    async with _client(timeout=CREDIT_TIMEOUT.total_seconds() + 1) as client:
        return await send_credit(client, account_id, amount_cents, context.idempotency_key)


async def send_credit(
    client: BillingClient, account_id: str, amount_cents: int, idempotency_key: str
) -> dict[str, Any]:
    """POST the credit once, and say what billing's refusals mean to onceflow.

    The receiver kit's refusals mean what `kit_problem_error` says: the key fenced by a reconciler
    (billing has no credit for it and never will: `ToolKeyNotFoundError`, the one answer that
    settles a resent call as failed), the key already used for another body (a no for this request,
    `ToolRejectedError`, which to a resend proves nothing about the first), in progress (unknown).
    Locked: refused at the door, nothing processed (`ToolNotAttemptedError`). Rejected: a no for
    this request (`ToolRejectedError`). Refused on policy grounds (above the authorization limit):
    final, never sent again, and the model is told so (`ToolRefusedError`). Anything else
    propagates, and onceflow calls the outcome unknown.
    """
    try:
        credit = await client.credit(account_id, amount_cents, idempotency_key=idempotency_key)
    except BadKeyError as exc:
        # The header carries 1-255 printable ASCII characters; refused before anything was sent.
        raise ToolNotAttemptedError(
            f"the call's key cannot travel as an Idempotency-Key: {exc.reason}"
        ) from exc
    except BillingLocked as exc:
        raise ToolNotAttemptedError(f"account {account_id} is locked: {exc.detail}") from exc
    except (BillingConflict, BillingRejected) as exc:
        kit_error = kit_problem_error(exc.problem, exc.detail)
        if kit_error is not None:
            raise kit_error from exc
        if isinstance(exc, BillingConflict):
            raise  # a conflict the kit did not name: nobody knows what it means for the effect
        raise ToolRejectedError(exc.detail) from exc
    except BillingPolicyRefused as exc:
        raise ToolRefusedError(exc.detail) from exc
    return credit.model_dump(mode="json")


# The same tools without a reconcile hook and without declaring the kit: an unknown credit waits for
# a person. The README's "settle it yourself" walk-through uses this (`billing-assistant-manual`).
billing_manual = Toolset("billing-manual")
billing_manual.tool(read(timeout=timedelta(seconds=5)), name="lookup_order")(lookup_order.fn)
billing_manual.tool(external(timeout=CREDIT_TIMEOUT), name="issue_credit", compensation=void_credit)(
    issue_credit.fn
)

# The same credit behind an operator's approval: recorded `awaiting_approval`, sent only once
# approved (and then exactly once), never if denied. Used by `billing-assistant-approval`.
billing_approval = Toolset("billing-approval")
billing_approval.tool(read(timeout=timedelta(seconds=5)), name="lookup_order")(lookup_order.fn)
billing_approval.tool(
    external(timeout=CREDIT_TIMEOUT, approval=True),
    name="issue_credit",
    receiver=BILLING_RECEIVER,
    compensation=void_credit,
)(issue_credit.fn)

# The same credit, declared as one intent per run: asked again with the same arguments (a model that
# did not trust an answer it got late), it gets the recorded credit back and billing sees nothing.
# Used by `billing-assistant-repeat`.
billing_reuse = Toolset("billing-reuse")
billing_reuse.tool(read(timeout=timedelta(seconds=5)), name="lookup_order")(lookup_order.fn)
billing_reuse.tool(
    external(timeout=CREDIT_TIMEOUT),
    name="issue_credit",
    receiver=BILLING_RECEIVER,
    compensation=void_credit,
    guards=Guards(intent="reuse"),
)(issue_credit.fn)
