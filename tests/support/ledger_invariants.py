"""What must hold of the ledger after any step, checked against its own tables
(tests/test_ledger_properties.py). The test keeps only what the ledger cannot know: which calls the
model heard when a call was sent, and what purged calls had drawn on the budget."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg

from onceflow.ledger import (
    AlreadySettledError,
    EventSource,
    InvalidTransitionError,
    Ledger,
    Status,
    queries,
)
from onceflow.ledger.records import to_record, validated_record

GUARDED_TOOL = "issue_credit"
ENTITY = "acct_1"
TOOLSET = "billing"
LIMIT = Decimal(3)
EVIDENCE = {"checked": "the receiver's records"}
# Events whose to_status is what someone reported, not a change of the row.
REPORTS = ("late_outcome", "outcome_ignored")
SENT = ("reserved", "dispatched")  # events that hand a call to an owner to send (to_status started)
# Statuses under which a sent call may have taken effect.
MAY_HAVE_APPLIED = {Status.STARTED, Status.INDETERMINATE, Status.COMPLETED, Status.COMPENSATED}


@dataclass
class Model:
    live: set[str] = field(default_factory=set)  # keys reserved and not purged
    sent_with: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)  # key: (intent, heard)
    purged_usage: Decimal = Decimal(0)  # what purged completed calls had drawn on the budget
    events: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # every event seen, as first seen

    def note_decision(self, key: str, actor: str, outcome: Any) -> None:
        """A refused decision names who decided instead (an AlreadySettledError never says nobody)."""
        if isinstance(outcome, AlreadySettledError):
            assert outcome.settled_by, f"{actor} was refused on {key} without naming the winner"

    def purged(self, before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> None:
        for key, row in before.items():
            if key in after:
                continue
            self.live.discard(key)
            if _draws(row) and row["status"] == Status.COMPLETED:
                self.purged_usage += row["amount"]
        self.events = {i: e for i, e in self.events.items() if e[0] in after}


def _draws(row: dict[str, Any]) -> bool:
    return (
        row["tool_name"] == GUARDED_TOOL
        and row["entity"] == ENTITY
        and row["amount"] is not None
        and row["reused_from"] is None
    )


async def attempt(coro: Awaitable[Any]) -> Any:
    """The decision's record, or the refusal the ledger answered with."""
    try:
        return await coro
    except InvalidTransitionError as refused:
        return refused


async def race(first: Awaitable[Any], second: Awaitable[Any]) -> list[Any]:
    return list(await asyncio.gather(attempt(first), attempt(second)))


def settlement(actor: str, status: Status, key: str) -> dict[str, Any]:
    result = {"id": key} if status is Status.COMPLETED else None
    return {
        "status": status,
        "actor": actor,
        "reason": f"{actor} checked",
        "evidence": EVIDENCE,
        "result": result,
    }


async def owners(ledger: Ledger, key: str) -> list[str]:
    """The call's owner first, then every worker that owned it before."""
    async with ledger.connection("test_owners") as conn:
        owner = await conn.fetchval("SELECT owner FROM tool_executions WHERE key = $1", key)
        past = await conn.fetch(
            "SELECT DISTINCT actor FROM tool_execution_events WHERE key = $1 AND kind = ANY($2) ORDER BY actor",
            key,
            list(SENT),
        )
    return [owner] + [r["actor"] for r in past if r["actor"] != owner]


async def snapshot(ledger: Ledger) -> dict[str, dict[str, Any]]:
    async with ledger.connection("test_snapshot") as conn:
        return {r["key"]: dict(r) for r in await conn.fetch("SELECT * FROM tool_executions")}


