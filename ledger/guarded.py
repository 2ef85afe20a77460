"""Reserving a call under guards: one statement, a server-side function that locks, checks and writes.

The guards' rules (ledger/guards.py describes them) are decided by `onceflow_guarded_reserve`
(migrations/0010_guarded_reserve_function.sql), in one statement. Since migration 0018 it takes the
advisory locks and inserts a call with nothing in its way (no row for its key, no twin, no busy entity,
room in its budget, no call it replaces) itself, with its event; any other call it hands to
`onceflow_guarded_decide` (0017's form of the whole decision): one read of the call's row and its
twins, lineage, intent, entity and budget, the write (only over the row version read) and its event.
tests/test_guarded_fast_path.py holds the first to writing exactly what the second would. A run's first write claims its run id in
the same statement (migrations/0011_claim_with_reservation.sql). One round trip and one commit: the
statement commits on its own, and its backend aborts it if the worker dies while it waits on a lock
(`client_connection_check_interval`, ledger/connections.py), so that nothing is committed for a client that
died while it waited. This module sends the call and turns the answer into a ReserveResult.
Used for every call a workflow reserves; `Ledger.reserve` without a guard keeps its one-statement
path (compensations, and callers that want no checks).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from onceflow import metrics
from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase, check_provenance
from onceflow.ledger.canonical import CanonicalPayload
from onceflow.ledger.errors import (
    AttemptExpiredError,
    LedgerUnavailableError,
    PayloadMismatchError,
    TenantMismatchError,
)
from onceflow.ledger.guards import Action, Guard, GuardArgumentError, Heard
from onceflow.ledger.records import (
    STATUSES,
    Reservation,
    ReserveResult,
    ToolExecutionRecord,
    built_record,
    reserve_result,
    to_record,
)
from onceflow.ledger.run_ids import RunIdTakenError
from onceflow.ledger.status import EventSource, SideEffect, Status

_ROUNDS = 3

# SQLSTATEs the function raises (see its migration).
_GUARD_ARGUMENT = "OF001"
_TENANT_MISMATCH = "OF002"
_RUN_ID_TAKEN = "OF003"
_BLOCKER_SETTLED = "OF004"
_CHANGED_MEANWHILE = "OF005"
_PAST_DEADLINE = "OF006"


def decided_again(record: ToolExecutionRecord) -> bool:
    """Do the guards decide again when this recorded call is reserved once more? Held, or failed
    without effect and open to a retry (not final, never in conflict). Any other row answers for
    itself, and its budget limit is the one recorded on it. (The function spells the same test, and
    also lets a failure settled after the attempt began answer for itself: that reservation sends
    nothing, so which budget limit was read for it does not matter.)"""
    if record.status is Status.HELD:
        return True
    if record.status is not Status.FAILED or record.conflict_at is not None:
        return False
    return record.failure_kind is None or not record.failure_kind.is_final


def statement_values(
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
    not_after: datetime | None = None,
    began_at: datetime | None = None,
) -> tuple[Any, ...]:
    """The parameters of queries.GUARDED_RESERVE ($1 to $27), in order."""
    # (A guard copied with `model_copy(update=...)` skips validation: bare ids may still be here.)
    heard = sorted(
        (Heard(tool_call_id=h) if isinstance(h, str) else h for h in guard.heard),
        key=lambda h: h.tool_call_id,
    )
    return (
        guard.locks(tenant=tenant, run_id=run_id, tool_name=tool_name, payload_sha256=payload.sha256),
        key,
        tenant,
        run_id,
        tool_call_id,
        agent,
        tool_name,
        side_effect.value,
        payload.text,
        payload.sha256,
        owner,
        approval,
        lease,
        guard.intent,
        guard.entity,
        guard.exclusive,
        guard.on_busy,
        guard.amount,
        guard.limit,
        guard.replaces,
        # No heard calls go as NULL, not as empty arrays: the function reads both alike (no id is
        # found in either), and three arrays fewer to encode were a tenth of the client's work.
        [h.tool_call_id for h in heard] if heard else None,
        guard.toolset,
        guard.currency,
        [h.status.value if h.status is not None else None for h in heard] if heard else None,
        [h.settled_at for h in heard] if heard else None,
        not_after,
        began_at,
    )


def _inserted(row: asyncpg.Record, values: tuple[Any, ...], side_effect: SideEffect) -> ToolExecutionRecord:
    """The record of a call the function inserted as sent (queries.GUARDED_RESERVE_BRIEF answered
    without the row): the values it was given (`statement_values`), and what the row holds that the
    caller cannot know. What both of the function's inserts write for such a call, column for column
    (tests/test_ledger_records.py holds it to the row)."""
    payload = row["payload"]
    return built_record(
        {
            "key": values[1],
            "tenant": values[2],
            "run_id": values[3],
            "tool_call_id": values[4],
            "agent": values[5],
            "tool_name": values[6],
            "side_effect": side_effect,
            "status": STATUSES[row["status"]],
            "payload": json.loads(payload),
            "payload_sha256": values[9],
            "attempt": 1,
            "owner": values[10],
            "result": None,
            "result_reference": None,
            "failure_kind": None,
            "error": None,
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
            "settled_at": None,
            "settled_by": None,
            "reason": None,
            "evidence": None,
            "lease_expires_at": row["lease_expires_at"],
            "approved_by": None,
            "approved_at": None,
            "escalated_to": None,
            "escalated_at": None,
            "conflict_at": None,
            "conflict_detail": None,
            "conflict_cleared_at": None,
            "conflict_cleared_by": None,
            "entity": values[14],
            "entity_exclusive": values[15],
            "amount": row["amount"],
            "budget_limit": row["budget_limit"],
            "toolset": values[21],
            "currency": values[22],
            "replaces": values[19],
            "held_by": None,
            "hold_reason": None,
            "reused_from": None,
            "holds_calls": False,
            "events": [],
        }
    )


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
        execution: str | None = None,
        not_after: datetime | None = None,
        began_at: datetime | None = None,
    ) -> ReserveResult:
        """`execution`: the run's first execution, when this write is to claim the run id for it
        first (RunIdTakenError when another execution holds it; nothing is reserved then).
        `not_after`: the attempt's deadline; past it (by the database's clock, after the locks)
        AttemptExpiredError, and nothing is reserved. `began_at`: when the attempt began; a call
        that failed after it is not retried by it (the row answers for itself)."""
        check_provenance(owner, EventSource.OWNER)  # the function writes events as the owner
        values = statement_values(
            key=key,
            tenant=tenant,
            run_id=run_id,
            tool_call_id=tool_call_id,
            agent=agent,
            tool_name=tool_name,
            side_effect=side_effect,
            payload=payload,
            owner=owner,
            approval=approval,
            lease=lease,
            guard=guard,
            not_after=not_after,
            began_at=began_at,
        )
        query = queries.GUARDED_RESERVE_BRIEF
        if execution is not None:
            query, values = queries.GUARDED_RESERVE_CLAIMING, (*values, execution)
        for _ in range(_ROUNDS):
            try:
                async with self.connection("reserve", key=key, tool=tool_name) as conn:
                    row = await conn.fetchrow(query, *values)
                    assert row is not None  # the function always returns one row
                    if execution is None:
                        stored = row["record"]
                        record = _inserted(row, values, side_effect) if stored is None else to_record(stored)
                    else:
                        record = to_record(row)
                    return self._answer(row, record, key, payload)  # inside the ledger.reserve span
            except asyncpg.UniqueViolationError:
                # Between the read and the write, another path recorded this key, or made the
                # entity busy (a unique index caught it; the statement rolled back): decide again.
                continue
            except asyncpg.PostgresError as exc:
                if exc.sqlstate in (_BLOCKER_SETTLED, _CHANGED_MEANWHILE):
                    # It was to be held behind a call that settled meanwhile, or its own recorded
                    # row changed after it was read; nothing was written, and the next round
                    # decides on what is there now.
                    continue
                if exc.sqlstate == _GUARD_ARGUMENT:
                    raise GuardArgumentError(exc.args[0] if exc.args else str(exc)) from None
                if exc.sqlstate == _TENANT_MISMATCH:
                    raise TenantMismatchError(key) from None
                if exc.sqlstate == _PAST_DEADLINE:
                    raise AttemptExpiredError(key, not_after) from None
                if exc.sqlstate == _RUN_ID_TAKEN:
                    raise RunIdTakenError(run_id, datetime.fromisoformat(exc.detail or "")) from None
                raise
        raise LedgerUnavailableError(f"reserving {key!r} kept racing other reservations; nothing was sent")

    def _answer(
        self, row: asyncpg.Record, record: ToolExecutionRecord, key: str, payload: CanonicalPayload
    ) -> ReserveResult:
        """The function's answer as a ReserveResult, with the span attributes and metrics it calls for."""
        outcome_text: str = row["outcome"]
        if outcome_text == "payload_mismatch":  # its refusal event is written (and committed)
            raise PayloadMismatchError(key, record.payload_sha256, payload.sha256)
        outcome = Reservation(outcome_text)
        action: Action | None = row["action"]
        self.annotate(record, outcome)
        if action is None:
            if outcome is not Reservation.NEW and outcome is not Reservation.HELD:
                metrics.record_replay(record)  # a recorded call answered for itself
        elif action != "proceed":
            metrics.record_guard_verdict(record.tool_name, action)
            if row["previous_status"] == Status.HELD and record.status.is_settled:
                metrics.record_settled(record, Status.HELD, EventSource.GUARD, row["previous_updated_at"])
        return reserve_result(outcome, record)
