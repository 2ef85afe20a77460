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
    from temporalio.client import Client
    from temporalio.openai_agents.testing import TestModelProvider

    from onceflow.adapters.openai_agents import client_plugins, worker_plugins
    from onceflow.ledger import Ledger
    from onceflow.runtime.agents import AgentRegistry
    from onceflow.runtime.config import Settings
    from onceflow.runtime.worker import build_worker
    from tests.support.openai_agents_support import ScriptedModel
    from tests.support.openai_agents_workflow import OpenAIProcessWorkflow

    settings = Settings.from_env()
    ledger = await Ledger.connect(settings.database_url)
    client = await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        plugins=client_plugins(model_provider=TestModelProvider(ScriptedModel())),
    )
    worker = build_worker(
        client,
        ledger,
        OPENAI_PROCESS_WRITES.register(AgentRegistry({})),
        task_queue=settings.task_queue,
        workflows=[OpenAIProcessWorkflow],
        plugins=worker_plugins(),
    )
    async with worker:
        logging.getLogger("openai-process").info("polling %s", settings.task_queue)
        await asyncio.Event().wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    # Serve the module the workflow imports by name, not this __main__ copy of it.
    from tests.support.openai_agents_process import serve as serve_imported

    asyncio.run(serve_imported())
