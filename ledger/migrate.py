"""Apply ledger/migrations/NNNN_*.sql in order, then ledger/definitions/*.sql, each in its own transaction.

Numbered migrations are history: tables, indexes, data, applied once each, in order. Definitions are
the current text of the functions and triggers the ledger decides with (the guarded reservation,
the budget totals): one file each, re-applied whenever the file changes, as Flyway applies its
repeatable migrations and sqitch its reworked changes, so that a rule's text lives in one file and
its history is that file's git log. A definition runs after every numbered migration, and a
definitions file replaces whatever an older migration or an older version of itself defined.

Safe to run twice and from several processes at once: a session-level advisory lock serialises the
runners, a one-row version table records how far the numbered migrations have come, and
`onceflow_definitions` records the SHA-256 of each definition as applied.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

log = logging.getLogger("onceflow.ledger")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
DEFINITIONS_DIR = Path(__file__).parent / "definitions"
_LOCK_ID = 0x6F6E6365  # "once": any constant shared by every runner
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_DEFINITION_NAME = re.compile(r"^[a-z0-9_]+\.sql$")
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


@dataclass(frozen=True)
class Definition:
    name: str
    path: Path


def discover_definitions(directory: Path = DEFINITIONS_DIR) -> list[Definition]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        if not _DEFINITION_NAME.match(path.name):
            raise ValueError(f"definition file {path.name!r} is not named like name_of_what_it_defines.sql")
        found.append(Definition(path.stem, path))
    return found


async def migrate(
    dsn_or_conn: str | asyncpg.Connection,
    *,
    directory: Path = MIGRATIONS_DIR,
    definitions: Path | None = DEFINITIONS_DIR,
) -> int:
    """Bring the schema up to date with the migrations in `directory`, then re-apply each definition
    in `definitions` whose text changed since it was last applied (None: none); returns the version
    after the numbered migrations."""
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
            if definitions is not None:
                await _apply_definitions(conn, discover_definitions(definitions))
            await _report_isolation(conn)
            return current
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_ID)
    finally:
        if isinstance(dsn_or_conn, str):
            await conn.close()


async def _apply_definitions(conn: asyncpg.Connection, found: list[Definition]) -> None:
    """Apply each definition whose checksum is not the one recorded, in its own transaction."""
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS onceflow_definitions ("
        " name text PRIMARY KEY, sha256 text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
    )
    applied = {
        r["name"]: r["sha256"] for r in await conn.fetch("SELECT name, sha256 FROM onceflow_definitions")
    }
    for definition in found:
        text = definition.path.read_text()
        digest = hashlib.sha256(text.encode()).hexdigest()
        if applied.get(definition.name) == digest:
            continue
        async with conn.transaction():
            await conn.execute(text)
            await conn.execute(
                "INSERT INTO onceflow_definitions (name, sha256) VALUES ($1, $2)"
                " ON CONFLICT (name) DO UPDATE SET sha256 = EXCLUDED.sha256, applied_at = now()",
                definition.name,
                digest,
            )


async def _report_isolation(conn: asyncpg.Connection) -> None:
    """Say so when the database (or the role) defaults to another isolation level than the guards
    need: the ledger sets READ COMMITTED on its own connections (ledger/base.py), but anything else
    writing through its functions would decide on a stale snapshot."""
    level = await conn.fetchval("SELECT current_setting('default_transaction_isolation')")
    if level != "read committed":
        log.warning(
            "the ledger database's default_transaction_isolation is %r: onceflow's own connections "
            "run READ COMMITTED, as its guards need; anything else that reserves through "
            "onceflow_guarded_reserve must do the same",
            level,
        )
