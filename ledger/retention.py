"""Retention: purge (or archive) settled calls older than a cutoff, with their events.

What may go is decided twice: here, and by the database's triggers (migration 0004), which refuse
any delete of a call or an event unless the transaction set `onceflow.purge_before` and the call is
settled, untouched since that cutoff and without an open conflict, and the cutoff is at least a day
old. So a bug here cannot remove younger evidence, and nothing can remove an unresolved call.

A run's calls go together: a call is taken only when every call of its run is purgeable, so a run
that is still making calls keeps all its keys. Work is done in batches, each in its own short
transaction, so no lock is held for long; running it again finds nothing more to do.
"""

from __future__ import annotations

import re
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
