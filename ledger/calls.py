"""The call path: reserve a call before it runs. The owner's outcome after it, and `indeterminate`,
are ledger.outcomes'.

One of the parts `Ledger` (ledger.store) is made of. A reservation without a guard is one statement
(RESERVE); with a guard, the guards decide first in the same transaction (ledger.guarded).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from onceflow import metrics
from onceflow.ledger import queries
from onceflow.ledger.canonical import canonical_payload
from onceflow.ledger.errors import (
    AttemptExpiredError,
    LedgerUnavailableError,
    RecordNotFoundError,
    TenantMismatchError,
)
from onceflow.ledger.guarded import GuardedReservations
from onceflow.ledger.guards import Guard
from onceflow.ledger.outcomes import OwnerOutcomes
from onceflow.ledger.records import (
    Reservation,
    ReserveResult,
    ToolExecutionRecord,
    reserve_result,
    to_record,
)
from onceflow.ledger.run_ids import RunIds
from onceflow.ledger.status import FailureKind, SideEffect, Status
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


class CallIdentity(BaseModel):
    """Who a call belongs to. The key is derived, never chosen."""

    tenant: str
    run_id: str
    tool_call_id: str
    agent: str = ""

    @property
    def key(self) -> str:
        return call_key(self.run_id, self.tool_call_id)


class CallPath(GuardedReservations, OwnerOutcomes):
    """Reserve a call before it runs; the owner's outcomes come from ledger.outcomes."""

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


def _settled_since(record: ToolExecutionRecord, began_at: datetime) -> bool:
    """Was the call settled at or after the attempt began? (queries.RESERVE's $14 test.)"""
    return record.settled_at is not None and record.settled_at >= began_at
