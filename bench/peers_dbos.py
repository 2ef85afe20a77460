"""bench/peers.py's DBOS way: a DBOS workflow with one step, on the same PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

from peers_common import from_prompt, post_credit


def dbos_functions() -> Any:
    """The DBOS workflow and step, registered when the worker process sets DBOS up (not on import:
    the Temporal sandbox re-imports this module)."""
    from dbos import DBOS

    @DBOS.step(retries_allowed=False)
    async def dbos_credit_step(account_id: str, amount_cents: int, key: str) -> dict[str, Any]:
        return await post_credit(account_id, amount_cents, key)

    @DBOS.workflow()
    async def dbos_credit(text: str) -> dict[str, Any]:
        arguments = from_prompt(text)
        begun = time.perf_counter()
        credit = await dbos_credit_step(
            arguments["account_id"], arguments["amount_cents"], f"{DBOS.workflow_id}:call_credit"
        )
        return {"step_ms": (time.perf_counter() - begun) * 1000, "credit": credit}

    return dbos_credit
