"""Retention purge throughput and what a run leaves behind: N runs of one settled call each (two
events), a stored conversation of --turns model turns each and the run id's claim, all aged 100 days,
purged at 90.

Rows are inserted straight into a fresh embedded PostgreSQL (the events' trigger is lifted for the
seeding alone), then `ledger.retention.purge_settled` takes the calls in its default batches and
`purge_conversations` the conversations, with every run reported closed long ago and its history
gone (as Temporal answers once its namespace retention passed; tests/test_conversation_retention.py
asks a real Temporal). Printed: throughput, and the bytes a run holds in each table before and after
(rows' own bytes, `pg_column_size`, not the files, which a purge leaves for VACUUM to reuse).

    .venv/bin/python bench/purge.py [N] [--archive] [--turns 10]
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
from onceflow.ledger.retention import RunEnd, purge_conversations  # noqa: E402
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


# A conversation as a run's model turns store it: the system and user messages, then an assistant
# message and a tool result per turn, each a link of the hash chain (ledger/conversations.py).
SEED_CONVERSATIONS = """
INSERT INTO conversation_messages (sha256, parent, tenant, run_id, position, message, created_at)
SELECT encode(sha256(convert_to('run-' || g || ':' || p, 'UTF8')), 'hex'),
       CASE WHEN p = 0 THEN NULL ELSE encode(sha256(convert_to('run-' || g || ':' || (p - 1), 'UTF8')), 'hex') END,
       't1', 'run-' || g, p,
       jsonb_build_object('role', CASE WHEN p % 2 = 0 THEN 'user' ELSE 'assistant' END,
                          'content', repeat('x', 400)),
       now() - interval '100 days'
  FROM generate_series(1, $1) g, generate_series(0, $2 - 1) p
 ORDER BY g, p
"""

SEED_RUN_IDS = """
INSERT INTO run_ids (run_id, execution, tenant, claimed_at)
SELECT 'run-' || g, 'exec-' || g, 't1', now() - interval '100 days' FROM generate_series(1, $1) g
"""

TABLES = ("tool_executions", "tool_execution_events", "conversation_messages", "run_ids")


async def bytes_per_run(dsn: str, runs: int) -> dict[str, float]:
    conn = await asyncpg.connect(dsn)
    try:
        return {
            table: await conn.fetchval(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t") / runs
            for table in TABLES
        }
    finally:
        await conn.close()


async def every_run_gone(run_ids: object) -> dict[str, RunEnd]:
    return dict.fromkeys(run_ids, RunEnd())  # type: ignore[call-overload]


async def measure(admin_dsn: str, calls: int, archive: bool, turns: int) -> None:
    dsn = await create_database(admin_dsn, "purge_bench")
    await migrate(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SEED_CALLS, calls)
        await conn.execute("ALTER TABLE tool_execution_events DISABLE TRIGGER USER")
        await conn.execute(SEED_EVENTS, calls)
        await conn.execute("ALTER TABLE tool_execution_events ENABLE TRIGGER USER")
        await conn.execute(SEED_CONVERSATIONS, calls, 2 + 2 * turns)
        await conn.execute(SEED_RUN_IDS, calls)
        await conn.execute("ANALYZE")
    finally:
        await conn.close()
    before = await bytes_per_run(dsn, calls)
    ledger = await Ledger.connect(dsn, max_size=2)
    try:
        started = time.perf_counter()
        report = await purge_settled(ledger, older_than=timedelta(days=90), archive=archive)
        took = time.perf_counter() - started
        started = time.perf_counter()
        talked = await purge_conversations(ledger, every_run_gone, older_than=timedelta(days=90))
        took_talk = time.perf_counter() - started
    finally:
        await ledger.close()
    after = await bytes_per_run(dsn, calls)
    print(
        f"{'archived' if archive else 'purged'} {report.calls} calls and {report.events} events "
        f"in {took:.2f}s ({report.calls / took:,.0f} calls/s)"
    )
    print(
        f"purged the conversations of {talked.runs} runs ({talked.messages} messages, "
        f"{talked.bytes / max(talked.runs, 1):,.0f} bytes a run) in {took_talk:.2f}s"
    )
    print("bytes a run holds, before and after the purge (rows' own bytes):")
    for table in TABLES:
        print(f"  {table:<22} {before[table]:>8,.0f}  ->  {after[table]:>6,.0f}")
    print(
        f"  {'all':<22} {sum(before.values()):>8,.0f}  ->  {sum(after.values()):>6,.0f}"
        "  (run_ids: a run id stays claimed for good, docs/operations.md)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("calls", type=int, nargs="?", default=20_000)
    parser.add_argument("--archive", action="store_true")
    parser.add_argument("--turns", type=int, default=10, help="model turns in each run's conversation")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onceflow-purge-bench-") as tmp:
        asyncio.run(
            measure(start_embedded_postgres(Path(tmp) / "data"), args.calls, args.archive, args.turns)
        )


if __name__ == "__main__":
    main()
