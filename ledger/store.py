"""The ledger's operations over an asyncpg pool. The ledger decides; callers act on its answer."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import asyncpg
from opentelemetry import trace
from pydantic import BaseModel

from ledger import queries
from ledger.canonical import canonical_payload
from ledger.errors import (
    AlreadySettledError,
    InvalidTransitionError,
    LedgerUnavailableError,
    OutcomeIgnoredError,
    PayloadMismatchError,
    ReasonRequiredError,
    RecordNotFoundError,
    TenantMismatchError,
)
from ledger.records import (
    Reservation,
    ReserveResult,
    ToolExecutionRecord,
    to_event,
    to_record,
)
from ledger.status import UNRESOLVED, FailureKind, SideEffect, Status

_tracer = trace.get_tracer("onceflow.ledger")

# Driver errors that mean "the database is not there right now": nothing is known to have changed.
_UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.ConnectionFailureError,
)


_RESERVE_ROUNDS = 3
# What an existing row means for a caller that did not get to reserve it.
_EXISTING_OUTCOME = {
    Status.COMPLETED: Reservation.COMPLETED,
    Status.STARTED: Reservation.IN_FLIGHT,
    Status.INDETERMINATE: Reservation.IN_FLIGHT,
    Status.AWAITING_APPROVAL: Reservation.AWAITING_APPROVAL,
}


class CallIdentity(BaseModel):
    """Who a call belongs to. The key is derived, never chosen."""

    tenant: str
    run_id: str
    tool_call_id: str
    agent: str = ""

    @property
    def key(self) -> str:
        return f"{self.run_id}:{self.tool_call_id}"


class UnresolvedPage(BaseModel):
    records: list[ToolExecutionRecord]
    next_cursor: str | None


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)


def _require_reason(reason: str | None, action: str) -> str:
    if reason is None or not reason.strip():
        raise ReasonRequiredError(action)
    return reason.strip()


def encode_cursor(created_at: datetime, key: str) -> str:
    raw = json.dumps([created_at.isoformat(), key]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        at, key = json.loads(base64.urlsafe_b64decode(padded))
        return datetime.fromisoformat(at), str(key)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"malformed cursor {cursor!r}") from exc


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release a connection to the pool without asyncpg's reset query (one round trip per call).

    The ledger never changes session state (no SET, LISTEN, cursors or advisory locks), and asyncpg
    still rolls back a transaction left open before calling this.
    """


