"""Retention purge throughput: N settled calls (two events each), aged 100 days, purged at 90.

Rows are inserted straight into a fresh embedded PostgreSQL (the events' trigger is lifted for the
seeding alone), then `ledger.retention.purge_settled` takes them in its default batches.

    .venv/bin/python bench/purge.py [N] [--archive]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

# bench/ledger.py sits next to this script, and Python puts this directory first on sys.path: drop
# that entry so that `import ledger` finds the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import asyncpg  # noqa: E402

from onceflow.ledger import Ledger, migrate, purge_settled  # noqa: E402
from onceflow.local.postgres import create_database, start_embedded_postgres  # noqa: E402

SEED_CALLS = """
INSERT INTO tool_executions (key, tenant, run_id, tool_call_id, tool_name, side_effect, status,
    payload, payload_sha256, owner, settled_at, settled_by, created_at, updated_at)
SELECT 'run-' || g || ':call-1', 't1', 'run-' || g, 'call-1', 'issue_credit', 'external', 'completed',
       '{}'::jsonb, repeat('a', 64), 'w1', now() - interval '100 days', 'w1',
       now() - interval '100 days', now() - interval '100 days'
  FROM generate_series(1, $1) g
"""

SEED_EVENTS = """
INSERT INTO tool_execution_events (key, actor, kind, source, at)
SELECT 'run-' || g || ':call-1', 'w1', k, 'owner', now() - interval '100 days'
  FROM generate_series(1, $1) g, unnest(array['reserved', 'completed']) k
"""


async def measure(admin_dsn: str, calls: int, archive: bool) -> None:
    dsn = await create_database(admin_dsn, "purge_bench")
    await migrate(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SEED_CALLS, calls)
        await conn.execute("ALTER TABLE tool_execution_events DISABLE TRIGGER USER")
        await conn.execute(SEED_EVENTS, calls)
        await conn.execute("ALTER TABLE tool_execution_events ENABLE TRIGGER USER")
        await conn.execute("ANALYZE")
    finally:
        await conn.close()
    ledger = await Ledger.connect(dsn, max_size=2)
    try:
        started = time.perf_counter()
        report = await purge_settled(ledger, older_than=timedelta(days=90), archive=archive)
        took = time.perf_counter() - started
    finally:
        await ledger.close()
    print(
        f"{'archived' if archive else 'purged'} {report.calls} calls and {report.events} events "
        f"in {took:.2f}s ({report.calls / took:,.0f} calls/s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("calls", type=int, nargs="?", default=20_000)
    parser.add_argument("--archive", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onceflow-purge-bench-") as tmp:
        asyncio.run(measure(start_embedded_postgres(Path(tmp) / "data"), args.calls, args.archive))


if __name__ == "__main__":
    main()
