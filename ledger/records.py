"""What the ledger hands back: a record per call, its events, and the outcome of a reservation."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

import asyncpg
from pydantic import BaseModel, ConfigDict

from onceflow.ledger.status import EventSource, FailureKind, SideEffect, Status


class ToolExecutionEvent(BaseModel):
    """One line of a call's history. Never updated, never deleted."""

    model_config = ConfigDict(frozen=True)

    id: int
    key: str
    at: datetime
    actor: str
    kind: str
    source: EventSource = EventSource.UNRECORDED
    from_status: Status | None = None
    to_status: Status | None = None
    reason: str | None = None
    evidence: Any = None
    detail: Any = None


class ToolExecutionRecord(BaseModel):
    """The ledger's view of one side-effecting tool call."""

    model_config = ConfigDict(frozen=True)

    key: str
    tenant: str
    run_id: str
    tool_call_id: str
    agent: str
    tool_name: str
    side_effect: SideEffect
    status: Status
    payload: dict[str, Any]
    payload_sha256: str
    attempt: int
    owner: str | None
    result: Any = None
    result_reference: str | None = None
    failure_kind: FailureKind | None = None
    error: str | None = None
    created_at: datetime
    updated_at: datetime
    settled_at: datetime | None = None
    settled_by: str | None = None
    reason: str | None = None
    evidence: Any = None
    lease_expires_at: datetime | None = None
    approved_by: str | None = None
    approved_at: datetime | None = None
    escalated_to: str | None = None
    escalated_at: datetime | None = None
    # A late definite outcome contradicted the decision; the decision stands (see ledger.conflicts).
    conflict_at: datetime | None = None
    conflict_detail: Any = None
    conflict_cleared_at: datetime | None = None
    conflict_cleared_by: str | None = None
    # Guards (ledger/guards.py): the entity the call acts on, what it draws on that entity's budget,
    # the call it replaces, the call it waits for while held, and the call whose result it reused.
    entity: str | None = None
    entity_exclusive: bool = False
    amount: Decimal | None = None
    budget_limit: Decimal | None = None
    toolset: str | None = None  # the tool's toolset: its entity slots and budgets are its own
    currency: str | None = None  # the amount's currency: a budget of its own
    replaces: str | None = None
    held_by: str | None = None
    hold_reason: str | None = None
    reused_from: str | None = None
    # A guard held another call behind this one (migration 0015): when this call settles, the calls
    # held behind it are looked up and their runs woken. False: nobody waits for it.
    holds_calls: bool = False
    events: list[ToolExecutionEvent] = []

    @property
    def has_conflict(self) -> bool:
        """An open conflict: flagged and not yet acknowledged by an operator."""
        return self.conflict_at is not None and self.conflict_cleared_at is None


class Reservation(StrEnum):
    """What reserve found. Only NEW and RETRY mean: you own the call, send it now."""

    NEW = "new"
    RETRY = "retry"  # it had failed without effect; re-reserved with attempt + 1
    AWAITING_APPROVAL = "awaiting_approval"  # recorded; wait for an operator before sending
    COMPLETED = "completed"  # already done: use the recorded result, do not call the tool
    IN_FLIGHT = "in_flight"  # started or indeterminate: never dispatch again
    SETTLED = "settled"  # denied or compensated: a final answer that is not a result
    HELD = "held"  # a guard holds it behind another call: recorded, not sent; reserve again later
    REUSED = "reused"  # the same intent completed before: its recorded result, nothing sent
    REFUSED = "refused"  # a guard refused it (budget, busy entity, lineage): final, nothing sent


class ReserveResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    outcome: Reservation
    record: ToolExecutionRecord

    @property
    def may_send(self) -> bool:
        return self.outcome in (Reservation.NEW, Reservation.RETRY)


_JSON_COLUMNS = ("payload", "result", "evidence", "detail")


def row_to_dict(row: asyncpg.Record) -> dict[str, Any]:
    data = dict(row)
    for column in _JSON_COLUMNS:
        if isinstance(data.get(column), str):
            data[column] = json.loads(data[column])
    return data


_RECORD_FIELDS = tuple(ToolExecutionRecord.model_fields)  # in their order: `events` last
_RECORD_COLUMNS = _RECORD_FIELDS[:-1]
_RECORD_JSON_COLUMNS = frozenset({"payload", "result", "evidence", "conflict_detail"})
# The record's enum fields, from the text the row holds to the member: a lookup, not an Enum call.
_RECORD_ENUMS = {
    column: {member.value: member for member in enum}
    for column, enum in (("status", Status), ("side_effect", SideEffect), ("failure_kind", FailureKind))
}


