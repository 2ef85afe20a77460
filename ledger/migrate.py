"""Apply ledger/migrations/NNNN_*.sql in order, each in its own transaction.

Safe to run twice and from several processes at once: a session-level advisory lock serialises the
runners, and a one-row version table records how far the schema has come.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_LOCK_ID = 0x6F6E6365  # "once": any constant shared by every runner
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
# The oldest server the schema and the ledger's connections are written for: UNIQUE NULLS NOT
# DISTINCT (migration 0013) needs 15, client_connection_check_interval (ledger/base.py) 14.
OLDEST_SERVER = (15,)


class UnsupportedServerError(RuntimeError):
    """The database server is older than the ledger needs; nothing was changed."""


def check_server(version: tuple[int, ...]) -> None:
    """Refuse a PostgreSQL server older than OLDEST_SERVER, before anything is written to it."""
    if tuple(version[:1]) < OLDEST_SERVER:
        shown = ".".join(str(part) for part in version[:2])
        raise UnsupportedServerError(
            f"onceflow's ledger needs PostgreSQL {OLDEST_SERVER[0]} or later; this server is {shown}. "
            "Nothing was changed."
        )


@dataclass(frozen=True)
class Migration:
    version: int
    path: Path


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise ValueError(f"migration file {path.name!r} is not named NNNN_description.sql")
        found.append(Migration(int(match.group(1)), path))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


async def migrate(dsn_or_conn: str | asyncpg.Connection, *, directory: Path = MIGRATIONS_DIR) -> int:
    """Bring the schema up to date with the migrations in `directory`; returns the version after."""
    conn = await asyncpg.connect(dsn_or_conn) if isinstance(dsn_or_conn, str) else dsn_or_conn
    try:
        version = conn.get_server_version()
        check_server((version.major, version.minor))
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_ID)
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS onceflow_schema_version ("
                " only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),"
                " version integer NOT NULL)"
            )
            await conn.execute(
                "INSERT INTO onceflow_schema_version (version) VALUES (0) ON CONFLICT DO NOTHING"
            )
            current: int = await conn.fetchval("SELECT version FROM onceflow_schema_version")
            for migration in discover(directory):
                if migration.version <= current:
                    continue
                async with conn.transaction():
                    await conn.execute(migration.path.read_text())
                    await conn.execute("UPDATE onceflow_schema_version SET version = $1", migration.version)
                current = migration.version
            return current
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_ID)
    finally:
        if isinstance(dsn_or_conn, str):
            await conn.close()
