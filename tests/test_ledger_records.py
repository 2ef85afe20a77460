"""Records built from rows: `to_record` builds a row's record without validating it again
(onceflow/ledger/records.py), which holds only while the table's columns are the record's fields,
of their types. These tests hold the table to that, and the built record to the validated one.
The property test checks the same on every row after every step (tests/support/ledger_invariants.py).
"""

from __future__ import annotations

import types
import typing
import uuid
from datetime import datetime
from decimal import Decimal
from enum import Enum
from typing import Any

import pydantic
import pytest

from onceflow.ledger import (
    CallIdentity,
    EventSource,
    FailureKind,
    Guard,
    Ledger,
    OutcomeIgnoredError,
    Reservation,
    ReserveResult,
    SideEffect,
    Status,
    ToolExecutionRecord,
)
from onceflow.ledger.records import to_record
from tests.support.ledger_invariants import record_as_validated

# The Python types a column of each PostgreSQL type may stand for in the record.
PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "text": (str, Enum),
    "integer": (int,),
    "boolean": (bool,),
    "timestamp with time zone": (datetime,),
    "numeric": (Decimal,),
}
# A jsonb column is any JSON (Any) or, for the payload, an object.
JSONB_TYPES = ({object}, {dict})


def _field_types(annotation: Any) -> tuple[set[type], bool]:
    """The types a field's annotation allows, and whether it allows None."""
    if annotation is Any:
        return {object}, True
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        members = set(typing.get_args(annotation))
        optional = type(None) in members
        return {typing.get_origin(m) or m for m in members - {type(None)}}, optional
    return {typing.get_origin(annotation) or annotation}, False


async def test_the_table_has_the_records_fields_of_their_types_and_nullability(ledger: Ledger) -> None:
    async with ledger.connection("test_columns") as conn:
        columns = await conn.fetch(
            "SELECT column_name, data_type, is_nullable = 'YES' AS nullable FROM information_schema.columns"
            " WHERE table_name = 'tool_executions' AND table_schema = current_schema()"
        )
    fields = {name: f for name, f in ToolExecutionRecord.model_fields.items() if name != "events"}
    assert {c["column_name"] for c in columns} == set(fields)
    for column in columns:
        allowed, optional = _field_types(fields[column["column_name"]].annotation)
        assert optional == column["nullable"] or allowed == {object}, column
        if column["data_type"] == "jsonb":
            assert allowed in JSONB_TYPES, (column, allowed)
        else:
            assert all(issubclass(t, PYTHON_TYPES[column["data_type"]]) for t in allowed), (column, allowed)


async def _row(ledger: Ledger, key: str) -> Any:
    async with ledger.connection("test_row") as conn:
        return await conn.fetchrow("SELECT *, true AS inserted FROM tool_executions WHERE key = $1", key)