class Ledger:
    """The tool-execution ledger. Create with `await Ledger.connect(dsn)`; close with `close()`."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @classmethod
    async def connect(cls, dsn: str, *, min_size: int = 1, max_size: int = 10) -> Ledger:
        try:
            pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, reset=_keep_session)
        except _UNAVAILABLE as exc:
            raise LedgerUnavailableError(f"cannot reach the ledger database: {exc}") from exc
        return cls(pool)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def _connection(self, operation: str, **attributes: Any) -> AsyncIterator[Any]:
        span_attributes = {f"onceflow.{k}": str(v) for k, v in attributes.items() if v is not None}
        with _tracer.start_as_current_span(f"ledger.{operation}", attributes=span_attributes):
            connected = False
            try:
                async with self._pool.acquire() as conn:
                    connected = True
                    yield conn
            except _UNAVAILABLE as exc:
                raise LedgerUnavailableError(f"ledger {operation} failed: {exc}") from exc
            except asyncpg.PostgresError as exc:
                if connected:
                    raise
                # Refused while connecting ("not currently accepting connections", "too many
                # clients"...): no statement ran, so this is the database being away, nothing more.
                raise LedgerUnavailableError(f"ledger {operation} failed to connect: {exc}") from exc

    @staticmethod
    def _annotate(record: ToolExecutionRecord, outcome: str | None = None) -> None:
        span = trace.get_current_span()
        span.set_attribute("onceflow.tool", record.tool_name)
        span.set_attribute("onceflow.status", record.status.value)
        if outcome:
            span.set_attribute("onceflow.outcome", outcome)

    # -- reserve -------------------------------------------------------------------------------

    async def reserve(
        self,
        call: CallIdentity,
        *,
        tool_name: str,
        side_effect: SideEffect,
        arguments: dict[str, Any],
        owner: str,
        approval: bool = False,
    ) -> ReserveResult:
        """Write the call down before it runs. Of any number of racing callers, one may send."""
        payload = canonical_payload(tool_name, arguments)
        initial = Status.AWAITING_APPROVAL if approval else Status.STARTED
        async with self._connection("reserve", key=call.key, tool=tool_name) as conn:
            # A row seen as `failed` here was re-reserved and failed again between our two
            # statements; the reservation statement is then simply offered once more.
            for _ in range(_RESERVE_ROUNDS):
                row = await conn.fetchrow(
                    queries.RESERVE,
                    call.key,
                    call.tenant,
                    call.run_id,
                    call.tool_call_id,
                    call.agent,
                    tool_name,
                    side_effect.value,
                    initial.value,
                    payload.text,
                    payload.sha256,
                    owner,
                )
                if row is not None:
                    record = to_record(row)
                    outcome = Reservation.NEW if row["inserted"] else Reservation.RETRY
                    if record.status is Status.AWAITING_APPROVAL:
                        outcome = Reservation.AWAITING_APPROVAL
                    self._annotate(record, outcome)
                    return ReserveResult(outcome=outcome, record=record)
                existing = await conn.fetchrow(queries.SELECT_RECORD, call.key)
                if existing is None:  # pragma: no cover - rows are never deleted while a key is live
                    raise RecordNotFoundError(call.key)
                record = to_record(existing)
                if record.tenant != call.tenant:
                    raise TenantMismatchError(call.key)
                if record.payload_sha256 != payload.sha256:
                    break
                if record.status is not Status.FAILED:
                    outcome = _EXISTING_OUTCOME.get(record.status, Reservation.SETTLED)
                    self._annotate(record, outcome)
                    return ReserveResult(outcome=outcome, record=record)
            else:
                raise LedgerUnavailableError(
                    f"reserving {call.key!r} kept racing other reservations; nothing was sent"
                )
        await self._append_event(
            call.key,
            actor=owner,
            kind="payload_mismatch_refused",
            detail={"offered_sha256": payload.sha256, "offered": payload.value},
        )
        raise PayloadMismatchError(call.key, record.payload_sha256, payload.sha256)

    # -- outcomes from the owner -----------------------------------------------------------------

    async def complete(
        self, key: str, *, owner: str, result: Any, result_reference: str | None = None
    ) -> ToolExecutionRecord:
        """The owner reports success. Anyone else's report, or a late one, is logged and ignored."""
        async with self._connection("complete", key=key) as conn:
            row = await conn.fetchrow(queries.COMPLETE_STARTED, key, owner, _json(result), result_reference)
            if row is not None:
                record = to_record(row)
                self._annotate(record)
                return record
        return await self._late_owner_outcome(
            key,
            owner=owner,
            to=Status.COMPLETED,
            result=result,
            result_reference=result_reference,
        )

    async def fail(self, key: str, *, owner: str, kind: FailureKind, error: str) -> ToolExecutionRecord:
        """The owner reports that the call did not take effect: not attempted, or rejected."""
        async with self._connection("fail", key=key) as conn:
            row = await conn.fetchrow(queries.FAIL_STARTED, key, owner, kind.value, error)
            if row is not None:
                record = to_record(row)
                self._annotate(record)
                return record
        return await self._late_owner_outcome(
            key, owner=owner, to=Status.FAILED, failure_kind=kind, error=error
        )

    async def _late_owner_outcome(
        self,
        key: str,
        *,
        owner: str,
        to: Status,
        result: Any = None,
        result_reference: str | None = None,
        failure_kind: FailureKind | None = None,
        error: str | None = None,
    ) -> ToolExecutionRecord:
        """The slow path: the row is not `started` by this owner any more.

        A definite outcome from the owner settles an `indeterminate` call (the answer arrived late
        but it is the truth). Every other outcome is appended as an event and ignored.
        """
        async with self._connection("late_outcome", key=key) as conn, conn.transaction():
            row = await conn.fetchrow(queries.SELECT_RECORD_FOR_UPDATE, key)
            if row is None:
                raise RecordNotFoundError(key)
            current = to_record(row)
            if current.owner == owner and current.status is Status.INDETERMINATE:
                reason = "late outcome from the call's owner"
                if to is Status.COMPLETED:
                    updated = await conn.fetchrow(
                        queries.SET_COMPLETED,
                        key,
                        current.status.value,
                        _json(result),
                        result_reference,
                        owner,
                        reason,
                        None,
                    )
                else:
                    assert failure_kind is not None
                    updated = await conn.fetchrow(
                        queries.SET_FAILED,
                        key,
                        current.status.value,
                        failure_kind.value,
                        error,
                        owner,
                        reason,
                        None,
                    )
                await conn.execute(
                    queries.INSERT_EVENT,
                    key,
                    owner,
                    f"late_{to.value}",
                    current.status.value,
                    to.value,
                    reason,
                    None,
                    None,
                )
                record = to_record(updated)
                self._annotate(record, "late_outcome_applied")
                return record
            why = "not the owner" if current.owner != owner else f"call is {current.status}"
            await conn.execute(
                queries.INSERT_EVENT,
                key,
                owner,
                "outcome_ignored",
                current.status.value,
                None,
                why,
                None,
                _json(
                    {
                        "reported": to.value,
                        "result": result,
                        "error": error,
                        "failure_kind": failure_kind,
                    }
                ),
            )
        raise OutcomeIgnoredError(
            key,
            current.status.value,
            f"record {to.value} ({why})",
            settled_by=current.settled_by,
            settled_at=current.settled_at,
        )

    async def mark_indeterminate(self, key: str, *, actor: str, reason: str) -> ToolExecutionRecord:
        """`started` becomes `indeterminate`: it may have taken effect and nobody knows yet.

        Returns the record as it stands afterwards; a call already past `started` is left alone.
        """
        async with self._connection("mark_indeterminate", key=key) as conn, conn.transaction():
            row = await conn.fetchrow(queries.SET_INDETERMINATE, key, reason)
            if row is None:
                current = await conn.fetchrow(queries.SELECT_RECORD, key)
                if current is None:
                    raise RecordNotFoundError(key)
                return to_record(current)
            await conn.execute(
                queries.INSERT_EVENT,
                key,
                actor,
                "indeterminate",
                "started",
                "indeterminate",
                reason,
                None,
                None,
            )
            record = to_record(row)
            self._annotate(record)
        return record

    # -- settling what nobody knew ----------------------------------------------------------------

    async def settle(
        self,
        key: str,
        *,
        status: Status,
        actor: str,
        reason: str,
        evidence: Any = None,
        result: Any = None,
        result_reference: str | None = None,
        tenant: str | None = None,
    ) -> ToolExecutionRecord:
        """Compare-and-set an `indeterminate` call to `completed` or `failed`. One caller wins.

        The loser gets `AlreadySettledError` naming who won and when. `tenant`, when given, scopes
        the key: another tenant's key is reported as not found.
        """
        if status not in (Status.COMPLETED, Status.FAILED):
            raise ValueError(f"a call can be settled completed or failed, not {status!r}")
        reason = _require_reason(reason, "settling a call")
        actor = _require_reason(actor, "settling a call (actor)")
        async with self._connection("settle", key=key, status=status) as conn, conn.transaction():
            row = await conn.fetchrow(queries.SELECT_RECORD_FOR_UPDATE, key)
            if row is None or (tenant is not None and row["tenant"] != tenant):
                raise RecordNotFoundError(key)
            current = to_record(row)
            if current.status is not Status.INDETERMINATE:
                error_type = AlreadySettledError if current.status.is_settled else InvalidTransitionError
                raise error_type(
                    key,
                    current.status.value,
                    f"settle as {status.value}",
                    settled_by=current.settled_by,
                    settled_at=current.settled_at,
                )
            if status is Status.COMPLETED:
                updated = await conn.fetchrow(
                    queries.SET_COMPLETED,
                    key,
                    current.status.value,
                    _json(result),
                    result_reference,
                    actor,
                    reason,
                    _json(evidence),
                )
            else:
                updated = await conn.fetchrow(
                    queries.SET_FAILED,
                    key,
                    current.status.value,
                    FailureKind.NOT_APPLIED.value,
                    None,
                    actor,
                    reason,
                    _json(evidence),
                )
            await conn.execute(
                queries.INSERT_EVENT,
                key,
                actor,
                "settled",
                current.status.value,
                status.value,
                reason,
                _json(evidence),
                None,
            )
            record = to_record(updated)
            self._annotate(record)
        return record

    async def record_late_outcome(
        self, key: str, *, actor: str, status: Status, evidence: Any = None, detail: Any = None
    ) -> None:
        """Append an outcome that arrived after the call was settled. It changes nothing."""
        await self._append_event(
            key,
            actor=actor,
            kind="late_outcome",
            to_status=status,
            evidence=evidence,
            detail=detail,
        )

    # -- reading -----------------------------------------------------------------------------------

    async def get(
        self, key: str, *, with_events: bool = True, tenant: str | None = None
    ) -> ToolExecutionRecord:
        async with self._connection("get", key=key) as conn:
            row = await conn.fetchrow(queries.SELECT_RECORD, key)
            if row is None or (tenant is not None and row["tenant"] != tenant):
                raise RecordNotFoundError(key)
            events = await conn.fetch(queries.SELECT_EVENTS, key) if with_events else []
        return to_record(row, [to_event(e) for e in events])

    async def find(self, key: str) -> ToolExecutionRecord | None:
        """The record without events, or None when the key was never reserved."""
        async with self._connection("find", key=key) as conn:
            row = await conn.fetchrow(queries.SELECT_RECORD, key)
        return None if row is None else to_record(row)

    async def list_unresolved(
        self,
        tenant: str,
        *,
        statuses: Sequence[Status] = (Status.INDETERMINATE, Status.STARTED),
        limit: int = 50,
        cursor: str | None = None,
    ) -> UnresolvedPage:
        """A tenant's calls nobody can yet vouch for, longest waiting first."""
        wanted = [s.value for s in statuses if s in UNRESOLVED]
        if len(wanted) != len(statuses):
            raise ValueError(f"only unresolved statuses can be listed: {sorted(UNRESOLVED)}")
        if not 1 <= limit <= 500:
            raise ValueError("limit must be between 1 and 500")
        after_at, after_key = decode_cursor(cursor) if cursor else (None, None)
        async with self._connection("list_unresolved", tenant=tenant) as conn:
            rows = await conn.fetch(queries.LIST_UNRESOLVED, tenant, wanted, after_at, after_key, limit + 1)
        records = [to_record(r) for r in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = records[-1]
            next_cursor = encode_cursor(last.created_at, last.key)
        return UnresolvedPage(records=records, next_cursor=next_cursor)

    async def _append_event(
        self,
        key: str,
        *,
        actor: str,
        kind: str,
        from_status: Status | None = None,
        to_status: Status | None = None,
        reason: str | None = None,
        evidence: Any = None,
        detail: Any = None,
    ) -> None:
        async with self._connection("append_event", key=key) as conn:
            try:
                await conn.execute(
                    queries.INSERT_EVENT,
                    key,
                    actor,
                    kind,
                    from_status.value if from_status else None,
                    to_status.value if to_status else None,
                    reason,
                    _json(evidence),
                    _json(detail),
                )
            except asyncpg.ForeignKeyViolationError as exc:
                raise RecordNotFoundError(key) from exc
