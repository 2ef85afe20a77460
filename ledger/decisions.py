"""Decisions people (and reconcilers) make about calls that were sent: settle, late outcomes,
escalate, compensated. Approving, denying and releasing a call that was never sent are in
ledger/approvals.py, on the same footing (`LockedDecisions`).

Each one locks the row, checks that the call is in a state that allows it, changes it and appends
its event, all in one transaction. Of two people deciding at once, one wins; the other gets an error
that names the winner and when.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from onceflow import metrics
from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase, has_evidence, require_text, to_json
from onceflow.ledger.conflicts import ConflictFlags, contradicts, never_sent, same_report
from onceflow.ledger.errors import (
    AlreadySettledError,
    EvidenceRequiredError,
    HeldCallError,
    InvalidTransitionError,
    OwnerLeaseLiveError,
    RecordNotFoundError,
    ReusedCallError,
)
from onceflow.ledger.records import ToolExecutionRecord, repeated_decision, to_record
from onceflow.ledger.resends import refuse_during_resend
from onceflow.ledger.status import EventSource, FailureKind, Status


def _same_settlement(
    row: asyncpg.Record, *, status: Status, actor: str, reason: str, evidence: Any, result: Any
) -> bool:
    """Is `row` exactly what this settle would have written? Then it is our own, retried."""
    record = to_record(row)
    return (
        record.status is status
        and record.settled_by == actor
        and record.reason == reason
        and record.evidence == evidence
        and (status is not Status.COMPLETED or record.result == result)
    )


class LockedDecisions(LedgerBase):
    """What every decision starts with: the row, locked, and the refusal that names who came first."""

    async def _locked(self, conn: asyncpg.Connection, key: str, tenant: str | None) -> asyncpg.Record:
        row = await conn.fetchrow(queries.SELECT_FOR_DECISION, key)
        if row is None or (tenant is not None and row["tenant"] != tenant):
            raise RecordNotFoundError(key)
        return row

    @staticmethod
    def _refuse(row: asyncpg.Record, wanted: str) -> InvalidTransitionError:
        """The error for a decision that came too late: who decided instead, and when. A held call
        was never sent: the error names the call it waits for, which is the one to decide."""
        current = Status(row["status"])
        if current is Status.HELD:
            return HeldCallError(row["key"], wanted, held_by=row["held_by"], hold_reason=row["hold_reason"])
        decided_by, decided_at, reason = row["settled_by"], row["settled_at"], row["reason"]
        if decided_by is None and row["approved_at"] is not None:
            # An approval's reason is on its event, not the row.
            decided_by, decided_at, reason = row["approved_by"], row["approved_at"], None
        error_type = AlreadySettledError if decided_by else InvalidTransitionError
        return error_type(
            row["key"], current.value, wanted, settled_by=decided_by, settled_at=decided_at, reason=reason
        )


class OperatorDecisions(ConflictFlags, LockedDecisions):
    """Decisions about a call that was sent: settle it, record a late outcome, escalate it, mark it
    compensated. (Decisions about calls never sent are in ledger.approvals.)"""

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
        source: EventSource = EventSource.API,
        detail: Any = None,
        failure_kind: FailureKind = FailureKind.NOT_APPLIED,
        after_owner_lease: bool = False,
    ) -> ToolExecutionRecord:
        """Compare-and-set an unknown call to `completed` or `failed`. One caller wins.

        A `failed` settlement says the effect is absent (`not_applied`), or, when the receiver
        answered a resend with a refusal on policy grounds, `policy_refused`, which is final.

        Unknown means `indeterminate`, or `started` with its owner's lease run out. The loser gets
        `AlreadySettledError` naming who won and when. `tenant`, when given, scopes the key: another
        tenant's key is reported as not found. The same settle again (same actor, status, reason,
        evidence and result: a step retried after its commit was lost) returns the record as it
        stands, without a second event.

        While the reconciler's resend of the call is on the wire, anyone but the reconciler is
        refused with `ResendInFlightError`, naming the resend and when its lease ends.
        `after_owner_lease` (a reconcile hook's "not there"): while the owner's own lease is live its
        request may still land, so a lookup that finds nothing proves nothing yet, and settling it
        `failed` is refused (`OwnerLeaseLiveError`). A receiver's fence or "no record of this key"
        answer is proof at any time (a fenced key is refused when it lands), and so is a
        `completed`; an operator decides on what they checked.

        A held call is refused with `HeldCallError` naming its blocker (nothing was sent). Settling a
        call that draws on a budget (it has an `amount`) as failed releases that amount, so a person
        must give `evidence` (`EvidenceRequiredError` otherwise); a reconcile hook's verdict is itself
        the evidence.
        """
        if status not in (Status.COMPLETED, Status.FAILED):
            raise ValueError(f"a call can be settled completed or failed, not {status!r}")
        if failure_kind not in (FailureKind.NOT_APPLIED, FailureKind.POLICY_REFUSED):
            raise ValueError(f"a settled failure is not_applied or policy_refused, not {failure_kind!r}")
        reason = require_text(reason, "settling a call")
        actor = require_text(actor, "settling a call (actor)")
        async with self.connection("settle", key=key, status=status) as conn, conn.transaction():
            row = await self._locked(conn, key, tenant)
            current = Status(row["status"])
            unknown = current is Status.INDETERMINATE or (current is Status.STARTED and row["owner_gone"])
            if not unknown:
                if _same_settlement(
                    row, status=status, actor=actor, reason=reason, evidence=evidence, result=result
                ):
                    return repeated_decision(row)
                raise self._refuse(row, f"settle as {status.value}")
            if source is not EventSource.RECONCILER:
                # The reconciler's resend may be on the wire: its answer settles the call.
                await refuse_during_resend(conn, key, f"settle as {status.value}")
            lease_live = row["lease_expires_at"] is not None and not row["owner_gone"]
            if after_owner_lease and status is Status.FAILED and lease_live:
                # The owner's own request may still land: a lookup's "not there" is no proof yet.
                raise OwnerLeaseLiveError(
                    key, current.value, f"settle as {status.value}", until=row["lease_expires_at"]
                )
            if (
                status is Status.FAILED
                and row["amount"] is not None
                and source is not EventSource.RECONCILER
                and not has_evidence(evidence)
            ):
                raise EvidenceRequiredError(key, str(row["amount"]), row["entity"])
            if status is Status.COMPLETED:
                updated = await conn.fetchrow(
                    queries.SET_COMPLETED,
                    key,
                    current.value,
                    to_json(result),
                    result_reference,
                    actor,
                    reason,
                    to_json(evidence),
                )
            else:
                updated = await conn.fetchrow(
                    queries.SET_FAILED,
                    key,
                    current.value,
                    failure_kind.value,
                    None,
                    actor,
                    reason,
                    to_json(evidence),
                )
            await self.insert_event(
                conn,
                key,
                actor=actor,
                kind="settled",
                source=source,
                from_status=current,
                to_status=status,
                reason=reason,
                evidence=evidence,
                detail=detail,
            )
            record = to_record(updated)
            self.annotate(record)
            since = await conn.fetchval(queries.ENTERED_STATUS_AT, key, current.value)
        metrics.record_settled(record, current, source, since)
        self.acknowledge(record)
        return record

    async def record_late_outcome(
        self,
        key: str,
        *,
        actor: str,
        status: Status,
        evidence: Any = None,
        detail: Any = None,
        result: Any = None,
        result_reference: str | None = None,
        source: EventSource = EventSource.RECONCILER,
    ) -> ToolExecutionRecord:
        """A definite outcome (a reconcile hook's) that arrived after someone else settled the call.

        The decision stands. If the outcome agrees, it is appended as a `late_outcome` event; if it
        contradicts the decision, the call is flagged as a conflict (see ledger.conflicts), keeping
        the hook's result so that an acknowledgement as `completed` gives the call that result. The
        same report again (a retried step) adds nothing. Returns the record as it stands.
        """
        async with self.connection("record_late_outcome", key=key) as conn, conn.transaction():
            row = await conn.fetchrow(queries.SELECT_RECORD_FOR_UPDATE, key)
            if row is None:
                raise RecordNotFoundError(key)
            current = to_record(row)
            unsent = never_sent(current)
            if unsent is not None:  # kept as an event; it changes nothing
                await self.insert_event(
                    conn,
                    key,
                    actor=actor,
                    kind="outcome_ignored",
                    source=source,
                    to_status=status,
                    evidence=evidence,
                    reason=unsent,
                    detail=detail,
                )
                return current
            if contradicts(current.status, status):
                if same_report(current, reported_by=actor, reported=status):
                    return current
                return await self.flag_conflict(
                    conn,
                    current,
                    reported_by=actor,
                    source=source,
                    reported=status,
                    evidence=evidence,
                    outcome=_reported(detail=detail, result=result, result_reference=result_reference),
                )
            await self.insert_event(
                conn,
                key,
                actor=actor,
                kind="late_outcome",
                source=source,
                to_status=status,
                evidence=evidence,
                detail=detail,
            )
        return current

    async def escalate(
        self,
        key: str,
        *,
        owner: str,
        actor: str,
        reason: str,
        source: EventSource = EventSource.RECONCILER,
    ) -> ToolExecutionRecord:
        """Name who must look at a call. The outcome is not touched; escalating twice is a no-op."""
        owner = require_text(owner, "escalating a call (owner)")
        async with self.connection("escalate", key=key) as conn, conn.transaction():
            row = await self._locked(conn, key, None)
            updated = await conn.fetchrow(queries.ESCALATE, key, owner)
            if updated is None:
                return to_record(row)
            await self.insert_event(
                conn,
                key,
                actor=actor,
                kind="escalated",
                source=source,
                reason=reason,
                detail={"owner": owner},
            )
        record = to_record(updated)
        metrics.record_escalation(record)
        return record

    async def mark_compensated(
        self,
        key: str,
        *,
        actor: str,
        reason: str,
        evidence: Any = None,
        source: EventSource = EventSource.COMPENSATION,
    ) -> ToolExecutionRecord:
        """A completed call whose compensation took effect becomes `compensated`."""
        reason = require_text(reason, "marking a call compensated")
        async with self.connection("mark_compensated", key=key) as conn, conn.transaction():
            row = await self._locked(conn, key, None)
            if Status(row["status"]) is Status.COMPENSATED:
                return to_record(row)
            if row["reused_from"] is not None:
                raise ReusedCallError(key, "mark compensated", reused_from=row["reused_from"])
            updated = await conn.fetchrow(queries.SET_COMPENSATED, key)
            if updated is None:
                raise self._refuse(row, "mark compensated")
            await self.insert_event(
                conn,
                key,
                actor=actor,
                kind="compensated",
                source=source,
                from_status=Status.COMPLETED,
                to_status=Status.COMPENSATED,
                reason=reason,
                evidence=evidence,
            )
        return to_record(updated)


def _reported(**fields: Any) -> dict[str, Any] | None:
    """What a late report carried, without the fields it left out."""
    kept = {name: value for name, value in fields.items() if value is not None}
    return kept or None
