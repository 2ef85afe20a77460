"""A migrated ledger on a real primary and standby (onceflow/local/replication.py), for failover tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg

from onceflow.ledger import migrate
from onceflow.local.replication import ReplicatedPostgres

LEDGER = "onceflow"


@asynccontextmanager
async def replicated_ledger(*, synchronous: bool) -> AsyncIterator[tuple[ReplicatedPostgres, str]]:
    """A primary and a streaming standby with a migrated ledger database; yields the pair and the
    ledger's multi-host DSN (target_session_attrs=read-write).

    The servers' folders are made under /tmp, not in pytest's tmp_path: the servers run as another
    user, and any pytest that starts on the machine makes /tmp/pytest-of-<user> private again, after
    which a server could no longer reach its own folder."""
    root = Path(tempfile.mkdtemp(prefix="onceflow-pair-"))
    pair = ReplicatedPostgres(root / "pg", synchronous=synchronous)
    try:
        pair.start()
        admin = await asyncpg.connect(pair.dsn())
        try:
            await admin.execute(f"CREATE DATABASE {LEDGER}")
        finally:
            await admin.close()
        dsn = pair.dsn(LEDGER)
        await migrate(dsn)
        yield pair, dsn
    finally:
        pair.stop()
        shutil.rmtree(root, ignore_errors=True)


def fail_over(pair: ReplicatedPostgres, *, lose_recent_writes: bool = False) -> None:
    """SIGKILL the primary and promote the standby. With `lose_recent_writes`, the caller had held
    replication (`hold_replication`): whatever the primary acknowledged since never reaches the
    standby."""
    pair.kill_primary()
    if lose_recent_writes:
        pair.release_replication()  # the senders are dead with their primary; nothing more is sent
    pair.promote()
