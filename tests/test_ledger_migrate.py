"""Migrations and the schema they leave behind."""

from __future__ import annotations

import asyncio
import hashlib
import re
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from onceflow.ledger import (
    UNRESOLVED,
    CallIdentity,
    EventSource,
    FailureKind,
    Guard,
    Ledger,
    SideEffect,
    Status,
    migrate,
)
from onceflow.ledger.migrate import (
    DEFINITIONS_DIR,
    MIGRATIONS_DIR,
    UnsupportedServerError,
    check_server,
    discover,
    discover_definitions,
)
from onceflow.local.postgres import create_database, drop_database
from tests.support.migrations import migrate_to_just_before

LATEST = len(discover())


@pytest.fixture
async def empty_database(postgres_dsn: str) -> AsyncIterator[str]:
    """A database nothing has been applied to yet."""
    name = f"onceflow_empty_{uuid.uuid4().hex[:12]}"
    yield await create_database(postgres_dsn, name)
    await drop_database(postgres_dsn, name)


async def schema_version(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT version FROM onceflow_schema_version")
    finally:
        await conn.close()
    assert len(rows) == 1
    version: int = rows[0]["version"]
    return version


async def schema_snapshot(dsn: str) -> list[tuple[str, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        columns = await conn.fetch(
            "SELECT table_name, column_name, data_type, coalesce(column_default, '')"
            " FROM information_schema.columns WHERE table_schema = 'public'"
            " ORDER BY table_name, column_name"
        )
        indexes = await conn.fetch(
            "SELECT tablename, indexdef, '' , '' FROM pg_indexes WHERE schemaname = 'public' ORDER BY indexdef"
        )
    finally:
        await conn.close()
    return [tuple(r) for r in [*columns, *indexes]]


def test_migrations_are_numbered_without_gaps() -> None:
    assert [m.version for m in discover()] == list(range(1, LATEST + 1))
    assert LATEST >= 1


async def test_applying_migrations_twice_is_a_no_op(empty_database: str) -> None:
    assert await migrate(empty_database) == LATEST
    schema = await schema_snapshot(empty_database)

    assert await migrate(empty_database) == LATEST

    assert await schema_version(empty_database) == LATEST
    assert await schema_snapshot(empty_database) == schema


async def test_migrations_from_concurrent_connections_all_end_at_the_latest_version(
    empty_database: str,
) -> None:
    connections = [await asyncpg.connect(empty_database) for _ in range(5)]
    try:
        versions = await asyncio.gather(*(migrate(conn) for conn in connections))
    finally:
        for conn in connections:
            await conn.close()

    assert versions == [LATEST] * 5
    assert await schema_version(empty_database) == LATEST


async def test_migrations_from_two_processes_at_once_end_at_the_latest_version(empty_database: str) -> None:
    script = "import asyncio, sys; from ledger import migrate; print(asyncio.run(migrate(sys.argv[1])))"
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            script,
            empty_database,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(2)
    ]
    results = await asyncio.gather(*(p.communicate() for p in processes))

    for process, (stdout, stderr) in zip(processes, results, strict=True):
        assert process.returncode == 0, stderr.decode()
        assert stdout.decode().strip() == str(LATEST)
    assert await schema_version(empty_database) == LATEST


async def test_a_broken_migration_leaves_the_version_and_schema_unchanged(
    empty_database: str, tmp_path: Path
) -> None:
    for migration in discover():
        shutil.copy(migration.path, tmp_path / migration.path.name)
    broken = tmp_path / f"{LATEST + 1:04d}_broken.sql"
    broken.write_text(
        "CREATE TABLE half_done (id integer);\n"
        "ALTER TABLE tool_executions ADD COLUMN half_done_marker text;\n"
        "SELECT 1 / 0;\n"
    )

    with pytest.raises(asyncpg.DivisionByZeroError):
        await migrate(empty_database, directory=tmp_path)

    # Every migration before the broken one committed in its own transaction; the broken one left nothing.
    assert await schema_version(empty_database) == LATEST
    conn = await asyncpg.connect(empty_database)
    try:
        assert await conn.fetchval("SELECT to_regclass('half_done')") is None
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM information_schema.columns WHERE column_name = 'half_done_marker'"
            )
            == 0
        )
        # The advisory lock was released: another runner is not blocked.
        assert await asyncio.wait_for(migrate(conn), timeout=5) == LATEST
    finally:
        await conn.close()

    broken.write_text("CREATE TABLE half_done (id integer);\n")
    assert await migrate(empty_database, directory=tmp_path) == LATEST + 1


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (["0001_first.sql", "0003_third.sql"], "without gaps"),
        (["0001_first.sql", "2_second.sql"], "NNNN_description"),
        (["0002_second.sql"], "without gaps"),
    ],
)
def test_discover_rejects_misnamed_or_missing_migrations(
    tmp_path: Path, names: list[str], problem: str
) -> None:
    for name in names:
        (tmp_path / name).write_text("SELECT 1;\n")
    with pytest.raises(ValueError, match=problem):
        discover(tmp_path)


