"""The operator queue and the guarded reservation at scale: a ledger of 1M rows, 99% settled.

Fills the ledger in bulk (SQL generate_series: 99% completed calls, 1% indeterminate ones, spread
over 1,000 runs per 100,000 rows, one tenant), then measures through the operator API served for
real (the `onceflow api` process of the dev stack, a real Temporal dev server behind it, an
operator's token):
`GET /v1/tool-executions?limit=50` p50/p95, first page and a page deep into the queue (by cursor).
And the guarded reservation with the default intent guard plus its completion (`Ledger.reserve`,
`Ledger.complete`), p50/p95, once at 1,000 rows and again at the full size, each after the fill is
vacuumed and checkpointed and 100 untimed cycles: an index lookup each, so it should not move.
Also WAL bytes per write call (pg_current_wal_lsn() before and after the timed reservations:
reserve + complete, events included).

    .venv/bin/python bench/queue_at_scale.py [--rows 1000000] [--requests 200] [--cycles 1000]

Quick check: --rows 20000. TEMPORAL_ADDRESS or ONCEFLOW_DATABASE_URL, when set, replace the
embedded parts (see onceflow.cli.dev).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from e2e_stack import dev_stack, percentile  # bench/e2e_stack.py, beside this file

from onceflow.ledger import CallIdentity, Guard, Ledger, OperatorTokens, SideEffect

TENANT = "bench"
WARMUP = 100  # untimed guarded cycles before each timed series
# Rows i of a fill: run `scale-<i / 100>`, call `c<i>`; every 100th is unknown, the rest completed.
FILL = """
INSERT INTO tool_executions
    (key, tenant, run_id, tool_call_id, agent, tool_name, side_effect, status, payload, payload_sha256,
     owner, result, created_at, updated_at, settled_at, settled_by)
SELECT 'scale-' || (i / 100) || ':c' || i, $3, 'scale-' || (i / 100), 'c' || i, 'bench-agent',
       'issue_credit', 'external',
       CASE WHEN i % 100 = 0 THEN 'indeterminate' ELSE 'completed' END,
       jsonb_build_object('tool', 'issue_credit',
                          'arguments', jsonb_build_object('account_id', 'acct_' || i, 'amount_cents', 500)),
       encode(sha256(('p' || i)::bytea), 'hex'), 'bench-worker',
       CASE WHEN i % 100 = 0 THEN NULL ELSE jsonb_build_object('credit_id', 'cr_' || i) END,
       now() - make_interval(secs => ($2 - i) / 100.0), now(),
       CASE WHEN i % 100 = 0 THEN NULL ELSE now() END,
       CASE WHEN i % 100 = 0 THEN NULL ELSE 'bench-worker' END
  FROM generate_series($1::bigint, $2::bigint - 1) AS i
