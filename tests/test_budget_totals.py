"""Budget totals (migrations 0013 and 0014): the running totals per budget key answer what the full sum over
the entity's history answered (migration 0010's `onceflow_budget_used`, kept here as the oracle),
after any sequence of the ledger's own operations, under concurrent writers, and from the back-fill
of a ledger migrated with history in it."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import asyncpg
import pytest

from onceflow.ledger import CallIdentity, FailureKind, Guard, Ledger, SideEffect, migrate, purge_settled
from onceflow.ledger.migrate import discover
from onceflow.local.postgres import create_database, drop_database
from tests.support.budget_history import CURRENCIES, ENTITIES, TENANTS, TOOLS, TOOLSETS, Call, Driver
from tests.support.ledger_invariants import age_everything
from tests.support.migrations import migrate_to_just_before, version_of

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


Key = tuple[str, str, str, str | None, str | None]


async def install_oracle(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(OLD_BUDGET_USED)
    finally:
        await conn.close()


async def budget_used(conn: asyncpg.Connection, *asked: str | None) -> tuple[Decimal, Decimal]:
    row = await conn.fetchrow("SELECT * FROM onceflow_budget_used($1, $2, $3, $4, $5, $6)", *asked)
    assert row is not None
    return row["completed"], row["unresolved"]


async def assert_totals_match(conn: asyncpg.Connection, keys: list[str]) -> int:
    """The totals table against the rows and budget_purged_usage, then the function against the
    oracle for every tenant, tool, entity, toolset and currency, apart from no call and from each
    of `keys`. Returns how many questions were asked."""
    expected: dict[Key, Decimal] = {}
    for r in await conn.fetch(ROW_SUMS):
        expected[(r[0], r[1], r[2], r[3], r[4])] = r["completed"] + r["unresolved"]
    for r in await conn.fetch("SELECT * FROM budget_purged_usage"):
        key = (r["tenant"], r["tool_name"], r["entity"], r["toolset"] or None, r["currency"] or None)
        expected[key] = expected.get(key, Decimal(0)) + r["completed"]
    totals = {
        (r[0], r[1], r[2], r[3], r[4]): r["carried"]
        for r in await conn.fetch(
            "SELECT tenant, tool_name, entity, toolset, currency, carried FROM budget_totals"
        )
    }
    assert {k: v for k, v in totals.items() if v != 0} == {k: v for k, v in expected.items() if v != 0}, (
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
        assert any(r["unresolved"] > 0 for r in await conn.fetch(ROW_SUMS))
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


@pytest.mark.parametrize("upgrade", ["budget_totals", "budget_carried"])
async def test_the_migration_back_fills_a_ledger_with_history(
    postgres_dsn: str, tmp_path: Path, upgrade: str
) -> None:
    """A ledger with live, settled, conflicted and purged budget calls, migrated (from before the
    totals, migration 0013, or from 0013's two columns, by 0014): the function answers as the one it
    replaces did, on the same rows."""
    totals = version_of(upgrade)
    name = f"onceflow_test_{uuid.uuid4().hex[:12]}"
    dsn = await create_database(postgres_dsn, name)
    try:
        assert await migrate_to_just_before(dsn, upgrade, tmp_path / "migrations") == totals - 1
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
                before = [await budget_used(conn, *a) for a in asked]
                assert await conn.fetchval("SELECT count(*) FROM budget_purged_usage") > 0
                if upgrade == "budget_totals":
                    assert await conn.fetchval("SELECT to_regclass('budget_totals')") is None
                assert await migrate(dsn) == len(discover())
                after = [await budget_used(conn, *a) for a in asked]
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


async def test_a_reused_row_that_comes_to_draw_its_amount_is_added_to_its_total(database_url: str) -> None:
    """A reused result draws nothing. Should such a row ever pass through `started` and then draw
    (reused_from cleared, which no path of the ledger does today, and the CHECK
    `reused_is_completed` forbids: this test's own database drops it), its key's total must follow:
    the update trigger's quick test for "draws the same before and after" looks at reused_from on
    both sides (before the definitions it looked only at the new row)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("ALTER TABLE tool_executions DROP CONSTRAINT reused_is_completed")
        await conn.execute(OLD_BUDGET_USED)  # the full sum, the oracle assert_totals_match asks
        await conn.execute(
            "INSERT INTO tool_executions (key, tenant, run_id, tool_call_id, tool_name, side_effect, status,"
            " payload, payload_sha256, owner, amount, entity, toolset, reused_from)"
            " VALUES ('r:c2', 't1', 'r', 'c2', 'refund', 'external', 'started', '{}', $1, 'w1', 5,"
            " 'ord_1', 'billing', 'r:c1')",
            "0" * 64,
        )
        assert await assert_totals_match(conn, ["r:c2"]) > 0
        await conn.execute(
            "UPDATE tool_executions SET reused_from = NULL, status = 'completed' WHERE key = 'r:c2'"
        )
        await assert_totals_match(conn, ["r:c2"])
        assert await conn.fetchval("SELECT carried FROM budget_totals WHERE entity = 'ord_1'") == 5
    finally:
        await conn.close()