async def age_everything(dsn: str, by: timedelta) -> None:
    """Move every row's and event's times `by` into the past, in the test's own database only."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute(
                "UPDATE tool_executions SET created_at = created_at - $1::interval,"
                " updated_at = updated_at - $1::interval, settled_at = settled_at - $1::interval,"
                " conflict_at = conflict_at - $1::interval, conflict_cleared_at = conflict_cleared_at - $1::interval",
                by,
            )
            await conn.execute(
                "ALTER TABLE tool_execution_events DISABLE TRIGGER tool_execution_events_append_only"
            )
            await conn.execute("UPDATE tool_execution_events SET at = at - $1::interval", by)
            # A resend's lease is a time in its detail: it moves with the event.
            await conn.execute(
                "UPDATE tool_execution_events SET detail = jsonb_set(detail, '{on_the_wire_until}',"
                " to_jsonb((detail->>'on_the_wire_until')::timestamptz - $1::interval))"
                " WHERE kind = 'resend' AND detail ? 'on_the_wire_until'",
                by,
            )
            await conn.execute(
                "ALTER TABLE tool_execution_events ENABLE TRIGGER tool_execution_events_append_only"
            )
    finally:
        await conn.close()


async def budget_carried(ledger: Ledger, model: Model) -> Decimal:
    """What the entity's budget carries, from the rows: amounts completed or not ruled out (unresolved
    and sent or waiting for approval, or failed with an open conflict), and what purged calls drew."""
    rows = (await snapshot(ledger)).values()
    carried = model.purged_usage
    for row in rows:
        if not _draws(row):
            continue
        status = Status(row["status"])
        open_conflict = row["conflict_at"] is not None and row["conflict_cleared_at"] is None
        if status in (Status.AWAITING_APPROVAL, Status.STARTED, Status.INDETERMINATE, Status.COMPLETED) or (
            status is Status.FAILED and open_conflict
        ):
            carried += row["amount"]
    return carried


async def ledger_budget(ledger: Ledger) -> Decimal:
    """The budget as the ledger's own guard reads it."""
    async with ledger.connection("test_budget") as conn:
        used = await conn.fetchrow(queries.ENTITY_BUDGET_USED, "t1", GUARDED_TOOL, ENTITY, "", TOOLSET, None)
    return Decimal(used["completed"]) + Decimal(used["unresolved"])


# -- the invariants ------------------------------------------------------------------------------


async def check(ledger: Ledger, model: Model) -> None:
    async with ledger.connection("test_invariants") as conn:
        raw = await conn.fetch("SELECT * FROM tool_executions")
        rows = {r["key"]: dict(r) for r in raw}
        events = [dict(e) for e in await conn.fetch("SELECT * FROM tool_execution_events ORDER BY id")]
        keys = await conn.fetchval("SELECT count(*) = count(DISTINCT key) FROM tool_executions")
    assert keys, "a key has two rows"
    for row in raw:
        record_as_validated(row)
    assert set(rows) == model.live, (
        f"rows {sorted(rows)} are not the calls reserved and not purged {sorted(model.live)}"
    )
    by_key: dict[str, list[dict[str, Any]]] = {key: [] for key in rows}
    for event in events:
        by_key[event["key"]].append(event)
    _append_only(events, model)
    for key, row in rows.items():
        _no_decision_during_a_resend(row, by_key[key])
        _decision_stands(row, by_key[key])
        _way_out(row)
        _never_resent_after_a_conflict(row, by_key[key])
        _blocker_marked(row, rows)
    _intent_rule(rows, by_key, model)
    conflicted = sum(
        (r["amount"] for r in rows.values() if _draws(r) and r["conflict_at"] is not None), Decimal(0)
    )
    carried = await budget_carried(ledger, model)
    ledger_says = await ledger_budget(ledger)
    assert ledger_says == carried, f"the ledger reads the budget as {ledger_says}, the rows say {carried}"
    # Only a late report contradicting a decision (a conflict) can carry a budget past its limit.
    assert carried <= LIMIT + conflicted, f"the budget carries {carried} over the limit {LIMIT}"


def record_as_validated(row: asyncpg.Record) -> None:
    """The record `to_record` builds from a row, unvalidated, is the one pydantic validates from it."""
    built, validated = to_record(row), validated_record(row)
    assert built == validated, f"{row['key']}: built {built!r}, validated {validated!r}"
    # Equality alone would pass a status left as text (a StrEnum equals its value).
    types_of = {name: type(value) for name, value in built.__dict__.items()}
    assert types_of == {name: type(value) for name, value in validated.__dict__.items()}, row["key"]
    assert built.model_dump_json() == validated.model_dump_json(), row["key"]


