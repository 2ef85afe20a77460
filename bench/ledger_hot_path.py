"""The ledger's hot path against its floor: reserve + complete cycles per second.

Ledger: `Ledger.reserve` then `Ledger.complete` through its pool, library code included (canonical
payload, records, spans). Floor: the very SQL the ledger sends for those two calls
(`ledger.queries.RESERVE` and `ledger.queries.COMPLETE_STARTED`, each appending its event in the same
statement) with the same parameters, through bare asyncpg the way an asyncpg application runs two
statements that a tool call separates: `pool.acquire()` then `conn.fetchrow` for each, on an asyncpg
pool of the ledger's size and settings, into the same table, no onceflow code. The ratio is
therefore onceflow's client-side overhead alone; the events are a requirement and cost both sides
alike, and asyncpg's pool is asyncpg's. For reference the script also prints a second floor with no
pool at all (one dedicated connection per worker) and the ratio against it.
The two alternate in short rounds after a warm-up so that drift on a busy machine hits both alike.

    .venv/bin/python bench/ledger_hot_path.py [--seconds 0.75] [--rounds 5] [--concurrency 1 8 32]

Figures: cycles per second over all rounds, the client's CPU per cycle (this process; the server's
is not counted), and per concurrency the ratio ledger/floor: the median over rounds, each round
running both back to back, which holds up better than one total against a machine whose load moves.

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
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
from scratch import on_a_server, scratch_database  # bench/scratch.py, beside this file

from onceflow.ledger import CallIdentity, Ledger, SideEffect, migrate
from onceflow.ledger.queries import COMPLETE_STARTED, RESERVE

ARGUMENTS = {"account_id": "acct_1", "amount_cents": 500, "memo": "goodwill credit"}
RESULT = {"credit_id": "cr_1", "amount_cents": 500}

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


def _reserve_arguments(run_id: str, n: int) -> tuple[str, tuple[object, ...]]:
    tool_call_id = f"c{n}"
    key = f"{run_id}:{tool_call_id}"
    # For these arguments compact, sorted stdlib JSON is byte for byte the RFC 8785 text.
    payload = json.dumps(
        {"arguments": ARGUMENTS, "tool": "issue_credit"}, separators=(",", ":"), sort_keys=True
    )
    sha256 = hashlib.sha256(payload.encode()).hexdigest()
    # The lease: the ledger cycle passes none either.
    values = (key, "bench", run_id, tool_call_id, "", "issue_credit", "external", "started", payload, sha256)
    # Owner, lease, no deadline, no attempt start ($11 to $14).
    return key, (*values, "bench-worker", None, None, None)


RESULT_JSON = json.dumps(RESULT, separators=(",", ":"), sort_keys=True)


class PooledFloor:
    """The floor: the ledger's two statements through an asyncpg pool, one checkout each."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def cycle(self, run_id: str, n: int) -> None:
        key, reserve = _reserve_arguments(run_id, n)
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(RESERVE, *reserve)
        assert row is not None and row["inserted"]
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(COMPLETE_STARTED, key, "bench-worker", RESULT_JSON, None)
        assert row is not None


class DedicatedFloor:
    """For reference: the same two statements on one dedicated connection per worker, no pool."""

    def __init__(self, connections: list[asyncpg.Connection]) -> None:
        self._idle = connections

    async def cycle(self, run_id: str, n: int) -> None:
        conn = self._idle.pop()
        try:
            key, reserve = _reserve_arguments(run_id, n)
            row = await conn.fetchrow(RESERVE, *reserve)
            assert row is not None and row["inserted"]
            row = await conn.fetchrow(COMPLETE_STARTED, key, "bench-worker", RESULT_JSON, None)
            assert row is not None
        finally:
            self._idle.append(conn)


async def run_for(cycle: Cycle, concurrency: int, seconds: float) -> tuple[int, float, float]:
    """Run `concurrency` loops of cycles for `seconds`.

    Returns (cycles done, elapsed seconds, this process's CPU seconds: the client's side).
    """
    run_id = f"bench-{uuid.uuid4().hex[:12]}"
    counter = itertools.count()
    deadline = time.perf_counter() + seconds
    done = 0

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await cycle(run_id, next(counter))
            done += 1

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return done, time.perf_counter() - started, time.process_time() - cpu


