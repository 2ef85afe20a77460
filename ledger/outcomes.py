"""The owner's outcome of a call it reserved (complete, fail, and the slow path of a late or
repeated report), and `indeterminate`.

One of the parts `Ledger` (ledger.store) is made of, beside the reservation (ledger.calls). The
owner's report of a call it still holds `started` is one statement; anything else takes the slow
path, and a report that contradicts a settled decision is flagged as a conflict (ledger.conflicts).
"""

from __future__ import annotations

from typing import Any

import asyncpg

from onceflow import metrics
from onceflow.ledger import queries
from onceflow.ledger.base import to_json
from onceflow.ledger.conflicts import ConflictFlags, contradicts, never_sent, same_report
from onceflow.ledger.errors import OutcomeIgnoredError, RecordNotFoundError
from onceflow.ledger.records import ToolExecutionRecord, completed, to_record
from onceflow.ledger.status import EventSource, FailureKind, Status


def _already_recorded(
    record: ToolExecutionRecord,
    owner: str,
    to: Status,
    result: Any,
    result_reference: str | None,
    failure_kind: FailureKind | None,
    error: str | None,
) -> bool:
    """Does the row hold exactly this owner's report? Then the report is its own, repeated."""
    if record.settled_by != owner or record.status is not to:
        return False
    if to is Status.COMPLETED:
        return (record.result, record.result_reference) == (result, result_reference)
    return (record.failure_kind, record.error) == (failure_kind, error)


