"""Killing workers: on purpose at an armed point (the watcher) and at random moments (chaos).

Both take one lock, so kills never overlap: each kill SIGKILLs one worker's process group, reaps it,
starts a fresh worker in its place, and is written down with what the killed worker was holding and
whether the ledger and billing confirm it died exactly where it was meant to.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from onceflow.drill.points import Held, KillPoint, mark_done, read_held
from onceflow.drill.processes import DrillProcesses, WorkerSlot
from onceflow.drill.scenario import PlannedRun
from onceflow.drill.tools import CREDIT_TIMEOUT
from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, Status

# The ledger status a killed worker must leave behind for the kill to count as "at that point".
_STATUS_AT = {
    KillPoint.BEFORE_SEND: Status.STARTED,
    KillPoint.DOWNSTREAM: Status.STARTED,
    KillPoint.AFTER_ANSWER: Status.STARTED,
    KillPoint.RECONCILE: Status.INDETERMINATE,
}
# Credit requests billing must have received for the key, and effects it must show, at the kill.
_RECEIVED_AT = {KillPoint.BEFORE_SEND: 0, KillPoint.AFTER_ANSWER: 1}
_EFFECTS_AT = {KillPoint.BEFORE_SEND: 0, KillPoint.AFTER_ANSWER: 1}

Facts = tuple[Status | None, int | None, int | None]  # ledger status, effects, requests received


@dataclass
class PointHit:
    """One kill point a killed worker was holding."""

    point: KillPoint
    run_id: str
    key: str | None
    verified: bool
    note: str = ""


@dataclass
class Kill:
    at_seconds: float
    cause: str  # "planned" (the watcher, at an armed point) or "random"
    workers: list[str]
    pids: list[int]
    hits: list[PointHit] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Killer:
    """Performs and records every kill of the drill."""

    def __init__(
        self,
        processes: DrillProcesses,
        ledger: Ledger,
        billing: BillingClient,
        markers: Path,
        runs: dict[str, PlannedRun],
        started: float,
    ) -> None:
        self.processes = processes
        self.ledger = ledger
        self.billing = billing
        self.markers = markers
        self.runs = runs
        self.started = started
        self.kills: list[Kill] = []
        self.notes: list[str] = []
        self.lock = asyncio.Lock()

    # -- on purpose -------------------------------------------------------------------------------

    async def watch(self, stop: asyncio.Event) -> None:
        """Act on every announcement of an armed point until `stop` is set."""
        while not stop.is_set():
            for path, held in read_held(self.markers):
                async with self.lock:
                    if path.exists():  # a random kill may have taken it meanwhile
                        await self._planned_kill(path, held)
            await asyncio.sleep(0.03)

    async def _planned_kill(self, path: Path, held: Held) -> None:
        slot = self.processes.slot_of(held.pid)
        if slot is None:
            self.notes.append(f"{held.run_id} reached {held.point} in pid {held.pid}, already gone")
            mark_done(path)
            return
        ready = await self._downstream_holds(held) if held.point is KillPoint.DOWNSTREAM else True
        # Points the same worker holds and sleeps at (all but `downstream`, which is only announced)
        # are hit by this kill too: judge them as well, with their facts from before and after it.
        # Look again after taking facts (which takes a while), so that a point the worker reached
        # meanwhile is judged too rather than lost as "not checked"; only the last instant is left.
        targets: list[tuple[Path, Held]] = [(path, held)]
        before: list[Facts] = []
        while len(before) < len(targets):
            before += [await self._facts(h) for _, h in targets[len(before) :]]
            known = {target_path for target_path, _ in targets}
            targets += [
                (other_path, other)
                for other_path, other in read_held(self.markers)
                if other.pid == held.pid
                and other_path not in known
                and other.point is not KillPoint.DOWNSTREAM
            ]
        pid = await self._kill_and_replace([slot], "planned")
        for (target_path, target), facts in zip(targets, before, strict=True):
            after = await self._facts(target)
            is_aimed = target_path == path
            hit = self._judge(
                target, alive=pid is not None, ready=ready or not is_aimed, before=facts, after=after
            )
            if not is_aimed:
                hit.note = "; ".join(
                    filter(None, ["held by the same worker, killed for another point", hit.note])
                )
            self.kills[-1].hits.append(hit)
            mark_done(target_path)
        self._take_other_holds(held.pid, self.kills[-1], exclude=path)

    async def _downstream_holds(self, held: Held) -> bool:
        """Wait (within the tool's timeout) until billing has the request in its hands."""
        run = self.runs[held.run_id]
        deadline = time.monotonic() + CREDIT_TIMEOUT.total_seconds() - 0.5
        while time.monotonic() < deadline:
            if run.fault == "apply_then_hang" and held.key:
                if (await self.billing.effects()).count(held.key) == 1:
                    return True
            elif not await self._fault_pending(run.account_id):
                return True  # `slow`: billing took the fault and sleeps before applying
            await asyncio.sleep(0.02)
        return False

    async def _fault_pending(self, account_id: str) -> bool:
        async with httpx.AsyncClient(base_url=self.processes.billing_url, timeout=2) as http:
            response = await http.get("/faults")
        response.raise_for_status()
        return any(fault["account_id"] == account_id for fault in response.json())

    async def _facts(self, held: Held) -> Facts:
        if held.key is None:
            return None, None, None
        record = await self.ledger.find(held.key)
        effects = (await self.billing.effects()).count(held.key)
        received = (await self.billing.received(held.key)).received
        return (record.status if record else None), effects, received

    def _judge(
        self,
        held: Held,
        *,
        alive: bool,
        ready: bool,
        before: Facts,
        after: Facts,
    ) -> PointHit:
        problems = []
        if not alive:
            problems.append("the worker was already dead")
        if not ready:
            problems.append("billing never held the request")
        wanted = _STATUS_AT.get(held.point)
        if wanted is not None and not (before[0] is wanted and after[0] is wanted):
            problems.append(f"ledger was {before[0]} before and {after[0]} after the kill, not {wanted}")
        effects = _EFFECTS_AT.get(held.point)
        if effects is not None and before[1] != effects:
            problems.append(f"billing showed {before[1]} effects, not {effects}")
        received = _RECEIVED_AT.get(held.point)
        if received is not None and before[2] != received:
            problems.append(f"billing had received {before[2]} requests for the key, not {received}")
        return PointHit(held.point, held.run_id, held.key, verified=not problems, note="; ".join(problems))

    # -- at random --------------------------------------------------------------------------------

    async def chaos(self, stop: asyncio.Event, rng: random.Random, interval: tuple[float, float]) -> None:
        """Kill a random worker (now and then both) at random moments until `stop` is set."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), rng.uniform(*interval))
                return
            except TimeoutError:
                pass
            slots = self.processes.slots if rng.random() < 0.15 else [rng.choice(self.processes.slots)]
            async with self.lock:
                await self._kill_and_replace(slots, "random")
                kill = self.kills[-1]
                for pid in kill.pids:
                    self._take_other_holds(pid, kill)

    def _take_other_holds(self, pid: int, kill: Kill, exclude: Path | None = None) -> None:
        """Points the killed process was also holding: hit by this kill, but not the one it aimed at."""
        for path, held in read_held(self.markers):
            if held.pid == pid and path != exclude:
                note = "held by the killed worker; not checked"
                kill.hits.append(PointHit(held.point, held.run_id, held.key, verified=False, note=note))
                mark_done(path)

    async def kill_for_point(self, slots: list[WorkerSlot], cause: str = "planned") -> Kill:
        """Kill and replace these workers for a point the runner itself detected (reserve.py); the
        caller holds `lock` and adds the hit. Points the workers also held are taken as for chaos."""
        await self._kill_and_replace(slots, cause)
        kill = self.kills[-1]
        for pid in kill.pids:
            self._take_other_holds(pid, kill)
        return kill

    # -- the kill itself --------------------------------------------------------------------------

    async def _kill_and_replace(self, slots: list[WorkerSlot], cause: str) -> int | None:
        names, pids = [], []
        for slot in slots:
            names.append(f"{slot.name}-{slot.incarnation}")
            pid = await self.processes.kill_worker(slot)
            if pid is not None:
                pids.append(pid)
        for slot in slots:
            self.processes.start_worker(slot)
        self.kills.append(Kill(round(time.monotonic() - self.started, 2), cause, names, pids))
        return pids[0] if pids else None

    async def replace_exited(self) -> None:
        """A worker that died without being killed is a finding; note it and start a fresh one."""
        async with self.lock:
            for slot in self.processes.slots:
                process = slot.process
                if process is not None and process.poll() is not None:
                    self.notes.append(
                        f"{slot.name}-{slot.incarnation} exited on its own ({process.returncode})"
                    )
                    self.processes.start_worker(slot)
