"""The receiver drill: runs against a receiver whose only dedup is onceflow's receiver kit, with the
workers AND the receiver SIGKILLed at random, and every unknown call left to the kit to settle.

Each run makes one credit through the drill's `kit_toolset` (its receiver declared in one line:
`receiver=kit_receiver(...)`, no reconcile hook). Billing runs with its dedup on, which since it is
built on the kit (examples/billing) is the kit's key store and nothing else: its credits table has
no unique key. Answers are lost on purpose (billing applies then hangs, applies then drops the
connection, or holds the request past the tool's timeout), and kills strike at random: a worker
(now and then both), or billing itself, restarted a moment later on the same database.

Then the drill counts, from billing's own tables and the ledger: effects per key (goal: none twice),
whether each settled call agrees with billing (completed: one credit, failed: none), and the unknown
calls: how many were made, how many the kit settled (the reconciler's lookup and fence), how many
anyone else settled, and how many are left (goal: none, nobody needed). See report in kit_report.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError

from onceflow.drill.kit_report import KitDrillReport, KitRunEnd, collect_kit_report
from onceflow.drill.processes import NAMESPACE, TASK_QUEUE, DrillProcesses
from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger
from onceflow.runtime.client import connect, start_run
from onceflow.runtime.config import Settings
from onceflow.sdk.payloads import AgentRunInput

log = logging.getLogger("onceflow.drill")

AGENT = "drill-kit-credit"
TENANT = "drill-kit"
CREDIT_CALL = "call_0_0"
HANG_SECONDS = 20.0  # far past the tool's timeout (3 s): only the timeout or a kill ends the wait
SLOW_SECONDS = 5.0  # held inside billing's keyed transaction, past the tool's timeout

AGENTS_YAML = f"""\
toolsets:
  drill-kit: onceflow.drill.tools:kit_toolset
agents:
  {AGENT}:
    model:
      provider: scripted
      script:
        - tool_calls:
            - name: issue_credit
              arguments: {{account_id: "{{{{ input.account_id }}}}", amount_cents: "{{{{ input.amount_cents }}}}"}}
        - final: "credit: {{{{ results.issue_credit }}}}"
    instructions: Credit the account the amount asked for.
    toolsets: [drill-kit]
    tool_policy:
      on_indeterminate: pause
      reconcile_deadline: 15m
      reconcile_initial_interval: 0.5s
      reconcile_max_interval: 2s
