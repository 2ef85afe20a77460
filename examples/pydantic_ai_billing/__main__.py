"""Run the Pydantic AI billing agent twice on a local stack: once plainly, once with the payment
applied and its answer lost. Prints what the ledger recorded and what the far side applied."""

from __future__ import annotations

import asyncio
import uuid

from onceflow.adapters.pydantic_ai import worker_plugins
from onceflow.examples.local_stack import local_stack
from onceflow.examples.pydantic_ai_billing.agent import AGENT, PAYMENTS, WRITES
from onceflow.examples.pydantic_ai_billing.workflow import BillingAgentWorkflow
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.worker import build_worker


async def main() -> None:
    async with local_stack() as (client, ledger):
        task_queue = "pydantic-ai-billing"
        registry = WRITES.register(AgentRegistry({}))
        worker = build_worker(
            client,
            ledger,
            registry,
            task_queue=task_queue,
            workflows=[BillingAgentWorkflow],
            plugins=worker_plugins(AGENT),
        )
        async with worker:
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
    problems = [key for key, count in PAYMENTS.applied.items() if count != 1]
    if problems:
        raise SystemExit(f"applied more than once: {problems}")
    print("every credit applied exactly once")


if __name__ == "__main__":
    asyncio.run(main())
