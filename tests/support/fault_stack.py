"""Real processes for the infrastructure fault tests (tests/test_faults_infrastructure.py,
tests/test_faults_workers.py): `python worker.py` workers on a fresh task queue, the runs they are
given, and the check that every run completed with each key sent and applied once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest
from temporalio.client import Client

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, Status, ToolExecutionRecord
from onceflow.runtime.client import start_run
from onceflow.sdk.payloads import AgentRunInput, AgentRunResult
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.billing_tools import PROCESS_AGENTS_YAML
from tests.support.fault_runs import RunHandle, new_order
from tests.support.processes import ChildProcesses
from tests.support.proxy import DroppingProxy

# Enough for a killed attempt's activity timeout (tool 2 s + 5 s), a dead worker's sticky workflow
# task timing out (10 s), a fresh worker starting, and reconciling.
RUN_TIMEOUT = 60


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ChildProcesses]:
    children = ChildProcesses(tmp_path / "logs")
    yield children
    children.close()


@dataclass
class Stack:
    """One test's workers on a fresh task queue, its Temporal client and its view of the world."""

    client: Client
    billing: BillingClient
    proxy: DroppingProxy
    processes: ChildProcesses
    env: dict[str, str]
    runs: list[tuple[RunHandle, str]] = field(default_factory=list)
    _workers: int = 0

    def start_worker(self) -> subprocess.Popen[bytes]:
        self._workers += 1
        return self.processes.start(f"worker-{self._workers}", ["worker.py"], self.env)

    async def start_run(self, order: str | None = None) -> tuple[RunHandle, str]:
        order = order or new_order()
        handle = await start_run(
            self.client,
            AgentRunInput(agent="credit-billing", tenant="acme", input=json.dumps({"order_id": order})),
            run_id=f"run-{uuid.uuid4().hex[:12]}",
            task_queue=self.env["ONCEFLOW_TASK_QUEUE"],
        )
        run = (handle, f"{handle.id}:call_1_0")
        self.runs.append(run)
        return run

    async def wait_for(self, check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30) -> None:
        async def poll() -> None:
            while not await check():
                await asyncio.sleep(0.05)

        try:
            await asyncio.wait_for(poll(), timeout)
        except TimeoutError:
            pytest.fail(f"gave up after {timeout}s waiting for {what}\n{self.processes.logs_text()}")

    async def results(self, client: Client | None = None) -> list[AgentRunResult]:
        """Every run's result, through `client` (default: the stack's own)."""
        client = client or self.client

        async def one(handle: RunHandle) -> AgentRunResult:
            again = client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id)
            try:
                return await asyncio.wait_for(again.result(), RUN_TIMEOUT)
            except TimeoutError:
                status = await again.query(AgentRunWorkflow.status)
                pytest.fail(f"run {handle.id} did not finish: {status}\n{self.processes.logs_text()}")

        return list(await asyncio.gather(*(one(h) for h, _ in self.runs)))

    async def effects(self) -> dict[str, int]:
        counted = await self.billing.effects()
        return {key: counted.count(key) for _, key in self.runs}

    async def sends(self) -> dict[str, int]:
        """Credit requests billing received per run's key, counted on arrival (before anything else)."""
        received = await self.billing.received_counts()
        return {key: received.count(key) for _, key in self.runs}


def worker_env(*, temporal: Client, database_url: str, billing_url: str, tmp_path: Path) -> dict[str, str]:
    agents = tmp_path / "agents.yaml"
    agents.write_text(PROCESS_AGENTS_YAML)
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": temporal.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": temporal.namespace,
        "ONCEFLOW_TASK_QUEUE": f"tq-{uuid.uuid4().hex[:10]}",
        "ONCEFLOW_DATABASE_URL": database_url,
        "ONCEFLOW_AGENTS": str(agents),
        "ONCEFLOW_BILLING_URL": billing_url,
    }


async def ledger_keys(database_url: str, run_ids: list[str]) -> list[str]:
    """Every ledger row these runs have, straight from the table: one per write call, no more."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT key FROM tool_executions WHERE run_id = ANY($1::text[]) ORDER BY key", run_ids
        )
    finally:
        await conn.close()
    return [r["key"] for r in rows]


async def check_every_run_completed_once(
    stack: Stack, ledger: Ledger, database_url: str, results: list[AgentRunResult]
) -> dict[str, ToolExecutionRecord]:
    """One row per call, each key sent once and applied once, the ledger's result is the service's
    credit, the run saw it."""
    keys = [key for _, key in stack.runs]
    assert await ledger_keys(database_url, [h.id for h, _ in stack.runs]) == sorted(keys)
    assert await stack.sends() == dict.fromkeys(keys, 1)
    assert await stack.effects() == dict.fromkeys(keys, 1)
    records = {}
    for (_, key), result in zip(stack.runs, results, strict=True):
        record = await ledger.get(key)
        credit = await stack.billing.find_credit(key)
        assert record.status is Status.COMPLETED, record
        assert credit is not None and record.result == credit
        assert credit["credit_id"] in result.final
        assert [c.status for c in result.calls] == ["ok", "completed"]
        records[key] = record
    return records


def transitions(record: ToolExecutionRecord) -> list[Status]:
    return [e.to_status for e in record.events if e.to_status]