def test_default_migrations_directory_is_the_packaged_one() -> None:
    assert discover() == discover(MIGRATIONS_DIR)


# -- the schema mirrors the enums ----------------------------------------------------------------------


# A column's own rule is either the table's CHECK on that column alone or, since migration 0021
# (every such rule but `status`'s), the CHECK of the column's type, a domain: read and prepared
# once per connection rather than in every statement that writes the table.
COLUMN_RULES = """
SELECT format_type(a.atttypid, NULL) AS type,
       array(SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
              WHERE c.contype = 'c'
                AND (c.contypid = a.atttypid
                     OR (c.conrelid = a.attrelid AND c.conkey = ARRAY[a.attnum]))) AS rules
  FROM pg_attribute a
 WHERE a.attrelid = $1::regclass AND a.attname = $2
"""


async def column_rule(dsn: str, table: str, column: str) -> tuple[str, str]:
    """The column's type and its one rule of its own."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(COLUMN_RULES, table, column)
    finally:
        await conn.close()
    assert row is not None, (table, column)
    assert len(row["rules"]) == 1, (table, column, row)
    return row["type"], row["rules"][0]


@pytest.mark.parametrize(
    ("table", "column", "enum"),
    [
        ("tool_executions", "status", Status),
        ("tool_executions", "side_effect", SideEffect),
        ("tool_executions", "failure_kind", FailureKind),
        ("tool_execution_events", "source", EventSource),
    ],
)
async def test_allowed_values_match_the_enum_exactly(
    database_url: str, table: str, column: str, enum: type[StrEnum]
) -> None:
    _, rule = await column_rule(database_url, table, column)
    assert set(re.findall(r"'([^']*)'::text", rule)) == {member.value for member in enum}


async def test_a_value_outside_the_list_is_refused_and_changes_nothing(database_url: str) -> None:
    """On an insert, and on an update that sets the column (a domain checks what is assigned)."""
    run_id = f"r{uuid.uuid4().hex[:8]}"
    insert = (
        "INSERT INTO tool_executions (key, tenant, run_id, tool_call_id, agent, tool_name,"
        " side_effect, status, payload, payload_sha256, owner)"
        " VALUES ($1 || ':' || $2, 't', $1, $2, 'a', 'x', $3, 'started', '{}', $4, 'o')"
    )
    sha = hashlib.sha256(b"call").hexdigest()
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(asyncpg.CheckViolationError, match="onceflow_side_effect_known"):
            await conn.execute(insert, run_id, "c1", "writes", sha)
        assert await conn.fetchval("SELECT count(*) FROM tool_executions WHERE run_id = $1", run_id) == 0
        await conn.execute(insert, run_id, "c2", "write", sha)
        with pytest.raises(asyncpg.CheckViolationError, match="onceflow_side_effect_known"):
            await conn.execute("UPDATE tool_executions SET side_effect = 'writes' WHERE run_id = $1", run_id)
        assert (
            await conn.fetchval("SELECT side_effect FROM tool_executions WHERE run_id = $1", run_id)
            == "write"
        )
    finally:
        await conn.close()


async def test_unresolved_index_covers_exactly_the_unresolved_statuses(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        definition = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'tool_executions_unresolved'"
        )
    finally:
        await conn.close()
    predicate = definition.split(" WHERE ", 1)[1]
    assert set(re.findall(r"'([^']*)'::text", predicate)) == {s.value for s in UNRESOLVED}


def test_a_server_older_than_the_ledger_needs_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedServerError) as refused:
        check_server((14, 12))
    assert "PostgreSQL 15 or later; this server is 14.12. Nothing was changed." in str(refused.value)
    check_server((15, 0))
    check_server((18, 6))


HASHED_COLUMNS = [
    ("tool_executions", "payload_sha256"),
    ("conversation_messages", "sha256"),
    ("operator_tokens", "token_sha256"),
    ("console_sessions", "id_sha256"),
]
NOT_A_SHA256 = [
    "",
    "a" * 63,
    "a" * 65,
    "A" * 64,  # upper case: the ledger writes hexdigest(), lower case
    "a" * 63 + "g",
    "a" * 63 + " ",
    "a" * 64 + "\n",
    "é" * 64,  # 64 characters, not 64 hex digits
    "a" * 62 + "é",
]


@pytest.mark.parametrize(("table", "column"), HASHED_COLUMNS)
async def test_a_hash_column_takes_64_lower_case_hex_digits_and_nothing_else(
    database_url: str, table: str, column: str
) -> None:
    """The column's one rule (0020's, without a regex; its domain's since 0021), tried on a column
    of the same type."""
    column_type, _ = await column_rule(database_url, table, column)
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            await conn.execute(f"CREATE TEMP TABLE probe (value {column_type})")
            await conn.execute("INSERT INTO probe VALUES ($1)", hashlib.sha256(b"call").hexdigest())
            for value in NOT_A_SHA256:
                with pytest.raises(asyncpg.CheckViolationError):
                    async with conn.transaction():
                        await conn.execute("INSERT INTO probe VALUES ($1)", value)
            assert await conn.fetchval("SELECT count(*) FROM probe") == 1
            await conn.execute("DROP TABLE probe")
    finally:
        await conn.close()


async def test_0021_moves_the_rules_to_domains_without_rewriting_and_its_rows_validate(
    empty_database: str, tmp_path: Path
) -> None:
    """On a ledger with calls and events, 0021 rebuilds no table or index, the rules hold after it,
    and the `VALIDATE` docs/operations.md offers finds the existing rows valid."""
    assert await migrate_to_just_before(empty_database, "allowed_values_as_domains", tmp_path) == 20
    ledger = await Ledger.connect(empty_database)
    try:
        for n in range(3):
            reserved = await ledger.reserve(
                CallIdentity(tenant="t", run_id="run-0021", tool_call_id=f"c{n}"),
                tool_name="issue_credit",
                side_effect=SideEffect.EXTERNAL,
                arguments={"n": n},
                owner="worker",
                guard=Guard(),
            )
            await ledger.complete(reserved.record.key, owner="worker", result={"n": n})
    finally:
        await ledger.close()
    conn = await asyncpg.connect(empty_database)
    try:
        files = "SELECT relname, relfilenode FROM pg_class WHERE relkind IN ('r', 'i') ORDER BY relname"
        before: dict[str, int] = {r["relname"]: r["relfilenode"] for r in await conn.fetch(files)}
        assert await migrate(conn) == LATEST
        # (and the definitions' record, a table new on such a ledger)
        after = {r["relname"]: r["relfilenode"] for r in await conn.fetch(files)}
        assert {name: after.get(name) for name in before} == before
        assert (
            await conn.fetchval("SELECT count(*) FROM tool_execution_events WHERE key LIKE 'run-0021:%'") == 6
        )
        domains = {
            "onceflow_side_effect": "onceflow_side_effect_known",
            "onceflow_failure_kind": "onceflow_failure_kind_known",
            "onceflow_event_source": "onceflow_event_source_known",
            "onceflow_sha256": "onceflow_sha256_is_hex",
        }
        unvalidated = await conn.fetch("SELECT conname FROM pg_constraint WHERE NOT convalidated")
        assert sorted(row["conname"] for row in unvalidated) == sorted(domains.values())
        for domain, constraint in domains.items():
            await conn.execute(f"ALTER DOMAIN {domain} VALIDATE CONSTRAINT {constraint}")
        assert await conn.fetchval("SELECT count(*) FROM pg_constraint WHERE NOT convalidated") == 0
        with pytest.raises(asyncpg.CheckViolationError, match="onceflow_event_source_known"):
            await conn.execute(
                "INSERT INTO tool_execution_events (key, actor, kind, source) VALUES ('run-0021:c0', 'x', 'note', 'nobody')"
            )
    finally:
        await conn.close()


# -- definitions: the functions and triggers the ledger decides with, one file each ----------------


async def _definitions(dsn: str) -> dict[str, tuple[str, Any]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT name, sha256, applied_at FROM onceflow_definitions")
    finally:
        await conn.close()
    return {r["name"]: (r["sha256"], r["applied_at"]) for r in rows}


async def test_definitions_are_applied_again_only_when_their_text_changes(
    empty_database: str, tmp_path: Path
) -> None:
    await migrate(empty_database)
    first = await _definitions(empty_database)
    assert set(first) == {d.name for d in discover_definitions()}
    await migrate(empty_database)
    assert await _definitions(empty_database) == first, "an unchanged definition was applied again"

    changed = tmp_path / "definitions"
    shutil.copytree(DEFINITIONS_DIR, changed)
    path = changed / "guarded_reserve.sql"
    path.write_text(
        path.read_text().replace("'the same call (%s) is still %s;", "'the same call (%s) is %s;")
    )
    await asyncio.gather(*(migrate(empty_database, definitions=changed) for _ in range(3)))
    after = await _definitions(empty_database)
    assert after["budget_totals"] == first["budget_totals"]
    assert after["guarded_reserve"][0] != first["guarded_reserve"][0]
    assert after["guarded_reserve"][1] > first["guarded_reserve"][1]
    conn = await asyncpg.connect(empty_database)
    try:
        bodies = await conn.fetch(
            "SELECT pg_get_functiondef(oid) AS body FROM pg_proc WHERE proname = 'onceflow_guarded_decide'"
        )
    finally:
        await conn.close()
    assert len(bodies) == 1, "one guarded decision, not one per signature it ever had"
    assert "the same call (%s) is %s;" in bodies[0]["body"]


def test_numbered_migrations_after_the_definitions_define_none_of_their_functions() -> None:
    """The guarded reservation and the budget totals live in ledger/definitions/, one file each: a
    numbered migration never copies one of their functions again (history before 0022 stays)."""
    defined = set()
    for definition in discover_definitions():
        defined |= set(re.findall(r"CREATE OR REPLACE FUNCTION (\w+)\(", definition.path.read_text()))
    assert {"onceflow_guarded_reserve", "onceflow_guarded_decide", "tool_executions_budget_totals"} <= defined
    for migration in discover():
        if migration.version < 22:
            continue
        created = set(re.findall(r"CREATE (?:OR REPLACE )?FUNCTION (\w+)\(", migration.path.read_text()))
        assert not created & defined, f"{migration.path.name} defines {sorted(created & defined)} again"


async def test_a_ledger_with_calls_upgrades_in_place_to_the_definitions(
    empty_database: str, tmp_path: Path
) -> None:
    """A ledger as 0021 left it, with calls of today's code (through the old signature), takes the
    definitions on its next migrate; the same calls then decide by the current rules."""
    assert await migrate_to_just_before(empty_database, "allowed_values_as_domains", tmp_path) == 20
    assert await migrate(empty_database, definitions=None) == LATEST
    ledger = await Ledger.connect(empty_database)
    try:
        reserved = await ledger.reserve(
            CallIdentity(tenant="t", run_id="run-up", tool_call_id="c1"),
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments={"n": 1},
            owner="worker",
            guard=Guard(),
        )
        await ledger.complete(reserved.record.key, owner="worker", result={"n": 1})
        assert await migrate(empty_database) == LATEST
        twin = await ledger.reserve(
            CallIdentity(tenant="t", run_id="run-up", tool_call_id="c2"),
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments={"n": 1},
            owner="worker",
            guard=Guard(),
        )
        assert twin.record.reused_from == reserved.record.key
    finally:
        await ledger.close()
