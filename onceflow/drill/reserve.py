"""Kill point `reserve`: a worker killed inside the guarded reservation of the first credit's twin.

A guarded reservation is one transaction that first takes a transaction-scoped advisory lock on the
call's intent (ledger/guards.py). The twin (the same credit in the same answer) has the intent of the
run's first credit, so once that credit is recorded, the runner takes the same lock from a session of
its own: the next reservation of that payload, the twin's, then waits inside its transaction, with nothing decided and nothing
written. The runner sees the wait in `pg_locks`, finds the worker by its session's
`application_name` (processes.py names each incarnation), SIGKILLs it, and lets the lock go.

Confirmed when the killed worker was alive and its session was the one waiting, the twin had no
ledger record before the kill, and still none once that session had ended: the transaction rolled
back, nothing was reserved, so nothing can have been sent. The run reserves the twin again after
the activity's timeout and gets the ledger's answer then. No worker code stops here on purpose.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from onceflow.drill.kills import Killer, PointHit
from onceflow.drill.points import KillPoint, still_armed
from onceflow.drill.scenario import ORIGINAL_CALL, REISSUE_CALL, TENANT, PlannedRun
from onceflow.ledger.guards import Guard

_TAKE = "SELECT pg_advisory_lock(hashtextextended($1, 0))"
_GIVE = "SELECT pg_advisory_unlock(hashtextextended($1, 0))"
_LOCK_ID = "SELECT hashtextextended($1, 0)"
# Sessions waiting for an advisory lock given as one bigint: its high half is `classid`, its low
# half `objid`, and `objsubid` is 1 (PostgreSQL's documented layout of pg_locks).
_WAITERS = """
SELECT l.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1
  AND l.classid::bigint = $1 AND l.objid::bigint = $2
"""
_SESSION_ALIVE = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1"
_GONE_WITHIN = 10.0  # seconds for a dead worker's session to end once it has the lock


@dataclass
class _Trap:
    """The runner's session holding one run's intent lock."""

    conn: asyncpg.Connection
    name: str
    classid: int
    objid: int


class ReserveTrap:
    """Arms nothing in the workers: holds intent locks and kills whoever waits on one."""

    def __init__(self, killer: Killer, database_url: str, runs: dict[str, PlannedRun]) -> None:
        self.killer = killer
        self.database_url = database_url
        self.runs = runs
        self.traps: dict[str, _Trap] = {}

    async def watch(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                for run_id, point in still_armed(self.killer.markers):
                    if point is KillPoint.RESERVE:
                        await self._step(self.runs[run_id])
                await asyncio.sleep(0.05)
        finally:
            for trap in self.traps.values():
                await trap.conn.close()
            self.traps.clear()

    async def _step(self, run: PlannedRun) -> None:
        trap = self.traps.get(run.run_id)
        if trap is None:
            trap = await self._set(run)
            if trap is None:
                return
            self.traps[run.run_id] = trap
        waiting = await trap.conn.fetch(_WAITERS, trap.classid, trap.objid)
        if not waiting:
            return
        pid, name = waiting[0]["pid"], waiting[0]["application_name"]
        async with self.killer.lock:
            slot = self.killer.processes.slot_named(name)
            if slot is None:
                # A worker killed at random left its session waiting here: let it end, and set the
                # trap again for the attempt that comes next.
                self.killer.notes.append(f"{run.run_id} reserve: waited on by {name}, already killed")
                await self._release(run.run_id, pid)
                return
            key = run.key(REISSUE_CALL)
            before = await self.killer.ledger.find(key)
            kill = await self.killer.kill_for_point([slot])
            ended = await self._release(run.run_id, pid)
            after = await self.killer.ledger.find(key)
            problems = []
            if not kill.pids:
                problems.append("the worker was already dead")
            if before is not None or after is not None:
                problems.append(
                    f"the twin had a ledger record ({before and before.status} before, "
                    f"{after and after.status} after the kill), not none"
                )
            if not ended:
                problems.append(f"the killed worker's session {pid} did not end while it waited on the lock")
            hit = PointHit(
                KillPoint.RESERVE, run.run_id, key, verified=not problems, note="; ".join(problems)
            )
            kill.hits.append(hit)
        _disarm(self.killer.markers, run.run_id)

    async def _set(self, run: PlannedRun) -> _Trap | None:
        """Take the run's intent lock once its first credit is recorded (its reservation is over)."""
        original = await self.killer.ledger.find(run.key(ORIGINAL_CALL))
        if original is None:
            return None
        [name] = Guard().locks(
            tenant=TENANT,
            run_id=run.run_id,
            tool_name=original.tool_name,
            payload_sha256=original.payload_sha256,
        )
        conn = await asyncpg.connect(self.database_url)
        await conn.execute(_TAKE, name)
        whole = int(await conn.fetchval(_LOCK_ID, name)) & 0xFFFF_FFFF_FFFF_FFFF
        return _Trap(conn, name, whole >> 32, whole & 0xFFFF_FFFF)

    async def _release(self, run_id: str, pid: int) -> bool:
        """Wait for session `pid`, which waits on the lock, to end while the lock is still held (its
        backend sees its client gone: ledger/connections.py's client check), then give the lock up. A
        session that only ends once it has the lock may have committed its reservation: False."""
        trap = self.traps.pop(run_id)
        try:
            ended = await self._ended(trap, pid)
            await trap.conn.execute(_GIVE, trap.name)
            if not ended:
                await self._ended(trap, pid)  # let it finish before the next attempt's trap is set
            return ended
        finally:
            await trap.conn.close()

    @staticmethod
    async def _ended(trap: _Trap, pid: int) -> bool:
        deadline = time.monotonic() + _GONE_WITHIN
        while time.monotonic() < deadline:
            if not await trap.conn.fetchval(_SESSION_ALIVE, pid):
                return True
            await asyncio.sleep(0.02)
        return False


def _disarm(markers: Path, run_id: str) -> None:
    """The point was met: the marker no longer counts as armed (points.py's naming)."""
    armed = markers / f"{run_id}.{KillPoint.RESERVE.value}.armed"
    try:
        armed.rename(armed.with_suffix(".done"))
    except FileNotFoundError:
        pass
