"""The receiver kit's key store is migrated by the ledger's runner as a component of its own: its
own migrations directory, version table and lock, in a service's database without the ledger or in
the ledger's beside it. Idempotent and safe from many connections and processes at once, as the
ledger's migrations are (tests/test_ledger_migrate.py)."""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from onceflow.ledger import migrate
from onceflow.ledger.migrate import LEDGER, component, discover, migrate_component
from onceflow.local.postgres import create_database, drop_database
from onceflow.receiver import migrate_receiver
from onceflow.receiver.store import MIGRATIONS

LATEST = len(discover(MIGRATIONS.migrations))


@pytest.fixture
async def empty_database(postgres_dsn: str) -> AsyncIterator[str]:
    name = f"receiver_empty_{uuid.uuid4().hex[:12]}"
    yield await create_database(postgres_dsn, name)
    await drop_database(postgres_dsn, name)


async def tables(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    return {row["tablename"] for row in rows}


async def version(dsn: str, table: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f"SELECT version FROM {table}")
    finally:
        await conn.close()
    assert len(rows) == 1
    found: int = rows[0]["version"]
    return found


async def test_the_key_store_migrates_into_a_database_without_the_ledger(empty_database: str) -> None:
    assert await migrate_receiver(empty_database) == LATEST
    assert await tables(empty_database) == {"onceflow_receiver_keys", "onceflow_receiver_schema_version"}
    assert await migrate_receiver(empty_database) == LATEST  # twice: nothing more
    assert await version(empty_database, "onceflow_receiver_schema_version") == LATEST


async def test_beside_the_ledger_each_keeps_its_own_version(empty_database: str) -> None:
    ledger_version = await migrate(empty_database)
    assert await migrate_receiver(empty_database) == LATEST
    assert await version(empty_database, LEDGER.version_table) == ledger_version
    assert await version(empty_database, MIGRATIONS.version_table) == LATEST
    assert await migrate(empty_database) == ledger_version


async def test_from_concurrent_connections_and_processes_all_end_at_the_latest_version(
    empty_database: str, postgres_dsn: str
) -> None:
    connections = [await asyncpg.connect(empty_database) for _ in range(5)]
    try:
        versions = await asyncio.gather(*(migrate_receiver(conn) for conn in connections))
    finally:
        for conn in connections:
            await conn.close()
    assert versions == [LATEST] * 5

    name = f"receiver_procs_{uuid.uuid4().hex[:12]}"
    other = await create_database(postgres_dsn, name)
    try:
        script = (
            "import asyncio, sys; from onceflow.receiver import migrate_receiver; "
            "print(asyncio.run(migrate_receiver(sys.argv[1])))"
        )
        processes = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                script,
                other,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for _ in range(2)
        ]
        results = await asyncio.gather(*(p.communicate() for p in processes))
        for process, (stdout, stderr) in zip(processes, results, strict=True):
            assert process.returncode == 0, stderr.decode()
            assert stdout.decode().strip() == str(LATEST)
        assert await version(other, MIGRATIONS.version_table) == LATEST
    finally:
        await drop_database(postgres_dsn, name)


async def test_a_broken_component_migration_leaves_its_version_and_schema_unchanged(
    empty_database: str, tmp_path: Path
) -> None:
    for migration in discover(MIGRATIONS.migrations):
        shutil.copy(migration.path, tmp_path / migration.path.name)
    (tmp_path / f"{LATEST + 1:04d}_broken.sql").write_text(
        "CREATE TABLE half_done (id integer);\nSELECT 1 / 0;\n"
    )
    broken = component("receiver", tmp_path)
    with pytest.raises(asyncpg.DivisionByZeroError):
        await migrate_component(empty_database, broken)
    assert await version(empty_database, MIGRATIONS.version_table) == LATEST
    assert "half_done" not in await tables(empty_database)
    # The component's lock was let go: the next runner is not blocked.
    assert await asyncio.wait_for(migrate_receiver(empty_database), timeout=5) == LATEST


@pytest.mark.parametrize("name", ["ledger", "Receiver", "1st", "with-dash", "x" * 41, ""])
def test_a_component_is_named_so_that_its_tables_are_its_own(name: str) -> None:
    with pytest.raises(ValueError, match="component name"):
        component(name, Path("."))


def test_components_take_locks_and_tables_of_their_own() -> None:
    billing = component("billing", Path("."))
    assert billing.version_table == "onceflow_billing_schema_version"
    assert billing.definitions_table == "onceflow_billing_definitions"
    assert len({billing.lock_id, MIGRATIONS.lock_id, LEDGER.lock_id}) == 3