class OwnerOutcomes(ConflictFlags):
    """The owner's complete and fail, their slow path, and `mark_indeterminate`."""

    async def complete(
        self, key: str, *, owner: str, result: Any, result_reference: str | None = None
    ) -> ToolExecutionRecord:
        """The owner reports success. Anyone else's report, or a late one, is logged and ignored."""
        reserved = self.acknowledged.latest(key)
        async with self.connection("complete", key=key) as conn:
            if reserved is not None and reserved.owner == owner and reserved.status is Status.STARTED:
                # This process reserved it: only what the completion sets comes back, if the row is
                # still the one the reservation answered (queries.COMPLETE_RESERVED).
                try:
                    row = await conn.fetchrow(
                        queries.COMPLETE_RESERVED,
                        key,
                        owner,
                        to_json(result),
                        result_reference,
                        reserved.updated_at,
                    )
                except asyncpg.UndefinedColumnError:
                    # A schema from before migration 0015 (no holds_calls), as tests build to
                    # migrate real rows: refused when prepared, nothing ran; the whole-row statement.
                    row = None
                if row is not None:
                    record = completed(reserved, row, result_reference)
                    self.acknowledge(record)
                    self.annotate(record)
                    return record
            row = await conn.fetchrow(queries.COMPLETE_STARTED, key, owner, to_json(result), result_reference)
            if row is not None:
                record = to_record(row)
                self.acknowledge(record)
                self.annotate(record)
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
        async with self.connection("fail", key=key) as conn:
            row = await conn.fetchrow(queries.FAIL_STARTED, key, owner, kind.value, error)
            if row is not None:
                record = to_record(row)
                self.acknowledge(record)
                self.annotate(record)
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

        - Already exactly what this owner's report would make it: our own write, whose commit
          answer was lost and which a retry repeats. It is returned as it stands, with no event.
        - `indeterminate` and ours: the answer arrived late but it is the truth; it settles the call.
        - Settled by someone else, reported by an attempt that owned the call, and contradicting the
          decision: flagged as a conflict (ledger.conflicts); the decision stands.
        - Anything else (not an owner, a report that agrees, or a reused call, never sent under its
          key): appended as an event and ignored.
        """
        reported = {"result": result, "error": error, "failure_kind": failure_kind}
        async with self.connection("late_outcome", key=key) as conn, conn.transaction():
            row = await conn.fetchrow(queries.SELECT_RECORD_FOR_UPDATE, key)
            if row is None:
                raise RecordNotFoundError(key)
            current = to_record(row)
            if _already_recorded(current, owner, to, result, result_reference, failure_kind, error):
                return current
            applied = None
            if current.owner == owner and current.status is Status.INDETERMINATE:
                applied = await self._apply_late(conn, current, owner, to, reported, result_reference)
            else:
                was_owner = current.owner == owner or await conn.fetchval(queries.WAS_OWNER, key, owner)
                unsent = never_sent(current)
                if unsent is None and was_owner and contradicts(current.status, to):
                    if not same_report(current, reported_by=owner, reported=to):
                        current = await self.flag_conflict(
                            conn,
                            current,
                            reported_by=owner,
                            source=EventSource.OWNER,
                            reported=to,
                            outcome={**reported, "result_reference": result_reference},
                        )
                    why = f"contradicts the decision ({current.status} by {current.settled_by}): conflict"
                else:
                    why = unsent or ("not the owner" if not was_owner else f"call is {current.status}")
                    await self.insert_event(
                        conn,
                        key,
                        actor=owner,
                        kind="outcome_ignored",
                        source=EventSource.OWNER,
                        from_status=current.status,
                        reason=why,
                        detail={"reported": to.value, **reported},
                    )
        if applied is not None:
            self.acknowledge(applied)
            return applied
        raise OutcomeIgnoredError(
            key,
            current.status.value,
            f"record {to.value} ({why})",
            settled_by=current.settled_by,
            settled_at=current.settled_at,
        )

    async def _apply_late(
        self,
        conn: Any,
        current: ToolExecutionRecord,
        owner: str,
        to: Status,
        reported: dict[str, Any],
        result_reference: str | None,
    ) -> ToolExecutionRecord:
        key, reason = current.key, "late outcome from the call's owner"
        if to is Status.COMPLETED:
            updated = await conn.fetchrow(
                queries.SET_COMPLETED,
                key,
                current.status.value,
                to_json(reported["result"]),
                result_reference,
                owner,
                reason,
                None,
            )
        else:
            assert reported["failure_kind"] is not None
            updated = await conn.fetchrow(
                queries.SET_FAILED,
                key,
                current.status.value,
                reported["failure_kind"].value,
                reported["error"],
                owner,
                reason,
                None,
            )
        await self.insert_event(
            conn,
            key,
            actor=owner,
            kind=f"late_{to.value}",
            source=EventSource.OWNER,
            from_status=current.status,
            to_status=to,
            reason=reason,
        )
        record = to_record(updated)
        self.annotate(record, "late_outcome_applied")
        since = await conn.fetchval(queries.ENTERED_STATUS_AT, key, current.status.value)
        metrics.record_settled(record, current.status, EventSource.OWNER, since)
        return record

    async def mark_indeterminate(
        self,
        key: str,
        *,
        actor: str,
        reason: str,
        source: EventSource = EventSource.INSPECTOR,
        lease_ended: bool = False,
    ) -> ToolExecutionRecord:
        """`started` becomes `indeterminate`: it may have taken effect and nobody knows yet.

        Returns the record as it stands afterwards; a call already past `started` is left alone.
        With `lease_ended` (anyone but the owner), so is a call whose owner's lease has not run out:
        its owner may still be sending it, and will say how it ended.
        """
        async with self.connection("mark_indeterminate", key=key) as conn, conn.transaction():
            row = await conn.fetchrow(queries.SET_INDETERMINATE, key, reason, lease_ended)
            if row is None:
                current = await conn.fetchrow(queries.SELECT_RECORD, key)
                if current is None:
                    raise RecordNotFoundError(key)
                return to_record(current)
            await self.insert_event(
                conn,
                key,
                actor=actor,
                kind="indeterminate",
                source=source,
                from_status=Status.STARTED,
                to_status=Status.INDETERMINATE,
                reason=reason,
            )
            record = to_record(row)
            self.annotate(record)
        self.acknowledge(record)
        return record
