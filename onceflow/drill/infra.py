"""The infrastructure drills: the ledger's primary dies and its standby takes over, the Temporal
server is SIGKILLed and started again, a worker's network is cut (partitions.py), and an operator
settles what only an operator can.

- Failovers (`InfraConfig.replication`, `failovers`): every `failover_every` seconds the primary's
  whole process tree is SIGKILLed, the standby promoted (`pg_ctl promote`) and a fresh standby made
  from the new primary in the dead one's place, so the next failover finds a standby again. Under
  `async` replication the primary's WAL senders are first stopped for `lag_seconds`: the writes it
  acknowledges meanwhile never reach the standby, so the failover loses them for certain.
- Temporal restarts (`temporal_restarts`): every `temporal_every` seconds the dev server is SIGKILLed
  and kept down for `temporal_down` seconds, then started on the same address and database file.
  While it is down the drill, as an operator, settles the unknown calls of runs that wait for one
  through the operator API (which settles them in the ledger, then fails to signal the run): once
  Temporal is back each such run must resume within its recheck interval, with no signal.
- Operator runs (`operator_every`): their first credit's answer is lost and the reconcile hook
  leaves it to the operator (gates.py); once the chaos is over the drill settles what is left,
  from billing's own record, through the API, which signals each run: paused runs stay resumable
  by an operator.

Each event is recorded with its timings for the report (infra_report.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from onceflow.drill.judge import RunEnd
from onceflow.drill.operator import DrillOperator
from onceflow.drill.partitions import Partitions
from onceflow.drill.processes import NAMESPACE, TASK_QUEUE, DrillProcesses
from onceflow.drill.scenario import ORIGINAL_CALL, RECHECK_SECONDS, TENANT, InfraConfig, PlannedRun
from onceflow.examples.billing.client import BillingClient
from onceflow.examples.billing.models import Credit
from onceflow.ledger import Ledger, LedgerUnavailableError, Status
from onceflow.ledger.lost_writes import LOST_KIND
from onceflow.runtime.constants import PHASE
from onceflow.sdk.payloads import Phase

# How long past the recheck interval a resumed run may take (a workflow task, a ledger read).
RESUME_SLACK = 2.0


@dataclass
class InfraEvent:
    kind: str  # failover | temporal_restart | operator_settle
    at_seconds: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Resume:
    """A run whose unknown call an operator settled while Temporal was down."""

    run_id: str
    key: str
    settled_at: float
    temporal_back_at: float
    workers_back_at: float | None = None  # both of the task queue's pollers answered again
    resumed_after: float | None = None  # seconds after Temporal was back; None: never seen

    @property
    def after_workers_back(self) -> float | None:
        """Seconds from the workers polling again to the run leaving its wait."""
        if self.resumed_after is None or self.workers_back_at is None:
            return None
        return round(self.temporal_back_at + self.resumed_after - self.workers_back_at, 2)


class InfraChaos(Partitions):
    def __init__(
        self,
        processes: DrillProcesses,
        config: InfraConfig,
        ledger: Ledger,
        billing: BillingClient,
        plans: list[PlannedRun],
        started: float,
        operator: DrillOperator,
    ) -> None:
        super().__init__()
        self.operator = operator  # the operator API, with the drill tenant's token (operator.py)
        self.processes = processes
        self.config = config
        self.ledger = ledger
        self.billing = billing
        self.operator_runs = [p for p in plans if p.operator]
        self.started = started
        self.events: list[InfraEvent] = []
        self.resumes: list[Resume] = []
        self.notes: list[str] = []
        self.temporal_down = False
        # Calls a failover lost after their run had moved on: what the run said, what the ledger.
        self.disagreements: list[dict[str, Any]] = []

    def _now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    # -- the ledger fails over ----------------------------------------------------------------------

    async def failovers(self, stop: asyncio.Event) -> None:
        try:
            await self._failovers(stop)
        except Exception as exc:  # the drill goes on and fails `failovers_done`, saying why
            self.notes.append(f"failovers stopped: {exc!r}")

    async def _failovers(self, stop: asyncio.Event) -> None:
        pair = self.processes.pair
        if pair is None:
            return
        for number in range(1, self.config.failovers + 1):
            if await _stopped(stop, self.config.failover_every):
                return
            detail: dict[str, Any] = {"number": number, "primary": pair.primary.address}
            if self.config.replication == "async" and self.config.lag_seconds > 0:
                detail["replication_held_for"] = self.config.lag_seconds
                await asyncio.to_thread(pair.hold_replication)
                await asyncio.sleep(self.config.lag_seconds)
            killed = time.monotonic()
            await asyncio.to_thread(pair.kill_primary)
            pair.release_replication()
            await asyncio.to_thread(pair.promote)
            promoted = time.monotonic()
            await asyncio.to_thread(pair.rebuild_standby)
            detail.update(
                promoted_after=round(promoted - killed, 2),
                standby_back_after=round(time.monotonic() - killed, 2),
                new_primary=pair.primary.address,
                timeline=number + 1,
            )
            self.events.append(InfraEvent("failover", round(killed - self.started, 2), detail))

    # -- Temporal restarts ----------------------------------------------------------------------------

    async def temporal_restarts(self, stop: asyncio.Event, client: Client) -> None:
        try:
            await self._temporal_restarts(stop, client)
        except Exception as exc:
            self.temporal_down = False
            self.notes.append(f"Temporal restarts stopped: {exc!r}")

    async def _temporal_restarts(self, stop: asyncio.Event, client: Client) -> None:
        for number in range(1, self.config.temporal_restarts + 1):
            if await _stopped(stop, self.config.temporal_every):
                return
            killed = self._now()
            self.temporal_down = True
            await self.processes.kill_temporal()
            settled = await self._settle_waiting(while_down=True)
            await asyncio.sleep(self.config.temporal_down)
            await self.processes.start_temporal()
            self.temporal_down = False
            back = self._now()
            workers_back = await self._workers_polling(client, since=time.time())
            self.events.append(
                InfraEvent(
                    "temporal_restart",
                    killed,
                    {
                        "number": number,
                        "down_for": round(back - killed, 2),
                        "settled_while_down": len(settled),
                    },
                )
            )
            for run_id, key, at in settled:
                self.resumes.append(Resume(run_id, key, at, back, workers_back))
            await self._watch_resumes(client)

    async def _workers_polling(self, client: Client, *, since: float, timeout: float = 60.0) -> float | None:
        """When the task queue's workflow and activity pollers had both come back (drill seconds):
        from then on the workers can act on what Temporal has for them."""
        deadline = time.monotonic() + timeout
        kinds = (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        while time.monotonic() < deadline:
            try:
                seen = []
                for kind in kinds:
                    described = await client.workflow_service.describe_task_queue(
                        DescribeTaskQueueRequest(
                            namespace=NAMESPACE, task_queue=TaskQueue(name=TASK_QUEUE), task_queue_type=kind
                        )
                    )
                    seen.append(any(p.last_access_time.ToSeconds() >= since for p in described.pollers))
                if all(seen):
                    return self._now()
            except RPCError:
                pass
            await asyncio.sleep(0.2)
        return None

    async def _watch_resumes(self, client: Client) -> None:
        """Until every run settled while Temporal was down has left its wait (or the bound passed)."""
        waiting = [r for r in self.resumes if r.resumed_after is None]
        bound = RECHECK_SECONDS + RESUME_SLACK
        while waiting:
            for resume in waiting:
                if await _resumed(client, resume.run_id):
                    resume.resumed_after = round(self._now() - resume.temporal_back_at, 2)
            waiting = [r for r in waiting if r.resumed_after is None]
            if waiting and self._now() - min(r.temporal_back_at for r in waiting) > 3 * bound:
                return  # judged late in the report
            await asyncio.sleep(0.2)

    # -- the operator -------------------------------------------------------------------------------

    async def _settle_waiting(self, *, while_down: bool) -> list[tuple[str, str, float]]:
        """Settle every unknown operator call from billing's record of its key, through the operator
        API (which then signals the run, or says it could not). Returns (run id, key, when) of each."""
        waiting = []
        for run in self.operator_runs:
            key = run.key(ORIGINAL_CALL)
            try:
                record = await self.ledger.find(key)
            except LedgerUnavailableError:
                continue
            if record is not None and record.status is Status.INDETERMINATE:
                credits = [c for c in await self.billing.credits(run.account_id) if c.idempotency_key == key]
                waiting.append((run, key, credits))
        # At once: with Temporal down, each answer of the API waits for its failed signal's retries.
        done = await asyncio.gather(
            *(self._resolve(key, credits, "the reconcile hook cannot tell;") for _, key, credits in waiting)
        )
        settled = []
        for (run, key, _), ok in zip(waiting, done, strict=True):
            if ok:
                at = self._now()
                settled.append((run.run_id, key, at))
                self.events.append(
                    InfraEvent("operator_settle", at, {"key": key, "temporal_down": while_down})
                )
        return settled

    async def settle_the_rest(self) -> int:
        """After the chaos: settle what is left (the API signals each run)."""
        return len(await self._settle_waiting(while_down=False))

    async def settle_lost_calls(self, ends: dict[str, RunEnd | None]) -> None:
        """After the runs: the calls a failover lost and that are still unknown. Where the run had
        already been told an outcome, the ledger and Temporal's history disagree: noted. The operator
        then settles each from billing's record, as for any unknown call in the queue."""
        page = await self.ledger.list_unresolved(TENANT, statuses=[Status.INDETERMINATE], limit=500)
        for record in page.records:
            full = await self.ledger.get(record.key)
            lost = [e for e in full.events if e.kind == LOST_KIND]
            if not lost:
                continue
            end = ends.get(record.run_id)
            told = None
            if end is not None and end.result is not None:
                told = next(
                    (c.status for c in end.result.calls if c.tool_call_id == record.tool_call_id), None
                )
            if told is not None and told != record.status:
                self.disagreements.append(
                    {
                        "key": record.key,
                        "run_said": str(told),
                        "ledger": record.status.value,
                        "why": lost[-1].reason,
                    }
                )
            credits = [c for c in await self.billing.credits() if c.idempotency_key == record.key]
            if await self._resolve(record.key, credits, "lost in a failover;"):
                self.events.append(
                    InfraEvent("operator_settle", self._now(), {"key": record.key, "lost": True})
                )

    async def _resolve(self, key: str, credits: list[Credit], why: str) -> bool:
        """Settle `key` through the operator API from billing's record of it: completed with the
        credit under the key, or failed when there is none. False when the API refused."""
        try:
            if credits:
                await self.operator.resolve(
                    key,
                    "completed",
                    f"{why} billing shows the credit under this key",
                    evidence={"credit_id": credits[0].credit_id},
                    result=credits[0].model_dump(mode="json"),
                )
            else:
                await self.operator.resolve(
                    key, "failed", f"{why} billing has no credit under this key", evidence={"credits": 0}
                )
        except (RuntimeError, httpx.HTTPError) as exc:
            self.notes.append(f"operator could not settle {key}: {exc}")
            return False
        return True


async def _stopped(stop: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
        return True
    except TimeoutError:
        return False


async def _resumed(client: Client, run_id: str) -> bool:
    try:
        described = await client.get_workflow_handle(run_id).describe()
    except RPCError:
        return False
    if described.status != WorkflowExecutionStatus.RUNNING:
        return True
    return described.typed_search_attributes.get(PHASE) != Phase.AWAITING_RECONCILIATION.value
