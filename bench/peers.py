"""Against the peers, one run, one machine: the same one-write step five ways, side by side.

The same request (POST /credits with an Idempotency-Key to the example billing service) sent as the
one write of: onceflow's write call; a Pydantic AI tool under Temporal durability; an OpenAI Agents
`activity_as_tool`; a DBOS step; a plain Temporal activity (bench/peers_common.py says how each is
built). One dev stack: the Temporal dev server, one embedded PostgreSQL (the ledger's database and
DBOS's, side by side), the billing service. Every system's worker, and DBOS, run in one worker
process (bench/peers_worker.py); this process only starts runs and reads results.

Rounds interleave the systems (the order turns by one each round), a few calls each, one call at a
time. Printed per system:
- the write step's latency, p50 and p95 with 95% bootstrap intervals: for the Temporal-hosted ways
  the write activity's ActivityTaskScheduled -> ActivityTaskCompleted from history (the result is
  durable then); for DBOS the step as its workflow times it (the step's output is recorded then);
- the run, start to result, as a client sees it (DBOS's started in the worker process, in-process);
- CPU time per call of each process: the worker process, the Temporal server, PostgreSQL (the
  postmaster and its backends), the billing service; measured around each system's calls (the
  histories are read afterwards, outside the measured time), less what each process spends idle
  (measured first, --idle-seconds) over the time those calls took.
Then onceflow against the plain activity, beside the two commits it needs (the bare pair of
bench/instructions.py: a plain INSERT ... ON CONFLICT and an UPDATE on a table like the ledger's,
each committed, sent bare on one connection): goal, onceflow's extra latency at most the two commits
plus 0.5 ms, and its extra CPU at most the two commits' plus 0.5 ms.
Last, with `--writes N` (default 5; 1 skips it), the same rounds again for onceflow and the plain
activity only, each with runs of one write and of N: what one more write call in a run costs, per
process, apart from what its run costs once (the hosting workflow's start, its search attributes),
with a bootstrap interval over rounds (bench/peers_report.py prints it).

    .venv/bin/python bench/peers.py [--rounds 20] [--per-round 5] [--warmup 3] [--writes 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import psutil
from e2e_stack import (  # bench/e2e_stack.py, beside this file
    PlainCreditInput,
    PlainCreditWorkflow,
    activity_latency,
    dev_stack,
)
from instructions import BARE_TABLES, bare_cycle  # bench/instructions.py
from peers_common import WRITE_ACTIVITY, prompt
from peers_onceflow import OnceflowCreditWorkflow
from peers_openai_agents import CreditModel, OpenAIAgentsCreditWorkflow
from peers_pydantic_ai import PydanticAICreditWorkflow
from peers_report import (
    PROCESSES,
    SYSTEMS,
    Figures,
    Shapes,
    report,
    report_per_write,
)
from peers_worker import TASK_QUEUES
from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.openai_agents import OpenAIAgentsPlugin
from temporalio.openai_agents.testing import TestModelProvider

from onceflow.examples.billing.client import BillingClient
from onceflow.local.postgres import create_database
from onceflow.runtime.client import connect
from onceflow.runtime.config import Settings

# CPU seconds per second each process spends with nothing to do (pollers, timers, DBOS's queue
# thread), measured before the rounds and taken off each system's CPU for the time its calls took:
# otherwise a way whose runs take longer would be charged more of everyone's background work.
IDLE: dict[str, float] = dict.fromkeys(PROCESSES, 0.0)


class Cpu:
    """CPU seconds (user + system) of each measured process, its children included."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._processes = {name: psutil.Process(pid) for name, pid in pids.items()}

    def read(self) -> dict[str, float]:
        found = {}
        for name, process in self._processes.items():
            total = 0.0
            for each in [process, *process.children(recursive=True)]:
                try:
                    times = each.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                total += times.user + times.system
            found[name] = total
        return found


async def temporal_call(
    client: Client, pai_client: Client, agents_client: Client, system: str, n: int, writes: int = 1
) -> WorkflowHandle[Any, Any]:
    """Start one run of `system`; onceflow's and the plain activity's make `writes` write calls."""
    account = f"acct_peers_{system}_{n}"
    run_id = f"peers-{system}-{n}-{time.time_ns()}"
    queue = TASK_QUEUES[system]
    if system == "onceflow":
        handle = await client.start_workflow(
            OnceflowCreditWorkflow.run, args=[prompt(account), writes], id=run_id, task_queue=queue
        )
    elif system == "plain":
        request = PlainCreditInput(
            account_id=account, amount_cents=500, idempotency_key=f"{run_id}:call_credit", writes=writes
        )
        handle = await client.start_workflow(PlainCreditWorkflow.run, request, id=run_id, task_queue=queue)
    elif system == "pydantic-ai":
        handle = await pai_client.start_workflow(
            PydanticAICreditWorkflow.run, prompt(account), id=run_id, task_queue=queue
        )
    else:
        handle = await agents_client.start_workflow(
            OpenAIAgentsCreditWorkflow.run, prompt(account), id=run_id, task_queue=queue
        )
    return handle


