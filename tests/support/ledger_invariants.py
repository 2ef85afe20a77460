"""What must hold of the ledger after any step, checked against its own tables
(tests/test_ledger_properties.py).

The test keeps its own record of what the ledger cannot be trusted to judge: what the model was told
of each call (the conversation of each run, as the test itself told it, and forgot on a reset), what
each sent call had heard and what its twins were when it was sent (read at that moment, not now),
what each reused call was given, and what purged calls had drawn on the budget. "Heard" is judged
from that record, never by a twin's status now: a twin heard as "failed" that an operator later
found completed was not heard as completed."""

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
    Heard,
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


@dataclass(frozen=True)
class Twin:
    """A call as a reservation found it: what the test read of it the moment that reservation returned."""

    tool_call_id: str
    status: Status
    settled_at: datetime | None
    open_conflict: bool
    reused_from: str | None


@dataclass(frozen=True)
class Sent:
    """A call handed out to be sent: its intent rule, what the model had heard when it asked for it
    (as the test told it), and its twins as they were when it was sent."""

    intent: str
    heard: tuple[Heard, ...]
    twins: dict[str, Twin]


@dataclass
class Model:
    live: set[str] = field(default_factory=set)  # keys reserved and not purged
    # Per run, the model's conversation: what it was told of each call, as told (status and
    # settlement at that moment). A reset empties it: the model no longer knows of those calls.
    told: dict[str, dict[str, Heard]] = field(default_factory=dict)
    sent_with: dict[str, Sent] = field(default_factory=dict)  # key: how its latest send was asked
    reused: dict[str, str] = field(default_factory=dict)  # reused key: the call whose effect it was given
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


async def twins_of(ledger: Ledger, record: Any) -> dict[str, Twin]:
    """The other calls of the record's run with its payload, as they are the moment it returned."""
    async with ledger.connection("test_twins") as conn:
        rows = await conn.fetch(
            "SELECT * FROM tool_executions WHERE run_id = $1 AND payload_sha256 = $2 AND key <> $3",
            record.run_id,
            record.payload_sha256,
            record.key,
        )
    return {
        r["key"]: Twin(
            tool_call_id=r["tool_call_id"],
            status=Status(r["status"]),
            settled_at=r["settled_at"],
            open_conflict=r["conflict_at"] is not None and r["conflict_cleared_at"] is None,
            reused_from=r["reused_from"],
        )
        for r in rows
    }


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
    _reused_rows(rows)
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
    calls that may have applied, the one sent later was sent with `allow`, or, under `hold`, the
    model had heard the other's outcome as it still stood when the later one was sent (from the
    test's own record of what it told the model), or the other was known not applied then."""
    effects: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows.values():
        if row["tool_name"] != GUARDED_TOOL or row["reused_from"] is not None:
            continue  # a reused row is no effect: it points to one
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
                sent = model.sent_with.get(later["key"])
                seen = sent.twins.get(earlier["key"]) if sent is not None else None
                if seen is None:  # sent by a path that kept no record (plain): the events say
                    status, conflict = _state_at(by_key[earlier["key"]], max(one_sent, other_sent))
                else:
                    status, conflict = seen.status, seen.open_conflict
                may_have_applied = status in MAY_HAVE_APPLIED or (status is Status.FAILED and conflict)
                if not may_have_applied:
                    continue
                assert sent is not None and (sent.intent == "allow" or _heard(sent, earlier["key"])), (
                    f"two effects of one intent: {later['key']} was sent "
                    f"({sent.intent if sent else '?'}, heard {_told(sent)}) while its twin {earlier['key']} "
                    f"was {status}{' with an open conflict' if conflict else ''}"
                    f"{f' (told {_told_of(sent, seen)})' if seen else ''}"
                )


def _reused_rows(rows: dict[str, dict[str, Any]]) -> None:
    """Every reused row points to the call that took effect, a call of its run with its payload,
    never to another reused row."""
    for key, row in rows.items():
        source = rows.get(row["reused_from"]) if row["reused_from"] else None
        if source is None:
            continue  # not reused, or its source was purged
        assert source["reused_from"] is None, f"{key} points to {source['key']}, itself a reused row"
        assert (source["run_id"], source["payload_sha256"]) == (row["run_id"], row["payload_sha256"]), (
            f"{key} points to {source['key']}, not a call of its run with its payload"
        )


def _stands(told: Heard, seen: Twin) -> bool:
    """Was the call, when the reservation was made, still what the model had been told of it?"""
    return (
        not seen.open_conflict
        and told.status is seen.status
        and (told.settled_at is None or told.settled_at == seen.settled_at)
    )


def _heard(sent: Sent, key: str) -> bool:
    """Under `hold`: had the model heard call `key`'s outcome as it stood when `sent` was sent, itself
    or through a call it was told had been given `key`'s result?"""
    if sent.intent != "hold":
        return False
    told = {h.tool_call_id: h for h in sent.heard}

    def stands(seen: Twin | None) -> bool:
        return seen is not None and seen.tool_call_id in told and _stands(told[seen.tool_call_id], seen)

    source = sent.twins.get(key)
    if stands(source):
        return True
    return (
        source is not None
        and source.status is Status.COMPLETED
        and any(t.reused_from == key and stands(t) for t in sent.twins.values())
    )


def _told(sent: Sent | None) -> list[str]:
    return [f"{h.tool_call_id}={h.status}" for h in sent.heard] if sent else []


def _told_of(sent: Sent | None, seen: Twin) -> str:
    told = [h for h in (sent.heard if sent else ()) if h.tool_call_id == seen.tool_call_id]
    return f"{told[0].status} at {told[0].settled_at}" if told else "nothing"


def check_reused(
    record: Any, source: Any, heard: tuple[Heard, ...], intent: str, twins: dict[str, Twin], model: Model
) -> None:
    """A reservation answered "reused" (the model is told the call already took effect, with a
    result): that effect is the one the answer points to, it stands (completed, not undone), it is
    not itself a reused row, it is a call of the run with the same payload, the result is its
    result, the model had not heard it as it stands, and it is given to a second re-issue only when
    no other effect of the intent is left unclaimed (one-to-one pairing)."""
    key = record.key
    assert source is not None, f"{key} was reused from {record.reused_from}, which is not in the ledger"
    assert source.reused_from is None, f"{key} was given {source.key}'s result, itself a reused row"
    assert (source.run_id, source.payload_sha256) == (record.run_id, record.payload_sha256), (
        f"{key} was given the result of {source.key}, not a call of its run with its payload"
    )
    assert source.status is Status.COMPLETED, (
        f"{key} was told {source.key} took effect, but the ledger has it {source.status}"
    )
    assert record.result == source.result, f"{key} was given another result than {source.key}'s"
    told = {h.tool_call_id: h for h in heard}
    seen = twins.get(source.key)
    if intent == "hold" and seen is not None and source.tool_call_id in told:
        assert not _stands(told[source.tool_call_id], seen), (
            f"{key} was given {source.key}'s result although the model had heard it"
        )
    already = {k for k, src in model.reused.items() if src == source.key and k != key and k in model.live}
    if already:
        claimed = set(model.reused.values())
        unclaimed = [
            k
            for k, t in twins.items()
            if t.status is Status.COMPLETED
            and t.reused_from is None
            and k not in claimed
            and not (intent == "hold" and t.tool_call_id in told and _stands(told[t.tool_call_id], t))
        ]
        assert not unclaimed, f"{key} was given {source.key}'s result again while {unclaimed} stood unclaimed"
    model.reused[key] = source.key


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
