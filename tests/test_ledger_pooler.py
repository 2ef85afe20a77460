"""PgBouncer in transaction mode in front of the ledger: detected, and the worker refuses to start.

Transaction pooling hands each transaction to whichever server connection is free: the session
settings the ledger makes when a connection opens (isolation, client_connection_check_interval,
keepalives) stay behind on one server connection, asyncpg's prepared statements vanish, and a
worker that dies mid-statement is invisible to the server behind the pooler. The ledger refuses it
rather than half-working (docs/operations.md). Real parts: Debian's `pgbouncer`, the test session's
PostgreSQL.
"""

from __future__ import annotations

import dataclasses

import pytest

from onceflow.ledger import Ledger
from onceflow.ledger.durability import Verdict, detect_pooler
from onceflow.runtime.config import Settings
from onceflow.runtime.ledger_check import check_ledger_at_start
from tests.support import pgbouncer

pytestmark = pytest.mark.skipif(
    not pgbouncer.available(), reason="Debian's pgbouncer is not installed (.ci/run installs it)"
)


def _settings() -> Settings:
    return dataclasses.replace(Settings("127.0.0.1:7233", "default", "q", "", "agents.yaml"))


async def test_transaction_pooling_is_detected_and_the_worker_refuses_it(database_url: str) -> None:
    with pgbouncer.pgbouncer(database_url, pool_mode="transaction") as through:
        # asyncpg's statement cache would fail on the first reuse; the check must say why first.
        ledger = await Ledger.connect(through, max_size=4)
        try:
            check = await detect_pooler(ledger)
            assert check.verdict is Verdict.UNSAFE, check
            assert "transaction pooling" in check.value
            with pytest.raises(SystemExit) as stopped:
                await check_ledger_at_start(ledger, _settings())  # any profile, development included
        finally:
            await ledger.close()
    message = str(stopped.value)
    assert "pooler" in message and "pool_mode = transaction" in message
    assert "session-mode pooler" in message


async def test_session_pooling_keeps_each_session_on_its_backend(database_url: str) -> None:
    with pgbouncer.pgbouncer(database_url, pool_mode="session") as through:
        ledger = await Ledger.connect(through, max_size=4)
        try:
            assert (await detect_pooler(ledger)).verdict is Verdict.OK
            checks = {c.name: c for c in await check_ledger_at_start(ledger, _settings())}
        finally:
            await ledger.close()
    assert checks["isolation"].verdict is Verdict.OK
    assert checks["client_connection_check_interval"].verdict is Verdict.OK
