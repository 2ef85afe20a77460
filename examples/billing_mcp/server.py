"""An MCP server for the billing example, built with the official `mcp` SDK (MCPServer).

Tools and their annotations (honest, except the one marked as a liar):

| tool | annotations | what it does |
|---|---|---|
| `lookup_order(order_id)` | readOnly | the seeded order (same orders as the HTTP service) |
| `issue_credit(account_id, amount_cents, memo?)` | not readOnly, not destructive, open world | moves money, once per idempotency key |
| `find_credit(idempotency_key)` | readOnly, closed world | the lookup a reconciler asks: was the credit under this key applied? |
| `credit_allowance(account_id)` | readOnly | `{"limit": cents}`: how much an account may be credited in all (a budget's `limit_from`) |
| `send_statement(account_id)` | readOnly (a lie) | records a statement "sent"; for tests of annotation overrides |

`issue_credit` and `send_statement` take their idempotency key from the request's
`_meta["io.onceflow/idempotency-key"]`, never from an argument: the model cannot choose it. A call
without one is refused (`isError`), with nothing applied.

`issue_credit` applies the billing example's policy rule (examples/billing/policy.py): a credit
above the authorization limit (`BILLING_MCP_CREDIT_LIMIT` cents, default 50000) is answered
`isError: true` with `_meta["io.onceflow/refused"] = true`, which onceflow records as a final
refusal on policy grounds, never sent again.

Every request for a key is written to the `mcp_requests` table before anything else happens, so a
test can count what the server *received*, which a server that deduplicates by key would otherwise
hide. Credits live in this example's own store (examples/billing_mcp/store.py), in the SQLite
file given by `--db`, so they survive the server being killed.

With `BILLING_MCP_CACHE_BY_KEY=1` the server also behaves like a careless deduplicating gateway: it
keeps the answer of every `tools/call`, whatever the tool, under the request's
`_meta["io.onceflow/idempotency-key"]` alone, and answers any later request with that key from it.
onceflow gives every request its own key (a read's, a limit read's and a lookup's differ from the
write's, which they carry under `io.onceflow/write-key`), so such a server never answers a write
with a read's answer.

Faults per account come from the environment variable `BILLING_MCP_FAULTS`, a JSON object
`{"acct_x": {"mode": "apply_then_hang", "delay_seconds": 30}}`; modes as in the billing service:
`apply_then_hang`, `slow`, `reject`, `locked`, `fail_before_apply`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

from onceflow.local.extras import needs_extra

with needs_extra("mcp"):
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import CallToolResult, TextContent, ToolAnnotations

from onceflow.examples.billing.faults import Fault
from onceflow.examples.billing.models import CreditRequest, FaultMode, seeded_order
from onceflow.examples.billing.policy import DEFAULT_CREDIT_LIMIT_CENTS, over_credit_limit
from onceflow.examples.billing_mcp.store import BillingStore, IdempotencyConflict, KeyFenced
from onceflow.mcp.meta import IDEMPOTENCY_META_KEY, REFUSED_META_KEY

FAULTS_ENV = "BILLING_MCP_FAULTS"
TOKEN_ENV = "BILLING_MCP_TOKEN"
CREDIT_LIMIT_ENV = "BILLING_MCP_CREDIT_LIMIT"
CACHE_BY_KEY_ENV = "BILLING_MCP_CACHE_BY_KEY"

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
MOVES_MONEY = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
)

_REQUESTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS mcp_requests (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT,
    tool            TEXT NOT NULL,
    received_at     TEXT NOT NULL
);
"""


class RequestLog:
    """Every keyed request as it arrived, committed before the tool does anything."""

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, check_same_thread=False, timeout=10)
        with self._lock, self._conn:
            self._conn.executescript(_REQUESTS_SCHEMA)

    def received(self, tool: str, key: str | None) -> None:
        with self._lock, self._conn:
            self._conn.execute(
                "INSERT INTO mcp_requests (idempotency_key, tool, received_at) VALUES (?, ?, ?)",
                (key, tool, datetime.now(UTC).isoformat()),
            )


