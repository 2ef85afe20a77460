"""The start-up check of the ledger database's durability (ledger/durability.py, `onceflow doctor`),
against live servers: the embedded one (no standby, a Unix socket) and a primary with a synchronous
standby over TCP whose settings the test then makes unsafe."""

from __future__ import annotations

import asyncio
import dataclasses
from urllib.parse import urlsplit

import asyncpg
import pytest
from typer.testing import CliRunner, Result

from onceflow.cli.commands import app
from onceflow.ledger import Ledger
from onceflow.ledger.durability import Check, Profile, Replication, Verdict, check_durability, refused
from onceflow.runtime.config import Settings
from onceflow.runtime.ledger_check import check_ledger_at_start
from tests.support.replication import replicated_ledger


async def _doctor(dsn: str, profile: str) -> Result:
    """`onceflow doctor`, as typed (in a thread: it runs its own event loop)."""
    arguments = ["doctor", "--database-url", dsn, "--profile", profile]
    return await asyncio.to_thread(lambda: CliRunner().invoke(app, arguments))


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def _settings(profile: str, replication: str = "streaming") -> Settings:
    base = Settings("127.0.0.1:7233", "default", "q", "", "agents.yaml")
    return dataclasses.replace(base, profile=profile, ledger_replication=replication)


async def test_the_embedded_server_passes_development_and_production_refuses_it_for_lack_of_a_standby(
    ledger: Ledger,
) -> None:
    checks = _by_name(await check_durability(ledger))
    assert checks["fsync"].verdict is Verdict.OK
    assert checks["full_page_writes"].verdict is Verdict.OK
    assert checks["synchronous_commit"].verdict is Verdict.OK
    assert checks["isolation"].verdict is Verdict.OK
    assert checks["client_connection_check_interval"].verdict is Verdict.OK
    assert checks["pooler"].verdict is Verdict.OK
    assert checks["tcp_keepalives_idle"].verdict is Verdict.NOTE  # a Unix socket
    assert checks["synchronous_standby"].verdict is Verdict.UNSAFE
    assert await check_ledger_at_start(ledger, _settings("development"))
    with pytest.raises(SystemExit) as stopped:
        await check_ledger_at_start(ledger, _settings("production"))
    message = str(stopped.value)
    assert "synchronous_standby" in message and "failover can lose acknowledged writes" in message
    assert "fsync" not in message
    # A managed service's synchronous copy, declared, is taken at the operator's word.
    declared = await check_durability(ledger, replication=Replication.MANAGED)
    assert not refused(declared, Profile.PRODUCTION)


async def test_database_defaults_the_ledger_overrides_and_ones_it_cannot(
    ledger: Ledger, database_url: str
) -> None:
    """A database default of another isolation level is overridden on the ledger's connections (and
    reported); `synchronous_commit = off` is not, and is refused by name."""
    database = urlsplit(database_url).path.lstrip("/")
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(
            f"ALTER DATABASE {database} SET default_transaction_isolation = 'repeatable read'"
        )
        await admin.execute(f"ALTER DATABASE {database} SET synchronous_commit = off")
    finally:
        await admin.close()
    fresh = await Ledger.connect(database_url)
    try:
        checks = _by_name(await check_durability(fresh))
    finally:
        await fresh.close()
    assert checks["isolation"].verdict is Verdict.OK
    assert checks["isolation"].value == "read committed (database default: repeatable read)"
    assert checks["synchronous_commit"].verdict is Verdict.UNSAFE
    assert "synchronous_commit" in {c.name for c in refused(list(checks.values()), Profile.PRODUCTION)}
    assert "synchronous_commit" not in {c.name for c in refused(list(checks.values()), Profile.DEVELOPMENT)}


async def test_a_synchronous_standby_over_tcp_passes_production_until_settings_turn_unsafe() -> None:
    async with replicated_ledger(synchronous=True) as (_, dsn):
        ledger = await Ledger.connect(dsn)
        try:
            checks = await check_durability(ledger)
            assert refused(checks, Profile.PRODUCTION) == []
            by_name = _by_name(checks)
            assert by_name["synchronous_standby"].verdict is Verdict.OK
            assert "(sync)" in by_name["synchronous_standby"].value
            assert by_name["tcp_keepalives_idle"].value == "10"  # TCP: the ledger's keepalives hold
            assert by_name["timeline"].value == "1"

            result = await _doctor(dsn, "production")
            assert result.exit_code == 0, result.output
            assert "a worker would start" in result.output

            # A role that may not see the standby's state: unknown, which production refuses too.
            admin = await asyncpg.connect(dsn)
            try:
                await admin.execute("CREATE ROLE ledger_app LOGIN")
                await admin.execute("ALTER SYSTEM SET fsync = off")
                await admin.execute("ALTER SYSTEM SET full_page_writes = off")
                await admin.execute("SELECT pg_reload_conf()")
            finally:
                await admin.close()
            app_dsn = dsn.replace("postgres@", "ledger_app@", 1)
            limited = await Ledger.connect(app_dsn)
            try:
                stopped = {c.name: c for c in refused(await check_durability(limited), Profile.PRODUCTION)}
            finally:
                await limited.close()
            assert stopped["synchronous_standby"].verdict is Verdict.UNKNOWN
            assert "pg_monitor" in stopped["synchronous_standby"].why
            assert {"fsync", "full_page_writes"} <= set(stopped)

            result = await _doctor(dsn, "production")
            assert result.exit_code == 1
            assert "refuses to start" in result.output and "fsync" in result.output
        finally:
            await ledger.close()
