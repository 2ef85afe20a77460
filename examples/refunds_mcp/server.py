"""A refunds MCP server on onceflow's receiver kit: its only dedup is the kit.

| tool | annotations | what it does |
|---|---|---|
| `issue_refund(order_id, cents)` | not read-only, open world | refunds an order, once per idempotency key (`_meta`) |
| `list_refunds(order_id)` | read-only | the refunds applied for an order |
| `onceflow_key_lookup(idempotency_key)` | read-only | the kit's lookup: what was recorded for a key |
| `onceflow_key_fence(idempotency_key)` | idempotent | the kit's fence: completed -> returned, absent -> never |

A refund is a row in the server's own `refunds` table, written on the kit's transaction: the row and
the key's record commit together, when the tool returns. Faults per order id come from
`REFUNDS_MCP_FAULTS`, a JSON object `{"ord_x": {"mode": "slow", "delay_seconds": 3}}`: `slow` writes,
waits, then answers (the row commits late); `fail_after` writes, waits, then fails (nothing commits).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from onceflow.local.extras import needs_extra

with needs_extra("mcp"):
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

import asyncpg

from onceflow.receiver.mcp import McpKeyed, McpReceiver

FAULTS_ENV = "REFUNDS_MCP_FAULTS"
SCHEMA = """
CREATE TABLE IF NOT EXISTS refunds (
    id         bigserial PRIMARY KEY,
    order_id   text NOT NULL,
    cents      bigint NOT NULL CHECK (cents > 0),
    key        text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""
MOVES_MONEY = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
)
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)


def create_server(database_url: str, faults: dict[str, dict[str, Any]] | None = None) -> MCPServer:
    """The refunds server over `database_url` (its `refunds` table and the kit's keys)."""
    faults = json.loads(os.environ.get(FAULTS_ENV) or "{}") if faults is None else faults
    receiver = McpReceiver(dsn=database_url)
    server = MCPServer(
        "refunds", instructions="Refunds of orders, once per idempotency key.", log_level="WARNING"
    )
    ready = asyncio.Lock()
    created = False

    async def with_schema() -> None:
        nonlocal created
        async with ready:
            if not created:
                store = await receiver.store()
                await store.pool.execute(SCHEMA)
                created = True

    @receiver.tool(server, annotations=MOVES_MONEY)
    async def issue_refund(order_id: str, cents: int, keyed: McpKeyed) -> dict[str, Any]:
        """Refund an order, in cents. Applied once per idempotency key (sent in _meta)."""
        if cents <= 0:
            raise ToolError("a refund is a positive number of cents; nothing was applied")
        await with_schema()
        refund_id = await keyed.connection.fetchval(
            "INSERT INTO refunds (order_id, cents, key) VALUES ($1, $2, $3) RETURNING id",
            order_id,
            cents,
            keyed.key,
        )
        fault = faults.get(order_id)
        if fault is not None:
            await asyncio.sleep(float(fault.get("delay_seconds", 3)))
            if fault.get("mode") == "fail_after":
                raise ToolError("the refund failed after all; nothing was applied")
        return {"refund_id": refund_id, "order_id": order_id, "cents": cents, "idempotency_key": keyed.key}

    @server.tool(annotations=READ_ONLY)
    async def list_refunds(order_id: str) -> dict[str, Any]:
        """The refunds applied for an order."""
        await with_schema()
        store = await receiver.store()
        rows = await store.pool.fetch(
            "SELECT id, cents, key FROM refunds WHERE order_id = $1 ORDER BY id", order_id
        )
        return {"order_id": order_id, "refunds": [dict(row) for row in rows]}

    receiver.add_protocol_tools(server)
    return server


async def refunds_of(database_url: str, key: str) -> int:
    """Refund rows under `key`: the effects, counted by the server's own table (for tests)."""
    conn = await asyncpg.connect(database_url)
    try:
        if await conn.fetchval("SELECT to_regclass('refunds')") is None:
            return 0
        count: int = await conn.fetchval("SELECT count(*) FROM refunds WHERE key = $1", key)
        return count
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m onceflow.examples.refunds_mcp", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--database-url", required=True, help="PostgreSQL for refunds and the kit's keys")
    args = parser.parse_args(argv)
    create_server(args.database_url).run("stdio")
