"""What every part of the ledger shares: the pool (its connections are ledger.connections'), spans,
and event appends."""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import TYPE_CHECKING, Any, NoReturn, Self, TypeVar

import asyncpg
from opentelemetry import trace

from onceflow.ledger import queries
from onceflow.ledger.acknowledged import AcknowledgedWrites
from onceflow.ledger.connections import (
    UNAVAILABLE,
    Connections,
    NotOpenYet,
    Operation,
    keep_session,
    set_up_session,
)
from onceflow.ledger.errors import (
    LedgerUnavailableError,
    PayloadMismatchError,
    ProvenanceError,
    ReasonRequiredError,
    RecordNotFoundError,
)
from onceflow.ledger.records import ToolExecutionRecord
from onceflow.ledger.status import OPERATOR_PREFIX, EventSource, Status
from onceflow.ledger.timelines import Timelines

if TYPE_CHECKING:
    from onceflow.ledger.canonical import CanonicalPayload

tracer = trace.get_tracer("onceflow.ledger")
log = logging.getLogger("onceflow.ledger")
_E = TypeVar("_E", bound=BaseException | None)


# Made once: json.dumps with any non-default option builds a new encoder on every call.
# allow_nan=False: NaN or Infinity is refused here (ValueError), never sent for PostgreSQL to refuse.
_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False)


def to_json(value: Any) -> str | None:
    return None if value is None else _JSON.encode(value)


def require_text(value: str | None, action: str) -> str:
    if value is None or not value.strip():
        raise ReasonRequiredError(action)
    return value.strip()


def has_evidence(evidence: Any) -> bool:
    """Something to go on: not null, not an empty object, list or blank text."""
    if evidence is None:
        return False
    if isinstance(evidence, str):
        return bool(evidence.strip())
    if isinstance(evidence, dict | list):
        return bool(evidence)
    return True


# Doors that act for an authenticated operator: the API itself, and the compensation workflow the
# API starts for one (its input names the operator who asked).
_OPERATOR_DOORS = frozenset({EventSource.API, EventSource.COMPENSATION})


def check_provenance(actor: str, source: EventSource) -> None:
    """Only the operator API (and the compensation it starts) may write an `operator:` actor."""
    if actor.startswith(OPERATOR_PREFIX) and source not in _OPERATOR_DOORS:
        raise ProvenanceError(actor, source.value)


class LedgerBase:
    """The pool and the plumbing. `Ledger` (ledger.store) is what callers use."""

    def __init__(self, pool: asyncpg.Pool | None, timelines: Timelines | None = None) -> None:
        self._connections = NotOpenYet() if pool is None else Connections(pool)
        # The server timeline under the pool (ledger/timelines.py) and the call-path writes seen
        # acknowledged (ledger/acknowledged.py): how a failover that lost writes is noticed.
        self.timelines = timelines or Timelines(f"{socket.gethostname()}:{os.getpid()}")
        self.acknowledged = AcknowledgedWrites()

    @property
    def _pool(self) -> asyncpg.Pool:
        return self._connections._pool

    @classmethod
    async def connect(
        cls, dsn: str, *, min_size: int = 1, max_size: int = 10, process: str | None = None
    ) -> Self:
        """`process`: how this process is named in `onceflow_timelines` (default host:pid)."""
        ledger = cls.opened_later()
        if process is not None:
            ledger.timelines.process = process
        await ledger.open(dsn, min_size=min_size, max_size=max_size)
        return ledger

    @classmethod
    def opened_later(cls) -> Self:
        """A ledger to hand to activities before its database is reached (a Temporal worker plugin
        binds them when the worker is built; it connects when the worker starts). Until `open`,
        every operation raises LedgerUnavailableError."""
        return cls(None)

    async def open(self, dsn: str, *, min_size: int = 1, max_size: int = 10) -> None:
        """Connect a ledger made with `opened_later()`."""
        if self.is_open:
            raise RuntimeError("this ledger is open already")
        timelines = self.timelines

        async def set_up(conn: asyncpg.Connection) -> None:
            await set_up_session(conn)
            await timelines.observe(conn)

        try:
            pool = await asyncpg.create_pool(
                dsn, min_size=min_size, max_size=max_size, init=set_up, reset=keep_session
            )
        except UNAVAILABLE as exc:
            raise LedgerUnavailableError(f"cannot reach the ledger database: {exc}") from exc
        self._connections = Connections(pool)

    @property
    def is_open(self) -> bool:
        return not isinstance(self._connections, NotOpenYet) and not self._connections._closed

    def acknowledge(self, record: ToolExecutionRecord) -> None:
        """Note a call-path write the server acknowledged (ledger/lost_writes.py checks them after
        a failover)."""
        self.acknowledged.add(record, self.timelines.current)

    async def close(self) -> None:
        """Close the connections (waiting for operations under way); `open` may connect it again."""
        await self.timelines.settled()
        await self._connections.close()

    def connection(self, operation: str, **attributes: Any) -> Operation:
        """`async with` a pooled connection inside a `ledger.<operation>` span.

        Attributes become `onceflow.<name>` span attributes (None is left out); outages become
        LedgerUnavailableError.
        """
        span_attributes = {f"onceflow.{k}": str(v) for k, v in attributes.items() if v is not None}
        return Operation(self._connections, operation, span_attributes)

    @staticmethod
    def annotate(record: ToolExecutionRecord, outcome: str | None = None) -> None:
        span = trace.get_current_span()
        if not span.is_recording():
            return
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
        source: EventSource,
        from_status: Status | str | None = None,
        to_status: Status | str | None = None,
        reason: str | None = None,
        evidence: Any = None,
        detail: Any = None,
    ) -> None:
        check_provenance(actor, source)
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
            source.value,
        )

    async def append_event(
        self, key: str, *, actor: str, kind: str, source: EventSource, **fields: Any
    ) -> None:
        async with self.connection("append_event", key=key) as conn:
            try:
                await self.insert_event(conn, key, actor=actor, kind=kind, source=source, **fields)
            except asyncpg.ForeignKeyViolationError as exc:
                raise RecordNotFoundError(key) from exc

    async def refuse_other_payload(
        self, key: str, *, owner: str, recorded_sha256: str, offered: CanonicalPayload
    ) -> NoReturn:
        """The key is recorded with another payload: log what was offered, then refuse it. The one
        way every reservation path reports a reused key."""
        await self.append_event(
            key,
            actor=owner,
            kind="payload_mismatch_refused",
            source=EventSource.OWNER,
            detail={"offered_sha256": offered.sha256, "offered": offered.value},
        )
        raise PayloadMismatchError(key, recorded_sha256, offered.sha256)
