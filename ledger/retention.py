"""Retention: purge (or archive) settled calls older than a cutoff, with their events; and the stored
conversations of runs that nothing can read again.

What may go is decided twice: here, and by the database's triggers (migration 0004), which refuse
any delete of a call or an event unless the transaction set `onceflow.purge_before` and the call is
settled, untouched since that cutoff and without an open conflict, and the cutoff is at least a day
old. So a bug here cannot remove younger evidence, and nothing can remove an unresolved call.

A run's calls go together: a call is taken only when every call of its run is purgeable, so a run
that is still making calls keeps all its keys. Work is done in batches, each in its own short
transaction, so no lock is held for long; running it again finds nothing more to do.

A run's conversation (ledger/conversations.py) is read by its model turns, and by the model turns a
Temporal reset replays. So it may go only when the run is closed and past the retention age, and the
namespace no longer keeps the history a reset would start from. The ledger cannot see that; the
workflow engine answers it (`RunEnds`: onceflow/runtime/run_ends.py asks Temporal). The ledger
adds what it knows: no message of the run since the cutoff, no unresolved call in the run. A run the
engine does not answer for is kept.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import BaseModel

from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase

# Temporal's own minimum namespace retention; the database refuses younger cutoffs as well.
MINIMUM_AGE = timedelta(days=1)
DEFAULT_AGE = timedelta(days=90)
DEFAULT_BATCH = 500
_AGE = re.compile(r"^\s*(\d+)\s*([dhms])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_age(text: str) -> timedelta:
    """`90d`, `36h`, `45m` or `600s` as a timedelta; at least MINIMUM_AGE."""
    match = _AGE.match(text)
    if not match:
        raise ValueError(f"an age is a number and a unit (d, h, m or s), like 90d; got {text!r}")
    age = timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    if age < MINIMUM_AGE:
        raise ValueError(f"the retention age must be at least {MINIMUM_AGE.days} day; got {text!r}")
    return age


class PurgeReport(BaseModel):
    cutoff: datetime
    calls: int
    events: int
    archived: bool
    dry_run: bool


async def purge_settled(
    ledger: LedgerBase,
    *,
    older_than: timedelta,
    archive: bool = False,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH,
) -> PurgeReport:
    """Delete (or with `archive`, move) settled calls older than `older_than`, and their events."""
    if older_than < MINIMUM_AGE:
        raise ValueError(f"the retention age must be at least {MINIMUM_AGE}")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    async with ledger.connection("purge_candidates") as conn:
        cutoff: datetime = await conn.fetchval(queries.PURGE_CUTOFF, older_than)
        keys = [row["key"] for row in await conn.fetch(queries.PURGE_CANDIDATES, cutoff)]
        if dry_run:
            events = await conn.fetchval(queries.COUNT_EVENTS, keys) if keys else 0
            return PurgeReport(cutoff=cutoff, calls=len(keys), events=events, archived=archive, dry_run=True)
    calls = events = 0
    for start in range(0, len(keys), batch_size):
        batch = keys[start : start + batch_size]
        async with ledger.connection("purge_batch", calls=len(batch)) as conn, conn.transaction():
            await conn.execute(queries.SET_PURGE_CUTOFF, cutoff)
            # Anything that changed since the candidates were read (a conflict, a rerun) stays.
            locked = [row["key"] for row in await conn.fetch(queries.LOCK_PURGEABLE, batch, cutoff)]
            if not locked:
                continue
            if archive:
                await conn.execute(queries.ARCHIVE_EVENTS, locked)
                await conn.execute(queries.ARCHIVE_EXECUTIONS, locked)
            deleted_events = await conn.execute(queries.DELETE_EVENTS, locked)
            deleted_calls = await conn.execute(queries.DELETE_EXECUTIONS, locked)
        events += int(deleted_events.split()[-1])
        calls += int(deleted_calls.split()[-1])
    return PurgeReport(cutoff=cutoff, calls=calls, events=events, archived=archive, dry_run=False)


@dataclass(frozen=True)
class RunEnd:
    """What the workflow engine says of a run that is not running: when it closed, and until when its
    namespace keeps the history a reset would replay. Both None: the history is gone already (the
    namespace's retention passed), so nothing can run it again."""

    closed_at: datetime | None = None
    history_until: datetime | None = None

    def past_use(self, *, cutoff: datetime, now: datetime) -> bool:
        """Can nothing read this run's conversation again, for a purge at `cutoff`?"""
        if self.closed_at is not None and self.closed_at >= cutoff:
            return False
        return self.history_until is None or self.history_until <= now


# Given run ids, what the engine knows of the closed ones; a run left out (running, or unknown to the
# engine for any other reason) is kept.
RunEnds = Callable[[Sequence[str]], Awaitable[dict[str, RunEnd]]]


class ConversationPurgeReport(BaseModel):
    cutoff: datetime
    runs: int
    messages: int
    bytes: int
    kept_open: int  # candidates the engine reported running, or did not answer for
    dry_run: bool


async def purge_conversations(
    ledger: LedgerBase,
    run_ends: RunEnds,
    *,
    older_than: timedelta,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH,
) -> ConversationPurgeReport:
    """Delete the stored conversations of runs nothing can read again (see the module's docstring)."""
    if older_than < MINIMUM_AGE:
        raise ValueError(f"the retention age must be at least {MINIMUM_AGE}")
    async with ledger.connection("purge_conversations") as conn:
        cutoff: datetime = await conn.fetchval(queries.PURGE_CUTOFF, older_than)
    return await purge_conversations_before(ledger, run_ends, cutoff, dry_run=dry_run, batch_size=batch_size)


async def purge_conversations_before(
    ledger: LedgerBase,
    run_ends: RunEnds,
    cutoff: datetime,
    *,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH,
) -> ConversationPurgeReport:
    """purge_conversations at a given cutoff (which the database refuses unless a day old)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    async with ledger.connection("conversation_candidates") as conn:
        candidates = [row["run_id"] for row in await conn.fetch(queries.CONVERSATION_CANDIDATES, cutoff)]
        now: datetime = await conn.fetchval(queries.DATABASE_NOW)
    runs = messages = size = kept = 0
    for start in range(0, len(candidates), batch_size):
        batch = candidates[start : start + batch_size]
        ends = await run_ends(batch)
        gone = [run for run in batch if run in ends and ends[run].past_use(cutoff=cutoff, now=now)]
        kept += len(batch) - len(gone)
        if not gone:
            continue
        async with ledger.connection("purge_conversations", runs=len(gone)) as conn, conn.transaction():
            counted = await conn.fetchrow(queries.CONVERSATION_BYTES, gone)
            if not dry_run:
                await conn.execute(queries.SET_PURGE_CUTOFF, cutoff)
                deleted = await conn.execute(queries.DELETE_CONVERSATIONS, gone, cutoff)
                if int(deleted.split()[-1]) != counted["messages"]:
                    # A run wrote a message since the candidates were read: it is not past use.
                    raise ConversationsChangedError(cutoff)
        runs += len(gone)
        messages += counted["messages"]
        size += counted["bytes"]
    return ConversationPurgeReport(
        cutoff=cutoff, runs=runs, messages=messages, bytes=size, kept_open=kept, dry_run=dry_run
    )


class ConversationsChangedError(RuntimeError):
    """A run wrote to its conversation while the purge looked at it; nothing of that batch was deleted."""

    def __init__(self, cutoff: datetime) -> None:
        super().__init__(
            f"a run wrote to its conversation during the purge (cutoff {cutoff.isoformat()}); "
            "that batch was left whole: run the purge again"
        )
