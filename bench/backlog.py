"""The write path while unknown calls pile up: does a completion cost more when the queue is long?

A ledger's statistics are taken when autovacuum last analysed it, usually while almost nothing was
unresolved. Then a downstream starts timing out and unknown calls pile up faster than autoanalyze
looks again (it waits for a tenth of the table to change). This bench plays that out: a ledger of
`--rows` settled calls, vacuumed and analysed; then a backlog of indeterminate calls added in steps
(no analyse in between); at each step, guarded write calls one at a time (`Ledger.reserve` with the
default intent guard, then `Ledger.complete`), reserve and complete timed apart. Last, the same
after an ANALYZE that has seen the whole backlog. A completion addresses one row by its key, so
neither figure should move with the backlog.

    .venv/bin/python bench/backlog.py [--rows 100000] [--backlog 0 1000 5000 20000] [--cycles 300]

Autovacuum is off for the scratch database's two tables while it runs, so that the moment of its
analysis is the bench's and not chance's; `--autovacuum` leaves it on.
Uses ONCEFLOW_DATABASE_URL when set (an admin DSN: a scratch database is created and dropped),
otherwise starts the embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import uuid

from e2e_stack import percentile  # bench/e2e_stack.py, beside this file
from scratch import on_a_server, scratch_database  # bench/scratch.py, beside this file

from onceflow.ledger import CallIdentity, Guard, Ledger, SideEffect, migrate

TENANT = "bench"
WARMUP = 50  # untimed cycles before each timed series

# Rows first..last-1 of run `backlog-<i / 100>`, call `c<i>`, all in status $3.
FILL = """
INSERT INTO tool_executions
    (key, tenant, run_id, tool_call_id, agent, tool_name, side_effect, status, payload, payload_sha256,
     owner, result, settled_at, settled_by)
SELECT 'backlog-' || (i / 100) || ':c' || i, $4, 'backlog-' || (i / 100), 'c' || i, 'bench-agent',
       'issue_credit', 'external', $3,
       jsonb_build_object('tool', 'issue_credit',
                          'arguments', jsonb_build_object('account_id', 'acct_' || i, 'amount_cents', 500)),
       encode(sha256(('p' || i)::bytea), 'hex'), 'bench-worker',
       CASE WHEN $3 = 'completed' THEN jsonb_build_object('credit_id', 'cr_' || i) END,
       CASE WHEN $3 = 'completed' THEN now() END,
       CASE WHEN $3 = 'completed' THEN 'bench-worker' END
  FROM generate_series($1::bigint, $2::bigint - 1) AS i
"""


async def cycles(ledger: Ledger, count: int) -> tuple[list[float], list[float]]:
    """Reserve and complete latencies in ms, one call at a time, after WARMUP untimed ones."""
    run_id = f"bench-{uuid.uuid4().hex[:12]}"
    reserves, completes = [], []
    for n in range(-WARMUP, count):
        begun = time.perf_counter()
        reserved = await ledger.reserve(
            CallIdentity(tenant=TENANT, run_id=run_id, tool_call_id=f"c{n}"),
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments={"account_id": f"acct_w{n}", "amount_cents": 500},
            owner="bench-worker",
            guard=Guard(),
        )
        between = time.perf_counter()
        await ledger.complete(reserved.record.key, owner="bench-worker", result={"n": n})
        if n >= 0:
            reserves.append((between - begun) * 1000)
            completes.append((time.perf_counter() - between) * 1000)
    return reserves, completes


def line(label: str, reserves: list[float], completes: list[float]) -> str:
    return (
        f"  {label:<28} reserve p50 {statistics.median(reserves):6.2f} p95 {percentile(reserves, 0.95):6.2f} ms"
        f"   complete p50 {statistics.median(completes):6.2f} p95 {percentile(completes, 0.95):6.2f} ms"
    )


async def measure(dsn: str, args: argparse.Namespace) -> None:
    await migrate(dsn)
    ledger = await Ledger.connect(dsn)
    try:
        async with ledger.connection("bench") as conn:
            if not args.autovacuum:
                for table in ("tool_executions", "tool_execution_events"):
                    await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            for start in range(0, args.rows, 100_000):
                await conn.execute(FILL, start, min(start + 100_000, args.rows), "completed", TENANT)
            await conn.execute("VACUUM (ANALYZE) tool_executions, tool_execution_events")
            await conn.execute("CHECKPOINT")
        print(f"Python {platform.python_version()}; {os.cpu_count()} CPUs; {platform.platform()}")
        print(f"{args.rows:,} settled calls, vacuumed and analysed; then a backlog of indeterminate calls:")
        added = args.rows
        for backlog in args.backlog:
            async with ledger.connection("bench") as conn:
                await conn.execute(FILL, added, args.rows + backlog, "indeterminate", TENANT)
            added = args.rows + backlog
            reserves, completes = await cycles(ledger, args.cycles)
            print(line(f"backlog {backlog:,}", reserves, completes))
        async with ledger.connection("bench") as conn:
            await conn.execute("ANALYZE tool_executions, tool_execution_events")
        # A new pool: plans cached by the old connections were made before the analysis.
        await ledger.close()
        ledger = await Ledger.connect(dsn)
        reserves, completes = await cycles(ledger, args.cycles)
        print(line(f"backlog {added - args.rows:,}, analysed", reserves, completes))
    finally:
        await ledger.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000, help="settled calls to start from")
    parser.add_argument("--backlog", type=int, nargs="+", default=[0, 1_000, 5_000, 20_000])
    parser.add_argument("--cycles", type=int, default=300, help="write calls timed per step")
    parser.add_argument("--autovacuum", action="store_true", help="leave autovacuum on")
    args = parser.parse_args()
    if args.rows < 0 or args.cycles < 1 or args.backlog != sorted(args.backlog) or min(args.backlog) < 0:
        parser.error("--rows must be >= 0, --cycles >= 1, --backlog ascending and >= 0")

    async def run(admin_dsn: str) -> None:
        async with scratch_database(admin_dsn, "backlog") as dsn:
            await measure(dsn, args)

    on_a_server(run)


if __name__ == "__main__":
    main()