def to_record(row: asyncpg.Record, events: list[ToolExecutionEvent] | None = None) -> ToolExecutionRecord:
    """A row of tool_executions (and any extra columns a statement adds, which are dropped) as a record.

    The row is the database's own, and the table's column types and nullability are the record's
    fields' (tests/test_ledger_records.py holds them to that), so it is not validated again: its
    JSON columns are parsed, its enum columns become their members, and the record is built from
    exactly its fields. Validating it took the hot path's largest share of the client's time (two
    records per write call; docs/benchmarks.md, "Issue 22, fifth pass"). A row short of a column,
    which no statement returns, is validated, and fails there.
    """
    columns = dict(zip(row.keys(), row, strict=True))
    try:
        data = {name: columns[name] for name in _RECORD_COLUMNS}
    except KeyError:
        return validated_record(row, events)
    for name in _RECORD_JSON_COLUMNS:
        value = data[name]
        if value is not None:
            data[name] = json.loads(value)
    for name, members in _RECORD_ENUMS.items():
        value = data[name]
        if value is not None:
            data[name] = members[value]
    data["events"] = events or []
    return built_record(data)


def built_record(data: dict[str, Any]) -> ToolExecutionRecord:
    """A record of `data`, which holds every field (`events` too) as the record's type: trusted
    values, not validated again (see `to_record`)."""
    record = ToolExecutionRecord.__new__(ToolExecutionRecord)
    # What pydantic's `model_construct` sets, without its pass over defaults (every field is here).
    object.__setattr__(record, "__dict__", data)
    object.__setattr__(record, "__pydantic_fields_set__", set(_RECORD_FIELDS))  # its own: copies add to it
    object.__setattr__(record, "__pydantic_extra__", None)
    object.__setattr__(record, "__pydantic_private__", None)
    return record


def completed(
    reserved: ToolExecutionRecord, row: asyncpg.Record, result_reference: str | None
) -> ToolExecutionRecord:
    """The record of a call its owner completed, from the record its reservation answered (the row
    as it stood until this completion: queries.COMPLETE_RESERVED wrote only over that row) and what
    the completion returned. The same record `to_record` makes of the whole row
    (tests/test_ledger_records.py)."""
    data = dict(reserved.__dict__)
    result = row["result"]
    data["status"] = Status.COMPLETED
    data["result"] = None if result is None else json.loads(result)
    data["result_reference"] = result_reference
    data["settled_at"] = row["settled_at"]
    data["settled_by"] = reserved.owner
    data["updated_at"] = row["updated_at"]
    data["holds_calls"] = row["holds_calls"]
    data["events"] = []
    return built_record(data)


def reserve_result(outcome: Reservation, record: ToolExecutionRecord) -> ReserveResult:
    """`ReserveResult(outcome=outcome, record=record)` of values already of their types, without
    validating them again (two per write call)."""
    answer = ReserveResult.__new__(ReserveResult)
    object.__setattr__(answer, "__dict__", {"outcome": outcome, "record": record})
    object.__setattr__(answer, "__pydantic_fields_set__", {"outcome", "record"})
    object.__setattr__(answer, "__pydantic_extra__", None)
    object.__setattr__(answer, "__pydantic_private__", None)
    return answer


STATUSES = {member.value: member for member in Status}


class RepeatedDecision(ToolExecutionRecord):
    """The record as it stands, answering a decision that was already recorded exactly so (the same
    actor deciding the same again: a retried request, or a second browser tab): nothing was written.
    A record like any other to whoever does not ask; the API tells its caller it was a repeat."""


def repeated_decision(row: asyncpg.Record) -> RepeatedDecision:
    return RepeatedDecision.model_construct(**dict(to_record(row)))


def validated_record(
    row: asyncpg.Record, events: list[ToolExecutionEvent] | None = None
) -> ToolExecutionRecord:
    """The same row through pydantic's validation: what `to_record` falls back to for a row short of
    a column, and what the tests hold its records to."""
    columns = dict(row)
    for name in _RECORD_JSON_COLUMNS:
        if isinstance(columns.get(name), str):
            columns[name] = json.loads(columns[name])
    return ToolExecutionRecord.model_validate({**columns, "events": events or []})


def to_event(row: asyncpg.Record) -> ToolExecutionEvent:
    return ToolExecutionEvent(**row_to_dict(row))