def requests_received(db_path: str, key: str, tool: str | None = None) -> int:
    """How many requests carrying `key` (optionally for one tool) the server at `db_path` received."""
    conn = sqlite3.connect(db_path, timeout=10)
    try:
        conn.executescript(_REQUESTS_SCHEMA)
        query = "SELECT count(*) FROM mcp_requests WHERE idempotency_key = ?"
        params: tuple[str, ...] = (key,)
        if tool is not None:
            query += " AND tool = ?"
            params = (key, tool)
        (count,) = conn.execute(query, params).fetchone()
        return int(count)
    finally:
        conn.close()


def _faults_from_env() -> dict[str, Fault]:
    raw = os.environ.get(FAULTS_ENV)
    if not raw:
        return {}
    faults: dict[str, Fault] = {}
    for account, spec in json.loads(raw).items():
        faults[account] = Fault.of(FaultMode(spec["mode"]), spec.get("delay_seconds"), spec.get("detail"))
    return faults


def _key(ctx: Context) -> str | None:
    meta = ctx.request_context.meta or {}
    key = meta.get(IDEMPOTENCY_META_KEY)
    return key if isinstance(key, str) and key else None


def _credit_limit_from_env() -> int:
    return int(os.environ.get(CREDIT_LIMIT_ENV) or DEFAULT_CREDIT_LIMIT_CENTS)


def policy_refusal(text: str) -> CallToolResult:
    """An error result that says: refused on policy grounds, and final (see onceflow.mcp.meta)."""
    return CallToolResult(
        content=[TextContent(type="text", text=text)], is_error=True, _meta={REFUSED_META_KEY: True}
    )


def credit_result(body: dict[str, Any]) -> CallToolResult:
    """A credit as MCPServer would have answered a returned dict: JSON text plus structured content."""
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(body, indent=2))], structured_content=body
    )


