"""Decisions about calls that were never sent: approve or deny one that awaits approval, release one
that is held (or approved and not yet claimed by its run).

Each locks the row, checks that the call is in a state that allows it, changes it and appends its
event, in one transaction, as every decision does (ledger/decisions.py); of two operators the first
wins, and the other is told who, and when.
"""

from __future__ import annotations

from onceflow import metrics
from onceflow.ledger import queries
from onceflow.ledger.base import require_text
from onceflow.ledger.decisions import LockedDecisions
from onceflow.ledger.errors import InvalidTransitionError
from onceflow.ledger.records import ToolExecutionRecord, repeated_decision, to_record
from onceflow.ledger.status import EventSource, FailureKind, Status


class Approvals(LockedDecisions):
    async def approve(
        self,
        key: str,
        *,
        actor: str,
        reason: str | None = None,
        tenant: str | None = None,
        source: EventSource = EventSource.API,
    ) -> ToolExecutionRecord:
        """Record an approval on an `awaiting_approval` call. The run then dispatches it, once.

        Approving again as the same actor (a retried request) returns the record without an event.
        """
        actor = require_text(actor, "approving a call (actor)")
        async with self.connection("approve", key=key) as conn, conn.transaction():
            row = await self._locked(conn, key, tenant)
            updated = await conn.fetchrow(queries.APPROVE, key, actor)
            if updated is None:
                if row["approved_by"] == actor and row["approved_at"] is not None:
                    return repeated_decision(row)
                raise self._refuse(row, "approve")
            await self.insert_event(
                conn,
                key,
                actor=actor,
                kind="approved",
                source=source,
                from_status=Status.AWAITING_APPROVAL,
                reason=reason.strip() if reason and reason.strip() else None,
                detail={"payload_sha256": row["payload_sha256"]},
            )
        return to_record(updated)

    async def deny(
        self,
        key: str,
        *,
        actor: str,
        reason: str,
        tenant: str | None = None,
        source: EventSource = EventSource.API,
    ) -> ToolExecutionRecord:
        """Deny an `awaiting_approval` call: `denied` is final, and nothing is ever sent.

        The same denial again (same actor and reason: a retried request) returns the record.
        """
        reason = require_text(reason, "denying a call")
        actor = require_text(actor, "denying a call (actor)")
        async with self.connection("deny", key=key) as conn, conn.transaction():
            row = await self._locked(conn, key, tenant)
            updated = await conn.fetchrow(queries.DENY, key, actor, reason)
            if updated is None:
                if row["status"] == Status.DENIED and (row["settled_by"], row["reason"]) == (actor, reason):
                    return repeated_decision(row)
                raise self._refuse(row, "deny")
            await self.insert_event(
                conn,
                key,
                actor=actor,
                kind="denied",
                source=source,
                from_status=Status.AWAITING_APPROVAL,
                to_status=Status.DENIED,
                reason=reason,
            )
            since = await conn.fetchval(queries.ENTERED_STATUS_AT, key, Status.AWAITING_APPROVAL.value)
        record = to_record(updated)
        metrics.record_settled(record, Status.AWAITING_APPROVAL, source, since)
        return record

    async def release(
        self,
        key: str,
        *,
        actor: str,
        reason: str,
        tenant: str | None = None,
        source: EventSource = EventSource.API,
    ) -> ToolExecutionRecord:
        """Release a call that was never sent: `held`, or approved and not yet claimed by its run.

        It becomes `failed` (`released`, final): it no longer holds its entity slot or budget
        amount, its key is never reserved again, and its run, asking the ledger, is told it did not
        take effect. Of two operators the first wins; the other gets `AlreadySettledError` naming
        them. The same release again (same actor and reason) returns the record without an event.
        An approval still awaited is denied, not released.
        """
        reason = require_text(reason, "releasing a call")
        actor = require_text(actor, "releasing a call (actor)")
        async with self.connection("release", key=key) as conn, conn.transaction():
            row = await self._locked(conn, key, tenant)
            current = Status(row["status"])
            updated = await conn.fetchrow(queries.RELEASE, key, actor, reason)
            if updated is None:
                if row["failure_kind"] == FailureKind.RELEASED and (row["settled_by"], row["reason"]) == (
                    actor,
                    reason,
                ):
                    return repeated_decision(row)
                if current is Status.AWAITING_APPROVAL and row["approved_at"] is None:
                    raise InvalidTransitionError(
                        key, current.value, "release: it awaits approval; deny it instead"
                    )
                raise self._refuse(row, "release")
            detail = (
                {"held_by": row["held_by"]} if current is Status.HELD else {"approved_by": row["approved_by"]}
            )
            await self.insert_event(
                conn,
                key,
                actor=actor,
                kind="released",
                source=source,
                from_status=current,
                to_status=Status.FAILED,
                reason=reason,
                detail=detail,
            )
            record = to_record(updated)
            self.annotate(record, "released")
        return record