def _append_only(events: list[dict[str, Any]], model: Model) -> None:
    now = {e["id"]: (e["key"], e["kind"], e["actor"], e["to_status"], e["reason"]) for e in events}
    for event_id, seen in model.events.items():
        assert now.get(event_id) == seen, f"event {event_id} {seen} was changed or lost: {now.get(event_id)}"
    model.events = now


def _resend_leases(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], datetime, timedelta]]:
    """Each resend with the end of its lease (its time on the wire, cut short by an answer) and lead."""
    leases = []
    for event in events:
        if event["kind"] != "resend":
            continue
        detail = json.loads(event["detail"]) if isinstance(event["detail"], str) else event["detail"]
        ends = datetime.fromisoformat(detail["on_the_wire_until"])
        answers = [
            e["at"]
            for e in events
            if e["id"] > event["id"] and e["kind"] == "resend_inconclusive" and _answered(e)
        ]
        leases.append((event, min([ends, *answers]), timedelta(seconds=detail["lead_seconds"])))
    return leases


def _answered(event: dict[str, Any]) -> bool:
    detail = json.loads(event["detail"]) if isinstance(event["detail"], str) else event["detail"]
    return bool(detail and detail.get("answered"))


def _no_decision_during_a_resend(row: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """While a resend is on the wire its answer settles the call: no one else's decision lands, and
    no other resend leaves during its lease nor for as long again (the quiet spell)."""
    leases = _resend_leases(events)
    for resend, ends, _ in leases:
        for event in events:
            if event["id"] <= resend["id"] or event["at"] >= ends:
                continue
            assert not (event["kind"] == "settled" and event["source"] != "reconciler"), (
                f"{row['key']}: {event['actor']} settled it while resend {resend['id']} was on the wire"
            )
    for (first, ends, lead), (second, _, _) in itertools.pairwise(leases):
        assert second["at"] >= ends + lead, (
            f"{row['key']}: a resend left in the quiet spell after {first['id']}"
        )


def _decision_stands(row: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """The row is what its last status-changing event says; a settlement names who made it."""
    # A `late_outcome` or `outcome_ignored` event records what was reported (to_status), not a change.
    changes = [e for e in events if e["to_status"] is not None and e["kind"] not in REPORTS]
    assert changes, f"{row['key']} has no event that put it where it is"
    last = changes[-1]
    assert last["to_status"] == row["status"], (
        f"{row['key']} is {row['status']} but its last decision says {last['to_status']} ({last['kind']} by {last['actor']})"
    )
    if last["kind"] == "settled":
        assert row["settled_by"] == last["actor"], (
            f"{row['key']} settled by {last['actor']}, row says {row['settled_by']}"
        )


def _way_out(row: dict[str, Any]) -> None:
    """Every open call has a way out: a lease that runs out, or a decision someone may make (the
    decisions themselves are taken at the end of each example, every_open_call_has_a_way_out)."""
    status = Status(row["status"])
    if status is Status.STARTED:
        assert row["owner"] and row["lease_expires_at"] is not None, f"{row['key']} is started with no lease"
    if status is Status.HELD:
        assert row["held_by"], f"{row['key']} is held behind nothing"


def _blocker_marked(row: dict[str, Any], rows: dict[str, dict[str, Any]]) -> None:
    """A held call's blocker is marked as holding calls, so that its settle wakes it (migration
    0015): an unmarked blocker's settle would not look for it."""
    if row["status"] == Status.HELD.value and row["held_by"] in rows:
        assert rows[row["held_by"]]["holds_calls"], f"{row['key']} is held behind unmarked {row['held_by']}"


def _never_resent_after_a_conflict(row: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """A call ever in conflict is final: open, its owner says it took effect; acknowledged, an
    operator said what the world is. No reservation hands it out again."""
    conflicts = [e["id"] for e in events if e["kind"] == "outcome_conflict"]
    if conflicts:
        sent = _last_send(events)
        assert sent is None or sent < conflicts[0], f"{row['key']} was sent again after its conflict"


def _state_at(events: list[dict[str, Any]], before: int) -> tuple[Status | None, bool]:
    """A call's status, and whether a conflict was open on it, just before event `before`."""
    status, conflict = None, False
    for event in events:
        if event["id"] >= before:
            break
        if event["to_status"] is not None and event["kind"] not in REPORTS:
            status = Status(event["to_status"])
        if event["kind"] == "outcome_conflict":
            conflict = True
        elif event["kind"] == "conflict_acknowledged" or event["kind"] in SENT:
            conflict = False
    return status, conflict


def _last_send(events: list[dict[str, Any]]) -> int | None:
    sends = [e["id"] for e in events if e["kind"] in SENT and e["to_status"] == Status.STARTED]
    return sends[-1] if sends else None


def _intent_rule(
    rows: dict[str, dict[str, Any]], by_key: dict[str, list[dict[str, Any]]], model: Model
) -> None:
    """No intent (run, tool, canonical payload) has more possible effects than the rule allows: of two
    calls that may have applied, the one sent later was sent with `allow`, or the model had heard the
    other's settled outcome (hold), or the other was known not applied when it was sent."""
    effects: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows.values():
        if row["tool_name"] != GUARDED_TOOL or row["reused_from"] is not None:
            continue
        now = Status(row["status"])
        open_conflict = row["conflict_at"] is not None and row["conflict_cleared_at"] is None
        if now in MAY_HAVE_APPLIED or (now is Status.FAILED and open_conflict):
            effects.setdefault((row["run_id"], row["payload_sha256"]), []).append(row)
    for group in effects.values():
        for i, one in enumerate(group):
            for other in group[i + 1 :]:
                one_sent, other_sent = _last_send(by_key[one["key"]]), _last_send(by_key[other["key"]])
                if one_sent is None or other_sent is None:
                    continue  # not sent by a reservation at all (cannot be: a twin is always sent by one)
                later, earlier = (one, other) if one_sent > other_sent else (other, one)
                status, conflict = _state_at(by_key[earlier["key"]], max(one_sent, other_sent))
                may_have_applied = status in MAY_HAVE_APPLIED or (status is Status.FAILED and conflict)
                intent, heard = model.sent_with.get(later["key"], ("hold", frozenset()))
                heard_it = (
                    intent == "hold"
                    and earlier["tool_call_id"] in heard
                    and status in (Status.COMPLETED, Status.COMPENSATED)
                )
                assert not may_have_applied or intent == "allow" or heard_it, (
                    f"two effects of one intent: {later['key']} was sent ({intent}, heard {sorted(heard)}) "
                    f"while its twin {earlier['key']} was {status}{' with an open conflict' if conflict else ''}"
                )


async def _events(ledger: Ledger, key: str) -> list[dict[str, Any]]:
    async with ledger.connection("test_events") as conn:
        return [dict(e) for e in await conn.fetch(queries.SELECT_EVENTS, key)]


async def every_open_call_has_a_way_out(ledger: Ledger) -> None:
    """Take, for every call still open, the decision the ledger must accept, and check it settled."""
    async with ledger.connection("test_clock") as conn:
        now = await conn.fetchval("SELECT clock_timestamp()")
    for key, row in (await snapshot(ledger)).items():
        status = Status(row["status"])
        if status is Status.STARTED:
            await ledger.mark_indeterminate(key, actor="inspector", reason="end of the example")
            status = Status.INDETERMINATE
        if status is Status.INDETERMINATE:
            # An operator decides; while a resend is on the wire (its lease runs out), its answer does.
            on_the_wire = any(ends > now for _, ends, _ in _resend_leases(await _events(ledger, key)))
            if on_the_wire:
                await ledger.settle(
                    key, **settlement("reconciler", Status.FAILED, key), source=EventSource.RECONCILER
                )
            else:
                await ledger.settle(key, **settlement("operator:alice", Status.FAILED, key))
        elif status is Status.HELD or (status is Status.AWAITING_APPROVAL and row["approved_at"] is not None):
            await ledger.release(key, actor="operator:alice", reason="end of the example")
        elif status is Status.AWAITING_APPROVAL:
            await ledger.deny(key, actor="operator:alice", reason="end of the example")
        after = Status((await snapshot(ledger))[key]["status"])
        assert after.is_settled, f"{key} ({status}) has no way out: it is still {after}"