class KeyCache:
    """The careless gateway of `BILLING_MCP_CACHE_BY_KEY`: one answer per key, whatever the tool."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._answers: dict[str, Any] = {}

    async def answer(self, ctx: Context, tool: Callable[[], Awaitable[Any]]) -> Any:
        key = _key(ctx)
        if not self.enabled or key is None:
            return await tool()
        if key not in self._answers:
            self._answers[key] = await tool()
        return self._answers[key]

    async def read(self, ctx: Context, tool: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        kept = await self.answer(ctx, tool)
        if isinstance(kept, CallToolResult):  # a write's answer, handed to a read
            return kept.structured_content or {}
        answer: dict[str, Any] = kept
        return answer


def create_server(
    db_path: str,
    faults: dict[str, Fault] | None = None,
    credit_limit_cents: int | None = None,
    cache_by_key: bool | None = None,
) -> MCPServer:
    """The billing MCP server over the credits stored in `db_path`."""
    store = BillingStore(db_path)
    requests = RequestLog(db_path)
    faults = _faults_from_env() if faults is None else faults
    limit = _credit_limit_from_env() if credit_limit_cents is None else credit_limit_cents
    if cache_by_key is None:
        cache_by_key = os.environ.get(CACHE_BY_KEY_ENV) == "1"
    cache = KeyCache(cache_by_key)
    server = MCPServer(
        "billing-mcp", instructions="Orders and credits of the onceflow billing example.", log_level="WARNING"
    )

    async def before_apply(fault: Fault | None) -> None:
        if fault is None:
            return
        if fault.mode is FaultMode.REJECT:
            raise ToolError(fault.detail)
        if fault.mode is FaultMode.LOCKED:
            raise ToolError("the account is locked; nothing was applied")
        if fault.mode is FaultMode.FAIL_BEFORE_APPLY:
            raise ToolError("billing is unavailable; nothing was applied")
        if fault.mode is FaultMode.SLOW:
            await asyncio.sleep(fault.delay_seconds)

    async def after_apply(fault: Fault | None) -> None:
        if fault is not None and fault.mode is FaultMode.APPLY_THEN_HANG:
            await asyncio.sleep(fault.delay_seconds)

    @server.tool(annotations=READ_ONLY)
    async def lookup_order(order_id: str, ctx: Context) -> dict[str, Any]:
        """Look up an order: its account, amount and status."""

        async def look() -> dict[str, Any]:
            order = seeded_order(order_id)
            if order is None:
                raise ToolError(f"no order {order_id!r}; order ids look like ord_<suffix>")
            return order.model_dump(mode="json")

        return await cache.read(ctx, look)

    @server.tool(annotations=READ_ONLY)
    async def credit_allowance(account_id: str, ctx: Context) -> dict[str, Any]:
        """How much this account may be credited in all, in cents: {"limit": cents}."""
        requests.received("credit_allowance", _key(ctx))

        async def allowance() -> dict[str, Any]:
            return {"account_id": account_id, "limit": limit}

        return await cache.read(ctx, allowance)

    @server.tool(annotations=MOVES_MONEY)
    async def issue_credit(
        account_id: str, amount_cents: int, ctx: Context, memo: str | None = None
    ) -> CallToolResult:
        """Credit an account, in cents. Applied once per idempotency key (sent in _meta)."""
        requests.received("issue_credit", _key(ctx))
        answer = await cache.answer(ctx, lambda: credit(account_id, amount_cents, ctx, memo))
        # From the careless cache, a read's answer may come back here, as such a gateway would.
        return answer if isinstance(answer, CallToolResult) else credit_result(answer)

    async def credit(account_id: str, amount_cents: int, ctx: Context, memo: str | None) -> CallToolResult:
        key = _key(ctx)
        if key is None:
            raise ToolError(f"no idempotency key in _meta[{IDEMPOTENCY_META_KEY!r}]; nothing was applied")
        try:
            request = CreditRequest(account_id=account_id, amount_cents=amount_cents, memo=memo)
        except ValueError as exc:
            raise ToolError(f"invalid credit: {exc}") from None
        try:
            recorded = store.recorded_answer(key, request)
        except IdempotencyConflict:
            raise ToolError(f"key {key!r} was first used for another credit; nothing was applied") from None
        if recorded is not None:
            return credit_result(recorded.body)
        refusal = over_credit_limit(amount_cents, limit)
        if refusal is not None:
            return policy_refusal(refusal)
        fault = faults.get(account_id)
        await before_apply(fault)
        try:
            answer = store.apply_credit(key, request)
        except (IdempotencyConflict, KeyFenced) as exc:
            raise ToolError(
                f"key {key!r} cannot be used ({type(exc).__name__}); nothing was applied"
            ) from None
        await after_apply(fault)
        return credit_result(answer.body)

    @server.tool(annotations=READ_ONLY)
    async def find_credit(idempotency_key: str, ctx: Context) -> dict[str, Any]:
        """Was a credit applied under this idempotency key? The onceflow reconcile lookup protocol:
        {"status": "completed", "result": credit, "reference": credit_id}, or "unknown" when none is
        found (this server cannot prove a credit will never land, so it never answers "failed")."""
        requests.received("find_credit", _key(ctx))

        async def find() -> dict[str, Any]:
            credit = store.credit_by_key(idempotency_key)
            if credit is None:
                return {"status": "unknown", "evidence": {"found": False}}
            body = credit.model_dump(mode="json")
            return {"status": "completed", "result": body, "reference": credit.credit_id}

        return await cache.read(ctx, find)

    @server.tool(annotations=READ_ONLY)
    async def send_statement(account_id: str, ctx: Context) -> dict[str, Any]:
        """Send the account's statement. Annotated read-only, which is a lie: it sends something."""
        requests.received("send_statement", _key(ctx))
        fault = faults.get(account_id)
        await before_apply(fault)
        await after_apply(fault)
        return {"account_id": account_id, "sent": True}

    return server


ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


def require_bearer(app: ASGIApp, token: str) -> ASGIApp:
    """Refuse HTTP requests without `Authorization: Bearer <token>` (401), before MCP sees them."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"missing or wrong bearer token"})
            return
        await app(scope, receive, send)

    return guarded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.billing_mcp", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--db", required=True, help="SQLite file for credits and received requests")
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--pid-file", help="write this process's id here (tests kill it mid-call)")
    args = parser.parse_args(argv)
    if args.pid_file:
        with open(args.pid_file, "w") as pid_file:
            pid_file.write(str(os.getpid()))
    server = create_server(args.db)
    if not args.http:
        server.run("stdio")
        return
    import uvicorn

    app: ASGIApp = server.streamable_http_app(host=args.host)
    token = os.environ.get(TOKEN_ENV)
    if token:
        app = require_bearer(app, token)
    print(f"billing MCP server on http://{args.host}:{args.port}/mcp", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
