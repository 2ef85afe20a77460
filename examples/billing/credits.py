"""The credit routes: apply once per idempotency key, look up by key, void, and misbehave on cue."""

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
from onceflow.examples.billing.problems import Problem
from onceflow.examples.billing.received import mark_unanswered, received_id
from onceflow.examples.billing.serving import ABORT_EXTENSION
from onceflow.examples.billing.store import BillingStore, IdempotencyConflict, KeyFenced, RecordedAnswer

IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255

# uvicorn's own logger, so demos see fault lines next to the access log without extra logging setup.
log = logging.getLogger("uvicorn.error")


@dataclass
class BillingState:
    """What the routes share; created by the app's lifespan, so the store opens and closes with it."""

    store: BillingStore
    faults: FaultBook = field(default_factory=FaultBook)
    credit_limit_cents: int = DEFAULT_CREDIT_LIMIT_CENTS


def billing_state(request: Request) -> BillingState:
    """Dependency: the running app's state."""
    state: BillingState = request.app.state.billing
    return state


State = Annotated[BillingState, Depends(billing_state)]
KeyHeader = Annotated[str | None, Header(alias=IDEMPOTENCY_HEADER)]

router = APIRouter(tags=["credits"])


def require_key(key: str | None) -> str:
    """The Idempotency-Key header's value, or a 400 problem: writes here are never keyless."""
    if key is None or not key.strip():
        raise Problem(
            400, "missing-idempotency-key", "Missing Idempotency-Key", "send an Idempotency-Key header"
        )
    if len(key) > MAX_KEY_LENGTH:
        raise Problem(400, "invalid-idempotency-key", "Invalid Idempotency-Key", "at most 255 characters")
    return key


def _answer(answer: RecordedAnswer) -> JSONResponse:
    headers = {REPLAYED_HEADER: "true"} if answer.replayed else None
    return JSONResponse(answer.body, status_code=answer.status_code, headers=headers)


@router.post("/credits", status_code=201, response_model=Credit)
async def create_credit(
    request: Request,
    body: CreditRequest,
    state: State,
    idempotency_key: KeyHeader = None,
    fault_mode: Annotated[FaultMode | None, Header(alias=FAULT_HEADER)] = None,
    fault_delay: Annotated[float | None, Header(alias=FAULT_DELAY_HEADER, ge=0)] = None,
) -> Response:
    """Apply a credit once per Idempotency-Key; the same key and body replays the first answer.

    A credit above the authorization limit is refused on policy grounds (403, type `…/policy/…`).

    With dedup off (`--no-dedup`) nothing is replayed: every request applies a new credit.
    """
    key = require_key(idempotency_key)
    # A replay never meets a fault: the effect already happened, and a payment API answers it from
    # its record. Only new keys reach the fault (and spend one of an account fault's `times`).
    try:
        recorded = state.store.recorded_answer(key, body)
    except IdempotencyConflict:
        raise _conflict(key) from None
    if recorded is not None:
        return _answer(recorded)
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
            "fault %s (delay %ss) for key %r on %s", fault.mode, fault.delay_seconds, key, body.account_id
        )
        await _before_apply(fault)
    try:
        answer = state.store.apply_credit(key, body, received_id(request))
    except IdempotencyConflict:
        raise _conflict(key) from None
    except KeyFenced:
        raise Problem(
            409,
            "idempotency-key-fenced",
            "Idempotency key fenced",
            f"key {key!r} was fenced by a reconciler after it found no credit; nothing was applied",
            idempotency_key=key,
        ) from None
    if fault is not None and not answer.replayed:
        await _after_apply(fault, request)
    return _answer(answer)


@router.get("/credits", response_model=list[Credit])
async def list_credits(state: State, account_id: str | None = None) -> list[Credit]:
    """Every credit applied, oldest first (one account's with `?account_id=`): what was paid, by
    account and amount, whatever keys it came under."""
    return state.store.credits(account_id)


@router.get("/credits/by-key/{idempotency_key:path}", response_model=Credit)
async def credit_by_key(idempotency_key: str, state: State) -> Credit:
    """The credit applied for a key, in its current state: what a reconcile hook asks."""
    credit = state.store.credit_by_key(idempotency_key)
    if credit is None:
        raise Problem(404, "credit-not-found", "No such credit", f"no credit for key {idempotency_key!r}")
    return credit


@router.post("/credits/by-key/{idempotency_key:path}/fence")
async def fence_key(idempotency_key: str, state: State) -> dict[str, object]:
    """Prove absence for good: either the credit exists (returned), or the key can never apply now."""
    credit = state.store.fence(idempotency_key)
    if credit is not None:
        return {"fenced": False, "credit": credit.model_dump(mode="json")}
    return {"fenced": True, "credit": None}


@router.post("/credits/{credit_id}/void", response_model=Credit)
async def void_credit(credit_id: str, state: State, idempotency_key: KeyHeader = None) -> Response:
    """Void a credit; voiding again answers the same voided credit (marked as a replay)."""
    key = require_key(idempotency_key)
    result = state.store.void_credit(credit_id, key)
    if result is None:
        raise Problem(404, "credit-not-found", "No such credit", f"no credit {credit_id!r}")
    credit, already_voided = result
    headers = {REPLAYED_HEADER: "true"} if already_voided else None
    return JSONResponse(credit.model_dump(mode="json"), headers=headers)


def _conflict(key: str) -> Problem:
    return Problem(
        409,
        "idempotency-key-reused",
        "Idempotency key reused with a different request",
        f"key {key!r} was first used with a different body; nothing was applied",
        idempotency_key=key,
    )


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
