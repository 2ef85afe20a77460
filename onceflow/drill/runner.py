"""The drill: start the processes, start the runs, kill workers, wait for every run, then check.

A run is *finished* for the drill when its workflow has closed, or when it is visibly waiting
(`awaiting_reconciliation`) on calls whose reconcilers have all given up: nobody will settle those
without an operator, so waiting longer proves nothing. A run the drill walks down a path (a
conflict or a reset, walks.py) is not finished before its walk is; its workflow is looked at in its
latest Temporal run, which after a reset is the reset's new run.
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

from onceflow.drill.gates import close_turn, leave_to_operator
from onceflow.drill.judge import RunEnd
from onceflow.drill.kills import Killer
from onceflow.drill.operator import OPERATOR_NAME, DrillOperator, walk_conflict
from onceflow.drill.points import arm, still_armed
from onceflow.drill.processes import NAMESPACE, TASK_QUEUE, DrillProcesses
from onceflow.drill.report import DrillReport, collect_report
from onceflow.drill.reserve import ReserveTrap
from onceflow.drill.resets import walk_reset
from onceflow.drill.scenario import (
    AGENTS_YAML,
    FIRST_CREDIT,
    HANG_SECONDS,
    RETRY_TURN,
    TENANT,
    DrillConfig,
    PlannedRun,
    RunPath,
    plan_runs,
)
from onceflow.drill.walks import Walk
from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, OperatorTokens
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
    walk: Walk | None = None
    walking: asyncio.Task[None] | None = None


@dataclass
class Drill:
    config: DrillConfig
    run_dir: Path = field(init=False)
    tracked: dict[str, _Tracked] = field(default_factory=dict)
    # Set once the processes are up: the walks act through these (operator.py).
    ledger: Ledger = field(init=False)
    operator: DrillOperator = field(init=False)

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
        )
        started = time.monotonic()
        try:
            await processes.start()
            settings = Settings(
                processes.temporal_address, NAMESPACE, TASK_QUEUE, processes.database_url, str(agents)
            )
            client = await connect(settings)
            ledger = self.ledger = await Ledger.connect(processes.database_url)
            _, token = await OperatorTokens(ledger).create(tenant=TENANT, operator=OPERATOR_NAME)
            self.operator = DrillOperator(processes.api_url, token)
            try:
                async with BillingClient(processes.billing_url) as billing:
                    plans = plan_runs(self.config.runs, self.config.seed, self.config.only)
                    killer = Killer(
                        processes, ledger, billing, markers, {p.run_id: p for p in plans}, started
                    )
                    await self._drive(client, billing, killer, plans, markers, started)
                    report = await collect_report(
                        config=self.config,
                        run_dir=self.run_dir,
                        plans=plans,
                        ends={run_id: t.end for run_id, t in self.tracked.items()},
                        walks={run_id: t.walk for run_id, t in self.tracked.items() if t.walk},
                        told=processes.told,
                        killer=killer,
                        client=client,
                        ledger=ledger,
                        billing=billing,
                        database_url=processes.database_url,
                        wall_seconds=time.monotonic() - started,
                    )
            finally:
                await self.operator.aclose()
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
        deadline = started + self.config.timeout
        pending = list(plans)
        try:
            while time.monotonic() < deadline:
                in_flight = [t for t in self.tracked.values() if t.end is None]
                while pending and len(in_flight) < self.config.concurrency:
                    plan = pending.pop(0)
                    in_flight.append(await self._start(client, billing, plan, markers))
                await self._observe(client, killer.ledger, in_flight)
                await killer.replace_exited()
                # Random kills go on while planned points wait to be reached (walks started by then
                # have met them too); the tail then runs out undisturbed (each kill can cost a run a
                # minute of activity timeouts).
                if not pending and not self._points_waiting(markers):
                    stop_chaos.set()
                if not pending and all(t.end is not None for t in self.tracked.values()):
                    return
                await asyncio.sleep(0.25)
            for tracked in self.tracked.values():
                if tracked.end is None:
                    tracked.end = RunEnd("stuck", f"still going after the drill's {self.config.timeout:g}s")
        finally:
            stop_watch.set()
            stop_chaos.set()
            await asyncio.gather(*background)
            walking = [t.walking for t in self.tracked.values() if t.walking and not t.walking.done()]
            for task in walking:
                task.cancel()
            await asyncio.gather(*walking, return_exceptions=True)

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
        if plan.path is RunPath.CONFLICT:
            leave_to_operator(markers, plan.run_id, FIRST_CREDIT)
            close_turn(markers, plan.run_id, RETRY_TURN)
        handle = await start_run(
            client,
            AgentRunInput(agent=plan.agent, tenant=TENANT, input=json.dumps({"order_id": plan.order_id})),
            run_id=plan.run_id,
            task_queue=TASK_QUEUE,
        )
        tracked = _Tracked(plan, handle)
        if plan.path is not None:
            tracked.walk = Walk(plan.run_id, plan.path.value)
            if plan.path is RunPath.CONFLICT:
                walking = walk_conflict(
                    plan,
                    tracked.walk,
                    ledger=self.ledger,
                    billing=billing,
                    operator=self.operator,
                    client=client,
                    markers=markers,
                )
            else:
                walking = walk_reset(plan, tracked.walk, client=client, billing=billing)
            tracked.walking = asyncio.create_task(walking, name=f"walk-{plan.run_id}")
        self.tracked[plan.run_id] = tracked
        return tracked

    async def _observe(self, client: Client, ledger: Ledger, in_flight: list[_Tracked]) -> None:
        for tracked in in_flight:
            if tracked.walk is not None and not tracked.walk.done:
                continue  # the drill is still acting on it
            try:
                tracked.end = await _run_end(client, ledger, tracked.handle)
            except RPCError:
                continue  # Temporal busy: look again next round


async def _run_end(client: Client, ledger: Ledger, handle: RunHandle) -> RunEnd | None:
    """How the run ended, whether it waits with nobody left to settle its calls, or None (going on).
    Always the workflow's latest Temporal run (a reset's new run, for a run that was reset)."""
    described = await client.get_workflow_handle(handle.id).describe()
    latest = client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id, run_id=described.run_id)
    if described.status == WorkflowExecutionStatus.COMPLETED:
        return RunEnd("completed", result=await latest.result(), temporal_run_id=described.run_id)
    if described.status != WorkflowExecutionStatus.RUNNING:
        try:
            await latest.result(follow_runs=False)
        except WorkflowFailureError as exc:
            return RunEnd(
                "failed",
                f"{described.status.name if described.status else '?'}: {exc.cause}",
                temporal_run_id=described.run_id,
            )
        return RunEnd("failed", f"closed as {described.status}", temporal_run_id=described.run_id)
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
    return RunEnd(
        "waiting",
        "awaiting_reconciliation; reconcile gave up on " + ", ".join(keys),
        temporal_run_id=described.run_id,
    )


async def run_drill(config: DrillConfig) -> DrillReport:
    """Run the whole drill and return its report (also written as JSON)."""
    return await Drill(config).run()
