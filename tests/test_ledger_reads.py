"""The operator's queue at the ledger (ledger/reads.py): a tenant's unresolved calls, oldest first, by
page, with bad limits, cursors and statuses refused, and served by the partial index."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import asyncpg
import pytest

from onceflow.ledger import Ledger, Status, queries
from tests.support.ledger_calls import indeterminate, started


async def test_unresolved_list_shows_only_the_tenants_calls_oldest_first(ledger: Ledger) -> None:
    ours = [await indeterminate(ledger, tenant="acme") for _ in range(3)]
    theirs = [await indeterminate(ledger, tenant="globex") for _ in range(2)]
    ours.append(await started(ledger, tenant="acme", lease=timedelta(0)))  # its owner is gone
    await started(ledger, tenant="acme", lease=timedelta(minutes=5))  # someone is working on it
    settled = await indeterminate(ledger, tenant="acme")
    await ledger.settle(settled, status=Status.FAILED, actor="op-alice", reason="not in billing")

    page = await ledger.list_unresolved("acme")

    assert [r.key for r in page.records] == ours
    assert page.next_cursor is None
    only_unknown = await ledger.list_unresolved("acme", statuses=[Status.INDETERMINATE])
    assert [r.key for r in only_unknown.records] == ours[:3]
    assert [r.key for r in (await ledger.list_unresolved("globex")).records] == theirs
    assert (await ledger.list_unresolved("initech")).records == []


async def _seed_unresolved(conn: asyncpg.Connection, tenant: str, count: int, created_at: str) -> list[str]:
    keys = []
    for _ in range(count):
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        key = f"{run_id}:call-1"
        await conn.execute(
            "INSERT INTO tool_executions (key, tenant, run_id, tool_call_id, tool_name, side_effect,"
            " status, payload, payload_sha256, created_at) VALUES ($1, $2, $3, 'call-1', 'issue_credit',"
            " 'external', 'indeterminate', '{}'::jsonb, repeat('0', 64), $4::text::timestamptz)",
            key,
            tenant,
            run_id,
            created_at,
        )
        keys.append(key)
    return keys


@pytest.mark.parametrize("limit", [1, 5, 7, 23, 24])
async def test_unresolved_list_pages_without_duplicates_or_omissions(
    ledger: Ledger, database_url: str, limit: int
) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        # Ties on created_at are common under load; the key breaks them.
        tied = await _seed_unresolved(conn, "acme", 8, "2026-11-30 10:00:00+00")
        later = await _seed_unresolved(conn, "acme", 15, "2026-11-30 10:00:00.000001+00")
        await _seed_unresolved(conn, "globex", 4, "2026-11-30 09:00:00+00")
    finally:
        await conn.close()
    expected = sorted(tied) + sorted(later)

    seen: list[str] = []
    pages = 0
    cursor = None
    while True:
        page = await ledger.list_unresolved("acme", limit=limit, cursor=cursor)
        pages += 1
        assert len(page.records) <= limit
        seen.extend(r.key for r in page.records)
        cursor = page.next_cursor
        if cursor is None:
            break
        assert pages < 100

    assert seen == expected
    assert pages == -(-len(expected) // limit)


@pytest.mark.parametrize("limit", [0, -1, 501])
async def test_unresolved_list_rejects_a_bad_limit(ledger: Ledger, limit: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        await ledger.list_unresolved("acme", limit=limit)


@pytest.mark.parametrize("cursor", ["not a cursor", "bm9wZQ", "WzEsMiwzXQ", "eyJhIjogMX0"])
async def test_unresolved_list_rejects_a_malformed_cursor(ledger: Ledger, cursor: str) -> None:
    with pytest.raises(ValueError, match="malformed cursor"):
        await ledger.list_unresolved("acme", cursor=cursor)


async def test_unresolved_list_rejects_settled_statuses(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="unresolved"):
        await ledger.list_unresolved("acme", statuses=[Status.INDETERMINATE, Status.COMPLETED])


async def test_unresolved_list_is_served_by_the_partial_index(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await _seed_unresolved(conn, "acme", 50, "2026-11-30 10:00:00+00")
        await conn.execute("ANALYZE tool_executions")
        await conn.execute("SET enable_seqscan = off")
        statuses = [Status.INDETERMINATE.value, Status.STARTED.value]
        for after_at, after_key in ((None, None), ("2026-11-30 10:00:00+00", "run-0:call-1")):
            at = None if after_at is None else await conn.fetchval("SELECT $1::text::timestamptz", after_at)
            plan = await conn.fetchval(
                "EXPLAIN (FORMAT JSON) " + queries.LIST_UNRESOLVED,
                "acme",
                statuses,
                None,
                None,
                None,
                at,
                after_key,
                51,
                True,
            )
            used = _index_names(json.loads(plan))
            assert {"tool_executions_unresolved", "tool_executions_open_conflicts"} <= used, plan
    finally:
        await conn.close()


def _index_names(plan: object) -> set[str]:
    if isinstance(plan, dict):
        names = {plan["Index Name"]} if "Index Name" in plan else set()
        return names.union(*(_index_names(v) for v in plan.values()))
    if isinstance(plan, list):
        return set().union(*(_index_names(v) for v in plan))
    return set()
