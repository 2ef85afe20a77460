"""Every request to the business routes, written down the moment it arrives.

The receiver kit (its dedup and fences) and the faults decide what a request *does*; this records
that it *came*, with its Idempotency-Key, before any of them runs. A client that sends one key twice shows
up here twice, whether the service then replayed, refused or applied the second request.

`ReceivingMiddleware` wraps the whole app (plain ASGI, so the `drop` fault's abort hook still
reaches the route). The routes below let tests and the crash drill read the record.
"""

from __future__ import annotations

from typing import Any

from onceflow.local.extras import needs_extra

with needs_extra("api"):
    from fastapi import APIRouter, Query, Request

from onceflow.examples.billing.models import ReceivedByKey, ReceivedCounts, ReceivedRequest
from onceflow.examples.billing.store import BillingStore, ReceivedRow
from onceflow.receiver import BadKeyError, parse_key_header

# Business routes and the kit's reconcile protocol; the service's health, effects, faults and this
# record are not counted.
RECORDED_PREFIXES = ("/credits", "/orders", "/idempotency-keys")
RECEIVED_ID = "billing_received_id"  # in the request's scope state: the row this request got
NO_ANSWER = "billing_no_answer"  # set by a route that drops the connection instead of answering

router = APIRouter(tags=["requests"])


def _key(scope: dict[str, Any]) -> str | None:
    """The Idempotency-Key as sent: the key inside its quotes, or the raw value if it is no key."""
    for header, value in scope.get("headers", []):
        if header.lower() == b"idempotency-key":
            raw = str(value.decode("latin-1"))
            try:
                return parse_key_header(raw)
            except BadKeyError:
                return raw
    return None


class ReceivingMiddleware:
    """Record each business request on arrival, and its answer's status once it is sent."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(RECORDED_PREFIXES):
            await self.app(scope, receive, send)
            return
        store: BillingStore = scope["app"].state.billing.store
        received_id = await store.receive(scope["method"], path, _key(scope))
        state = scope.setdefault("state", {})
        state[RECEIVED_ID] = received_id

        async def noting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and not state.get(NO_ANSWER):
                await store.answered(received_id, message["status"])
            await send(message)

        await self.app(scope, receive, noting_send)


def received_id(request: Request) -> int | None:
    """The `received_requests` row of the request being served (None if it was not recorded)."""
    value = request.scope.get("state", {}).get(RECEIVED_ID)
    return value if isinstance(value, int) else None


def mark_unanswered(request: Request) -> None:
    """The route drops the connection: whatever it returns afterwards never reaches the caller."""
    request.scope.setdefault("state", {})[NO_ANSWER] = True


def _model(row: ReceivedRow) -> ReceivedRequest:
    return ReceivedRequest(
        method=row.method,
        path=row.path,
        idempotency_key=row.idempotency_key,
        received_at=row.received_at,
        applied=row.applied,
        status_code=row.status_code,
    )


def _store(request: Request) -> BillingStore:
    store: BillingStore = request.app.state.billing.store
    return store


@router.get("/requests/by-key/{idempotency_key:path}", response_model=ReceivedByKey)
async def requests_by_key(idempotency_key: str, request: Request) -> ReceivedByKey:
    """Every request that arrived with this Idempotency-Key, oldest first (none: `received: 0`)."""
    rows = await _store(request).received(idempotency_key)
    return ReceivedByKey(key=idempotency_key, received=len(rows), requests=[_model(r) for r in rows])


@router.get("/requests", response_model=ReceivedCounts)
async def request_counts(
    request: Request,
    method: str | None = None,
    path: str | None = Query(default=None, description="exactly this path"),
    prefix: str | None = Query(default=None, description="paths starting with this"),
) -> ReceivedCounts:
    """Requests received per Idempotency-Key, e.g. `?method=POST&path=/credits` for credit requests."""
    counts = await _store(request).received_counts(method.upper() if method else None, path, prefix)
    keyless = counts.pop(None, 0)
    keyed = {key: n for key, n in counts.items() if key is not None}
    return ReceivedCounts(counts=keyed, keyless=keyless, total=keyless + sum(keyed.values()))
