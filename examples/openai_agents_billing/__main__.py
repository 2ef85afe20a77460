"""Run the OpenAI Agents billing agent twice on a local stack: once plainly, once with the payment
applied and its answer lost. Prints what the ledger recorded and what the far side applied.

The worker is built as docs/adapters.md says: the SDK's plugin and OnceflowPlugin on the client.
The dev server starts without onceflow's search attributes; the plugin registers them before the
worker polls."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from agents import set_tracing_disabled
from temporalio.client import Client
from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
from temporalio.openai_agents.testing import TestModelProvider
from temporalio.worker import Worker

from onceflow import OnceflowPlugin
from onceflow.examples.local_stack import local_stack
from onceflow.examples.openai_agents_billing.agent import PAYMENTS, WRITES, BillingModel, lookup_order
from onceflow.examples.openai_agents_billing.workflow import OpenAIBillingAgentWorkflow
from onceflow.ledger import Ledger


async def main() -> None:
    set_tracing_disabled(True)  # no OpenAI account to export traces to
    async with local_stack() as stack:
        openai_agents = OpenAIAgentsPlugin(
            model_provider=TestModelProvider(BillingModel()),
            model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=30)),
        )
        client = await Client.connect(
            stack.temporal_address,
            plugins=[openai_agents, OnceflowPlugin(stack.database_url, agents=[WRITES])],
        )
        task_queue = "openai-agents-billing"
        worker = Worker(
            client, task_queue=task_queue, workflows=[OpenAIBillingAgentWorkflow], activities=[lookup_order]
        )
        async with worker:
            ledger = await Ledger.connect(stack.database_url)  # migrated by the plugin as the worker started
            try:
                for order, lost in (("o100", False), ("o200", True)):
                    if lost:
                        PAYMENTS.hang_after_apply.add(f"acct_{order}")
                    run_id = f"oai-{order}-{uuid.uuid4().hex[:6]}"
                    output = await client.execute_workflow(
                        OpenAIBillingAgentWorkflow.run,
                        f"refund order {order}",
                        id=run_id,
                        task_queue=task_queue,
                    )
                    record = await ledger.get(f"{run_id}:call_credit")
                    path = " -> ".join(e.to_status.value for e in record.events if e.to_status)
                    print(f"order {order}{' (answer lost)' if lost else ''}: {output}")
                    print(f"  ledger {record.key}: {path}; applied {PAYMENTS.applied[record.key]} time(s)")
            finally:
                await ledger.close()
    problems = [key for key, count in PAYMENTS.applied.items() if count != 1]
    if problems:
        raise SystemExit(f"applied more than once: {problems}")
    print("every credit applied exactly once")


if __name__ == "__main__":
    asyncio.run(main())
