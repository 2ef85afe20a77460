"""The partition drill's faults: one worker at a time cut from PostgreSQL, from Temporal, or from
both (netns.py), for longer than the tool's timeout and the reservation's lease, while it has a call
on the wire; then healed. Part of InfraChaos (infra.py).

"On the wire" is read from the ledger: a `started` call whose owner token names the worker's process
(`...@<host>:<pid>`, activities/outcomes.py), i.e. reserved and not yet answered. Each cut waits (a
while) for a worker with one and cuts that worker, so it catches it mid-call; the keys are recorded.

`watch_leases` samples, every second, the calls still `started` after their owner's lease ran out:
such a call is in the operator queue already (it lists a `started` call once its lease is over), and
must become `indeterminate` (or settled) soon after. The longest overrun is reported.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import asyncpg

from onceflow.drill.scenario import TENANT

if TYPE_CHECKING:
    from onceflow.drill.processes import DrillProcesses, WorkerSlot
    from onceflow.drill.scenario import InfraConfig

# Read-only: calls in flight of one worker process, and calls still started past their lease.
_ON_THE_WIRE = """
SELECT key FROM tool_executions
 WHERE tenant = $1 AND status = 'started' AND owner LIKE '%:' || $2::text
"""
_PAST_LEASE = """
SELECT key, extract(epoch FROM clock_timestamp() - lease_expires_at)::float8 AS over
  FROM tool_executions
 WHERE tenant = $1 AND status = 'started' AND lease_expires_at < clock_timestamp()
"""
_WAIT_FOR_A_CALL = 60.0  # seconds a cut waits for a worker to have a call on the wire


@dataclass
class Cut:
    kind: str  # postgres | temporal | both
    worker: str
    at_seconds: float
    seconds: float
    on_the_wire: list[str] = field(default_factory=list)


class Partitions:
    """Mixin of InfraChaos: the cuts, and the lease watch."""

    processes: DrillProcesses
    config: InfraConfig
    started: float
    notes: list[str]

    def __init__(self) -> None:
        self.cuts: list[Cut] = []
        self.past_lease: dict[str, float] = {}  # key -> longest seen past its lease, seconds

    def _ports(self, kind: str) -> tuple[int, ...]:
        pg = tuple(node.port for node in self.processes.pair.nodes) if self.processes.pair else ()
        temporal = (int(self.processes.worker_temporal_address.rsplit(":", 1)[1]),)
        return {"postgres": pg, "temporal": temporal, "both": pg + temporal}[kind]

    async def partitions(self, stop: asyncio.Event) -> None:
        lab = self.processes.lab
        if lab is None or not self.config.partitions:
            return
        try:
            for number, kind in enumerate(self.config.partitions):
                try:
                    await asyncio.wait_for(stop.wait(), self.config.partition_every)
                    return
                except TimeoutError:
                    pass
                slot, keys = await self._worker_with_a_call_on_the_wire(number)
                at = round(time.monotonic() - self.started, 2)
                lab.cut(slot.name, self._ports(kind))
                await asyncio.sleep(self.config.partition_seconds)
                lab.heal(slot.name)
                self.cuts.append(Cut(kind, slot.name, at, self.config.partition_seconds, keys))
        except Exception as exc:  # the report then shows fewer cuts than planned, and why
            self.notes.append(f"partitions stopped: {exc!r}")

    async def _worker_with_a_call_on_the_wire(self, number: int) -> tuple[WorkerSlot, list[str]]:
        """Wait (a while) until a worker process has a call reserved and not yet answered; that one
        is cut (by turns when both have). Past the wait, the turn's worker, with nothing on the wire."""
        slots = self.processes.slots
        order = slots[number % len(slots) :] + slots[: number % len(slots)]
        deadline = time.monotonic() + _WAIT_FOR_A_CALL
        conn = await asyncpg.connect(self.processes.database_url)
        try:
            while time.monotonic() < deadline:
                for slot in order:
                    pid = slot.process.pid if slot.process else 0
                    keys = [r["key"] for r in await conn.fetch(_ON_THE_WIRE, TENANT, str(pid))]
                    if keys:
                        return slot, keys
                await asyncio.sleep(0.05)
        finally:
            await conn.close()
        return order[0], []

    async def watch_leases(self, stop: asyncio.Event) -> None:
        if not self.config.partitions:
            return
        conn: asyncpg.Connection | None = None
        while not stop.is_set():
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(self.processes.database_url)
                for row in await conn.fetch(_PAST_LEASE, TENANT):
                    self.past_lease[row["key"]] = max(self.past_lease.get(row["key"], 0.0), row["over"])
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                conn = None
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass
        if conn is not None:
            await conn.close()
