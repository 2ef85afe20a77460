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

The same runner migrates other components that keep tables of their own and may live in a
service's own database without the ledger (the receiver kit's key store, onceflow.receiver; the
example billing service's credits): each is a `Component` with its own migrations directory, its
own one-row version table and definitions table, and its own advisory lock, so that neither waits
for nor counts the other's migrations. `migrate(dsn)` is the ledger's, as it always was.
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
# DISTINCT (migration 0013) needs 15, client_connection_check_interval (ledger/connections.py) 14.
OLDEST_SERVER = (15,)


class UnsupportedServerError(RuntimeError):
    """The database server is older than the ledger needs; nothing was changed."""


def check_server(
    version: tuple[int, ...], oldest: tuple[int, ...] = OLDEST_SERVER, what: str = "onceflow's ledger"
) -> None:
    """Refuse a PostgreSQL server older than `oldest`, before anything is written to it."""
    if tuple(version[:1]) < oldest[:1]:
        shown = ".".join(str(part) for part in version[:2])
        raise UnsupportedServerError(
            f"{what} needs PostgreSQL {oldest[0]} or later; this server is {shown}. Nothing was changed."
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


@dataclass(frozen=True)
class Component:
    """A schema migrated on its own: its migrations, its definitions (or None), and where its
    version, definition checksums and lock live. Build one with `component()`; the ledger is LEDGER."""

    name: str
    migrations: Path
    definitions: Path | None
    version_table: str
    definitions_table: str
    lock_id: int
    oldest_server: tuple[int, ...] = OLDEST_SERVER


LEDGER = Component(
    "ledger",
    MIGRATIONS_DIR,
    DEFINITIONS_DIR,
    version_table="onceflow_schema_version",
    definitions_table="onceflow_definitions",
    lock_id=_LOCK_ID,
)
_COMPONENT_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def component(
    name: str,
    migrations: Path,
    definitions: Path | None = None,
    *,
    oldest_server: tuple[int, ...] = OLDEST_SERVER,
) -> Component:
    """A component other than the ledger: its version in `onceflow_<name>_schema_version`, its
    definitions' checksums in `onceflow_<name>_definitions`, its runners serialised by a lock of
    its own (derived from the name)."""
    if not _COMPONENT_NAME.match(name) or name == LEDGER.name:
        raise ValueError(
            f"component name {name!r}: lower-case letters, digits and _, starting with a letter, "
            f"at most 40 characters, and not {LEDGER.name!r}"
        )
    digest = hashlib.sha256(f"onceflow-migrate:{name}".encode()).digest()
    return Component(
        name,
        migrations,
        definitions,
        version_table=f"onceflow_{name}_schema_version",
        definitions_table=f"onceflow_{name}_definitions",
        lock_id=int.from_bytes(digest[:8], "big", signed=True),
        oldest_server=oldest_server,
    )


async def migrate(
    dsn_or_conn: str | asyncpg.Connection,
    *,
    directory: Path = MIGRATIONS_DIR,
    definitions: Path | None = DEFINITIONS_DIR,
) -> int:
    """Bring the ledger's schema up to date with the migrations in `directory`, then re-apply each
    definition in `definitions` whose text changed since it was last applied (None: none); returns
    the version after the numbered migrations."""
    ledger = Component(
        LEDGER.name,
        directory,
        definitions,
        version_table=LEDGER.version_table,
        definitions_table=LEDGER.definitions_table,
        lock_id=LEDGER.lock_id,
    )
    version = await migrate_component(dsn_or_conn, ledger)
    return version


async def migrate_component(dsn_or_conn: str | asyncpg.Connection, target: Component) -> int:
    """Bring one component's schema up to date (see the module docstring); returns its version."""
    conn = await asyncpg.connect(dsn_or_conn) if isinstance(dsn_or_conn, str) else dsn_or_conn
    try:
        version = conn.get_server_version()
        what = "onceflow's ledger" if target.name == LEDGER.name else f"onceflow's {target.name} schema"
        check_server((version.major, version.minor), target.oldest_server, what)
        await conn.execute("SELECT pg_advisory_lock($1)", target.lock_id)
        try:
            # Identifiers come from Component (a fixed name or one checked by component()), never input.
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {target.version_table} ("
                " only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),"
                " version integer NOT NULL)"
            )
            await conn.execute(
                f"INSERT INTO {target.version_table} (version) VALUES (0) ON CONFLICT DO NOTHING"
            )
            current: int = await conn.fetchval(f"SELECT version FROM {target.version_table}")
            for migration in discover(target.migrations):
                if migration.version <= current:
                    continue
                async with conn.transaction():
                    await conn.execute(migration.path.read_text())
                    await conn.execute(f"UPDATE {target.version_table} SET version = $1", migration.version)
                current = migration.version
            if target.definitions is not None:
                await _apply_definitions(conn, discover_definitions(target.definitions), target)
            if target.name == LEDGER.name:
                await _report_isolation(conn)
            return current
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", target.lock_id)
    finally:
        if isinstance(dsn_or_conn, str):
            await conn.close()


async def _apply_definitions(conn: asyncpg.Connection, found: list[Definition], target: Component) -> None:
    """Apply each definition whose checksum is not the one recorded, in its own transaction."""
    table = target.definitions_table
    await conn.execute(
        f"CREATE TABLE IF NOT EXISTS {table} ("
        " name text PRIMARY KEY, sha256 text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
    )
    applied = {r["name"]: r["sha256"] for r in await conn.fetch(f"SELECT name, sha256 FROM {table}")}
    for definition in found:
        text = definition.path.read_text()
        digest = hashlib.sha256(text.encode()).hexdigest()
        if applied.get(definition.name) == digest:
            continue
        async with conn.transaction():
            await conn.execute(text)
            await conn.execute(
                f"INSERT INTO {table} (name, sha256) VALUES ($1, $2)"
                " ON CONFLICT (name) DO UPDATE SET sha256 = EXCLUDED.sha256, applied_at = now()",
                definition.name,
                digest,
            )


async def _report_isolation(conn: asyncpg.Connection) -> None:
    """Say so when the database (or the role) defaults to another isolation level than the guards
    need: the ledger sets READ COMMITTED on its own connections (ledger/connections.py), but anything else
    writing through its functions would decide on a stale snapshot."""
    level = await conn.fetchval("SELECT current_setting('default_transaction_isolation')")
    if level != "read committed":
        log.warning(
            "the ledger database's default_transaction_isolation is %r: onceflow's own connections "
            "run READ COMMITTED, as its guards need; anything else that reserves through "
            "onceflow_guarded_reserve must do the same",
            level,
        )


async def schema_behind(dsn_or_conn: str | asyncpg.Connection) -> list[str]:
    """What `migrate` would still change, without changing anything: the numbered migrations not
    applied and the definitions whose text is not the one applied. Empty: the schema is this code's."""
    conn = await asyncpg.connect(dsn_or_conn) if isinstance(dsn_or_conn, str) else dsn_or_conn
    try:
        version = conn.get_server_version()
        check_server((version.major, version.minor))
        tables = {
            r["name"]
            for r in await conn.fetch(
                "SELECT tablename AS name FROM pg_tables WHERE schemaname = current_schema()"
                " AND tablename IN ('onceflow_schema_version', 'onceflow_definitions')"
            )
        }
        current = 0
        if "onceflow_schema_version" in tables:
            current = await conn.fetchval("SELECT version FROM onceflow_schema_version") or 0
        applied: dict[str, str] = {}
        if "onceflow_definitions" in tables:
            applied = {
                r["name"]: r["sha256"]
                for r in await conn.fetch("SELECT name, sha256 FROM onceflow_definitions")
            }
    finally:
        if isinstance(dsn_or_conn, str):
            await conn.close()
    behind = [m.path.name for m in discover() if m.version > current]
    for definition in discover_definitions():
        digest = hashlib.sha256(definition.path.read_text().encode()).hexdigest()
        if applied.get(definition.name) != digest:
            behind.append(f"definitions/{definition.path.name}")
    return behind
