"""Budget totals (migration 0012): the running totals per budget key answer what the full sum over
the entity's history answered (migration 0010's `onceflow_budget_used`, kept here as the oracle),
after any sequence of the ledger's own operations, under concurrent writers, and from the back-fill
of a ledger migrated with history in it."""

from __future__ import annotations

import asyncio
import random
import shutil
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from onceflow.ledger import (
    CallIdentity,
    ConflictNotOpenError,
    FailureKind,
    Guard,
    InvalidTransitionError,
    Ledger,
    RecordNotFoundError,
    SideEffect,
    Status,
    migrate,
    purge_settled,
)
from onceflow.ledger.migrate import discover
from onceflow.local.postgres import create_database, drop_database
from tests.support.ledger_invariants import age_everything

# Migration 0010's body, word for word: the sum over every row, and what purges folded away.
OLD_BUDGET_USED = """
CREATE FUNCTION old_budget_used(
    p_tenant text, p_tool_name text, p_entity text, p_key text, p_toolset text, p_currency text,
    OUT completed numeric, OUT unresolved numeric
) LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(t.amount) FILTER (WHERE t.status = 'completed'), 0)
             + coalesce((SELECT sum(u.completed) FROM budget_purged_usage u
                          WHERE u.tenant = p_tenant AND u.tool_name = p_tool_name
                            AND u.entity = p_entity
                            AND (u.toolset = '' OR p_toolset IS NULL OR u.toolset = p_toolset)
                            AND u.currency = coalesce(p_currency, '')), 0),
           coalesce(sum(t.amount) FILTER (WHERE t.status <> 'completed'), 0)
      FROM tool_executions t
     WHERE t.tenant = p_tenant AND t.tool_name = p_tool_name AND t.entity = p_entity
       AND t.key <> p_key
       AND (t.toolset IS NULL OR p_toolset IS NULL OR t.toolset = p_toolset)
       AND t.currency IS NOT DISTINCT FROM p_currency
       AND t.amount IS NOT NULL AND t.reused_from IS NULL
       AND (t.status IN ('awaiting_approval', 'started', 'indeterminate', 'completed')
            OR (t.status = 'failed' AND t.conflict_at IS NOT NULL AND t.conflict_cleared_at IS NULL))
$$
"""

# Both answers for every asked (tenant, tool, entity, key, toolset, currency), where they differ.
DIFFERENCES = """
SELECT p.*, n.completed AS new_completed, n.unresolved AS new_unresolved,
       o.completed AS old_completed, o.unresolved AS old_unresolved
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
         AS p(tenant, tool_name, entity, key, toolset, currency),
       LATERAL onceflow_budget_used(p.tenant, p.tool_name, p.entity, p.key, p.toolset, p.currency) n,
       LATERAL old_budget_used(p.tenant, p.tool_name, p.entity, p.key, p.toolset, p.currency) o
 WHERE (n.completed, n.unresolved) IS DISTINCT FROM (o.completed, o.unresolved)
"""

# Each budget key's rows as the old rules count them, without the totals table.
ROW_SUMS = """
SELECT tenant, tool_name, entity, toolset, currency,
       coalesce(sum(amount) FILTER (WHERE status = 'completed'), 0) AS completed,
       coalesce(sum(amount) FILTER (WHERE status <> 'completed'), 0) AS unresolved
  FROM tool_executions
 WHERE amount IS NOT NULL AND reused_from IS NULL
   AND (status IN ('awaiting_approval', 'started', 'indeterminate', 'completed')
        OR (status = 'failed' AND conflict_at IS NOT NULL AND conflict_cleared_at IS NULL))
 GROUP BY 1, 2, 3, 4, 5
"""

TENANTS = ("t1", "t2")
TOOLS = ("refund", "credit")
ENTITIES = ("ord_1", "ord_2", "ord_3")
TOOLSETS = (None, "shop", "billing")
CURRENCIES = (None, "EUR", "USD")
AMOUNTS = (Decimal(1), Decimal("2.50"), Decimal("0.1"), Decimal(7))
EVIDENCE = {"checked": "the receiver's records"}
KINDS = (FailureKind.NOT_ATTEMPTED, FailureKind.REJECTED, FailureKind.NOT_APPLIED)
# Rows the guards decide again when asked (ledger.guarded.decided_again).
DECIDED_AGAIN = (
    "status = 'held' OR (status = 'failed' AND conflict_at IS NULL"
    " AND failure_kind IN ('not_attempted', 'rejected', 'not_applied'))"
)
REFUSED = (InvalidTransitionError, ConflictNotOpenError, RecordNotFoundError)

