"""The example billing service: a small payment-style API built on onceflow's receiver kit.

It is the world onceflow's example tools change, and it misbehaves on cue (see faults.py) so tests
and demos can lose responses after the money moved. Its credits and the kit's keys live in one
PostgreSQL database and commit together (credits.py); it writes down every request it receives,
with its Idempotency-Key, before deciding anything (received.py). `--no-dedup` makes the kit honour
no key at all, as many real APIs don't: every credit request applies a new credit (fences still
hold). Run it with

    python -m onceflow.examples.billing.service --database-url DSN [--host 127.0.0.1] [--port 8081]
        [--no-dedup] [--credit-limit CENTS]

Endpoints (JSON; errors are problem documents):
    GET    /health                              {"ok": true, "dedup": ...}
    GET    /orders/{order_id}                   a deterministic order for any `ord_<suffix>`
    POST   /credits                             apply a credit once per Idempotency-Key (credits.py);
                                                above --credit-limit cents: 403, refused on policy grounds
    GET    /credits/by-key/{idempotency_key}    the credit for a key, or 404
    POST   /credits/{credit_id}/void            void once; repeats answer the same
    GET    /idempotency-keys/{key}              the kit's lookup (its stored answer, or absent)
    POST   /idempotency-keys/{key}/fence        the kit's fence (completed -> returned; absent -> never)
    GET    /effects, /effects/{key}             how often each key really took effect
    GET    /requests, /requests/by-key/{key}    requests received per key, before any dedup (received.py)
    GET    /faults; PUT, DELETE /faults/accounts/{account_id}; DELETE /faults
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from onceflow.local.extras import needs_extra

with needs_extra("api"):
    import uvicorn
    from fastapi import APIRouter, FastAPI, Response

from onceflow.examples.billing import credits, received
from onceflow.examples.billing.credits import BillingState, State, receiver
from onceflow.examples.billing.models import AccountFault, Effect, Effects, FaultSpec, Order, seeded_order
from onceflow.examples.billing.policy import DEFAULT_CREDIT_LIMIT_CENTS
from onceflow.examples.billing.problems import Problem, install_problem_handlers
from onceflow.examples.billing.serving import uvicorn_config
from onceflow.examples.billing.store import BillingStore

router = APIRouter(tags=["service"])


DATABASE_ENV = "ONCEFLOW_BILLING_DATABASE_URL"


def create_app(
    database_url: str,
    *,
    dedup: bool = True,
    credit_limit_cents: int = DEFAULT_CREDIT_LIMIT_CENTS,
) -> FastAPI:
    """The billing service over the PostgreSQL database `database_url` (migrated on start: the
    kit's key store and the service's tables; they survive restarts).

    `dedup=False`: the kit honours no Idempotency-Key (every credit request applies; fenced keys
    stay refused). `credit_limit_cents`: the authorization limit per credit; above it a credit is
    refused on policy grounds, in either mode. The store opens when the app starts serving and
    closes when it stops, so create one app per run.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await BillingStore.open(database_url)
        await receiver.open(app, store.pool, honour_keys=dedup)
        app.state.billing = BillingState(store, credit_limit_cents=credit_limit_cents, dedup=dedup)
        try:
            yield
        finally:
            await store.close()

    app = FastAPI(title="Example billing service", version="2", lifespan=lifespan)
    install_problem_handlers(app)
    receiver.install(app)
    app.include_router(credits.router)
    app.include_router(receiver.router())
    app.include_router(received.router)
    app.include_router(router)
    app.add_middleware(received.ReceivingMiddleware)
    return app


@router.get("/health")
async def health(state: State) -> dict[str, bool]:
    """Liveness: answers as soon as the service serves; `dedup` says whether keys are honoured."""
    return {"ok": True, "dedup": state.dedup}


@router.get("/orders/{order_id}", response_model=Order)
async def get_order(order_id: str) -> Order:
    """Any `ord_<suffix>` exists, with an account and amount derived from its id."""
    order = seeded_order(order_id)
    if order is None:
        raise Problem(404, "order-not-found", "No such order", f"no order {order_id!r}")
    return order


@router.get("/effects", response_model=Effects)
async def effects(state: State) -> Effects:
    """Applications per idempotency key; a correct service never shows a count above 1."""
    counts = await state.store.effects()
    return Effects(effects=counts, total=sum(counts.values()))


@router.get("/effects/{key:path}", response_model=Effect)
async def effect(key: str, state: State) -> Effect:
    """Applications of one key (0 if it never took effect) and whether its credit was voided."""
    applied, voided = await state.store.effect(key)
    return Effect(key=key, applied=applied, voided=voided)


@router.get("/faults", response_model=list[AccountFault])
async def list_faults(state: State) -> list[AccountFault]:
    """Per-account faults in force."""
    return state.faults.all()


@router.put("/faults/accounts/{account_id}", response_model=AccountFault)
async def set_account_fault(account_id: str, spec: FaultSpec, state: State) -> AccountFault:
    """Make `POST /credits` for this account misbehave, for `times` requests or until cleared."""
    return state.faults.set(account_id, spec)


@router.delete("/faults/accounts/{account_id}", status_code=204)
async def clear_account_fault(account_id: str, state: State) -> Response:
    """Heal one account (no error if it had no fault)."""
    state.faults.clear(account_id)
    return Response(status_code=204)


@router.delete("/faults", status_code=204)
async def clear_faults(state: State) -> Response:
    """Heal every account."""
    state.faults.clear_all()
    return Response(status_code=204)


def main(argv: list[str] | None = None) -> None:
    """Serve the billing service under uvicorn until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m onceflow.examples.billing.service", description="Run the example billing service."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument(
        "--database-url",
        default=os.environ.get(DATABASE_ENV),
        metavar="DSN",
        help=f"PostgreSQL database for credits and keys (default: ${DATABASE_ENV}); migrated on start",
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--no-dedup",
        action="store_true",
        help="honour no Idempotency-Key: every POST /credits applies a new credit (requests are still "
        "recorded, fenced keys still refused)",
    )
    parser.add_argument(
        "--credit-limit",
        type=int,
        default=DEFAULT_CREDIT_LIMIT_CENTS,
        metavar="CENTS",
        help="authorization limit per credit; above it a credit is refused on policy grounds "
        f"(default {DEFAULT_CREDIT_LIMIT_CENTS})",
    )
    args = parser.parse_args(argv)
    if args.credit_limit < 0:
        parser.error("--credit-limit cannot be negative")
    if not args.database_url:
        parser.error(f"give --database-url (or set {DATABASE_ENV}): billing keeps its credits in PostgreSQL")
    app = create_app(args.database_url, dedup=not args.no_dedup, credit_limit_cents=args.credit_limit)
    config = uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
