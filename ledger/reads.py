"""Reading calls: one call (with or without its events), and a tenant's unresolved calls by page.

One of the parts `Ledger` (ledger.store) is made of.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel

from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase
from onceflow.ledger.errors import RecordNotFoundError
from onceflow.ledger.records import ToolExecutionRecord, to_event, to_record
from onceflow.ledger.status import UNRESOLVED, Status


class UnresolvedPage(BaseModel):
    records: list[ToolExecutionRecord]
    next_cursor: str | None


def encode_cursor(created_at: datetime, key: str) -> str:
    raw = json.dumps([created_at.isoformat(), key]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        at, key = json.loads(base64.urlsafe_b64decode(padded))
        if not isinstance(key, str) or "\x00" in key:  # PostgreSQL text cannot hold NUL
            raise ValueError("not a key")
        return datetime.fromisoformat(at), key
    except (ValueError, TypeError) as exc:
        raise ValueError(f"malformed cursor {cursor!r}") from exc


class Reads(LedgerBase):
    """One call by key, and the operator's queue of unresolved calls."""

    async def get(
        self, key: str, *, with_events: bool = True, tenant: str | None = None
    ) -> ToolExecutionRecord:
        async with self.connection("get", key=key) as conn:
            row = await conn.fetchrow(queries.SELECT_RECORD, key)
            if row is None or (tenant is not None and row["tenant"] != tenant):
                raise RecordNotFoundError(key)
            events = await conn.fetch(queries.SELECT_EVENTS, key) if with_events else []
        return to_record(row, [to_event(e) for e in events])

    async def find(self, key: str) -> ToolExecutionRecord | None:
        """The record without events, or None when the key was never reserved."""
        async with self.connection("find", key=key) as conn:
            row = await conn.fetchrow(queries.SELECT_RECORD, key)
        return None if row is None else to_record(row)

    async def list_unresolved(
        self,
        tenant: str,
        *,
        statuses: Sequence[Status] = (Status.INDETERMINATE, Status.STARTED),
        tool: str | None = None,
        agent: str | None = None,
        escalated: bool | None = None,
        conflicts: bool = False,
        limit: int = 50,
        cursor: str | None = None,
    ) -> UnresolvedPage:
        """A tenant's calls nobody can yet vouch for, longest waiting first.

        `started` calls are listed only once their owner's lease has run out: before that, someone
        is working on them. With `conflicts`, settled calls with an open conflict are listed too;
        `statuses` may then be empty, to list conflicts alone.
        """
        wanted = [s.value for s in statuses if s in UNRESOLVED]
        if len(wanted) != len(statuses) or not (wanted or conflicts):
            raise ValueError(f"only unresolved statuses can be listed: {sorted(UNRESOLVED)}")
        if not 1 <= limit <= 500:
            raise ValueError("limit must be between 1 and 500")
        after_at, after_key = decode_cursor(cursor) if cursor else (None, None)
        async with self.connection("list_unresolved", tenant=tenant) as conn:
            rows = await conn.fetch(
                queries.LIST_UNRESOLVED,
                tenant,
                wanted,
                tool,
                agent,
                escalated,
                after_at,
                after_key,
                limit + 1,
                conflicts,
            )
        records = [to_record(r) for r in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = records[-1]
            next_cursor = encode_cursor(last.created_at, last.key)
        return UnresolvedPage(records=records, next_cursor=next_cursor)
