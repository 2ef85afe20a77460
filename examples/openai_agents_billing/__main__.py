"""Run the OpenAI Agents billing agent twice on a local stack: once plainly, once with the payment
applied and its answer lost. Prints what the ledger recorded and what the far side applied."""

from __future__ import annotations

import asyncio
import uuid

from agents import set_tracing_disabled
from temporalio.client import Client
from temporalio.openai_agents.testing import TestModelProvider

from onceflow.adapters.openai_agents import client_plugins, worker_plugins
from onceflow.examples.local_stack import local_stack
from onceflow.examples.openai_agents_billing.agent import PAYMENTS, WRITES, BillingModel, lookup_order
from onceflow.examples.openai_agents_billing.workflow import OpenAIBillingAgentWorkflow
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.worker import build_worker


async def main() -> None:
    set_tracing_disabled(True)  # no OpenAI account to export traces to
    async with local_stack() as (stack_client, ledger):
        config = stack_client.service_client.config
        client = await Client.connect(
            config.target_host,
            namespace=stack_client.namespace,
            plugins=client_plugins(model_provider=TestModelProvider(BillingModel())),
        )
        task_queue = "openai-agents-billing"
        worker = build_worker(
            client,
            ledger,
            WRITES.register(AgentRegistry({})),
            task_queue=task_queue,
            workflows=[OpenAIBillingAgentWorkflow],
            activities=[lookup_order],
            plugins=worker_plugins(),
        )
        async with worker:
            for order, lost in (("o100", False), ("o200", True)):
                if lost:
                    PAYMENTS.hang_after_apply.add(f"acct_{order}")
                run_id = f"oai-{order}-{uuid.uuid4().hex[:6]}"
                output = await client.execute_workflow(
                    OpenAIBillingAgentWorkflow.run, f"refund order {order}", id=run_id, task_queue=task_queue
                )
                record = await ledger.get(f"{run_id}:call_credit")
                path = " -> ".join(e.to_status.value for e in record.events if e.to_status)
                print(f"order {order}{' (answer lost)' if lost else ''}: {output}")
                print(f"  ledger {record.key}: {path}; applied {PAYMENTS.applied[record.key]} time(s)")
    problems = [key for key, count in PAYMENTS.applied.items() if count != 1]
    if problems:
        raise SystemExit(f"applied more than once: {problems}")
    print("every credit applied exactly once")


if __name__ == "__main__":
    asyncio.run(main())
