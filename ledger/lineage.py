"""Reading how calls relate under the guards: the chain of replacements, and who waits for whom.

A replacement names the call it replaces (`replaces`); a held call names the call it waits for
(`held_by`). Both links point backwards; these reads follow them both ways for the operator.
"""

from __future__ import annotations

from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase
from onceflow.ledger.records import ToolExecutionRecord, to_record

MAX_HELD_SHOWN = 100


class LineageReads(LedgerBase):
    async def lineage(self, key: str, *, tenant: str) -> list[ToolExecutionRecord]:
        """Every call in `key`'s replacement chain, oldest first: the calls it replaces (however far
        back), the calls that replace it or them (including failed replacements, which may be
        replaced again), and the call itself. Empty when it neither replaces nor was replaced."""
        async with self.connection("lineage", key=key) as conn:
            rows = await conn.fetch(queries.LINEAGE, key, tenant)
        if len(rows) < 2:
            return []
        return [to_record(row) for row in rows]

    async def held_behind(self, key: str, *, tenant: str, limit: int | None = MAX_HELD_SHOWN) -> list[str]:
        """The keys of the calls held until `key` settles, oldest first (at most `limit`; None: all)."""
        async with self.connection("held_behind", key=key) as conn:
            rows = await conn.fetch(queries.HELD_BEHIND, tenant, key, limit)
        return [row["key"] for row in rows]

    async def held_runs_behind(self, key: str, *, tenant: str) -> list[tuple[str, str]]:
        """(key, run id) of every call held until `key` settles, oldest first: the run ids as the
        ledger recorded them, for waking those runs."""
        async with self.connection("held_runs_behind", key=key) as conn:
            rows = await conn.fetch(queries.HELD_RUNS_BEHIND, tenant, key)
        return [(row["key"], row["run_id"]) for row in rows]
