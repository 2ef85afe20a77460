"""The drill: start the processes, start the runs, kill workers, wait for every run, then check.

A run is *finished* for the drill when its workflow has closed, or when it is visibly waiting
(`awaiting_reconciliation`) on calls whose reconcilers have all given up: nobody will settle those
without an operator, so waiting longer proves nothing.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError

from onceflow.drill.infra import InfraChaos
from onceflow.drill.infra_report import add_infra_report
from onceflow.drill.judge import RunEnd
from onceflow.drill.kills import Killer
from onceflow.drill.points import arm, still_armed
from onceflow.drill.processes import NAMESPACE, TASK_QUEUE, DrillProcesses
from onceflow.drill.report import DrillReport, collect_report
from onceflow.drill.reserve import ReserveTrap
from onceflow.drill.scenario import (
    AGENT,
    AGENTS_YAML,
    HANG_SECONDS,
    TENANT,
    DrillConfig,
    PlannedRun,
    plan_runs,
)
from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, LedgerUnavailableError
from onceflow.runtime.client import connect, start_run
from onceflow.runtime.config import Settings
from onceflow.runtime.constants import PHASE, UNRESOLVED_KEYS
from onceflow.sdk.payloads import AgentRunInput, AgentRunResult, Phase
from onceflow.workflows.agent_run import AgentRunWorkflow
from onceflow.workflows.reconcile import reconcile_workflow_id

RunHandle = WorkflowHandle[AgentRunWorkflow, AgentRunResult]


@dataclass
class _Tracked:
    plan: PlannedRun
    handle: RunHandle
    end: RunEnd | None = None


@dataclass
class Drill:
    config: DrillConfig
    run_dir: Path = field(init=False)
    tracked: dict[str, _Tracked] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.run_dir = self.config.run_dir()

    async def run(self) -> DrillReport:
        self.run_dir.mkdir(parents=True)
        agents = self.run_dir / "agents.yaml"
        agents.write_text(AGENTS_YAML)
        markers = self.run_dir / "markers"
        markers.mkdir()
        processes = DrillProcesses(
            self.run_dir,
            agents,
            markers,
            self.config.workers,
            sabotage=self.config.sabotage,
            sabotage_intent=self.config.sabotage_intent,
            replication=self.config.infra.replication,
            partitions=bool(self.config.infra.partitions),
            sabotage_failover=self.config.infra.sabotage_failover,
        )
        started = time.monotonic()
        try:
            await processes.start()
            settings = Settings(
                processes.temporal_address, NAMESPACE, TASK_QUEUE, processes.database_url, str(agents)
            )
            client = await connect(settings)
            ledger = await Ledger.connect(processes.database_url)
            try:
                async with BillingClient(processes.billing_url) as billing:
                    plans = plan_runs(self.config.runs, self.config.seed, self.config.infra.operator_every)
                    killer = Killer(
                        processes, ledger, billing, markers, {p.run_id: p for p in plans}, started
                    )
                    infra = InfraChaos(processes, self.config.infra, ledger, billing, plans, started)
                    await self._drive(client, billing, killer, plans, markers, started, infra)
                    if self.config.infra.replication:
                        await infra.settle_lost_calls(client, {r: t.end for r, t in self.tracked.items()})
                    report = await collect_report(
                        config=self.config,
                        run_dir=self.run_dir,
                        plans=plans,
                        ends={run_id: t.end for run_id, t in self.tracked.items()},
                        killer=killer,
                        client=client,
                        ledger=ledger,
                        billing=billing,
                        database_url=processes.database_url,
                        wall_seconds=time.monotonic() - started,
                    )
                    if self.config.infra.active:
                        await add_infra_report(report, infra, self.run_dir, processes.database_url)
            finally:
                await ledger.close()
        finally:
            stopping = time.monotonic()
            await processes.stop()
        report.teardown_seconds = round(time.monotonic() - stopping, 1)
        return report

    async def _drive(
        self,
        client: Client,
        billing: BillingClient,
        killer: Killer,
        plans: list[PlannedRun],
        markers: Path,
        started: float,
        infra: InfraChaos,
    ) -> None:
        stop_watch, stop_chaos = asyncio.Event(), asyncio.Event()
        rng = random.Random(self.config.seed + 1)
        trap = ReserveTrap(killer, killer.processes.database_url, {p.run_id: p for p in plans})
        background = [
            asyncio.create_task(killer.watch(stop_watch)),
            asyncio.create_task(trap.watch(stop_watch)),
        ]
        if self.config.random_kills:
            background.append(asyncio.create_task(killer.chaos(stop_chaos, rng, self.config.kill_interval)))
        # The infrastructure's faults run to their count, whatever the runs are doing.
        infra_tasks = [
            asyncio.create_task(infra.failovers(stop_watch)),
            asyncio.create_task(infra.temporal_restarts(stop_watch, client)),
            asyncio.create_task(infra.partitions(stop_watch)),
        ]
        background.append(asyncio.create_task(infra.watch_leases(stop_watch)))
        background += infra_tasks
        operator_done = not infra.operator_runs
        deadline = started + self.config.timeout
        pending = list(plans)
        try:
            while time.monotonic() < deadline:
                in_flight = [t for t in self.tracked.values() if t.end is None]
                while pending and len(in_flight) < self.config.concurrency and not infra.temporal_down:
                    try:
                        in_flight.append(await self._start(client, billing, pending[0], markers))
                    except RPCError:
                        break  # Temporal is away (a restart): start it next round
                    pending.pop(0)
                await self._observe(client, killer.ledger, in_flight)
                await killer.replace_exited()
                # Random kills go on while planned points wait to be reached; the tail then runs out
                # undisturbed (each kill can cost a run a minute of activity timeouts).
                if not pending and not self._points_waiting(markers):
                    stop_chaos.set()
                chaos_over = all(task.done() for task in infra_tasks)
                others_done = all(t.end is not None for t in self.tracked.values() if not t.plan.operator)
                if not operator_done and not pending and chaos_over and others_done:
                    # Only runs waiting for an operator are left: the operator settles them.
                    await infra.settle_the_rest(client)
                    operator_done = True
                if not pending and chaos_over and all(t.end is not None for t in self.tracked.values()):
                    return
                await asyncio.sleep(0.25)
            for tracked in self.tracked.values():
                if tracked.end is None:
                    tracked.end = RunEnd("stuck", f"still going after the drill's {self.config.timeout:g}s")
        finally:
            stop_watch.set()
            stop_chaos.set()
            await asyncio.gather(*background)

    def _points_waiting(self, markers: Path) -> bool:
        """Is any armed point still to be reached by a run that goes on?"""
        return any(
            self.tracked[run_id].end is None for run_id, _ in still_armed(markers) if run_id in self.tracked
        )

    async def _start(
        self, client: Client, billing: BillingClient, plan: PlannedRun, markers: Path
    ) -> _Tracked:
        if plan.fault:
            await billing.set_account_fault(plan.account_id, plan.fault, delay_seconds=HANG_SECONDS, times=1)
        if plan.point and self.config.planned_kills:
            arm(markers, plan.run_id, plan.point, **plan.condition)
        handle = await start_run(
            client,
            AgentRunInput(agent=AGENT, tenant=TENANT, input=json.dumps({"order_id": plan.order_id})),
            run_id=plan.run_id,
            task_queue=TASK_QUEUE,
        )
        tracked = _Tracked(plan, handle)
        self.tracked[plan.run_id] = tracked
        return tracked

    async def _observe(self, client: Client, ledger: Ledger, in_flight: list[_Tracked]) -> None:
        for tracked in in_flight:
            try:
                tracked.end = await _run_end(client, ledger, tracked.handle)
            except (RPCError, LedgerUnavailableError):
                continue  # Temporal or the ledger busy or away: look again next round


async def _run_end(client: Client, ledger: Ledger, handle: RunHandle) -> RunEnd | None:
    """How the run ended, whether it waits with nobody left to settle its calls, or None (going on)."""
    described = await handle.describe()
    if described.status == WorkflowExecutionStatus.COMPLETED:
        return RunEnd("completed", result=await handle.result())
    if described.status != WorkflowExecutionStatus.RUNNING:
        try:
            await handle.result()
        except WorkflowFailureError as exc:
            return RunEnd("failed", f"{described.status.name if described.status else '?'}: {exc.cause}")
        return RunEnd("failed", f"closed as {described.status}")
    attributes = described.typed_search_attributes
    if attributes.get(PHASE) != Phase.AWAITING_RECONCILIATION.value:
        return None
    keys = attributes.get(UNRESOLVED_KEYS) or []
    for key in keys:
        record = await ledger.find(key)
        if record is None or not record.status.is_unresolved:
            return None  # settled: the run has been (or is about to be) told, and goes on
        reconciler = await client.get_workflow_handle(reconcile_workflow_id(key)).describe()
        if reconciler.status == WorkflowExecutionStatus.RUNNING:
            return None
    return RunEnd("waiting", "awaiting_reconciliation; reconcile gave up on " + ", ".join(keys))


async def run_drill(config: DrillConfig) -> DrillReport:
    """Run the whole drill and return its report (also written as JSON)."""
    return await Drill(config).run()
