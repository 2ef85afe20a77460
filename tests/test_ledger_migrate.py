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

import asyncpg
import pytest

from onceflow.ledger import UNRESOLVED, FailureKind, SideEffect, Status, migrate
from onceflow.ledger.migrate import MIGRATIONS_DIR, UnsupportedServerError, check_server, discover
from onceflow.local.postgres import create_database, drop_database

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


async def check_values(dsn: str, column: str) -> set[str]:
    """The literals a column's CHECK constraint on tool_executions allows."""
    conn = await asyncpg.connect(dsn)
    try:
        definitions = await conn.fetch(
            "SELECT pg_get_constraintdef(c.oid) AS definition FROM pg_constraint c"
            " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)"
            " WHERE c.conrelid = 'tool_executions'::regclass AND c.contype = 'c' AND a.attname = $1"
            " AND cardinality(c.conkey) = 1",
            column,
        )
    finally:
        await conn.close()
    assert len(definitions) == 1, definitions
    return set(re.findall(r"'([^']*)'::text", definitions[0]["definition"]))


@pytest.mark.parametrize(
    ("column", "enum"),
    [("status", Status), ("side_effect", SideEffect), ("failure_kind", FailureKind)],
)
async def test_check_constraint_matches_the_enum_exactly(
    database_url: str, column: str, enum: type[StrEnum]
) -> None:
    assert await check_values(database_url, column) == {member.value for member in enum}


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
    """The column's one CHECK (migration 0020's, without a regex), tried on a copy of the column."""
    conn = await asyncpg.connect(database_url)
    try:
        definitions = await conn.fetch(
            """
            SELECT pg_get_constraintdef(c.oid) AS definition
              FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid
             WHERE c.conrelid = $1::regclass AND c.contype = 'c' AND a.attnum = ANY (c.conkey)
               AND a.attname = $2
            """,
            table,
            column,
        )
        assert len(definitions) == 1, definitions
        async with conn.transaction():
            await conn.execute(f"CREATE TEMP TABLE probe ({column} text, {definitions[0]['definition']})")
            await conn.execute("INSERT INTO probe VALUES ($1)", hashlib.sha256(b"call").hexdigest())
            for value in NOT_A_SHA256:
                with pytest.raises(asyncpg.CheckViolationError):
                    async with conn.transaction():
                        await conn.execute("INSERT INTO probe VALUES ($1)", value)
            assert await conn.fetchval("SELECT count(*) FROM probe") == 1
            await conn.execute("DROP TABLE probe")
    finally:
        await conn.close()
