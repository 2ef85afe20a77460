"""Every statement that addresses a call by its key reads it through the key's own index.

The trap (ledger/queries/__init__.py): a state test written plainly, such as `status = 'started'`,
proves the predicate of a partial index, and a planner whose statistics count almost nothing in that
index reads all of it for one key. Completions then cost as much as the backlog of unresolved calls
(bench/backlog.py). This test seeds the ledger the way that plan comes about (a settled history,
analysed while nothing is unresolved), plans each statement of onceflow.ledger.queries the way
asyncpg runs it (a prepared statement's generic plan), and fails if any node that looks a key up
on tool_executions uses an index other than its primary key. Before the state tests were written
`(...) IS TRUE`, eight statements failed it, the completion among them.

Statements inside the server-side functions (migrations) are not planned here: none of them pairs
a key with a state test that proves an index predicate (the hold mark's test includes `failed`).

Real parts: a fresh PostgreSQL ledger.
"""

from __future__ import annotations

import json
import re
from typing import Any

import asyncpg
import pytest

from onceflow.ledger import queries

# A settled history: enough rows that the primary key is a real tree, none of them unresolved.
SEED = """
INSERT INTO tool_executions
    (key, tenant, run_id, tool_call_id, tool_name, side_effect, status, payload, payload_sha256,
     owner, result, settled_at, settled_by)
SELECT 'seed-' || (i / 100) || ':c' || i, 'acme', 'seed-' || (i / 100), 'c' || i, 'issue_credit',
       'external', 'completed', jsonb_build_object('n', i), encode(sha256(('p' || i)::bytea), 'hex'),
       'worker', '{}'::jsonb, now(), 'worker'
  FROM generate_series(1, 20000) AS i
"""

# `key = $n`, with or without a table prefix: the node looks one call up by its key.
KEY_LOOKUP = re.compile(r"(^|[(\s.])key = \$\d+")


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(nodes(child))
    return found


async def generic_plan(conn: asyncpg.Connection, sql: str) -> dict[str, Any]:
    parameters = len((await conn.prepare(sql)).get_parameters())
    await conn.execute("PREPARE checked AS " + sql)
    try:
        arguments = ", ".join(["NULL"] * parameters)
        text = await conn.fetchval(
            f"EXPLAIN (FORMAT JSON) EXECUTE checked{f'({arguments})' if parameters else ''}"
        )
    finally:
        await conn.execute("DEALLOCATE checked")
    plan: dict[str, Any] = json.loads(text)[0]["Plan"]
    return plan


@pytest.fixture
async def seeded(database_url: str) -> Any:
    conn = await asyncpg.connect(database_url, statement_cache_size=0)
    try:
        await conn.execute(SEED)
        await conn.execute("ANALYZE tool_executions, tool_execution_events")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        yield conn
    finally:
        await conn.close()


async def test_every_statement_looks_a_call_up_by_its_primary_key(seeded: asyncpg.Connection) -> None:
    lookups: dict[str, list[str]] = {}
    for name in queries.__all__:
        sql = getattr(queries, name)
        plan = await generic_plan(seeded, sql)
        for node in nodes(plan):
            if node.get("Relation Name") != "tool_executions":
                continue
            conditions = f"{node.get('Index Cond', '')} {node.get('Filter', '')}"
            if KEY_LOOKUP.search(conditions):
                lookups.setdefault(name, []).append(node.get("Index Name") or node["Node Type"])
    wrong = {name: used for name, used in lookups.items() if set(used) != {"tool_executions_pkey"}}
    assert not wrong, f"statements that look a key up through another index (or none): {wrong}"
    # The check saw the statements it is about, so it cannot pass by finding nothing.
    for name in (
        "COMPLETE_STARTED",
        "FAIL_STARTED",
        "SET_INDETERMINATE",
        "APPROVE",
        "DENY",
        "CLAIM_APPROVED",
        "RELEASE",
        "ACKNOWLEDGE_CONFLICT",
        "SELECT_RECORD",
    ):
        assert lookups.get(name) == ["tool_executions_pkey"], (name, lookups.get(name))