async def test_a_record_in_each_state_is_the_one_pydantic_validates(ledger: Ledger) -> None:
    run = f"rec-{uuid.uuid4().hex[:8]}"
    arguments = {"account_id": "acct_1", "amount_cents": 500}

    async def reserve(call_id: str, **options: Any) -> str:
        call = CallIdentity(tenant="t", run_id=run, tool_call_id=call_id)
        reserved = await ledger.reserve(
            call,
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments=arguments,
            owner="w1",
            **options,
        )
        assert reserved.record == to_record(await _row(ledger, call.key))
        return call.key

    async def as_stored(record: ToolExecutionRecord) -> None:
        """What an operation returned is what the row holds now."""
        assert record == to_record(await _row(ledger, record.key)), record.key

    completed = await reserve("c1")
    await as_stored(
        await ledger.complete(completed, owner="w1", result={"credit_id": "cr_1", "n": [1.5, None]})
    )
    failed = await reserve("c2")
    await as_stored(await ledger.fail(failed, owner="w1", kind=FailureKind.REJECTED, error="no such account"))
    unknown = await reserve("c3")
    await as_stored(await ledger.mark_indeterminate(unknown, actor="inspector", reason="timed out"))
    await as_stored(await ledger.escalate(unknown, owner="ops", actor="reconciler", reason="no record"))
    await as_stored(
        await ledger.settle(
            unknown,
            status=Status.COMPLETED,
            actor="operator:ann",
            reason="found it",
            evidence={"checked": "billing"},
            result={"credit_id": "cr_3"},
            source=EventSource.API,
        )
    )
    # Its owner's late report contradicts the decision: a conflict, with its detail.
    flagged = await reserve("c4")
    await ledger.mark_indeterminate(flagged, actor="inspector", reason="timed out")
    await as_stored(
        await ledger.settle(flagged, status=Status.FAILED, actor="operator:ann", reason="not in billing")
    )
    with pytest.raises(OutcomeIgnoredError):
        await ledger.complete(flagged, owner="w1", result={"credit_id": "cr_4"})
    waiting = await reserve("c5", approval=True)
    await as_stored(await ledger.approve(waiting, actor="operator:bob", reason="ok"))

    statuses = set()
    for key in (completed, failed, unknown, flagged, waiting):
        row = await _row(ledger, key)
        record_as_validated(row)
        statuses.add(to_record(row).status)
    assert to_record(await _row(ledger, flagged)).has_conflict
    assert statuses == {Status.COMPLETED, Status.FAILED, Status.AWAITING_APPROVAL}


async def test_a_built_record_copies_and_dumps_as_a_validated_one(ledger: Ledger) -> None:
    call = CallIdentity(tenant="t", run_id=f"rec-{uuid.uuid4().hex[:8]}", tool_call_id="c1")
    reserved = await ledger.reserve(
        call, tool_name="issue_credit", side_effect=SideEffect.EXTERNAL, arguments={"a": 1}, owner="w1"
    )
    record = reserved.record
    copy = record.model_copy(update={"status": Status.COMPLETED})
    assert (copy.status, record.status) == (Status.COMPLETED, Status.STARTED)
    assert copy.model_fields_set is not record.model_fields_set
    assert ToolExecutionRecord.model_validate_json(record.model_dump_json()) == record
    with pytest.raises(pydantic.ValidationError):
        record.status = Status.FAILED  # frozen, as a validated record


async def test_a_row_short_of_a_column_is_validated_and_refused(ledger: Ledger) -> None:
    call = CallIdentity(tenant="t", run_id=f"rec-{uuid.uuid4().hex[:8]}", tool_call_id="c1")
    await ledger.reserve(
        call, tool_name="issue_credit", side_effect=SideEffect.EXTERNAL, arguments={"a": 1}, owner="w1"
    )
    async with ledger.connection("test_short_row") as conn:
        row = await conn.fetchrow("SELECT key, status, payload FROM tool_executions WHERE key = $1", call.key)
    with pytest.raises(pydantic.ValidationError, match="tenant"):
        to_record(row)