Key = tuple[str, str, str, str | None, str | None]


async def install_oracle(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(OLD_BUDGET_USED)
    finally:
        await conn.close()


async def assert_totals_match(conn: asyncpg.Connection, keys: list[str]) -> int:
    """The totals table against the rows and budget_purged_usage, then the function against the
    oracle for every tenant, tool, entity, toolset and currency, apart from no call and from each
    of `keys`. Returns how many questions were asked."""
    expected: dict[Key, list[Decimal]] = {}
    for r in await conn.fetch(ROW_SUMS):
        expected[(r[0], r[1], r[2], r[3], r[4])] = [r["completed"], r["unresolved"]]
    for r in await conn.fetch("SELECT * FROM budget_purged_usage"):
        key = (r["tenant"], r["tool_name"], r["entity"], r["toolset"] or None, r["currency"] or None)
        expected.setdefault(key, [Decimal(0), Decimal(0)])[0] += r["completed"]
    totals = {
        (r[0], r[1], r[2], r[3], r[4]): [r["completed"], r["unresolved"]]
        for r in await conn.fetch(
            "SELECT tenant, tool_name, entity, toolset, currency, completed, unresolved FROM budget_totals"
        )
    }
    nonzero = {k: v for k, v in totals.items() if v != [0, 0]}
    assert nonzero == {k: v for k, v in expected.items() if v != [0, 0]}, (
        "budget_totals drifted from the rows"
    )

    asked: list[tuple[str, str, str, str, str | None, str | None]] = []
    for tenant in TENANTS:
        for tool in TOOLS:
            for entity in ENTITIES:
                for toolset in TOOLSETS:
                    for currency in CURRENCIES:
                        asked += [(tenant, tool, entity, key, toolset, currency) for key in ["", *keys]]
    columns = [list(column) for column in zip(*asked, strict=True)]
    differences = await conn.fetch(DIFFERENCES, *columns)
    assert not differences, (
        f"onceflow_budget_used differs from the full sum: {[dict(r) for r in differences[:5]]}"
    )
    return len(asked)


@dataclass(frozen=True)
class Call:
    identity: CallIdentity
    tool: str
    arguments: dict[str, Any]
    guard: Guard


class Driver:
    """A random sequence of the ledger's operations on calls with budgets, one at a time."""

    def __init__(self, ledger: Ledger, dsn: str, rng: random.Random) -> None:
        self.ledger, self.dsn, self.rng = ledger, dsn, rng
        self.calls: dict[str, Call] = {}
        self.runs: list[tuple[str, str]] = []
        self.done: Counter[str] = Counter()

    async def rows(self, where: str) -> list[asyncpg.Record]:
        async with self.ledger.connection("test_rows") as conn:
            return list(
                await conn.fetch(f"SELECT key, owner FROM tool_executions WHERE {where} ORDER BY key")
            )

    async def budget_key(self, key: str) -> tuple[Any, ...] | None:
        async with self.ledger.connection("test_rows") as conn:
            row = await conn.fetchrow(
                "SELECT entity, toolset, currency FROM tool_executions WHERE key = $1 AND amount IS NOT NULL",
                key,
            )
        return None if row is None else tuple(row)

    async def pick(self, where: str) -> asyncpg.Record | None:
        found = await self.rows(where)
        return self.rng.choice(found) if found else None

    def new_call(self) -> Call:
        rng = self.rng
        if not self.runs or rng.random() < 0.3:
            self.runs.append((rng.choice(TENANTS), f"run-{len(self.runs)}"))
        tenant, run_id = rng.choice(self.runs[-4:])
        identity = CallIdentity(tenant=tenant, run_id=run_id, tool_call_id=f"c{len(self.calls)}")
        twins = [c for c in self.calls.values() if c.identity.run_id == run_id]
        if twins and rng.random() < 0.35:  # the same payload again in the run: held, reused or sent
            twin = rng.choice(twins)
            return Call(identity, twin.tool, twin.arguments, twin.guard)
        entity = rng.choice(ENTITIES)
        guard = Guard(
            intent=rng.choice(("hold", "hold", "reuse", "allow")),
            entity=entity,
            exclusive=rng.random() < 0.2,
            amount=rng.choice(AMOUNTS),
            limit=rng.choice((Decimal(10**6), Decimal(6))),
            toolset=rng.choice(TOOLSETS),
            currency=rng.choice(CURRENCIES),
        )
        arguments = {"order": entity, "amount": str(guard.amount), "n": rng.randrange(3)}
        return Call(identity, rng.choice(TOOLS), arguments, guard)

    async def reserve(self, call: Call, *, guarded: bool = True) -> None:
        result = await self.ledger.reserve(
            call.identity,
            tool_name=call.tool,
            side_effect=SideEffect.EXTERNAL,
            arguments=call.arguments,
            owner="w1",
            approval=guarded and self.rng.random() < 0.15,
            guard=call.guard if guarded else None,
        )
        self.calls[call.identity.key] = call
        self.done[f"reserved {result.outcome.value}"] += 1

    async def step(self) -> None:
        rng, ledger = self.rng, self.ledger
        op = rng.choices(
            ("reserve", "again", "plain", "complete", "fail", "unknown", "settle", "conflict",
             "acknowledge", "compensate", "approve", "deny", "release", "purge"),
            weights=(6, 3, 1, 4, 2, 1, 1, 2, 1, 1, 1, 0.5, 0.5, 0.6),
        )[0]  # fmt: skip
        if op == "reserve":
            await self.reserve(self.new_call())
            return
        if op in ("again", "plain"):  # a recorded (or purged) key asked again, guarded or not
            waiting = await self.pick(DECIDED_AGAIN) if rng.random() < 0.7 else None
            if waiting is not None:
                call = self.calls[waiting["key"]]
            elif self.calls:
                call = rng.choice(list(self.calls.values()))
            else:
                return
            if rng.random() < 0.5:  # declared differently this time: the row moves to another budget key
                moved = {"entity": rng.choice(ENTITIES), "toolset": rng.choice(TOOLSETS)}
                moved["currency"] = rng.choice(CURRENCIES)
                call = Call(call.identity, call.tool, call.arguments, call.guard.model_copy(update=moved))
            before = await self.budget_key(call.identity.key)
            await self.reserve(call, guarded=op == "again")
            if before is not None and before != await self.budget_key(call.identity.key):
                self.done["moved to another budget key"] += 1
            return
        if op == "purge":
            await age_everything(self.dsn, timedelta(days=2))
            report = await purge_settled(ledger, older_than=timedelta(days=1))
            self.done["purged calls"] += report.calls
            return
        where = {
            "complete": "status = 'started'",
            "fail": "status = 'started'",
            "unknown": "status = 'started'",
            "settle": "status IN ('started', 'indeterminate')",
            "conflict": "status IN ('failed', 'completed') AND conflict_at IS NULL",
            "acknowledge": "conflict_at IS NOT NULL AND conflict_cleared_at IS NULL",
            "compensate": "status = 'completed' AND reused_from IS NULL",  # a reused call was never sent
            "approve": "status = 'awaiting_approval' AND approved_at IS NULL",
            "deny": "status = 'awaiting_approval' AND approved_at IS NULL",
            "release": "status = 'held'",
        }[op]
        row = await self.pick(where + " AND amount IS NOT NULL")
        if row is None:
            return
        key = row["key"]
        try:
            await self.act(op, key, row["owner"])
        except REFUSED:
            self.done[f"{op} refused"] += 1
        else:
            self.done[op] += 1

    async def act(self, op: str, key: str, owner: str | None) -> None:
        rng, ledger = self.rng, self.ledger
        if op == "complete":
            await ledger.complete(key, owner=owner or "w1", result={"id": key})
        elif op == "fail":
            kind = rng.choice(KINDS)
            await ledger.fail(key, owner=owner or "w1", kind=kind, error=kind.value)
        elif op == "unknown":
            await ledger.mark_indeterminate(key, actor="inspector", reason="activity lost")
        elif op == "settle":
            status = rng.choice((Status.COMPLETED, Status.FAILED))
            result = {"id": key} if status is Status.COMPLETED else None
            await ledger.settle(
                key, status=status, actor="operator:alice", reason="checked", evidence=EVIDENCE, result=result
            )
        elif op == "conflict":  # a late report contradicting the decision
            record = await ledger.get(key, with_events=False)
            reported = Status.FAILED if record.status is Status.COMPLETED else Status.COMPLETED
            await ledger.record_late_outcome(key, actor="reconciler:hook", status=reported)
        elif op == "acknowledge":
            await ledger.acknowledge_conflict(
                key,
                actor="operator:bob",
                status=rng.choice((Status.FAILED, Status.COMPLETED, Status.COMPENSATED)),
                reason="looked at the other side",
                evidence=EVIDENCE,
            )
        elif op == "compensate":
            await ledger.mark_compensated(key, actor="compensation", reason="undone")
        elif op == "approve":
            await ledger.approve(key, actor="operator:alice")
        elif op == "deny":
            await ledger.deny(key, actor="operator:alice", reason="no")
        elif op == "release":
            await ledger.release(key, actor="operator:alice", reason="never sent")


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_totals_equal_the_full_sum_after_a_random_history(
    ledger: Ledger, database_url: str, seed: int
) -> None:
    await install_oracle(database_url)
    driver = Driver(ledger, database_url, random.Random(seed))
    asked = 0
    for step in range(300):
        await driver.step()
        if step % 20 == 19 or step == 299:
            keys = sorted(driver.calls)  # live and purged keys alike
            async with ledger.connection("test_check") as conn:
                asked += await assert_totals_match(conn, driver.rng.sample(keys, min(len(keys), 12)))
    done = driver.done
    # The history took every path that changes what a budget carries.
    for op in ("complete", "fail", "unknown", "settle", "conflict", "acknowledge", "compensate", "approve"):
        assert done[op] > 0, f"no {op} in the history: {done}"
    for outcome in ("new", "held", "reused", "refused", "retry", "awaiting_approval"):
        assert done[f"reserved {outcome}"] > 0, f"no reservation answered {outcome}: {done}"
    assert done["purged calls"] > 0, f"no purge took a call: {done}"
    assert done["moved to another budget key"] > 0, f"no call moved to another budget key: {done}"
    async with ledger.connection("test_check") as conn:
        assert await conn.fetchval("SELECT count(*) FROM budget_purged_usage") > 0
        assert await conn.fetchval("SELECT count(*) FROM budget_totals WHERE unresolved > 0") > 0
    assert asked > 10_000


async def test_concurrent_writers_of_one_budget_keep_it_exact(ledger: Ledger, database_url: str) -> None:
    """Reservations and settlements on two hot entities at once: no deadlock, no lost update, and
    no more reserved than the limit allows."""
    await install_oracle(database_url)
    limit = Decimal(40)

    async def cycle(n: int) -> bool:
        guard = Guard(entity=f"ord_{n % 2}", amount=Decimal(1), limit=limit, toolset="shop", currency="EUR")
        reserved = await ledger.reserve(
            CallIdentity(tenant="t1", run_id=f"hot-{n}", tool_call_id="c0"),
            tool_name="refund",
            side_effect=SideEffect.EXTERNAL,
            arguments={"n": n},
            owner="w1",
            guard=guard,
        )
        if not reserved.may_send:
            return False
        if n % 3 == 0:
            await ledger.fail(reserved.record.key, owner="w1", kind=FailureKind.NOT_APPLIED, error="no")
        else:
            await ledger.complete(reserved.record.key, owner="w1", result={"n": n})
        return True

    sent = await asyncio.gather(*(cycle(n) for n in range(120)))
    assert sum(sent) > 80  # failures release their amount: most cycles fit
    async with ledger.connection("test_check") as conn:
        await assert_totals_match(conn, [])
        for entity in ("ord_0", "ord_1"):
            used = await conn.fetchrow(
                "SELECT * FROM onceflow_budget_used('t1', 'refund', $1, '', 'shop', 'EUR')", entity
            )
            assert used["completed"] <= limit and used["unresolved"] == 0


async def test_a_row_moved_to_another_budget_key_takes_its_amount_along(
    ledger: Ledger, database_url: str
) -> None:
    """The ledger re-decides only calls that carry nothing (held, failed without effect), so only a
    hand-made change moves a counted row; the totals follow it all the same."""
    await install_oracle(database_url)
    driver = Driver(ledger, database_url, random.Random(11))
    for n, status in enumerate(("started", "completed", "indeterminate")):
        guard = Guard(
            intent="allow", entity="ord_1", amount=Decimal(n + 1), limit=Decimal(100), toolset="shop"
        )
        call = Call(
            CallIdentity(tenant="t1", run_id="moved", tool_call_id=f"c{n}"), "refund", {"n": n}, guard
        )
        await driver.reserve(call, guarded=True)
        if status == "completed":
            await ledger.complete(call.identity.key, owner="w1", result={})
        elif status == "indeterminate":
            await ledger.mark_indeterminate(call.identity.key, actor="inspector", reason="lost")
    conn = await asyncpg.connect(database_url)
    try:
        for toolset, currency, entity in (
            ("billing", "EUR", "ord_1"),
            (None, None, "ord_2"),
            ("shop", "USD", "ord_1"),
        ):
            await conn.execute(
                "UPDATE tool_executions SET toolset = $1, currency = $2, entity = $3 WHERE run_id = 'moved'",
                toolset,
                currency,
                entity,
            )
            await assert_totals_match(conn, ["moved:c0", "moved:c1", "moved:c2"])
    finally:
        await conn.close()


async def test_the_migration_back_fills_a_ledger_with_history(postgres_dsn: str, tmp_path: Path) -> None:
    """A ledger with live, settled, conflicted and purged budget calls, migrated: the function answers
    as the one it replaces did, on the same rows."""
    earlier = tmp_path / "migrations"
    earlier.mkdir()
    for migration in discover():
        if migration.version < 12:
            shutil.copy(migration.path, earlier / migration.path.name)
    name = f"onceflow_test_{uuid.uuid4().hex[:12]}"
    dsn = await create_database(postgres_dsn, name)
    try:
        assert await migrate(dsn, directory=earlier) == 11
        store = await Ledger.connect(dsn, max_size=4)
        try:
            driver = Driver(store, dsn, random.Random(7))
            for _ in range(150):
                await driver.step()
            # One completed call purged, and some calls still in flight, whatever the history was.
            spent = Guard(intent="allow", entity="ord_2", amount=Decimal(3), limit=Decimal(10**6))
            await driver.reserve(
                Call(CallIdentity(tenant="t1", run_id="gone", tool_call_id="c0"), "refund", {}, spent)
            )
            await store.complete("gone:c0", owner="w1", result={})
            await age_everything(dsn, timedelta(days=2))
            assert (await purge_settled(store, older_than=timedelta(days=1))).calls > 0
            for n in range(3):
                guard = Guard(intent="allow", entity="ord_1", amount=Decimal(2), limit=Decimal(10**6))
                await driver.reserve(Call(CallIdentity(tenant="t1", run_id="open", tool_call_id=f"c{n}"),
                                          "refund", {"n": n}, guard))  # fmt: skip
            conn = await asyncpg.connect(dsn)
            try:
                asked = [(t, tool, e, "", s, c) for t in TENANTS for tool in TOOLS for e in ENTITIES
                         for s in TOOLSETS for c in CURRENCIES]  # fmt: skip
                asked += [(c.identity.tenant, c.tool, c.guard.entity or "", key, s, c.guard.currency)
                          for key, c in driver.calls.items() for s in (None, c.guard.toolset)]  # fmt: skip
                query = "SELECT completed, unresolved FROM onceflow_budget_used($1, $2, $3, $4, $5, $6)"
                before = [tuple(await conn.fetchrow(query, *a)) for a in asked]
                assert await conn.fetchval("SELECT count(*) FROM budget_purged_usage") > 0
                assert await conn.fetchval("SELECT to_regclass('budget_totals')") is None
                assert await migrate(dsn) == len(discover())
                after = [tuple(await conn.fetchrow(query, *a)) for a in asked]
                assert after == before
                assert any(c != 0 for c, _ in after) and any(u != 0 for _, u in after)
                await conn.execute(OLD_BUDGET_USED)
                await assert_totals_match(conn, sorted(driver.calls)[:10])
            finally:
                await conn.close()
        finally:
            await store.close()
    finally:
        await drop_database(postgres_dsn, name)
