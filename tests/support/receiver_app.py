"""A small service on the receiver kit, in both forms, for tests of the kit over real HTTP.

- `POST /transfers` (transactional form): inserts a row into the service's own `transfers` table on
  the kit's connection and answers 201; the row and the key commit together.
- `POST /notes` (middleware form, IdempotencyMiddleware): inserts a row into `notes` on a
  connection of its own (committed at once), then answers 201; the kit records the answer after.
- `GET /effects/{key}`: rows per key in each table (the effects, counted by the service itself).
- the reconcile protocol at `/idempotency-keys`.

The scope comes from `Authorization: Bearer <tenant>-token` (401 otherwise), the service's own
authentication. `X-Hold-Seconds` makes a handler wait after its write and before it answers: in the
transactional form inside the open transaction, in the middleware form after the commit; the tests
SIGKILL the process there. `X-Hold-File` names a file the handler writes when it reaches the hold.

Run as a process: `python -m tests.support.receiver_app --database-url DSN --port N [--lifetime S]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import asyncpg
import httpx
import uvicorn
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from onceflow import ToolContext, Toolset, external, kit_receiver
from onceflow.receiver import ExpiryPolicy, key_header_value, migrate_receiver
from onceflow.receiver.asgi import IdempotencyMiddleware
from onceflow.receiver.fastapi import KeyedRequest, Receiver

SCHEMA = """
CREATE TABLE IF NOT EXISTS transfers (id bigserial PRIMARY KEY, tenant text NOT NULL, key text NOT NULL,
                                      account text NOT NULL, cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS notes (id bigserial PRIMARY KEY, tenant text NOT NULL, key text NOT NULL,
                                  text text NOT NULL);
"""


def tenant_of_token(authorization: str | None) -> str:
    if not authorization or not authorization.startswith("Bearer ") or not authorization.endswith("-token"):
        raise HTTPException(401, "a bearer token <tenant>-token is required")
    return authorization.removeprefix("Bearer ").removesuffix("-token")


async def tenant(authorization: Annotated[str | None, Header()] = None) -> str:
    """The service's own authentication, as a FastAPI dependency: the scope of every key."""
    return tenant_of_token(authorization)


def tenant_of_request(request: Request) -> str:
    """The same for the middleware, which sees the request before any route."""
    return tenant_of_token(request.headers.get("authorization"))


class TransferIn(BaseModel):
    account: str = Field(min_length=1)
    cents: int = Field(gt=0)


class NoteIn(BaseModel):
    text: str


async def hold(seconds: float | None, marker: str | None) -> None:
    if marker:
        await asyncio.to_thread(Path(marker).write_text, "holding")
    if seconds:
        await asyncio.sleep(seconds)


receiver = Receiver(scope=tenant)
# What a keyed handler is given: the transaction that records its key.
Keyed = Annotated[KeyedRequest, receiver.depends()]
# The same kit with keys that expire after a second, for the expiry tests.
short_receiver = Receiver(scope=tenant, policy=ExpiryPolicy(lifetime=timedelta(seconds=1)))
ShortKeyed = Annotated[KeyedRequest, short_receiver.depends()]


async def transfer(
    body: TransferIn,
    keyed: Keyed,
    hold_seconds: Annotated[float | None, Header(alias="X-Hold-Seconds")] = None,
    hold_file: Annotated[str | None, Header(alias="X-Hold-File")] = None,
) -> Response:
    """Move money once per key: the row and the key's record commit together."""
    if body.account == "closed":
        raise HTTPException(422, "account closed")  # raised: rolled back, nothing recorded
    transfer_id = await keyed.connection.fetchval(
        "INSERT INTO transfers (tenant, key, account, cents) VALUES ($1, $2, $3, $4) RETURNING id",
        keyed.scope,
        keyed.key,
        body.account,
        body.cents,
    )
    await hold(hold_seconds, hold_file)
    return await keyed.respond(
        {"transfer_id": transfer_id, "account": body.account, "cents": body.cents}, 201
    )


async def short_transfer(
    body: TransferIn,
    keyed: ShortKeyed,
    hold_seconds: Annotated[float | None, Header(alias="X-Hold-Seconds")] = None,
    hold_file: Annotated[str | None, Header(alias="X-Hold-File")] = None,
) -> Response:
    """The same under keys that expire after a second."""
    return await transfer(body, keyed, hold_seconds, hold_file)


def create_app(database_url: str, *, short_lived: bool = False) -> FastAPI:
    """The service; its tables and the kit's live in `database_url` (no ledger there).
    `short_lived`: keys expire a second after their first use."""
    kit = short_receiver if short_lived else receiver

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await migrate_receiver(database_url)
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=20)
        assert pool is not None
        await pool.execute(SCHEMA)
        app.state.pool = pool
        await kit.open(app, pool)
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(title="receiver kit test service", lifespan=lifespan)
    kit.install(app)
    app.include_router(kit.router())
    app.add_middleware(
        IdempotencyMiddleware, scope=tenant_of_request, paths=["/notes"], release_statuses=[503]
    )
    if short_lived:
        app.post("/transfers", status_code=201)(short_transfer)
    else:
        app.post("/transfers", status_code=201)(transfer)

    @app.post("/notes", status_code=201)
    async def note(
        body: NoteIn,
        request: Request,
        owner: Annotated[str, Depends(tenant)],
        hold_seconds: Annotated[float | None, Header(alias="X-Hold-Seconds")] = None,
        hold_file: Annotated[str | None, Header(alias="X-Hold-File")] = None,
        key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
    ) -> dict[str, Any]:
        """A note, written at once; the middleware records the answer after this returns."""
        if body.text == "unavailable":
            raise HTTPException(503, "try later")  # a release status: the claim is dropped
        note_id = await request.app.state.pool.fetchval(
            "INSERT INTO notes (tenant, key, text) VALUES ($1, $2, $3) RETURNING id",
            owner,
            key or "",
            body.text,
        )
        await hold(hold_seconds, hold_file)
        return {"note_id": note_id, "text": body.text}

    @app.get("/effects/{key:path}")
    async def effects(key: str, request: Request, owner: Annotated[str, Depends(tenant)]) -> dict[str, int]:
        """Rows per key, as the service's own tables have them."""
        pool = request.app.state.pool
        transfers = await pool.fetchval(
            "SELECT count(*) FROM transfers WHERE tenant = $1 AND key = $2", owner, key
        )
        # The middleware form's handler sees the header as sent: the key in quotes.
        quoted = '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
        notes = await pool.fetchval(
            "SELECT count(*) FROM notes WHERE tenant = $1 AND key = $2", owner, quoted
        )
        return {"transfers": transfers, "notes": notes}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = create_app(args.database_url)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()


# -- the caller's side: a tool whose receiver is this service, declared in one line -----------------

URL_ENV = "RECEIVER_APP_URL"
AUTH = {"Authorization": "Bearer acme-token"}  # tenant acme, as the ledger's test calls are

kit_tools = Toolset("kit-transfers")


@kit_tools.tool(
    external(timeout=timedelta(seconds=2)),
    name="transfer",
    receiver=kit_receiver(url_env=URL_ENV, headers=AUTH),
)
async def send_transfer(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Move money to an account, once per call's key."""
    async with httpx.AsyncClient(base_url=os.environ[URL_ENV], headers=AUTH, timeout=5) as http:
        response = await http.post(
            "/transfers",
            json={"account": account_id, "cents": amount_cents},
            headers={"Idempotency-Key": key_header_value(context.idempotency_key)},
        )
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer
