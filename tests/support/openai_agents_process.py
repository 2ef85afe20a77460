"""A worker process hosting an OpenAI Agents SDK agent whose write goes to the real billing service,
for the SIGKILL drill (tests/test_adapter_processes.py); the write tool is the Pydantic AI drill's
(no reconcile hook). Run as `python -m tests.support.openai_agents_process` with the drill's
environment."""

from __future__ import annotations

import asyncio
import logging

from onceflow.adapters.openai_agents import WriteTools
from tests.support.pydantic_ai_process import writes

OPENAI_PROCESS_WRITES = WriteTools(
    writes,
    agent="openai-agents-process-billing",
    tool_policy={"on_indeterminate": "pause", "recheck_interval": "2s", "reconcile_deadline": "2m"},
)


async def serve() -> None:
    """Served the way docs/adapters.md says: the SDK's plugin and OnceflowPlugin on the client."""
    from datetime import timedelta

    from temporalio.client import Client
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.openai_agents.testing import TestModelProvider
    from temporalio.worker import Worker

    from onceflow import OnceflowPlugin
    from onceflow.runtime.config import Settings
    from tests.support.openai_agents_support import ScriptedModel
    from tests.support.openai_agents_workflow import OpenAIProcessWorkflow

    settings = Settings.from_env()
    openai_agents = OpenAIAgentsPlugin(
        model_provider=TestModelProvider(ScriptedModel()),
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=10)),
    )
    client = await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        plugins=[openai_agents, OnceflowPlugin(settings.database_url, agents=[OPENAI_PROCESS_WRITES])],
    )
    worker = Worker(client, task_queue=settings.task_queue, workflows=[OpenAIProcessWorkflow])
    async with worker:
        logging.getLogger("openai-process").info("polling %s", settings.task_queue)
        await asyncio.Event().wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    # Serve the module the workflow imports by name, not this __main__ copy of it.
    from tests.support.openai_agents_process import serve as serve_imported

    asyncio.run(serve_imported())
