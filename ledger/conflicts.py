"""Conflicts: a definite outcome that arrives after a call was settled and contradicts the decision.

An operator said "failed", then the call's own attempt reports that it completed: the world and the
ledger disagree. The decision stands (the run already acted on it), but the call is flagged: it is
listed for operators, shown on the record, and the run's `OnceflowConflictKeys` search attribute
names it. The flag stays open until an operator acknowledges it, saying what the world is
(completed, failed or compensated) and how they know; that status is then final for the key.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from onceflow import metrics
from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase, has_evidence, require_text, to_json
from onceflow.ledger.errors import ConflictNotOpenError, RecordNotFoundError
from onceflow.ledger.records import ToolExecutionRecord, to_record
from onceflow.ledger.status import EventSource, Status

# Settled states that say the call took effect. A "completed" report contradicts every other one.
_TOOK_EFFECT = frozenset({Status.COMPLETED, Status.COMPENSATED})


def contradicts(settled: Status, reported: Status) -> bool:
    """Does a definite `reported` outcome disagree with the `settled` decision about the effect?"""
    if not settled.is_settled or reported not in (Status.COMPLETED, Status.FAILED):
        return False
    return (reported is Status.COMPLETED) != (settled in _TOOK_EFFECT)


def never_sent(record: ToolExecutionRecord) -> str | None:
    """Why no report about `record` can contradict anything, or None: a reused call was never sent
    under its key (it was answered with its twin's result, whose own key carries any conflict)."""
    if record.reused_from is None:
        return None
    return f"never sent: answered with the result of {record.reused_from}"


def same_report(record: ToolExecutionRecord, *, reported_by: str, reported: Status) -> bool:
    """Is the record's open conflict this very report (a retried step), so nothing new is to say?"""
    detail = record.conflict_detail if record.has_conflict else None
    return (
        isinstance(detail, dict)
        and detail.get("reported_by") == reported_by
        and detail.get("reported") == reported.value
    )


class ConflictFlags(LedgerBase):
    async def flag_conflict(
        self,
        conn: asyncpg.Connection,
        current: ToolExecutionRecord,
        *,
        reported_by: str,
        source: EventSource,
        reported: Status,
        evidence: Any = None,
        outcome: dict[str, Any] | None = None,
    ) -> ToolExecutionRecord:
        """Flag `current` (locked by the caller's transaction) and append `outcome_conflict`.

        The report is kept whole in `conflict_detail`, next to who had decided and when.
        """
        decided_at = current.settled_at.isoformat() if current.settled_at else None
        detail = {
            "reported": reported.value,
            "reported_by": reported_by,
            "source": source.value,
            "decided": current.status.value,
            "decided_by": current.settled_by,
            "decided_at": decided_at,
            "evidence": evidence,
            **(outcome or {}),
        }
        updated = await conn.fetchrow(queries.FLAG_CONFLICT, current.key, to_json(detail))
        if updated is None:  # pragma: no cover - the caller checked the row is settled, under lock
            raise RecordNotFoundError(current.key)
        await self.insert_event(
            conn,
            current.key,
            actor=reported_by,
            kind="outcome_conflict",
            source=source,
            from_status=current.status,
            reason=f"{reported_by} reports {reported.value}, but {current.settled_by or 'the ledger'} "
            f"decided {current.status.value}; the decision stands until an operator acts",
            evidence=evidence,
            detail=detail,
        )
        record = to_record(updated)
        self.annotate(record, "outcome_conflict")
        metrics.record_conflict(record, source)
        return record

    async def acknowledge_conflict(
        self,
        key: str,
        *,
        actor: str,
        status: Status,
        reason: str,
        evidence: Any = None,
        source: EventSource = EventSource.API,
        tenant: str | None = None,
    ) -> ToolExecutionRecord:
        """An operator has looked at the conflict and says what the world is; the flag is cleared.

        `status` is what they found: `completed` (it took effect), `failed` (it did not) or
        `compensated` (it took effect and was undone). With `evidence` (what they looked at) it is
        recorded as the call's final status: the key is never reserved again, and budgets count the
        call as that status says (a completed amount stays drawn). The same status as decided only
        closes the flag. Acknowledging again with the same actor and status (a retried request)
        returns the record unchanged.
        """
        if status not in _ACKNOWLEDGED:
            raise ValueError(
                f"a conflict is acknowledged as completed, failed or compensated, not {status!r}"
            )
        reason = require_text(reason, "acknowledging a conflict")
        actor = require_text(actor, "acknowledging a conflict (actor)")
        if not has_evidence(evidence):
            raise ValueError(
                "acknowledging a conflict sets the call's final status: give evidence "
                "(what you checked on the other side, e.g. a ticket, a query, a reference)"
            )
        async with self.connection("acknowledge_conflict", key=key) as conn, conn.transaction():
            row = await conn.fetchrow(queries.SELECT_RECORD_FOR_UPDATE, key)
            if row is None or (tenant is not None and row["tenant"] != tenant):
                raise RecordNotFoundError(key)
            current = to_record(row)
            if not current.has_conflict:
                if current.conflict_cleared_by == actor and current.status is status:
                    return current
                raise ConflictNotOpenError(key, current.conflict_cleared_by)
            updated = await conn.fetchrow(
                queries.ACKNOWLEDGE_CONFLICT, key, actor, status.value, reason, to_json(evidence)
            )
            await self.insert_event(
                conn,
                key,
                actor=actor,
                kind="conflict_acknowledged",
                source=source,
                from_status=current.status,
                to_status=status,
                reason=reason,
                evidence=evidence,
                detail={"conflict_at": current.conflict_at.isoformat() if current.conflict_at else None},
            )
        return to_record(updated)


# What an operator may say the world is, when they close a conflict.
_ACKNOWLEDGED = frozenset({Status.COMPLETED, Status.FAILED, Status.COMPENSATED})
