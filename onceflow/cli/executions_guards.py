"""What `onceflow executions show` prints about a call's guards: the call it is held behind, its
entity and budget, the call it replaces and the calls that replace it, and the whole chain."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LINEAGE_HEADERS = ["", "KEY", "STATUS", "REPLACES", "AMOUNT", "CREATED", "SETTLED BY"]


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


def lineage_rows(record: dict[str, Any], stamp: Callable[[str | None], str]) -> list[list[str]]:
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
