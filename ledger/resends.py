"""Re-sending an unknown call under its own key, while the receiver still honours that key.

A tool may declare how long its receiver deduplicates a repeated idempotency key (`dedup_window`,
e.g. 24 h). Inside that window a second request with the same key cannot make a second effect: the
receiver answers it with the first request's answer, or, if the first never arrived, applies it
now. Either way the answer tells what became of the call, so the reconciler may settle an unknown
call by sending it again. After the window the receiver may have forgotten the key and a resend
could apply twice, so it is never sent again.

Whether a resend may leave is decided here, by the database's clock, in the same transaction that
records it (event `resend`, source `reconciler`, the window in its detail). The resend must reach
the receiver before the window ends, so it may leave only until the window's end minus a lead
(the tool's timeout plus a margin). The window is counted from the key's first reservation
(`created_at`): no request under the key can have left before it, so the receiver's own clock for
the key started later, never earlier.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg
from pydantic import BaseModel, ConfigDict

from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase, require_text
from onceflow.ledger.errors import RecordNotFoundError, ResendInFlightError
from onceflow.ledger.records import ToolExecutionRecord, to_record
from onceflow.ledger.status import EventSource, Status

RESEND = "resend"
WINDOW_CLOSED = "resend_window_closed"


class ResendDecision(BaseModel):
    """Whether the reconciler may send the call again now, and the facts the ledger decided on."""

    model_config = ConfigDict(frozen=True)

    allowed: bool
    reason: str
    record: ToolExecutionRecord
    checked_at: datetime  # the database's clock when it decided
    window_ends_at: datetime  # created_at + the window
    send_by: datetime  # the last moment a resend may leave: the window's end minus the lead
    resends: int  # resends recorded under the key, this one included when allowed

    def evidence(self) -> dict[str, object]:
        """What a settlement reached by this resend cites."""
        return {
            "strategy": "resend_within_dedup_window",
            "resend": self.resends,
            "dedup_window_ends_at": self.window_ends_at.isoformat(),
            "sent_before": self.send_by.isoformat(),
        }


class Resends(LedgerBase):
    async def begin_resend(
        self, key: str, *, window: timedelta, lead: timedelta, actor: str = "reconciler"
    ) -> ResendDecision:
        """May an unknown call be sent again with its own key now? If so, it is recorded as sent.

        Allowed only while the call is `indeterminate` and the database's clock is before
        `created_at + window - lead`. An allowed resend appends a `resend` event; the first refusal
        because the window has closed appends `resend_window_closed` (once per key). A call that
        is not unknown any more is refused without an event: someone settled it.

        An allowed resend is leased: until the database's clock passes its start plus `lead`
        (`on_the_wire_until` in its detail), or its answer comes back (`resend_inconclusive` with
        `answered`, or the call settled), no decision other than the reconciler's lands
        (`ResendInFlightError`, see `refuse_during_resend`). No other resend leaves during the lease,
        nor for as long again after it: the quiet spell in which a person told to wait may decide.
        """
        if window <= timedelta(0):
            raise ValueError("a dedup window must be positive")
        if lead < timedelta(0):
            raise ValueError("a resend's lead cannot be negative")
        actor = require_text(actor, "re-sending a call (actor)")
        async with self.connection("begin_resend", key=key) as conn, conn.transaction():
            # Lock first, then read: a statement that waits for the lock keeps its older snapshot,
            # and would miss the resend a concurrent check committed meanwhile.
            if await conn.fetchrow(queries.SELECT_RECORD_FOR_UPDATE, key) is None:
                raise RecordNotFoundError(key)
            row = await conn.fetchrow(queries.SELECT_FOR_RESEND, key, window, lead)
            record = to_record(row)
            facts = {
                "record": record,
                "checked_at": row["checked_at"],
                "window_ends_at": row["window_ends_at"],
                "send_by": row["send_by"],
            }
            detail = {
                "dedup_window_seconds": window.total_seconds(),
                "lead_seconds": lead.total_seconds(),
                "window_ends_at": row["window_ends_at"].isoformat(),
                "send_by": row["send_by"].isoformat(),
                # The resend's lease: until then no decision lands and no other resend leaves.
                "on_the_wire_until": row["on_the_wire_until"].isoformat(),
            }
            if record.status is not Status.INDETERMINATE:
                return ResendDecision(
                    allowed=False, reason=f"the call is {record.status}", resends=row["resends"], **facts
                )
            latest = await conn.fetchrow(queries.LATEST_RESEND, key)
            if latest is not None and latest["quiet"]:
                reason = (
                    f"resend {latest['resend']} is still on the wire, until "
                    f"{latest['lease_ends_at'].isoformat()}"
                    if latest["on_the_wire"]
                    else f"resend {latest['resend']} ended at {latest['lease_ends_at'].isoformat()}; "
                    f"no resend before {latest['quiet_until'].isoformat()}, so a person may decide"
                )
                return ResendDecision(allowed=False, reason=reason, resends=row["resends"], **facts)
            if row["checked_at"] >= row["send_by"]:
                reason = (
                    f"the receiver's dedup window for the key ends {row['window_ends_at'].isoformat()}; "
                    "a resend could no longer be sure to arrive inside it, so the call is never re-sent"
                )
                if not row["window_closed_noted"]:
                    await self.insert_event(
                        conn,
                        key,
                        actor=actor,
                        kind=WINDOW_CLOSED,
                        source=EventSource.RECONCILER,
                        from_status=Status.INDETERMINATE,
                        reason=reason,
                        detail=detail,
                    )
                return ResendDecision(allowed=False, reason=reason, resends=row["resends"], **facts)
            resends = row["resends"] + 1
            reason = "re-sent with the same key inside the receiver's dedup window"
            await self.insert_event(
                conn,
                key,
                actor=actor,
                kind=RESEND,
                source=EventSource.RECONCILER,
                from_status=Status.INDETERMINATE,
                reason=reason,
                detail={**detail, "resend": resends},
            )
            decision = ResendDecision(allowed=True, reason=reason, resends=resends, **facts)
            self.annotate(record, RESEND)
        return decision


async def refuse_during_resend(conn: asyncpg.Connection, key: str, wanted: str) -> None:
    """Raise `ResendInFlightError` if a resend of `key` is on the wire (call with the row locked)."""
    row = await conn.fetchrow(queries.LATEST_RESEND, key)
    if row is not None and row["on_the_wire"]:
        raise ResendInFlightError(
            key,
            wanted,
            resend=row["resend"],
            until=row["lease_ends_at"],
            quiet_until=row["quiet_until"],
            actor=row["actor"],
        )