"""

# Billing faults that lose the answer after (or while) the credit is applied; None: none.
FAULTS = ("apply_then_hang", "drop", "slow", None, None)


@dataclass(frozen=True)
class KitDrillConfig:
    runs: int = 200
    seed: int = 1
    data_dir: Path = Path(".onceflow/drills")
    report: Path | None = None
    workers: int = 2
    concurrency: int = 8
    worker_kill_interval: tuple[float, float] = (3.0, 9.0)
    receiver_kill_interval: tuple[float, float] = (6.0, 15.0)
    receiver_down: tuple[float, float] = (0.5, 3.0)  # how long billing stays dead before its restart
    timeout: float = 1800.0

    def run_dir(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return self.data_dir.resolve() / f"{stamp}-receiver-seed{self.seed}-runs{self.runs}"


@dataclass
class KitPlan:
    index: int
    run_id: str
    account_id: str
    amount_cents: int
    fault: str | None

    @property
    def key(self) -> str:
        return f"{self.run_id}:{CREDIT_CALL}"


def plan_kit_runs(runs: int, seed: int) -> list[KitPlan]:
    rng = random.Random(seed)
    return [
        KitPlan(
            i, f"kit-{seed}-{i:04d}", f"acct_k{seed}n{i}", 1000 + rng.randrange(9000), FAULTS[i % len(FAULTS)]
        )
        for i in range(runs)
    ]


@dataclass
class KitDrill:
    config: KitDrillConfig
    run_dir: Path = field(init=False)
    ends: dict[str, KitRunEnd] = field(default_factory=dict)
    worker_kills: int = 0
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.run_dir = self.config.run_dir()

    async def run(self) -> KitDrillReport:
        self.run_dir.mkdir(parents=True)
        agents = self.run_dir / "agents.yaml"
        agents.write_text(AGENTS_YAML)
        markers = self.run_dir / "markers"  # unused by this drill's tools; the processes want one
        markers.mkdir()
        processes = DrillProcesses(self.run_dir, agents, markers, self.config.workers, receiver_kit=True)
        started = time.monotonic()
        try:
            await processes.start()
            settings = Settings(
                processes.temporal_address, NAMESPACE, TASK_QUEUE, processes.database_url, str(agents)
            )
            client = await connect(settings)
            ledger = await Ledger.connect(processes.database_url)
            try:
                plans = plan_kit_runs(self.config.runs, self.config.seed)
                await self._drive(client, processes, plans, started)
                async with BillingClient(processes.billing_url) as billing:
                    report = await collect_kit_report(
                        config=self.config,
                        run_dir=self.run_dir,
                        plans=plans,
                        ends=self.ends,
                        ledger=ledger,
                        database_url=processes.database_url,
                        billing=billing,
                        worker_kills=self.worker_kills,
                        receiver_kills=processes.billing_kills,
                        notes=self.notes,
                        wall_seconds=time.monotonic() - started,
                    )
            finally:
                await ledger.close()
        finally:
            await processes.stop()
        return report

    async def _drive(
        self, client: Client, processes: DrillProcesses, plans: list[KitPlan], started: float
    ) -> None:
        rng = random.Random(self.config.seed + 1)
        stop = asyncio.Event()
        lock = asyncio.Lock()  # one kill at a time, and no run started while billing is down
        chaos = [
            asyncio.create_task(self._kill_workers(processes, rng, stop, lock)),
            asyncio.create_task(self._kill_receiver(processes, rng, stop, lock)),
        ]
        handles: dict[str, WorkflowHandle[object, object]] = {}
        pending = list(plans)
        deadline = started + self.config.timeout
        try:
            async with BillingClient(processes.billing_url, timeout=5) as billing:
                while time.monotonic() < deadline:
                    in_flight = [run_id for run_id in handles if run_id not in self.ends]
                    while pending and len(in_flight) < self.config.concurrency:
                        plan = pending.pop(0)
                        async with lock:
                            handles[plan.run_id] = await self._start(client, billing, plan)
                        in_flight.append(plan.run_id)
                    if not pending:
                        stop.set()  # the tail runs out undisturbed
                    for run_id in in_flight:
                        end = await _run_end(handles[run_id])
                        if end is not None:
                            self.ends[run_id] = end
                    await self._replace_exited(processes, lock)
                    if not pending and len(self.ends) == len(plans):
                        return
                    await asyncio.sleep(0.25)
            for plan in plans:
                self.ends.setdefault(
                    plan.run_id, KitRunEnd("stuck", f"still going after {self.config.timeout:g}s")
                )
        finally:
            stop.set()
            await asyncio.gather(*chaos)

    async def _start(
        self, client: Client, billing: BillingClient, plan: KitPlan
    ) -> WorkflowHandle[object, object]:
        if plan.fault:
            delay = SLOW_SECONDS if plan.fault == "slow" else HANG_SECONDS
            try:
                await billing.set_account_fault(plan.account_id, plan.fault, delay_seconds=delay, times=1)
            except Exception as exc:  # billing just died: this run goes without its fault
                self.notes.append(f"{plan.run_id}: fault {plan.fault} not set ({type(exc).__name__})")
        payload = json.dumps({"account_id": plan.account_id, "amount_cents": plan.amount_cents})
        handle = await start_run(
            client,
            AgentRunInput(agent=AGENT, tenant=TENANT, input=payload),
            run_id=plan.run_id,
            task_queue=TASK_QUEUE,
        )
        return handle  # type: ignore[return-value]

    async def _kill_workers(
        self, processes: DrillProcesses, rng: random.Random, stop: asyncio.Event, lock: asyncio.Lock
    ) -> None:
        while not await _wait(stop, rng.uniform(*self.config.worker_kill_interval)):
            slots = processes.slots if rng.random() < 0.15 else [rng.choice(processes.slots)]
            async with lock:
                for slot in slots:
                    if await processes.kill_worker(slot) is not None:
                        self.worker_kills += 1
                    processes.start_worker(slot)

    async def _kill_receiver(
        self, processes: DrillProcesses, rng: random.Random, stop: asyncio.Event, lock: asyncio.Lock
    ) -> None:
        while not await _wait(stop, rng.uniform(*self.config.receiver_kill_interval)):
            async with lock:
                await processes.kill_billing()
                await asyncio.sleep(rng.uniform(*self.config.receiver_down))
                await processes.restart_billing()

    async def _replace_exited(self, processes: DrillProcesses, lock: asyncio.Lock) -> None:
        async with lock:
            for slot in processes.slots:
                if slot.process is not None and slot.process.poll() is not None:
                    self.notes.append(
                        f"{slot.name}-{slot.incarnation} exited on its own ({slot.process.returncode})"
                    )
                    processes.start_worker(slot)


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`, or less if `stop` is set; True when it was."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def _run_end(handle: WorkflowHandle[object, object]) -> KitRunEnd | None:
    try:
        described = await handle.describe()
    except RPCError:
        return None
    if described.status == WorkflowExecutionStatus.RUNNING:
        return None
    try:
        await handle.result()
    except WorkflowFailureError as exc:
        return KitRunEnd("failed", str(exc.cause))
    return KitRunEnd("completed")


async def run_kit_drill(config: KitDrillConfig) -> KitDrillReport:
    """Run the receiver drill and return its report."""
    return await KitDrill(config).run()


def run_kit_drill_from_cli(config: KitDrillConfig) -> int:
    """Run it, print what it found, write the JSON report; the exit code says pass (0) or fail."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(
        f"receiver drill: {config.runs} runs, seed {config.seed}, {config.workers} workers, "
        f"{config.concurrency} in flight; workers and the receiver killed at random",
        flush=True,
    )
    report = asyncio.run(run_kit_drill(config))
    path = config.report or Path(report.run_dir) / "report.json"
    report.write(path)
    print(report.text())
    print(f"JSON report: {path}", flush=True)
    return 0 if report.ok else 1