async def test_a_completion_built_from_its_reservation_is_the_row_it_wrote(ledger: Ledger) -> None:
    """`complete` builds the completed record from the reservation this process holds and the few
    columns the completion returns (queries.COMPLETE_RESERVED). Whatever happened to the row in
    between, the record is the row's, to the order of its result's keys, and one event says so."""
    run = f"rec-{uuid.uuid4().hex[:8]}"
    result = {"credit_id": "cr_1", "amount_cents": 500, "lines": [{"zz": 1, "a": None}], "n": 1.50}

    async def reserve(call_id: str, guard: Guard | None = None) -> str:
        call = CallIdentity(tenant="t", run_id=run, tool_call_id=call_id)
        reserved = await ledger.reserve(
            call,
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments={"account_id": call_id},  # no twins: each its own payload
            owner="w1",
            guard=guard,
        )
        assert reserved.outcome is Reservation.NEW, call_id
        return call.key

    async def completes_as_stored(key: str) -> ToolExecutionRecord:
        record = await ledger.complete(key, owner="w1", result=result, result_reference="ref-1")
        stored = to_record(await _row(ledger, key))
        assert record == stored, key
        assert record.model_dump_json() == stored.model_dump_json(), key  # keys in the row's order
        kinds = [e.kind for e in (await ledger.get(key, with_events=True)).events]
        assert kinds[-1] == "completed" and kinds.count("completed") == 1, kinds
        return record

    # Nothing happened in between (the unguarded and the guarded reservation).
    await completes_as_stored(await reserve("plain"))
    guarded = await completes_as_stored(await reserve("guarded", Guard()))
    assert not guarded.holds_calls
    # A twin was held behind it meanwhile: marked, without touching updated_at.
    other = f"rec2-{uuid.uuid4().hex[:8]}"
    first = CallIdentity(tenant="t", run_id=other, tool_call_id="first")
    twin = CallIdentity(tenant="t", run_id=other, tool_call_id="twin")
    for call, outcome in ((first, Reservation.NEW), (twin, Reservation.HELD)):
        reserved = await ledger.reserve(
            call,
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments={"account_id": "acct_2"},
            owner="w1",
            guard=Guard(),
        )
        assert reserved.outcome is outcome
    assert (await completes_as_stored(first.key)).holds_calls
    # Escalated meanwhile: the row moved on, and the completion reads it whole instead.
    escalated = await reserve("escalated")
    await ledger.escalate(escalated, owner="ops", actor="reconciler", reason="slow")
    assert (await completes_as_stored(escalated)).escalated_to == "ops"
    # Another owner's reservation answer held here does not complete the call for this owner.
    taken = await reserve("taken")
    with pytest.raises(OutcomeIgnoredError):
        await ledger.complete(taken, owner="w2", result=result)
    assert (await completes_as_stored(taken)).settled_by == "w1"


async def test_a_guarded_reservation_answered_briefly_is_the_row_it_wrote(ledger: Ledger) -> None:
    """A call the guarded function inserted as sent comes back without its row
    (queries.GUARDED_RESERVE_BRIEF); its record, built from what was sent, is the row's, to the
    order of the payload's keys. Every other answer (held, reused, refused, awaiting approval, a
    replacement, a retry) carries the row, and is the row's too."""
    run = f"rec-{uuid.uuid4().hex[:8]}"

    async def reserve(call_id: str, guard: Guard, **options: Any) -> tuple[Reservation, ToolExecutionRecord]:
        call = CallIdentity(tenant="t", run_id=run, tool_call_id=call_id, agent="billing")
        reserved = await ledger.reserve(
            call,
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments=options.pop("arguments", {"account_id": call_id, "zz": [1, {"b": True, "aa": None}]}),
            owner="w1",
            guard=guard,
            **options,
        )
        stored = to_record(await _row(ledger, call.key))
        assert reserved.record == stored, call_id
        assert reserved.record.model_dump_json() == stored.model_dump_json(), call_id
        assert reserved == ReserveResult.model_validate(reserved.model_dump()), call_id
        return reserved.outcome, reserved.record

    assert (await reserve("intent", Guard()))[0] is Reservation.NEW
    budget = Guard(
        entity="ord_1", exclusive=True, amount=Decimal("2.50"), limit=Decimal("1E+3"), currency="EUR"
    )
    outcome, record = await reserve("budget", budget.model_copy(update={"toolset": "billing"}))
    assert outcome is Reservation.NEW and record.amount == Decimal("2.50") and record.toolset == "billing"
    assert (await reserve("busy", budget))[0] is Reservation.HELD
    assert (await reserve("waits", Guard(), approval=True))[0] is Reservation.AWAITING_APPROVAL
    await ledger.fail(f"{run}:intent", owner="w1", kind=FailureKind.REJECTED, error="no")
    outcome, record = await reserve("next", Guard(replaces=f"{run}:intent"))
    assert outcome is Reservation.NEW and record.replaces == f"{run}:intent"
    assert (await reserve("intent", Guard()))[0] is Reservation.RETRY
    await ledger.complete(f"{run}:intent", owner="w1", result={"ok": 1})
    same = {"account_id": "intent", "zz": [1, {"b": True, "aa": None}]}
    assert (await reserve("again", Guard(), arguments=same))[0] is Reservation.REUSED
