"""The call path: reserve a call before it runs, the owner's outcome after, and `indeterminate`.

One of the parts `Ledger` (ledger.store) is made of. A reservation without a guard is one statement
(RESERVE); with a guard, the guards decide first in the same transaction (ledger.guarded). The
owner's late or repeated report takes the slow path here, and a report that contradicts a settled
decision is flagged as a conflict (ledger.conflicts).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from pydantic import BaseModel

from onceflow import metrics
from onceflow.ledger import queries
from onceflow.ledger.base import to_json
from onceflow.ledger.canonical import canonical_payload
from onceflow.ledger.conflicts import ConflictFlags, contradicts, never_sent, same_report
from onceflow.ledger.errors import (
    AttemptExpiredError,
    LedgerUnavailableError,
    OutcomeIgnoredError,
    RecordNotFoundError,
    TenantMismatchError,
)
from onceflow.ledger.guarded import GuardedReservations
from onceflow.ledger.guards import Guard
from onceflow.ledger.records import (
    Reservation,
    ReserveResult,
    ToolExecutionRecord,
    completed,
    reserve_result,
    to_record,
)
from onceflow.ledger.run_ids import RunIds
from onceflow.ledger.status import EventSource, FailureKind, SideEffect, Status
from onceflow.sdk.keys import call_key

_RESERVE_ROUNDS = 3
# What an existing row means for a caller that did not get to reserve it. The one table of it in
# Python: a guarded reservation's outcome comes from onceflow_guarded_reserve (migration 0010);
# tests/test_ledger_queries.py keeps it so.
_EXISTING_OUTCOME = {
    Status.COMPLETED: Reservation.COMPLETED,
    Status.STARTED: Reservation.IN_FLIGHT,
    Status.INDETERMINATE: Reservation.IN_FLIGHT,
    Status.AWAITING_APPROVAL: Reservation.AWAITING_APPROVAL,
    Status.HELD: Reservation.HELD,
}


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


class CallIdentity(BaseModel):
    """Who a call belongs to. The key is derived, never chosen."""

    tenant: str
    run_id: str
    tool_call_id: str
    agent: str = ""

    @property
    def key(self) -> str:
        return call_key(self.run_id, self.tool_call_id)


class CallPath(GuardedReservations, ConflictFlags):
    """Reserve, the owner's outcome (complete, fail, and the slow path of a late one), indeterminate."""

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
        lease: timedelta | None = None,
        guard: Guard | None = None,
        execution: str | None = None,
        not_after: datetime | None = None,
        unsent_owners: Sequence[str] = (),
        began_at: datetime | None = None,
    ) -> ReserveResult:
        """Write the call down before it runs. Of any number of racing callers, one may send.

        `lease`: how long the owner may hold the call `started` before it counts as gone (the
        tool's timeout plus a margin). With `approval`, the call is recorded `awaiting_approval`;
        once an operator approved it, the next reservation with the same payload claims it.
        With `guard`, the intent, lineage, entity and budget checks (ledger.guards) decide first,
        in the same transaction: the call may come back held, reused or refused instead.
        With `execution` (the run's first execution), the run id is claimed for it first, in the
        same statement when guarded (ledger/run_ids.py); RunIdTakenError if another holds it.
        With `not_after` (the attempt's deadline), nothing is reserved once the database's clock
        is past it (AttemptExpiredError): the attempt's workflow has given up on it, and may have
        run the call again and told the model how that ended.
        With `unsent_owners` (the owner tokens of earlier attempts whose reservation may have
        committed while its answer was lost: they sent nothing), a call found `started` under one of
        them is released as not attempted and reserved afresh, instead of answering IN_FLIGHT.
        With `began_at` (when the attempt began), a call that failed after it is not retried: a
        retry the workflow decides on begins after it heard the failure, so such an attempt is one
        its workflow gave up on (an execution a reset replaced), and the failure may be what the
        model was told since. The row answers for itself (SETTLED).
        """
        again = functools.partial(
            self._reserve,
            call,
            tool_name=tool_name,
            side_effect=side_effect,
            arguments=arguments,
            owner=owner,
            approval=approval,
            lease=lease,
            guard=guard,
            execution=execution,
            not_after=not_after,
            began_at=began_at,
        )
        reserved = await again()
        record = reserved.record
        lost = reserved.outcome is Reservation.IN_FLIGHT and record.status is Status.STARTED
        if not (lost and record.owner in unsent_owners):
            return reserved
        assert record.owner is not None
        await self.fail(
            call.key,
            owner=record.owner,
            kind=FailureKind.NOT_ATTEMPTED,
            error="its reservation committed but the answer was lost; nothing was sent",
        )
        # This attempt released it just now, after it began: its retry is its own to make.
        return await again(began_at=None)

    async def _reserve(
        self,
        call: CallIdentity,
        *,
        tool_name: str,
        side_effect: SideEffect,
        arguments: dict[str, Any],
        owner: str,
        approval: bool,
        lease: timedelta | None,
        guard: Guard | None,
        execution: str | None,
        not_after: datetime | None,
        began_at: datetime | None,
    ) -> ReserveResult:
        payload = canonical_payload(tool_name, arguments)
        if execution is not None and guard is None:
            await RunIds(self).claim(call.run_id, execution=execution, tenant=call.tenant, agent=call.agent)
        if guard is not None:
            # Held behind a call that settles at the same moment: the function marks that call
            # under its row lock, so its settle wakes this one, or this one is decided again on the
            # settled call (migration 0015); nothing needs a second look afterwards.
            guarded = await self.reserve_guarded(
                key=call.key,
                tenant=call.tenant,
                run_id=call.run_id,
                tool_call_id=call.tool_call_id,
                agent=call.agent,
                tool_name=tool_name,
                side_effect=side_effect,
                payload=payload,
                owner=owner,
                approval=approval,
                lease=lease,
                guard=guard,
                execution=execution,
                not_after=not_after,
                began_at=began_at,
            )
            if guarded.record.owner == owner:  # this reservation wrote the row (sent or not)
                self.acknowledge(guarded.record)
            return guarded
        initial = Status.AWAITING_APPROVAL if approval else Status.STARTED
        async with self.connection("reserve", key=call.key, tool=tool_name) as conn:
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
                    lease,
                    not_after,
                    began_at,
                )
                if row is not None:
                    record = to_record(row)
                    outcome = Reservation.NEW if row["inserted"] else Reservation.RETRY
                    if record.status is Status.AWAITING_APPROVAL:
                        outcome = Reservation.AWAITING_APPROVAL
                    self.acknowledge(record)
                    self.annotate(record, outcome)
                    return reserve_result(outcome, record)
                existing = await conn.fetchrow(queries.SELECT_RECORD, call.key)
                if not_after is not None and (existing is None or existing["status"] == Status.FAILED):
                    # Nothing was taken where a fresh or failed key would be: past the deadline?
                    if await conn.fetchval(queries.PAST, not_after):
                        raise AttemptExpiredError(call.key, not_after)
                if existing is None:  # pragma: no cover - rows are never deleted while a key is live
                    raise RecordNotFoundError(call.key)
                record = to_record(existing)
                if record.tenant != call.tenant:
                    raise TenantMismatchError(call.key)
                if record.payload_sha256 != payload.sha256:
                    break
                if record.status is Status.AWAITING_APPROVAL and record.approved_at is not None:
                    claimed = await conn.fetchrow(
                        queries.CLAIM_APPROVED, call.key, owner, payload.sha256, lease
                    )
                    if claimed is None:
                        continue  # someone else claimed it; read it again
                    record = to_record(claimed)
                    self.acknowledge(record)
                    self.annotate(record, Reservation.NEW)
                    return reserve_result(Reservation.NEW, record)
                # A failed call that was ever in conflict is not re-sent (open: its owner says it
                # took effect; acknowledged: an operator set its final status), nor a final refusal.
                final = record.failure_kind is not None and record.failure_kind.is_final
                failed_since = began_at is not None and _settled_since(record, began_at)
                if (
                    record.status is not Status.FAILED
                    or record.conflict_at is not None
                    or final
                    or failed_since
                ):
                    outcome = _EXISTING_OUTCOME.get(record.status, Reservation.SETTLED)
                    self.annotate(record, outcome)
                    metrics.record_replay(record)
                    return reserve_result(outcome, record)
            else:
                raise LedgerUnavailableError(
                    f"reserving {call.key!r} kept racing other reservations; nothing was sent"
                )
        await self.refuse_other_payload(
            call.key, owner=owner, recorded_sha256=record.payload_sha256, offered=payload
        )

    # -- outcomes from the owner -----------------------------------------------------------------

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


def _settled_since(record: ToolExecutionRecord, began_at: datetime) -> bool:
    """Was the call settled at or after the attempt began? (queries.RESERVE's $14 test.)"""
    return record.settled_at is not None and record.settled_at >= began_at
