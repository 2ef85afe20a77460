"""Pydantic AI and the OpenAI Agents SDK on Temporal with onceflow's writes, in real worker processes: a worker SIGKILLed while
its write tool waits for the billing service (which applied the credit and honours no key). The next
worker finds the call lost, the ledger calls it unknown, the run pauses; an operator settles it
through the operator API and the run finishes. One credit request arrived, one effect."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import PHASE, UNRESOLVED_KEYS
from tests.support.openai_agents_process import OPENAI_PROCESS_WRITES
from tests.support.openai_agents_workflow import OpenAIProcessWorkflow
from tests.support.operator_api import serving_api
from tests.support.processes import ChildProcesses
from tests.support.pydantic_ai_agents import AdapterRunInput
from tests.support.pydantic_ai_process import PROCESS_WRITES
from tests.support.pydantic_ai_workflow import PydanticProcessWorkflow
from tests.support.waiting import eventually


async def until(processes: ChildProcesses, check: Callable[[], Awaitable[bool]], what: str) -> None:
    try:
        await eventually(check, what, timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{processes.logs_text()}") from None


@pytest.fixture
async def processes(tmp_path: Path) -> AsyncIterator[ChildProcesses]:
    started = ChildProcesses(tmp_path / "logs")
    try:
        yield started
    finally:
        started.close()


FRAMEWORKS = {
    "pydantic-ai": ("tests.support.pydantic_ai_process", PydanticProcessWorkflow, PROCESS_WRITES),
    "openai-agents": ("tests.support.openai_agents_process", OpenAIProcessWorkflow, OPENAI_PROCESS_WRITES),
}


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
async def test_a_worker_killed_mid_write_pauses_the_run_until_an_operator_resolves_it_over_the_api(
    framework: str,
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    database_url: str,
    billing_url: str,
    processes: ChildProcesses,
) -> None:
    client = temporal_env.client
    account = f"acct_{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": client.namespace,
        "ONCEFLOW_TASK_QUEUE": f"tq-{uuid.uuid4().hex[:10]}",
        "ONCEFLOW_DATABASE_URL": database_url,
        "ONCEFLOW_BILLING_URL": billing_url,
    }
    module, workflow_class, writes = FRAMEWORKS[framework]
    worker_args = ["-m", module]
    async with BillingClient(billing_url) as billing:
        await billing.set_account_fault(account, "apply_then_hang", delay_seconds=30, times=1)
        first = processes.start("worker-1", worker_args, env)
        script = [
            [{"tool": "credit_account", "args": {"account_id": account, "amount_cents": 700}, "id": "w1"}]
        ]
        handle = await client.start_workflow(
            workflow_class.__name__,
            AdapterRunInput(tenant="acme", script=script),
            id=f"pai-proc-{uuid.uuid4().hex[:10]}",
            task_queue=env["ONCEFLOW_TASK_QUEUE"],
        )
        key = f"{handle.id}:w1"

        async def applied() -> bool:
            return (await billing.effects()).count(key) == 1

        await until(processes, applied, "billing to apply the credit")
        processes.kill(first)
        assert (await ledger.get(key, with_events=False)).status is Status.STARTED
        processes.start("worker-2", worker_args, env)

        async def paused() -> bool:
            attributes = (await handle.describe()).typed_search_attributes
            return attributes.get(PHASE) == "awaiting_reconciliation" and key in (
                attributes.get(UNRESOLVED_KEYS) or []
            )

        await until(processes, paused, "the run to pause on the unknown call")
        assert (await ledger.get(key, with_events=False)).status is Status.INDETERMINATE

        registry = writes.register(AgentRegistry({}))
        async with serving_api(client, ledger, registry) as api, await api.as_operator() as operator:
            listed = (await operator.get("/v1/tool-executions")).json()
            assert key in [item["key"] for item in listed["items"]]
            credit = await billing.find_credit(key)
            answer = await operator.post(
                f"/v1/tool-executions/{key}/resolve",
                json={"status": "completed", "reason": "billing shows the credit", "result": credit},
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["run_signalled"] is True
            result = await asyncio.wait_for(handle.result(), 60)

        record = await ledger.get(key)
        assert record.status is Status.COMPLETED and record.settled_by == "operator:alice"
        assert (await billing.received(key)).received == 1
        assert (await billing.effects()).count(key) == 1
        assert '"ok": true' in result
