"""Reserving a call under guards: one transaction that locks, checks (ledger.guards) and writes.

Used for every call a workflow reserves; `Ledger.reserve` without a guard keeps its one-statement
path (compensations, and callers that want no checks).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg

from onceflow import metrics
from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase, to_json
from onceflow.ledger.canonical import CanonicalPayload
from onceflow.ledger.errors import LedgerUnavailableError, PayloadMismatchError, TenantMismatchError
from onceflow.ledger.guards import GUARD_ACTOR, Candidate, Guard, Verdict, decide, take_locks
from onceflow.ledger.records import Reservation, ReserveResult, ToolExecutionRecord, to_record
from onceflow.ledger.status import EventSource, FailureKind, SideEffect, Status

_ROUNDS = 3

# What an existing row that the guards do not look at again means for this reservation.
_STANDING = {
    Status.COMPLETED: Reservation.COMPLETED,
    Status.STARTED: Reservation.IN_FLIGHT,
    Status.INDETERMINATE: Reservation.IN_FLIGHT,
    Status.AWAITING_APPROVAL: Reservation.AWAITING_APPROVAL,
}


def decided_again(record: ToolExecutionRecord) -> bool:
    """Do the guards decide again when this recorded call is reserved once more? Held, or failed
    without effect and open to a retry (not final, never in conflict). Any other row answers for
    itself, and its budget limit is the one recorded on it."""
    if record.status is Status.HELD:
        return True
    if record.status is not Status.FAILED or record.conflict_at is not None:
        return False
    return record.failure_kind is None or not record.failure_kind.is_final


class GuardedReservations(LedgerBase):
    async def reserve_guarded(
        self,
        *,
        key: str,
        tenant: str,
        run_id: str,
        tool_call_id: str,
        agent: str,
        tool_name: str,
        side_effect: SideEffect,
        payload: CanonicalPayload,
        owner: str,
        approval: bool,
        lease: timedelta | None,
        guard: Guard,
    ) -> ReserveResult:
        call = Candidate(key, tenant, run_id, tool_name, payload.sha256)
        mismatch: ToolExecutionRecord | None = None
        for _ in range(_ROUNDS):
            try:
                async with self.connection("reserve", key=key, tool=tool_name) as conn, conn.transaction():
                    await take_locks(
                        conn,
                        guard.locks(
                            tenant=tenant, run_id=run_id, tool_name=tool_name, payload_sha256=payload.sha256
                        ),
                    )
                    row = await conn.fetchrow(queries.SELECT_RECORD_FOR_UPDATE, key)
                    existing = None if row is None else to_record(row)
                    if existing is not None:
                        if existing.tenant != tenant:
                            raise TenantMismatchError(key)
                        if existing.payload_sha256 != payload.sha256:
                            mismatch = existing
                            break
                        standing = await self._standing(conn, existing, owner, payload, lease)
                        if standing is not None:
                            return standing
                        call = Candidate(key, tenant, run_id, tool_name, payload.sha256, existing.created_at)
                    verdict = await decide(conn, call, guard)
                    return await self._write(
                        conn,
                        existing,
                        verdict,
                        values=[key, tenant, run_id, tool_call_id, agent, tool_name, side_effect.value],
                        payload=payload,
                        owner=owner,
                        approval=approval,
                        lease=lease,
                        guard=guard,
                    )
            except asyncpg.UniqueViolationError:
                # Another path made the entity busy between our check and our write (the unique
                # index caught it): decide again, under the locks, with the row it wrote.
                continue
        else:
            raise LedgerUnavailableError(
                f"reserving {key!r} kept racing other reservations; nothing was sent"
            )
        await self.append_event(
            key,
            actor=owner,
            kind="payload_mismatch_refused",
            source=EventSource.OWNER,
            detail={"offered_sha256": payload.sha256, "offered": payload.value},
        )
        assert mismatch is not None
        raise PayloadMismatchError(key, mismatch.payload_sha256, payload.sha256)

    async def _standing(
        self,
        conn: asyncpg.Connection,
        existing: ToolExecutionRecord,
        owner: str,
        payload: CanonicalPayload,
        lease: timedelta | None,
    ) -> ReserveResult | None:
        """The answer for a recorded call, or None when the guards must decide again (held, or
        failed without effect and not final)."""
        status = existing.status
        if decided_again(existing):
            return None
        if status is Status.AWAITING_APPROVAL and existing.approved_at is not None:
            claimed = await conn.fetchrow(queries.CLAIM_APPROVED, existing.key, owner, payload.sha256, lease)
            assert claimed is not None  # the row is locked, approved and of this payload
            record = to_record(claimed)
            self.annotate(record, Reservation.NEW)
            return ReserveResult(outcome=Reservation.NEW, record=record)
        outcome = _STANDING.get(status, Reservation.SETTLED)
        if status is Status.COMPLETED and existing.reused_from is not None:
            outcome = Reservation.REUSED
        if status is Status.FAILED and existing.failure_kind is FailureKind.GUARD_REFUSED:
            outcome = Reservation.REFUSED
        self.annotate(existing, outcome)
        metrics.record_replay(existing)
        return ReserveResult(outcome=outcome, record=existing)

    async def _write(
        self,
        conn: asyncpg.Connection,
        existing: ToolExecutionRecord | None,
        verdict: Verdict,
        *,
        values: list[Any],
        payload: CanonicalPayload,
        owner: str,
        approval: bool,
        lease: timedelta | None,
        guard: Guard,
    ) -> ReserveResult:
        key = values[0]
        other = verdict.other
        if (
            existing is not None
            and existing.status is Status.HELD
            and verdict.action == "hold"
            and other is not None
            and existing.held_by == other.key
        ):
            self.annotate(existing, Reservation.HELD)
            return ReserveResult(outcome=Reservation.HELD, record=existing)  # still waiting, nothing new
        status, outcome, kind = _shape(
            verdict, approval, retry=existing is not None and existing.status is Status.FAILED
        )
        held_by = other.key if verdict.action == "hold" and other else None
        reused = other if verdict.action == "reuse" else None
        reused_from: str | None = None
        if reused is not None:
            reused_from = reused.reused_from or reused.key  # point at the call that took effect
        settled = status in (Status.COMPLETED, Status.FAILED)
        row = await conn.fetchrow(
            queries.GUARDED_WRITE,
            *values,
            status.value,
            payload.text,
            payload.sha256,
            owner,
            lease if status is Status.STARTED else None,
            guard.entity,
            guard.exclusive,
            guard.amount,
            guard.limit,
            guard.replaces,
            held_by,
            verdict.reason if held_by else None,
            reused_from,
            to_json(reused.result) if reused else None,
            reused.result_reference if reused else None,
            kind.value if kind else None,
            verdict.reason if kind else None,
            GUARD_ACTOR if settled else None,
            verdict.reason if settled else None,
            1 if existing is not None and existing.status is Status.FAILED else 0,
            guard.toolset,
            guard.currency,
        )
        assert row is not None  # an upsert always returns its row
        record = to_record(row)
        previous = existing.status if existing is not None else None
        detail: dict[str, Any] = {"attempt": record.attempt, **verdict.detail}
        if held_by:
            detail["held_by"] = held_by
        if reused_from:
            detail["reused_from"] = reused_from
        if verdict.action == "proceed":
            event_kind, actor, source = "reserved", owner, EventSource.OWNER
            if guard.replaces:
                detail["replaces"] = guard.replaces
        else:
            event_kind, actor, source = _EVENT[verdict.action], GUARD_ACTOR, EventSource.GUARD
        await self.insert_event(
            conn,
            key,
            actor=actor,
            kind=event_kind,
            source=source,
            from_status=previous,
            to_status=record.status,
            reason=verdict.reason or None,
            detail=detail,
        )
        self.annotate(record, outcome)
        if verdict.action != "proceed":
            metrics.record_guard_verdict(record.tool_name, verdict.action)
        if existing is not None and existing.status is Status.HELD and settled:
            metrics.record_settled(record, Status.HELD, EventSource.GUARD, existing.updated_at)
        return ReserveResult(outcome=outcome, record=record)


_EVENT = {"hold": "held", "reuse": "reused", "refuse": "guard_refused"}


def _shape(
    verdict: Verdict, approval: bool, *, retry: bool
) -> tuple[Status, Reservation, FailureKind | None]:
    """The status a verdict writes, what the reservation reports, and the failure kind if any."""
    if verdict.action == "hold":
        return Status.HELD, Reservation.HELD, None
    if verdict.action == "reuse":
        return Status.COMPLETED, Reservation.REUSED, None
    if verdict.action == "refuse":
        return Status.FAILED, Reservation.REFUSED, FailureKind.GUARD_REFUSED
    if approval:
        return Status.AWAITING_APPROVAL, Reservation.AWAITING_APPROVAL, None
    return Status.STARTED, Reservation.RETRY if retry else Reservation.NEW, None
