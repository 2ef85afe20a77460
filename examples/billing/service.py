"""The example billing service: a small payment-style API that honours idempotency keys.

It is the world onceflow's example tools change, and it misbehaves on cue (see faults.py) so tests
and demos can lose responses after the money moved. It writes down every request it receives, with
its Idempotency-Key, before deciding anything (received.py). `--no-dedup` makes it honour no key at
all, as many real APIs don't: every credit request applies a new credit. Run it with

    python -m examples.billing.service --host 127.0.0.1 --port 8081 [--db PATH] [--no-dedup]
        [--credit-limit CENTS]

Endpoints (JSON; errors are problem documents):
    GET    /health                              {"ok": true}
    GET    /orders/{order_id}                   a deterministic order for any `ord_<suffix>`
    POST   /credits                             apply a credit once per Idempotency-Key (credits.py);
                                                above --credit-limit cents: 403, refused on policy grounds
    GET    /credits/by-key/{idempotency_key}    the credit for a key, or 404
    POST   /credits/{credit_id}/void            void once; repeats answer the same
    GET    /effects, /effects/{key}             how often each key really took effect
    GET    /requests, /requests/by-key/{key}    requests received per key, before any dedup (received.py)
    GET    /faults; PUT, DELETE /faults/accounts/{account_id}; DELETE /faults
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from onceflow.local.extras import needs_extra

with needs_extra("api"):
    import uvicorn
    from fastapi import APIRouter, FastAPI, Response

from onceflow.examples.billing import credits, received
from onceflow.examples.billing.credits import BillingState, State
from onceflow.examples.billing.models import AccountFault, Effect, Effects, FaultSpec, Order, seeded_order
from onceflow.examples.billing.policy import DEFAULT_CREDIT_LIMIT_CENTS
from onceflow.examples.billing.problems import Problem, install_problem_handlers
from onceflow.examples.billing.serving import uvicorn_config
from onceflow.examples.billing.store import BillingStore

router = APIRouter(tags=["service"])


def create_app(
    store_path: str | None = None,
    *,
    dedup: bool = True,
    credit_limit_cents: int = DEFAULT_CREDIT_LIMIT_CENTS,
) -> FastAPI:
    """The billing service. `store_path` is an SQLite file that outlives restarts; None keeps it in memory.

    `dedup=False`: honour no Idempotency-Key (every credit request applies). `credit_limit_cents`:
    the authorization limit per credit; above it a credit is refused on policy grounds, in either
    mode. The store opens when
    the app starts serving and closes when it stops, so create one app per run.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = BillingStore(store_path, dedup=dedup)
        app.state.billing = BillingState(store, credit_limit_cents=credit_limit_cents)
        try:
            yield
        finally:
            store.close()

    app = FastAPI(title="Example billing service", version="1", lifespan=lifespan)
    install_problem_handlers(app)
    app.include_router(credits.router)
    app.include_router(received.router)
    app.include_router(router)
    app.add_middleware(received.ReceivingMiddleware)
    return app


@router.get("/health")
async def health(state: State) -> dict[str, bool]:
    """Liveness: answers as soon as the service serves; `dedup` says whether keys are honoured."""
    return {"ok": True, "dedup": state.store.dedup}


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
    counts = state.store.effects()
    return Effects(effects=counts, total=sum(counts.values()))


@router.get("/effects/{key:path}", response_model=Effect)
async def effect(key: str, state: State) -> Effect:
    """Applications of one key (0 if it never took effect) and whether its credit was voided."""
    applied, voided = state.store.effect(key)
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
        prog="python -m examples.billing.service", description="Run the example billing service."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--db", metavar="PATH", help="SQLite file kept across restarts (default: in memory)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--no-dedup",
        action="store_true",
        help="honour no Idempotency-Key: every POST /credits applies a new credit (requests are still recorded)",
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
    app = create_app(args.db, dedup=not args.no_dedup, credit_limit_cents=args.credit_limit)
    config = uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
