"""What `onceflow executions` prints as text: the list as a table, one call as `label  value` lines
(its guards too: the call it is held behind, its entity and budget, the calls it replaces and that
replace it), its replacement chain and its events. `--json` prints the API's JSON instead."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from onceflow.cli.tables import field_lines, table_lines

LIST_HEADERS = ["KEY", "STATUS", "TOOL", "AGENT", "WAITING SINCE", "AGE", "ATTEMPT", "ESCALATED TO"]
LINEAGE_HEADERS = ["", "KEY", "STATUS", "REPLACES", "AMOUNT", "CREATED", "SETTLED BY"]
EVENT_HEADERS = ["AT", "ACTOR", "SOURCE", "KIND", "CHANGE", "NOTES"]


def _when(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def age(since: datetime, now: datetime) -> str:
    seconds = max(0, int((now - since).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"


def stamp(value: str | None) -> str:
    at = _when(value)
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if at else "-"


def list_lines(items: Sequence[dict[str, Any]], now: datetime) -> list[str]:
    """`onceflow executions list` as a table, one call a row."""
    return table_lines(LIST_HEADERS, [row(item, now) for item in items])


def row(item: dict[str, Any], now: datetime) -> list[str]:
    created = _when(item["created_at"])
    conflict = item.get("conflict") or {}
    return [
        item["key"],
        f"{item['status']} (conflict)" if conflict.get("open") else item["status"],
        item["tool"],
        item["agent"] or "-",
        stamp(item["created_at"]),
        age(created, now) if created else "-",
        str(item["attempt"]),
        item.get("escalated_to") or "-",
    ]


def compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _who_when(actor: str | None, at: str | None, prefix: str = "by ") -> str | None:
    return f"{prefix}{actor} at {stamp(at)}" if actor else None


def _conflict_fields(conflict: dict[str, Any] | None) -> list[tuple[str, Any]]:
    if not conflict:
        return []
    detail = conflict.get("detail") or {}
    state = (
        "OPEN: the decision stands until an operator acknowledges it" if conflict["open"] else "acknowledged"
    )
    return [
        ("conflict", f"{state} (flagged {stamp(conflict['at'])})"),
        (
            "late outcome",
            f"{detail.get('reported_by')} ({detail.get('source')}) reports {detail.get('reported')}; "
            f"{detail.get('decided_by')} decided {detail.get('decided')}",
        ),
        ("acknowledged", _who_when(conflict.get("acknowledged_by"), conflict.get("acknowledged_at"))),
    ]


def describe(record: dict[str, Any]) -> Iterator[str]:
    """The record as aligned `label  value` lines, then its events, skipping what is empty."""
    fields: list[tuple[str, Any]] = [
        ("key", record["key"]),
        ("status", record["status"]),
        ("tool", f"{record['tool']} ({record['side_effect']})"),
        ("agent", record["agent"] or None),
        ("run", record["run_id"]),
        ("tool call", record["tool_call_id"]),
        ("attempt", record["attempt"]),
        ("owner", record.get("owner")),
        ("lease expires", record.get("lease_expires_at") and stamp(record["lease_expires_at"])),
        ("created", stamp(record["created_at"])),
        ("updated", stamp(record["updated_at"])),
        ("payload", compact(record["payload"])),
        ("payload sha256", record["payload_sha256"]),
        ("result", None if record.get("result") is None else compact(record["result"])),
        ("result ref", record.get("result_reference")),
        ("failure", record.get("failure_kind")),
        ("error", record.get("error")),
        ("approved", _who_when(record.get("approved_by"), record.get("approved_at"))),
        ("settled", _who_when(record.get("settled_by"), record.get("settled_at"))),
        ("reason", record.get("reason")),
        ("evidence", None if record.get("evidence") is None else compact(record["evidence"])),
        ("escalated to", _who_when(record.get("escalated_to"), record.get("escalated_at"), prefix="")),
        *_conflict_fields(record.get("conflict")),
        *guard_fields(record),
    ]
    yield from field_lines((label, str(value)) for label, value in fields if value not in (None, ""))
    chain = lineage_rows(record)
    if chain:
        yield ""
        yield f"lineage ({len(chain)} calls, oldest first; * is this one)"
        yield from ("  " + line for line in table_lines(LINEAGE_HEADERS, chain))
    events = record.get("events") or []
    yield ""
    yield f"events ({len(events)})"
    rows = []
    for event in events:
        change = ""
        if event.get("from_status") or event.get("to_status"):
            change = f"{event.get('from_status') or ''} -> {event.get('to_status') or ''}".strip()
        notes = [event["reason"]] if event.get("reason") else []
        for extra in ("evidence", "detail"):
            if event.get(extra) is not None:
                notes.append(f"{extra}={compact(event[extra])}")
        rows.append(
            [
                stamp(event["at"]),
                event["actor"],
                event.get("source") or "-",
                event["kind"],
                change,
                "; ".join(notes),
            ]
        )
    if rows:
        yield from ("  " + line for line in table_lines(EVENT_HEADERS, rows, wrap={"NOTES"}))


def decided(answer: dict[str, Any], verb: str) -> str:
    record = answer["execution"]
    told = "the run was told" if answer["run_signalled"] else "no run was waiting"
    return f"{record['key']} {verb}: now {record['status']} ({told})"


def guard_fields(record: dict[str, Any]) -> list[tuple[str, Any]]:
    """`label, value` pairs for the guard columns; None where there is nothing to say."""
    key = record["key"]
    held_by = record.get("held_by")
    entity = record.get("entity")
    if entity and record.get("entity_exclusive"):
        entity = f"{entity} (one unresolved {record['tool']} call at a time)"
    amount = record.get("amount")
    if amount is not None and record.get("currency"):
        amount = f"{amount} {record['currency']}"
    if amount is not None and record.get("budget_limit") is not None:
        amount = f"{amount} (limit {record['budget_limit']} for the entity)"
    lineage = record.get("lineage") or []
    replaced_by = [entry["key"] for entry in lineage if entry.get("replaces") == key]
    reused = record.get("reused_from")
    held_calls = record.get("held_calls") or []
    return [
        ("held by", held_by and f"{held_by} (nothing was sent; it waits for that call to settle)"),
        ("hold reason", record.get("hold_reason")),
        ("entity", entity),
        ("amount", amount),
        ("replaces", record.get("replaces")),
        ("replaced by", ", ".join(replaced_by) or None),
        ("reused from", reused and f"{reused} (its recorded result; nothing was sent)"),
        ("held behind it", ", ".join(held_calls) or None),
    ]


def lineage_rows(record: dict[str, Any]) -> list[list[str]]:
    """The replacement chain as table rows, oldest first, this call marked `*`; empty if none."""
    rows = []
    for entry in record.get("lineage") or []:
        status = entry["status"]
        if entry.get("failure_kind"):
            status = f"{status} ({entry['failure_kind']})"
        rows.append(
            [
                "*" if entry["key"] == record["key"] else "",
                entry["key"],
                status,
                entry.get("replaces") or "-",
                entry.get("amount") or "-",
                stamp(entry["created_at"]),
                entry.get("settled_by") or "-",
            ]
        )
    return rows
