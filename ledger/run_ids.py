"""Run ids are claimed once and refused to any other run forever after (migration 0009).

A run's keys are `<run_id>:<tool_call_id>`, and tool call ids repeat from run to run (`call_1_0`,
`t1_0`), so two runs under one run id would share keys: the second would be handed the first's
recorded results, or refused as a changed payload, or (if the first's row were gone) send again.
Temporal refuses a duplicate workflow id only within its retention, and only if the starter asks
for it; the ledger refuses it always, whoever started the run.

The claim is made by a run's first write, in the statement that reserves it and before the
reservation is decided (migration 0011; `Ledger.reserve(execution=...)`), with the run's first
execution id (the same across a reset or continue-as-new of that run), so every later write of the
same run passes and any other execution is refused with nothing reserved or sent. `RunIds.claim`
is the same claim on its own.
"""

from __future__ import annotations

from datetime import datetime

from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase
from onceflow.ledger.errors import LedgerError


class RunIdTakenError(LedgerError):
    """Another workflow execution has claimed this run id; this one may not use it."""

    def __init__(self, run_id: str, claimed_at: datetime) -> None:
        super().__init__(
            f"run id {run_id!r} was claimed by another run at {claimed_at.isoformat()}; a run id names "
            "one run forever (its keys are built from it), so this run reserves and sends nothing. "
            "Start it under a new run id."
        )
        self.run_id = run_id
        self.claimed_at = claimed_at


class RunIds:
    """Claims on run ids, in the ledger's database."""

    def __init__(self, ledger: LedgerBase) -> None:
        self._ledger = ledger

    async def claim(self, run_id: str, *, execution: str, tenant: str, agent: str | None = None) -> None:
        """Claim `run_id` for the run whose first execution is `execution`, or confirm that it
        already holds it. Raises RunIdTakenError when another execution holds it."""
        async with self._ledger.connection("claim_run_id", run_id=run_id) as conn:
            row = await conn.fetchrow(queries.CLAIM_RUN_ID, run_id, execution, tenant, agent)
            if row is None:
                # A claim committed between our insert and our read: read it now it is visible.
                row = await conn.fetchrow(queries.CLAIM_RUN_ID, run_id, execution, tenant, agent)
        assert row is not None
        if row["execution"] != execution:
            raise RunIdTakenError(run_id, row["claimed_at"])
