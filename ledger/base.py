"""What every part of the ledger shares: the pool, connection handling, spans, and event appends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Self

import asyncpg
from opentelemetry import trace

from ledger import queries
from ledger.errors import LedgerUnavailableError, ReasonRequiredError, RecordNotFoundError
from ledger.records import ToolExecutionRecord
from ledger.status import Status

tracer = trace.get_tracer("onceflow.ledger")

# Driver errors that mean "the database is not there right now": nothing is known to have changed.
UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.ConnectionFailureError,
)


def to_json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)


def require_text(value: str | None, action: str) -> str:
    if value is None or not value.strip():
        raise ReasonRequiredError(action)
    return value.strip()


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release a connection to the pool without asyncpg's reset query (one round trip per call).

    The ledger never changes session state (no SET, LISTEN, cursors or advisory locks), and asyncpg
    still rolls back a transaction left open before calling this.
    """


class LedgerBase:
    """The pool and the plumbing. `Ledger` (ledger.store) is what callers use."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @classmethod
    async def connect(cls, dsn: str, *, min_size: int = 1, max_size: int = 10) -> Self:
        try:
            pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, reset=_keep_session)
        except UNAVAILABLE as exc:
            raise LedgerUnavailableError(f"cannot reach the ledger database: {exc}") from exc
        return cls(pool)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def connection(self, operation: str, **attributes: Any) -> AsyncIterator[Any]:
        """A pooled connection inside a `ledger.<operation>` span; outages become LedgerUnavailable."""
        span_attributes = {f"onceflow.{k}": str(v) for k, v in attributes.items() if v is not None}
        with tracer.start_as_current_span(f"ledger.{operation}", attributes=span_attributes):
            connected = False
            try:
                async with self._pool.acquire() as conn:
                    connected = True
                    yield conn
            except UNAVAILABLE as exc:
                raise LedgerUnavailableError(f"ledger {operation} failed: {exc}") from exc
            except asyncpg.PostgresError as exc:
                if connected:
                    raise
                # Refused while connecting ("not currently accepting connections", "too many
                # clients"...): no statement ran, so this is the database being away, nothing more.
                raise LedgerUnavailableError(f"ledger {operation} failed to connect: {exc}") from exc

    @staticmethod
    def annotate(record: ToolExecutionRecord, outcome: str | None = None) -> None:
        span = trace.get_current_span()
        span.set_attribute("onceflow.tool", record.tool_name)
        span.set_attribute("onceflow.status", record.status.value)
        if outcome:
            span.set_attribute("onceflow.outcome", outcome)

    @staticmethod
    async def insert_event(
        conn: asyncpg.Connection,
        key: str,
        *,
        actor: str,
        kind: str,
        from_status: Status | str | None = None,
        to_status: Status | str | None = None,
        reason: str | None = None,
        evidence: Any = None,
        detail: Any = None,
    ) -> None:
        await conn.execute(
            queries.INSERT_EVENT,
            key,
            actor,
            kind,
            str(from_status) if from_status else None,
            str(to_status) if to_status else None,
            reason,
            to_json(evidence),
            to_json(detail),
        )

    async def append_event(self, key: str, *, actor: str, kind: str, **fields: Any) -> None:
        async with self.connection("append_event", key=key) as conn:
            try:
                await self.insert_event(conn, key, actor=actor, kind=kind, **fields)
            except asyncpg.ForeignKeyViolationError as exc:
                raise RecordNotFoundError(key) from exc