async def write_step_ms(handle: WorkflowHandle[Any, Any], system: str) -> float:
    if system in WRITE_ACTIVITY:
        return await activity_latency(handle, WRITE_ACTIVITY[system])
    # Pydantic AI: its tool-call activity (the model requests are activities of their own).
    history = await handle.fetch_history()
    names = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    tools = [name for name in names.values() if "tool" in name]
    if len(set(tools)) != 1:
        raise RuntimeError(f"{handle.id}: cannot tell its tool activity among {sorted(set(names.values()))}")
    return await activity_latency(handle, tools[0])


class Worker:
    """The worker process and its line protocol."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log

    async def line(self) -> str:
        assert self.process.stdout is not None
        text = (await self.process.stdout.readline()).decode().strip()
        if not text:
            raise RuntimeError(f"the worker process ended: {self.log.read_text()[-3000:]}")
        return text

    async def dbos(self, count: int, first: int) -> list[dict[str, float]]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"dbos {count} {first}\n".encode())
        await self.process.stdin.drain()
        samples: list[dict[str, float]] = json.loads(await self.line())
        return samples


async def one_system(
    system: str,
    count: int,
    first: int,
    clients: tuple[Client, Client, Client],
    worker: Worker,
    cpu: Cpu,
    into: Figures,
) -> None:
    before, began = cpu.read(), time.perf_counter()
    if system == "dbos":
        samples = await worker.dbos(count, first)
        after = cpu.read()
        into.step_ms += [s["step_ms"] for s in samples]
        into.run_ms += [s["run_ms"] for s in samples]
    else:
        handles = []
        for n in range(first, first + count):
            begun = time.perf_counter()
            handle = await temporal_call(*clients, system, n)
            await handle.result()
            into.run_ms.append((time.perf_counter() - begun) * 1000)
            handles.append(handle)
        after = cpu.read()
        for handle in handles:  # outside the measured time: reading histories costs Temporal CPU
            into.step_ms.append(await write_step_ms(handle, system))
    took = time.perf_counter() - began
    for name in PROCESSES:
        into.cpu[name] += after[name] - before[name] - IDLE[name] * took
    into.seconds += took
    into.calls += count


async def runs_cpu(
    system: str, writes: int, count: int, first: int, clients: tuple[Client, Client, Client], cpu: Cpu
) -> dict[str, float]:
    """CPU seconds per run of each process, idle taken off, over `count` runs of `writes` writes."""
    before, began = cpu.read(), time.perf_counter()
    for n in range(first, first + count):
        handle = await temporal_call(*clients, system, n, writes)
        await handle.result()
    after, took = cpu.read(), time.perf_counter() - began
    return {name: (after[name] - before[name] - IDLE[name] * took) / count for name in PROCESSES}


async def idle_rates(cpu: Cpu, seconds: float) -> dict[str, float]:
    before, began = cpu.read(), time.perf_counter()
    await asyncio.sleep(seconds)
    after, took = cpu.read(), time.perf_counter() - began
    return {name: (after[name] - before[name]) / took for name in PROCESSES}


async def bare_pairs(dsn: str, count: int, cpu: Cpu) -> tuple[list[float], float]:
    """The two commits alone: the bare pair, timed one by one; and its CPU (this process's and
    PostgreSQL's) per pair."""
    conn = await asyncpg.connect(dsn)
    try:
        cycle = bare_cycle(conn, "bare")
        for n in range(10):  # statements prepared
            await cycle(-1 - n)
        times = []
        before, mine, began = cpu.read()["postgres"], time.process_time(), time.perf_counter()
        for n in range(count):
            begun = time.perf_counter()
            await cycle(n)
            times.append((time.perf_counter() - begun) * 1000)
        idle = IDLE["postgres"] * (time.perf_counter() - began)
        used = cpu.read()["postgres"] - before - idle + time.process_time() - mine
        return times, used / count * 1000
    finally:
        await conn.close()


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="onceflow-peers-") as tmp:
        stack = dev_stack(Path(tmp) / "stack")
        worker_process = None
        try:
            info = await stack.start()
            os.environ.update(info.environment())
            admin = stack._postgres.dsn  # type: ignore[union-attr]  # the bench owns this stack
            dbos_dsn = await create_database(admin, "dbos_peers")
            conn = await asyncpg.connect(info.database_url)
            try:
                for statement in BARE_TABLES:
                    await conn.execute(statement)
            finally:
                await conn.close()
            log_path = Path(tmp) / "worker.log"
            log = log_path.open("wb")
            worker_process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(Path(__file__).with_name("peers_worker.py")),
                *("--temporal", info.temporal_address, "--namespace", info.namespace),
                *("--database", info.database_url, "--dbos", dbos_dsn),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )
            worker = Worker(worker_process, log_path)
            if await worker.line() != "ready":
                raise RuntimeError("the worker process did not start")
            pids = {name: process.pid for name, process in stack._processes}  # type: ignore[attr-defined]
            cpu = Cpu(
                {
                    "worker": worker_process.pid,
                    "temporal": pids["temporal"],
                    "postgres": stack._postgres.pid,  # type: ignore[union-attr,dict-item]
                    "billing": pids["billing"],
                }
            )
            settings = Settings(
                temporal_address=info.temporal_address,
                temporal_namespace=info.namespace,
                task_queue=TASK_QUEUES["plain"],
                database_url=info.database_url,
                agents_path="bench/peers.py",
            )
            client = await connect(settings)
            pai_client = await Client.connect(
                info.temporal_address, namespace=info.namespace, plugins=[PydanticAIPlugin()]
            )
            agents_client = await Client.connect(
                info.temporal_address,
                namespace=info.namespace,
                plugins=[OpenAIAgentsPlugin(model_provider=TestModelProvider(CreditModel()))],
            )
            async with BillingClient(info.billing_url) as billing:
                await billing.clear_faults()
                applied_before = (await billing.effects()).total
            warm = {s: Figures() for s in SYSTEMS}
            n = 0
            for system in SYSTEMS:
                await one_system(
                    system, args.warmup, n, (client, pai_client, agents_client), worker, cpu, warm[system]
                )
                n += args.warmup
            IDLE.update(await idle_rates(cpu, args.idle_seconds))
            print(
                "idle CPU, ms a second (taken off each system's CPU for the time its calls took): "
                + ", ".join(f"{name} {rate * 1000:.1f}" for name, rate in IDLE.items())
            )
            figures = {s: Figures() for s in SYSTEMS}
            credits = n + args.rounds * args.per_round * len(SYSTEMS)  # one write a run, until --writes
            print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            for round_ in range(args.rounds):
                turn = round_ % len(SYSTEMS)
                for system in SYSTEMS[turn:] + SYSTEMS[:turn]:
                    await one_system(
                        system,
                        args.per_round,
                        n,
                        (client, pai_client, agents_client),
                        worker,
                        cpu,
                        figures[system],
                    )
                    n += args.per_round
            shapes: Shapes = {}
            if args.writes > 1:  # the same rounds again: runs of one write and of --writes, both ways
                kinds = [(system, w) for system in ("onceflow", "plain") for w in (1, args.writes)]
                shapes = {kind: [] for kind in kinds}
                clients = (client, pai_client, agents_client)
                for kind in kinds:  # the longer runs' first calls, not counted
                    await runs_cpu(*kind, 1, n, clients, cpu)
                    n, credits = n + 1, credits + kind[1]
                for round_ in range(args.rounds):
                    turn = round_ % len(kinds)
                    for kind in kinds[turn:] + kinds[:turn]:
                        shapes[kind].append(await runs_cpu(*kind, args.per_round, n, clients, cpu))
                        n, credits = n + args.per_round, credits + args.per_round * kind[1]
            pairs, pair_cpu = await bare_pairs(info.database_url, args.rounds * args.per_round, cpu)
            print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            async with BillingClient(info.billing_url) as billing:
                effects = await billing.effects()
            if effects.total - applied_before != credits or any(c != 1 for c in effects.effects.values()):
                raise RuntimeError(
                    f"billing applied {effects.total - applied_before} credits for {credits} calls"
                )
            print(
                f"{args.rounds} rounds of {args.per_round} calls per system, order turning, after"
                f" {args.warmup} warm-up calls each; {credits} credits applied, each key once;"
                f" Python {platform.python_version()}; {os.cpu_count()} CPUs; {platform.platform()}"
            )
            report(figures, pairs, pair_cpu)
            if shapes:
                report_per_write(shapes, args.writes, pair_cpu)
        finally:
            if worker_process is not None and worker_process.returncode is None:
                assert worker_process.stdin is not None
                worker_process.stdin.write(b"stop\n")
                try:
                    await asyncio.wait_for(worker_process.wait(), 30)
                except TimeoutError:
                    worker_process.kill()
            await stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=5, help="calls per system in a round")
    parser.add_argument("--warmup", type=int, default=3, help="calls per system first, not counted")
    parser.add_argument(
        "--writes",
        type=int,
        default=5,
        help="then the same rounds of onceflow and the plain activity with runs of 1 and of this many"
        " writes, to tell a write call's CPU from its run's (1: not measured)",
    )
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="how long idle CPU is measured")
    args = parser.parse_args()
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
