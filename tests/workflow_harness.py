"""A worker per test on a fresh task queue, over the session's real Temporal and a fresh ledger."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from onceflow.ledger import Ledger
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.client import start_run
from onceflow.runtime.worker import build_worker
from onceflow.sdk.payloads import AgentRunInput, AgentRunResult
from onceflow.workflows.agent_run import AgentRunWorkflow


@dataclass
class Harness:
    client: Client
    ledger: Ledger
    task_queue: str
    worker: Worker

    async def start(
        self,
        agent: str,
        payload: str,
        *,
        tenant: str = "acme",
        run_id: str | None = None,
        max_turns: int = 20,
    ) -> WorkflowHandle[AgentRunWorkflow, AgentRunResult]:
        return await start_run(
            self.client,
            AgentRunInput(agent=agent, tenant=tenant, input=payload, max_turns=max_turns),
            run_id=run_id or f"run-{uuid.uuid4().hex[:10]}",
            task_queue=self.task_queue,
        )


@asynccontextmanager
async def running_worker(
    client: Client, ledger: Ledger, registry: AgentRegistry, **kw: Any
) -> AsyncIterator[Harness]:
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    worker = build_worker(client, ledger, registry, task_queue=task_queue, **kw)
    async with worker:
        yield Harness(client=client, ledger=ledger, task_queue=task_queue, worker=worker)
