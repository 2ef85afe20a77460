"""Run the Pydantic AI billing agent twice on a local stack: once plainly, once with the payment
applied and its answer lost. Prints what the ledger recorded and what the far side applied.

The worker is built as docs/adapters.md says: OnceflowPlugin and Pydantic AI's plugin on the client,
the agent's plugin on the worker. The dev server starts without onceflow's search attributes; the
plugin registers them before the worker polls."""

from __future__ import annotations

import asyncio
import uuid

from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin
from temporalio.client import Client
from temporalio.worker import Worker

from onceflow import OnceflowPlugin
from onceflow.examples.local_stack import local_stack
from onceflow.examples.pydantic_ai_billing.agent import AGENT, PAYMENTS, WRITES
from onceflow.examples.pydantic_ai_billing.workflow import BillingAgentWorkflow
from onceflow.ledger import Ledger


async def main() -> None:
    async with local_stack() as stack:
        client = await Client.connect(
            stack.temporal_address,
            plugins=[PydanticAIPlugin(), OnceflowPlugin(stack.database_url, agents=[WRITES])],
        )
        task_queue = "pydantic-ai-billing"
        worker = Worker(
            client, task_queue=task_queue, workflows=[BillingAgentWorkflow], plugins=[AgentPlugin(AGENT)]
        )
        async with worker:
            ledger = await Ledger.connect(stack.database_url)  # migrated by the plugin as the worker started
            try:
                for order, lost in (("o100", False), ("o200", True)):
                    if lost:
                        PAYMENTS.hang_after_apply.add(f"acct_{order}")
                    run_id = f"pai-{order}-{uuid.uuid4().hex[:6]}"
                    output = await client.execute_workflow(
                        BillingAgentWorkflow.run, f"refund order {order}", id=run_id, task_queue=task_queue
                    )
                    record = await ledger.get(f"{run_id}:call_credit")
                    print(f"order {order}{' (answer lost)' if lost else ''}: {output}")
                    path = " -> ".join(e.to_status.value for e in record.events if e.to_status)
                    print(f"  ledger {record.key}: {path}; applied {PAYMENTS.applied[record.key]} time(s)")
            finally:
                await ledger.close()
    problems = [key for key, count in PAYMENTS.applied.items() if count != 1]
    if problems:
        raise SystemExit(f"applied more than once: {problems}")
    print("every credit applied exactly once")


if __name__ == "__main__":
    asyncio.run(main())