"""


async def fill(ledger: Ledger, first: int, last: int) -> None:
    """Add rows first..last, then leave the database as a long-running one is between bursts:
    vacuumed and analysed, and checkpointed, so that neither the fill's autovacuum nor its
    checkpoint runs under the timed reservations (measured 2026-12-01: they had made the 1M-row
    figure 1.55x the 1,000-row one, and its WAL per call 3x, all of it full-page images)."""
    step = 100_000
    async with ledger.connection("bench") as conn:
        for start in range(first, last, step):
            await conn.execute(FILL, start, min(start + step, last), TENANT)
        await conn.execute("VACUUM (ANALYZE) tool_executions, tool_execution_events")
        await conn.execute("CHECKPOINT")


async def rows(ledger: Ledger) -> int:
    async with ledger.connection("bench") as conn:
        return int(await conn.fetchval("SELECT count(*) FROM tool_executions"))


async def wal_lsn(ledger: Ledger) -> int:
    async with ledger.connection("bench") as conn:
        return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


async def guarded_cycles(ledger: Ledger, cycles: int) -> tuple[list[float], float]:
    """Guarded reserve + complete, one at a time after WARMUP untimed ones: latencies in ms, and
    WAL bytes per timed cycle."""
    run_id = f"bench-{uuid.uuid4().hex[:12]}"
    latencies = []
    before = 0
    for n in range(-WARMUP, cycles):
        if n == 0:
            before = await wal_lsn(ledger)
        begun = time.perf_counter()
        reserved = await ledger.reserve(
            CallIdentity(tenant=TENANT, run_id=run_id, tool_call_id=f"c{n}"),
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments={"account_id": f"acct_g{n}", "amount_cents": 500},
            owner="bench-worker",
            guard=Guard(),
        )
        await ledger.complete(reserved.record.key, owner="bench-worker", result={"n": n})
        if n >= 0:
            latencies.append((time.perf_counter() - begun) * 1000)
    after = await wal_lsn(ledger)
    return latencies, (after - before) / cycles


async def list_latencies(http: httpx.AsyncClient, requests: int) -> dict[str, list[float]]:
    first = (await http.get("/v1/tool-executions", params={"limit": 50})).json()
    cursor = first.get("next_cursor")
    for _ in range(20):  # a page well into the queue
        if not cursor:
            break
        page = (await http.get("/v1/tool-executions", params={"limit": 50, "cursor": cursor})).json()
        cursor = page.get("next_cursor") or cursor
    found: dict[str, list[float]] = {"first page": [], "page 21": []}
    for _ in range(requests):
        for name, params in (("first page", {"limit": 50}), ("page 21", {"limit": 50, "cursor": cursor})):
            begun = time.perf_counter()
            response = await http.get("/v1/tool-executions", params=params)
            found[name].append((time.perf_counter() - begun) * 1000)
            response.raise_for_status()
    return found


def line(name: str, values: list[float]) -> str:
    return f"  {name:<34} p50 {percentile(values, 0.5):7.1f} ms  p95 {percentile(values, 0.95):7.1f} ms"


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="onceflow-queue-") as tmp:
        stack = dev_stack(Path(tmp) / "stack")
        try:
            info = await stack.start()
            ledger = await Ledger.connect(info.database_url)
            try:
                await fill(ledger, 0, 1_000)
                small, wal_small = await guarded_cycles(ledger, args.cycles)
                began = time.perf_counter()
                await fill(ledger, 1_000, args.rows)
                filled = time.perf_counter() - began
                total = await rows(ledger)
                large, wal_large = await guarded_cycles(ledger, args.cycles)
                _, secret = await OperatorTokens(ledger).create(tenant=TENANT, operator="bench")
                assert info.api_url is not None
                async with httpx.AsyncClient(
                    base_url=info.api_url, headers={"Authorization": f"Bearer {secret}"}, timeout=30
                ) as http:
                    listed = await list_latencies(http, args.requests)
            finally:
                await ledger.close()
            print(f"Python {platform.python_version()}; {os.cpu_count()} CPUs; {platform.platform()}")
            print(f"ledger filled to {total:,} rows (1% indeterminate) in {filled:.0f} s")
            print(f"operator queue, GET /v1/tool-executions?limit=50 through the API, {args.requests} each:")
            for name, values in listed.items():
                print(line(name, values))
            print(f"guarded reservation (default intent guard) + completion, {args.cycles} one at a time:")
            print(line("at 1,000 rows", small))
            print(line(f"at {total:,} rows", large))
            print(f"  p50 at {total:,} / at 1,000: {percentile(large, 0.5) / percentile(small, 0.5):.2f}")
            print(
                f"WAL bytes per write call (reserve + complete): {wal_small:,.0f} at 1,000 rows, {wal_large:,.0f} at {total:,}"
            )
        finally:
            await stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="ledger rows, at least 2,000")
    parser.add_argument("--requests", type=int, default=200, help="list requests per page measured")
    parser.add_argument("--cycles", type=int, default=1000, help="guarded reservations per measurement")
    args = parser.parse_args()
    if args.rows < 2_000 or args.requests < 1 or args.cycles < 1:
        parser.error("--rows must be at least 2000, --requests and --cycles at least 1")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    asyncio.run(bench(args))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
