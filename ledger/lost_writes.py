"""Writes a failover lost: what a process saw acknowledged, and calls made visible unknowns again.

Under synchronous replication a commit returns only once the standby has it, and a promoted
standby holds every acknowledged write. Under asynchronous replication it may not: the primary dies
with the last writes it acknowledged, and the promoted standby answers as if they never happened.
For a write call that is the dangerous kind of forgetting: "no row" reads as "nothing was sent",
and a `failed` row an attempt behind reads as "may run again".

So the ledger keeps, per process, the call-path writes it saw acknowledged in the last minutes
(`AcknowledgedWrites`): each reservation that let its owner send, and each outcome the owner
recorded. When the process meets a new timeline (ledger/timelines.py) it reads those calls again;
and the write activity compares the row with its own reservation when its outcome will not record.
A call whose row is missing, or behind what was acknowledged (an older attempt, or its reservation
without the outcome recorded after it), is made `indeterminate` at the acknowledged attempt and
owner, with a `lost_in_failover` event saying what had been acknowledged and what was found
(`restore_lost`): it may have been sent, so it is never sent again, and its reconcile hook or an
operator settles it. Its owner, if still running, settles it with its late answer as usual.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from onceflow.ledger import queries
from onceflow.ledger.acknowledged import behind
from onceflow.ledger.base import LedgerBase, to_json
from onceflow.ledger.records import ToolExecutionRecord, to_record
from onceflow.ledger.status import EventSource, FailureKind, Status
from onceflow.ledger.timelines import switch_since

log = logging.getLogger("onceflow.ledger")

LOST_KIND = "lost_in_failover"  # the event a restored call carries
# Clocks differ between the Temporal server (the time an attempt began) and the database (when a
# timeline was first seen): a switch seen up to this long before the attempt still counts.
CLOCK_SLACK = timedelta(seconds=30)


def never_sent_at_all(record: ToolExecutionRecord) -> bool:
    """Was this call, as recorded, never sent under its key (held, waiting for approval, refused by a
    guard, or answered with its twin's result)?"""
    return (
        record.status in (Status.HELD, Status.AWAITING_APPROVAL)
        or record.reused_from is not None
        or (record.status is Status.FAILED and record.failure_kind is FailureKind.GUARD_REFUSED)
    )


def _why(acknowledged: ToolExecutionRecord, found: ToolExecutionRecord | None, timeline: int | None) -> str:
    was = "no record" if found is None else f"{found.status} (attempt {found.attempt})"
    on = f" (now on timeline {timeline})" if timeline is not None else ""
    if found is None and never_sent_at_all(acknowledged):
        return (
            f"lost in a failover of the ledger{on}: written back as it had been acknowledged "
            f"({acknowledged.status}, attempt {acknowledged.attempt}); it was never sent"
        )
    return (
        f"lost in a failover of the ledger{on}: it had acknowledged this call {acknowledged.status} "
        f"(attempt {acknowledged.attempt}, owner {acknowledged.owner}), and now holds {was}. It may "
        "have been sent, so it is never sent again: unknown until its reconcile hook or an operator "
        "settles it"
    )


RestoredListener = Callable[[list[ToolExecutionRecord]], Awaitable[None]]


class LostWrites(LedgerBase):
    """Restore calls a failover lost as visible unknowns; check the acknowledged writes."""

    _restored_listeners: list[RestoredListener]  # set by Ledger.__init__

    def on_restored(self, listener: RestoredListener) -> None:
        """Call `listener(records)` with the calls each check after a failover made unknown again
        (the worker starts their reconcilers: onceflow/runtime/lost_calls.py)."""
        self._restored_listeners.append(listener)

    async def restore_lost(
        self,
        acknowledged: ToolExecutionRecord,
        *,
        actor: str,
        source: EventSource = EventSource.OWNER,
        reported: dict[str, Any] | None = None,
    ) -> ToolExecutionRecord:
        """If the row of `acknowledged.key` is missing or behind `acknowledged`, make it
        `indeterminate` at the acknowledged attempt and owner, with a `lost_in_failover` event.
        Returns the row as it stands afterwards (untouched when nothing was lost).

        `reported`: what the owner knows of how the call ended, kept in the event for whoever
        settles it (it is not applied: the call is unknown until someone settles it).
        """
        key = acknowledged.key
        async with self.connection("restore_lost", key=key) as conn, conn.transaction():
            row = await conn.fetchrow(queries.SELECT_RECORD_FOR_UPDATE, key)
            found = to_record(row) if row is not None else None
            if found is not None and not behind(found, acknowledged):
                return found
            why = _why(acknowledged, found, self.timelines.current)
            detail = {
                "acknowledged": {
                    "status": acknowledged.status.value,
                    "attempt": acknowledged.attempt,
                    "owner": acknowledged.owner,
                    "updated_at": acknowledged.updated_at.isoformat(),
                },
                "found": None if found is None else {"status": found.status.value, "attempt": found.attempt},
                "timeline": self.timelines.current,
                "reported": reported,
            }
            if found is None:
                restored = await self._insert_lost(conn, acknowledged, why, actor, source, detail)
            elif never_sent_at_all(acknowledged):
                return found  # nothing was sent: the run's next reservation decides it again
            else:
                restored = await self._move_back_to_unknown(
                    conn, acknowledged, found, why, actor, source, detail
                )
        log.warning("%s: %s", key, why)
        return restored

    async def _insert_lost(
        self,
        conn: Any,
        acknowledged: ToolExecutionRecord,
        why: str,
        actor: str,
        source: EventSource,
        detail: dict[str, Any],
    ) -> ToolExecutionRecord:
        a = acknowledged
        # A call never sent is written back as it was acknowledged; any other may have been sent.
        unsent = never_sent_at_all(a)
        status, error = (a.status, a.error) if unsent else (Status.INDETERMINATE, why)
        exclusive = a.entity_exclusive
        for _ in range(2):
            try:
                async with conn.transaction():  # a savepoint: a taken entity slot is tried again
                    row = await conn.fetchrow(
                        queries.RESTORE_LOST,
                        a.key,
                        a.tenant,
                        a.run_id,
                        a.tool_call_id,
                        a.agent,
                        a.tool_name,
                        a.side_effect.value,
                        status.value,
                        to_json(a.payload),
                        a.payload_sha256,
                        a.attempt,
                        a.owner,
                        error,
                        a.created_at,
                        a.entity,
                        exclusive,
                        a.amount,
                        a.budget_limit,
                        a.toolset,
                        a.currency,
                        a.replaces,
                        to_json(a.result) if unsent else None,
                        a.failure_kind.value if unsent and a.failure_kind else None,
                        a.reused_from if unsent else None,
                        a.held_by if unsent else None,
                        a.hold_reason if unsent else None,
                        a.settled_at if unsent else None,
                        a.settled_by if unsent else None,
                        a.lease_expires_at if unsent else None,
                        actor,
                        source.value,
                        why,
                        to_json(detail),
                    )
                break
            except asyncpg.UniqueViolationError:
                # Another unresolved call holds the entity's one slot (made after the failover):
                # both are kept, this one without the slot, and the event says so.
                exclusive = False
                detail["entity_slot"] = "taken by another unresolved call; restored without it"
        else:  # pragma: no cover - the second try takes no slot
            raise RuntimeError(f"could not restore {a.key}")
        if row is None:  # written meanwhile by someone else: theirs stands
            row = await conn.fetchrow(queries.SELECT_RECORD, a.key)
        return to_record(row)

    async def _move_back_to_unknown(
        self,
        conn: Any,
        acknowledged: ToolExecutionRecord,
        found: ToolExecutionRecord,
        why: str,
        actor: str,
        source: EventSource,
        detail: dict[str, Any],
    ) -> ToolExecutionRecord:
        # Also when it is unknown already (a settlement was lost): its reason becomes this one.
        row = await conn.fetchrow(
            queries.RESTORE_BEHIND,
            found.key,
            acknowledged.attempt,
            acknowledged.owner,
            why,
            found.status.value,
            found.attempt,
        )
        found = to_record(row)  # under the row lock: the compare-and-set holds
        await self.insert_event(
            conn,
            found.key,
            actor=actor,
            kind=LOST_KIND,
            source=source,
            from_status=Status(detail["found"]["status"]),
            to_status=Status.INDETERMINATE,
            reason=why,
            detail=detail,
        )
        return found

    async def check_acknowledged(self, previous: int, timeline: int) -> list[ToolExecutionRecord]:
        """After a failover: read every call whose write this process saw acknowledged on an earlier
        timeline, and restore the ones the failover lost. Returns the restored records."""
        entries = self.acknowledged.before(timeline)
        if not entries:
            return []
        async with self.connection("check_acknowledged") as conn:
            rows = await conn.fetch(queries.SELECT_RECORDS, [e.record.key for e in entries])
        found = {row["key"]: to_record(row) for row in rows}
        restored = []
        for entry in entries:
            if behind(found.get(entry.record.key), entry.record):
                restored.append(
                    await self.restore_lost(entry.record, actor=entry.record.owner or "inspector")
                )
        unknown = [record for record in restored if record.status is Status.INDETERMINATE]
        for listener in self._restored_listeners:
            await listener(unknown)
        log.warning(
            "after the failover from timeline %d to %d: %d acknowledged write(s) checked, %d lost and "
            "restored",
            previous,
            timeline,
            len(entries),
            len(restored),
        )
        return restored

    async def failover_since(self, since: datetime) -> tuple[int, datetime] | None:
        """Has the ledger failed over since `since` (less the clocks' slack)? The first new
        timeline seen since then and when, or None."""
        async with self.connection("failover_since") as conn:
            return await switch_since(conn, since - CLOCK_SLACK)

    async def hold_as_lost(
        self, key: str, *, owner: str, why: str, detail: dict[str, Any]
    ) -> ToolExecutionRecord:
        """The owner's own fresh reservation of a call an earlier attempt may have sent before a
        failover lost its record: `started` becomes `indeterminate`, and nothing is sent."""
        async with self.connection("hold_as_lost", key=key) as conn, conn.transaction():
            row = await conn.fetchrow(queries.SET_INDETERMINATE, key, why, False)
            if row is None:
                return to_record(await conn.fetchrow(queries.SELECT_RECORD, key))
            await self.insert_event(
                conn,
                key,
                actor=owner,
                kind=LOST_KIND,
                source=EventSource.OWNER,
                from_status=Status.STARTED,
                to_status=Status.INDETERMINATE,
                reason=why,
                detail=detail,
            )
        return to_record(row)

    async def failover_checks_done(self) -> None:
        """Wait until the checks started by failovers seen so far have finished."""
        await self.timelines.settled()
        await asyncio.sleep(0)
