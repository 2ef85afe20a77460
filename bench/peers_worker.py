"""The worker process of bench/peers.py: every system's worker, and DBOS, in one process of its own,
so that its CPU time is measured apart from the driver's. Not run by hand.

It serves the four Temporal-hosted ways on task queues of their own, launches DBOS on its database,
prints `ready`, then answers lines on stdin: `dbos N FIRST` runs N DBOS workflows one after another
(accounts FIRST...) and prints one JSON line of what each took; `stop` ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

from e2e_stack import PlainCreditWorkflow, plain_credit  # bench/, beside this file
from peers_common import prompt
from peers_dbos import dbos_functions
from peers_onceflow import ONCEFLOW_WRITES, OnceflowCreditWorkflow
from peers_openai_agents import CreditModel, OpenAIAgentsCreditWorkflow, agents_credit
from peers_pydantic_ai import PAI_AGENT, PydanticAICreditWorkflow
from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin
from temporalio.client import Client
from temporalio.openai_agents import OpenAIAgentsPlugin
from temporalio.openai_agents.testing import TestModelProvider
from temporalio.worker import Worker

from onceflow.ledger import Ledger
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.client import connect
from onceflow.runtime.config import Settings
from onceflow.runtime.worker import build_worker

TASK_QUEUES = {
    "onceflow": "peers-onceflow",
    "plain": "peers-plain",
    "pydantic-ai": "peers-pydantic-ai",
    "openai-agents": "peers-openai-agents",
}


async def run_dbos(workflow: Any, count: int, first: int) -> list[dict[str, float]]:
    from dbos import DBOS, SetWorkflowID

    samples = []
    for n in range(first, first + count):
        begun = time.perf_counter()
        with SetWorkflowID(f"dbos-{n}-{time.time_ns()}"):
            handle = await DBOS.start_workflow_async(workflow, prompt(f"acct_peers_dbos_{n}"))
        answer = await handle.get_result()
        samples.append({"step_ms": answer["step_ms"], "run_ms": (time.perf_counter() - begun) * 1000})
    return samples


async def serve(args: argparse.Namespace) -> None:
    from agents import set_tracing_disabled
    from dbos import DBOS

    set_tracing_disabled(True)  # no OpenAI account to send traces to
    settings = Settings(
        temporal_address=args.temporal,
        temporal_namespace=args.namespace,
        task_queue=TASK_QUEUES["onceflow"],
        database_url=args.database,
        agents_path="bench/peers.py",
    )
    client = await connect(settings)
    # Each framework as its own documentation sets it up: its plugin on the client, and for
    # Pydantic AI the agent's plugin on the worker.
    pai_client = await Client.connect(args.temporal, namespace=args.namespace, plugins=[PydanticAIPlugin()])
    agents_client = await Client.connect(
        args.temporal,
        namespace=args.namespace,
        plugins=[OpenAIAgentsPlugin(model_provider=TestModelProvider(CreditModel()))],
    )
    ledger = await Ledger.connect(args.database)
    workers = [
        build_worker(
            client,
            ledger,
            ONCEFLOW_WRITES.register(AgentRegistry({})),
            task_queue=TASK_QUEUES["onceflow"],
            workflows=[OnceflowCreditWorkflow],
        ),
        Worker(
            client,
            task_queue=TASK_QUEUES["plain"],
            workflows=[PlainCreditWorkflow],
            activities=[plain_credit],
        ),
        Worker(
            pai_client,
            task_queue=TASK_QUEUES["pydantic-ai"],
            workflows=[PydanticAICreditWorkflow],
            plugins=[AgentPlugin(PAI_AGENT)],
        ),
        Worker(
            agents_client,
            task_queue=TASK_QUEUES["openai-agents"],
            workflows=[OpenAIAgentsCreditWorkflow],
            activities=[agents_credit],
        ),
    ]
    DBOS(config={"name": "onceflow-peers", "system_database_url": args.dbos, "log_level": "WARNING"})
    dbos_credit = dbos_functions()
    DBOS.launch()
    loop = asyncio.get_running_loop()
    try:
        async with AsyncExitStack() as stack:
            for worker in workers:
                await stack.enter_async_context(worker)
            print("ready", flush=True)
            while True:
                line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
                if not line or line[0] == "stop":
                    break
                if line[0] == "dbos":
                    samples = await run_dbos(dbos_credit, int(line[1]), int(line[2]))
                    print(json.dumps(samples), flush=True)
    finally:
        await ledger.close()
        DBOS.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--temporal", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--database", required=True, help="the ledger's DSN")
    parser.add_argument("--dbos", required=True, help="DBOS's system database URL")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
