"""What the guards cost on the write path: reserve + complete cycles per second, with and without them.

Three variants through `Ledger.reserve` then `Ledger.complete`, in short rounds. Each round runs
all three, in an order that turns by one each round, and each variant's ratio is taken against the
`none` of its own round: the printed `(R of none)` is the median of those per-round ratios, with
their range, so that a machine whose speed drifts from one second to the next (a shared VM) moves
the rates more than the ratios. The rate printed is the median over rounds. `+N µs a cycle` is
what the guard adds in absolute terms: per round, the variant's time per cycle less `none`'s
(1/rate each: wall time per cycle at c=1, the machine's time per cycle when it is saturated), the
median over rounds. Unlike the ratio, it does not move when the unguarded cycle gets cheaper or
dearer, as it does with the disk's commit latency.
- none:   `guard=None`, the one-statement reservation (what compensations use);
- intent: the default guard every write tool gets (intent `hold`): a transaction with one advisory
          lock and a look for the same payload in the run;
- budget: an entity guard and a budget as well (two locks, a busy-entity check, a sum).
In `budget`, cycles spread over 64 entities with a limit no cycle reaches, so nothing is refused.

    .venv/bin/python bench/guards.py [--seconds 0.5] [--rounds 9] [--concurrency 1 8]

Uses ONCEFLOW_DATABASE_URL when set (an admin DSN: a scratch database is created and dropped),
otherwise starts the embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from decimal import Decimal

from scratch import on_a_server, scratch_database  # bench/scratch.py, beside this file

from onceflow.ledger import CallIdentity, Guard, Ledger, SideEffect, migrate

VARIANTS = ("none", "intent", "budget")


def guard_for(variant: str, n: int) -> Guard | None:
    if variant == "none":
        return None
    if variant == "intent":
        return Guard()
    return Guard(entity=f"ord_{n % 64}", exclusive=False, amount=Decimal(1), limit=Decimal(10**12))


async def cycles(ledger: Ledger, variant: str, seconds: float, concurrency: int) -> float:
    """Cycles per second for `seconds`, `concurrency` at a time."""
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    counter = iter(range(10**9))
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            n = next(counter)
            reserved = await ledger.reserve(
                CallIdentity(tenant="bench", run_id=run_id, tool_call_id=f"c{n}"),
                tool_name="issue_credit",
                side_effect=SideEffect.EXTERNAL,
                arguments={"account_id": f"acct_{n}", "amount_cents": 500},
                owner="bench",
                guard=guard_for(variant, n),
            )
            await ledger.complete(reserved.record.key, owner="bench", result={"n": n})
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - started)


async def measure(dsn: str, args: argparse.Namespace) -> None:
    await migrate(dsn)
    ledger = await Ledger.connect(dsn, max_size=10)
    try:
        for concurrency in args.concurrency:
            for variant in VARIANTS:  # warm-up
                await cycles(ledger, variant, 0.2, concurrency)
            rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
            ratios: dict[str, list[float]] = {v: [] for v in VARIANTS}
            added: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for round_ in range(args.rounds):
                turn = round_ % len(VARIANTS)
                this_round = {
                    v: await cycles(ledger, v, args.seconds, concurrency)
                    for v in VARIANTS[turn:] + VARIANTS[:turn]
                }
                for variant, rate in this_round.items():
                    rates[variant].append(rate)
                    ratios[variant].append(rate / this_round["none"])
                    added[variant].append(1e6 / rate - 1e6 / this_round["none"])
            for variant in VARIANTS:
                spread = ratios[variant]
                print(
                    f"concurrency {concurrency:>2}  {variant:<6}  {statistics.median(rates[variant]):7.0f} cycles/s"
                    f"  ({statistics.median(spread):4.2f} of none)"
                    + (
                        f"  [{min(spread):.2f} to {max(spread):.2f} over {len(spread)} rounds]"
                        f"  +{statistics.median(added[variant]):.0f} µs a cycle"
                        if variant != "none"
                        else ""
                    )
                )
    finally:
        await ledger.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()

    async def run(admin_dsn: str) -> None:
        async with scratch_database(admin_dsn, "guards") as dsn:
            await measure(dsn, args)

    on_a_server(run)


if __name__ == "__main__":
    main()