@dataclass
class Figures:
    rate: dict[str, float]  # cycles/s over all rounds
    cpu_us: dict[str, float]  # client CPU per cycle, µs
    ratio: float  # median over rounds of ledger/floor, each round measuring all back to back
    ratio_dedicated: float  # the same against the no-pool floor


async def measure(dsn: str, concurrency: int, seconds: float, rounds: int) -> Figures:
    ledger = await Ledger.connect(dsn, min_size=concurrency, max_size=concurrency)
    # The ledger's pool settings: same size, and no reset query on release (see ledger/connections.py).
    pool = await asyncpg.create_pool(dsn, min_size=concurrency, max_size=concurrency, reset=_no_reset)
    connections = [await asyncpg.connect(dsn) for _ in range(concurrency)]
    systems = {
        "ledger": ledger_cycle(ledger),
        "floor": PooledFloor(pool).cycle,
        "no-pool": DedicatedFloor(connections).cycle,
    }
    try:
        for cycle in systems.values():
            await run_for(cycle, concurrency, 1.0)  # warm-up: statements prepared, caches hot
        totals = {name: [0, 0.0, 0.0] for name in systems}
        ratios, ratios_dedicated = [], []
        for round_ in range(rounds):
            order = list(systems) if round_ % 2 == 0 else list(reversed(systems))
            rates = {}
            for name in order:
                done, elapsed, cpu = await run_for(systems[name], concurrency, seconds)
                rates[name] = done / elapsed
                for i, value in enumerate((done, elapsed, cpu)):
                    totals[name][i] += value
            ratios.append(rates["ledger"] / rates["floor"])
            ratios_dedicated.append(rates["ledger"] / rates["no-pool"])
        return Figures(
            rate={name: done / elapsed for name, (done, elapsed, _) in totals.items()},
            cpu_us={name: cpu / done * 1e6 for name, (done, _, cpu) in totals.items()},
            ratio=statistics.median(ratios),
            ratio_dedicated=statistics.median(ratios_dedicated),
        )
    finally:
        await ledger.close()
        await pool.close()
        for conn in connections:
            await conn.close()


async def _no_reset(conn: asyncpg.Connection) -> None:
    """As the ledger's pool: nothing to reset, since no session state is ever set."""


async def bench(admin_dsn: str, concurrencies: list[int], seconds: float, rounds: int) -> None:
    async with scratch_database(admin_dsn, "hot_path") as dsn:
        await migrate(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            server = await conn.fetchval("SHOW server_version")
        finally:
            await conn.close()
        print(f"PostgreSQL {server}; Python {platform.python_version()}; {os.cpu_count()} CPUs")
        print(f"{rounds} alternating rounds of {seconds:g} s per system and concurrency, after a warm-up")
        print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(
            f"{'concurrency':>11}  {'ledger cycles/s':>15}  {'floor cycles/s':>14}  {'no-pool cycles/s':>16}"
            f"  {'client CPU µs/cycle: ledger / floor / no-pool':>46}"
        )
        ratios = []
        for concurrency in concurrencies:
            figures = await measure(dsn, concurrency, seconds, rounds)
            ratios.append((concurrency, figures))
            cpu = " / ".join(f"{figures.cpu_us[name]:,.0f}" for name in ("ledger", "floor", "no-pool"))
            print(
                f"{concurrency:>11}  {figures.rate['ledger']:>15,.0f}  {figures.rate['floor']:>14,.0f}"
                f"  {figures.rate['no-pool']:>16,.0f}  {cpu:>46}"
            )
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print("for reference, ledger/no-pool (the same statements on dedicated connections):")
        for concurrency, figures in ratios:
            print(f"  ledger/no-pool c={concurrency}: {figures.ratio_dedicated:.2f}")
        print(
            f"ratio: ledger/floor cycles per second, the median of {rounds} rounds (each round runs all three)"
        )
        for concurrency, figures in ratios:
            print(f"ratio c={concurrency}: {figures.ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=0.75, help="length of one measured round")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per system")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    on_a_server(lambda admin_dsn: bench(admin_dsn, args.concurrency, args.seconds, args.rounds))


if __name__ == "__main__":
    main()
