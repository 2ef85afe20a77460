"""A worker process hosting a Pydantic AI agent whose write goes to the real billing service (in a
process of its own, honouring no key), for the SIGKILL drill (tests/test_adapter_processes.py).

The write tool has no reconcile hook: after its worker dies, the call stays unknown until an operator
settles it. Run as `python -m tests.support.pydantic_ai_process` with the drill's environment.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.models.function import FunctionModel

from onceflow import ToolContext, Toolset, external
from onceflow.adapters.pydantic_ai import OnceflowWrites, WriteTools
from onceflow.examples.billing.tools import send_credit
from tests.support.billing_tools import _client
from tests.support.pydantic_ai_agents import scripted

writes = Toolset("pydantic-process-billing")


@writes.tool(external(timeout=timedelta(seconds=2)))
async def credit_account(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account, in cents, once, with the call's idempotency key."""
    async with _client() as client:
        return await send_credit(client, account_id, amount_cents, context.idempotency_key)


PROCESS_WRITES = WriteTools(
    writes,
    agent="pydantic-ai-process-billing",
    tool_policy={"on_indeterminate": "pause", "recheck_interval": "2s", "reconcile_deadline": "2m"},
)
PROCESS_AGENT: Agent[None, str] = Agent(
    FunctionModel(scripted),
    name="pydantic_process_billing",
    capabilities=[TemporalDurability(), OnceflowWrites(PROCESS_WRITES)],
)


async def serve() -> None:
    """Served the way docs/adapters.md says: OnceflowPlugin and Pydantic AI's plugin on the client,
    the agent's plugin on the worker."""
    from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin
    from temporalio.client import Client
    from temporalio.worker import Worker

    from onceflow import OnceflowPlugin
    from onceflow.runtime.config import Settings
    from tests.support.pydantic_ai_workflow import PydanticProcessWorkflow

    settings = Settings.from_env()
    client = await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        plugins=[PydanticAIPlugin(), OnceflowPlugin(settings.database_url, agents=[PROCESS_WRITES])],
    )
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[PydanticProcessWorkflow],
        plugins=[AgentPlugin(PROCESS_AGENT)],
    )
    async with worker:
        logging.getLogger("pydantic-process").info("polling %s", settings.task_queue)
        await asyncio.Event().wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    # This file runs as __main__; the workflow imports it by name. Serve that module's agent, not a
    # second copy of it (whose activities no worker would have registered).
    from tests.support.pydantic_ai_process import serve as serve_imported

    asyncio.run(serve_imported())
