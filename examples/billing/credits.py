"""The credit routes, on the receiver kit's transactional form: apply once per idempotency key, look
up by key, void, and misbehave on cue.

A credit is inserted on the connection of the kit's keyed transaction and answered with
`keyed.respond()`, which records the answer with the key and commits both: the credit exists if and
only if its key is recorded. What the kit answers before the route runs (onceflow/receiver): a
missing or bad key 400, a key reused for another body 422, a key in progress 409 (Retry-After), a
key fenced by a reconciler 409 `key-fenced`, and a key that completed before: its first answer again
(`Idempotent-Replayed: true`), without meeting a fault. A refusal the route raises (the policy
limit, a fault's 422/423/503) rolls back and records nothing, so the key can still apply later.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Annotated

from onceflow.local.extras import needs_extra

with needs_extra("api"):
    from fastapi import APIRouter, Depends, Header, Request, Response
    from fastapi.responses import JSONResponse

from onceflow.examples.billing.faults import FAULT_DELAY_HEADER, FAULT_HEADER, Fault, FaultBook
from onceflow.examples.billing.models import Credit, CreditRequest, FaultMode
from onceflow.examples.billing.policy import CREDIT_LIMIT_SLUG, DEFAULT_CREDIT_LIMIT_CENTS, over_credit_limit
from onceflow.examples.billing.problems import TYPE_BASE, Problem
from onceflow.examples.billing.received import mark_unanswered, received_id
from onceflow.examples.billing.serving import ABORT_EXTENSION
from onceflow.examples.billing.store import BillingStore
from onceflow.receiver import REPLAYED_HEADER
from onceflow.receiver.fastapi import KeyedRequest, Receiver

# uvicorn's own logger, so demos see fault lines next to the access log without extra logging setup.
log = logging.getLogger("uvicorn.error")


def client_scope(client: Annotated[str | None, Header(alias="X-Billing-Client")] = None) -> str:
    """The scope of every key: the caller's client id. The example has no authentication; a real
    service returns the tenant its own authentication found (and answers 401 without one)."""
    return client or "default"


# The kit, once for every app of this module; each app opens its own key store (service.py).
receiver = Receiver(scope=client_scope, problem_base=TYPE_BASE)
Keyed = Annotated[KeyedRequest, receiver.depends()]


@dataclass
class BillingState:
    """What the routes share; created by the app's lifespan, so the store opens and closes with it."""

    store: BillingStore
    faults: FaultBook = field(default_factory=FaultBook)
    credit_limit_cents: int = DEFAULT_CREDIT_LIMIT_CENTS
    dedup: bool = True


def billing_state(request: Request) -> BillingState:
    """Dependency: the running app's state."""
    state: BillingState = request.app.state.billing
    return state


State = Annotated[BillingState, Depends(billing_state)]

router = APIRouter(tags=["credits"])


@router.post("/credits", status_code=201, response_model=Credit)
async def create_credit(
    request: Request,
    body: CreditRequest,
    state: State,
    keyed: Keyed,
    fault_mode: Annotated[FaultMode | None, Header(alias=FAULT_HEADER)] = None,
    fault_delay: Annotated[float | None, Header(alias=FAULT_DELAY_HEADER, ge=0)] = None,
) -> Response:
    """Apply a credit once per Idempotency-Key; the same key and body replays the first answer.

    A credit above the authorization limit is refused on policy grounds (403, type `…/policy/…`).

    With dedup off (`--no-dedup`) nothing is replayed: every request applies a new credit.
    """
    # Policy before faults: a credit the service will never make is refused whatever else happens.
    refusal = over_credit_limit(body.amount_cents, state.credit_limit_cents)
    if refusal is not None:
        raise Problem(
            403,
            CREDIT_LIMIT_SLUG,
            "Credit above the authorization limit",
            refusal,
            limit_cents=state.credit_limit_cents,
        )
    # The request's own header wins over (and does not spend) an account fault.
    fault = Fault.of(fault_mode, fault_delay) if fault_mode else state.faults.take(body.account_id)
    if fault is not None:
        log.info(
            "fault %s (delay %ss) for key %r on %s",
            fault.mode,
            fault.delay_seconds,
            keyed.key,
            body.account_id,
        )
        await _before_apply(fault)
    credit = await state.store.insert_credit(keyed.connection, keyed.key, body, received_id(request))
    answer = await keyed.respond(credit.model_dump(mode="json"), status_code=201)
    if fault is not None:
        await _after_apply(fault, request)
    return answer


@router.get("/credits", response_model=list[Credit])
async def list_credits(state: State, account_id: str | None = None) -> list[Credit]:
    """Every credit applied, oldest first (one account's with `?account_id=`): what was paid, by
    account and amount, whatever keys it came under."""
    return await state.store.credits(account_id)


@router.get("/credits/by-key/{idempotency_key:path}", response_model=Credit)
async def credit_by_key(idempotency_key: str, state: State) -> Credit:
    """The credit applied for a key, in its current state."""
    credit = await state.store.credit_by_key(idempotency_key)
    if credit is None:
        raise Problem(404, "credit-not-found", "No such credit", f"no credit for key {idempotency_key!r}")
    return credit


@router.post("/credits/{credit_id}/void", response_model=Credit)
async def void_credit(credit_id: str, state: State, keyed: Keyed) -> Response:
    """Void a credit; voiding again, under any key, answers the same voided credit (marked as a
    replay). The same key again is the kit's replay."""
    result = await state.store.void_credit(keyed.connection, credit_id, keyed.key)
    if result is None:
        raise Problem(404, "credit-not-found", "No such credit", f"no credit {credit_id!r}")
    credit, already_voided = result
    headers = {REPLAYED_HEADER: "true"} if already_voided else None
    return await keyed.respond(response=JSONResponse(credit.model_dump(mode="json"), headers=headers))


async def _before_apply(fault: Fault) -> None:
    """Faults that answer before, or instead of, applying."""
    if fault.mode is FaultMode.REJECT:
        raise Problem(422, "rejected", "Credit rejected", fault.detail)
    if fault.mode is FaultMode.LOCKED:
        raise Problem(423, "locked", "Account locked", "the account is locked; nothing was applied")
    if fault.mode is FaultMode.FAIL_BEFORE_APPLY:
        raise Problem(503, "unavailable", "Service unavailable", "try again later; nothing was applied")
    if fault.mode is FaultMode.SLOW:
        await asyncio.sleep(fault.delay_seconds)


async def _after_apply(fault: Fault, request: Request) -> None:
    """Faults that strike after the credit is committed: the caller cannot know it took effect."""
    if fault.mode is FaultMode.APPLY_THEN_HANG:
        await asyncio.sleep(fault.delay_seconds)
    elif fault.mode is FaultMode.DROP:
        abort = request.scope.get("extensions", {}).get(ABORT_EXTENSION)
        if abort is None:
            # Served without serving.py's protocol: no clean way to drop, so hang instead.
            await asyncio.sleep(fault.delay_seconds)
            return
        mark_unanswered(request)
        abort()
        # Wait until the server has seen the connection go, so the response returned afterwards is
        # discarded quietly instead of being written to a closed socket.
        for _ in range(100):
            if await request.is_disconnected():
                return
            await asyncio.sleep(0.01)
