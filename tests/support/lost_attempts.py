"""What the tests of lost attempts share (tests/test_lost_attempts.py, tests/test_lost_compensations.py):
a failover on record, as workers would have recorded it, and the activity environment of an attempt."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import asyncpg
from temporalio.testing import ActivityEnvironment


async def failed_over_at(database_url: str, when: datetime) -> None:
    """The ledger started on timeline 1 an hour before; timeline 2 was first seen at `when`."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("DELETE FROM onceflow_timelines")
        await conn.execute(
            "INSERT INTO onceflow_timelines (timeline, first_seen_at, first_seen_by) VALUES"
            " (1, $1, 'worker-a'), (2, $2, 'worker-b')",
            when - timedelta(hours=1),
            when,
        )
    finally:
        await conn.close()


def attempt_environment() -> ActivityEnvironment:
    """An attempt that started now and has a write's usual start-to-close timeout."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, started_time=datetime.now(UTC), start_to_close_timeout=timedelta(seconds=35)
    )
    return env
