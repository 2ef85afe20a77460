"""Agent conversations by reference: a hash chain of messages in PostgreSQL.

A model activity gets the hash of the conversation so far (its head) plus the messages added since,
stores those onto the chain, and reads the whole conversation back. The chain is content-addressed,
so a retried activity, a replay or a reset that writes the same messages again changes nothing, and
two runs never share rows (the first message's hash covers the run id).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase
from onceflow.ledger.errors import LedgerError


class ConversationMissingError(LedgerError):
    """The head names a conversation that is not stored (purged, or another database)."""

    def __init__(self, head: str, found: int) -> None:
        super().__init__(f"conversation {head} is not stored whole ({found} messages found)")
        self.head = head


def _encode(message: dict[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def message_hash(parent: str | None, run_id: str, encoded: str) -> str:
    root = parent if parent is not None else "run:" + run_id
    return hashlib.sha256(f"{root}\n{encoded}".encode()).hexdigest()


class Conversations:
    def __init__(self, ledger: LedgerBase) -> None:
        self._ledger = ledger

    async def extend(
        self,
        *,
        tenant: str,
        run_id: str,
        head: str | None,
        length: int,
        messages: Sequence[dict[str, Any]],
    ) -> str:
        """Store `messages` after the `length` messages ending at `head`; returns the new head."""
        rows = []
        parent = head
        for offset, message in enumerate(messages):
            encoded = _encode(message)
            digest = message_hash(parent, run_id, encoded)
            rows.append((digest, parent, tenant, run_id, length + offset, encoded))
            parent = digest
        if rows:
            async with self._ledger.connection("extend_conversation", run=run_id) as conn:
                try:
                    async with conn.transaction():
                        await conn.executemany(queries.INSERT_CONVERSATION_MESSAGE, rows)
                except asyncpg.ForeignKeyViolationError:
                    # The head is not stored: lost in a failover to a standby that lacked it, or
                    # purged. The run stores the conversation again, whole.
                    raise ConversationMissingError(head or "", 0) from None
        if parent is None:
            raise ValueError("an empty conversation has no head")
        return parent

    async def read(self, head: str, *, length: int) -> list[dict[str, Any]]:
        """The `length` messages that end at `head`, first to last."""
        async with self._ledger.connection("read_conversation") as conn:
            rows = await conn.fetch(queries.SELECT_CONVERSATION, head)
        if len(rows) != length or [r["position"] for r in rows] != list(range(length)):
            raise ConversationMissingError(head, len(rows))
        return [json.loads(r["message"]) for r in rows]
