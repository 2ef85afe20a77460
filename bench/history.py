"""History size per model turn: what one agent run writes into Temporal as its conversation grows.

Runs one agent for N turns on a Temporal dev server and an embedded PostgreSQL. Each turn the
scripted model calls a read tool that returns R bytes; the script prints the history bytes each turn
adds (from the model turn's scheduling to the next one's) at a few turns, and the run's total.

    .venv/bin/python bench/history.py --turns 150 --result-bytes 2000

It uses only interfaces that predate conversations by reference, so the same file run against an
older checkout (PYTHONPATH=<checkout>) prints the "before" figures (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from onceflow import Toolset, read
from onceflow.ledger import Ledger, migrate
from onceflow.local.postgres import create_database, start_embedded_postgres
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.runtime.client import start_run
from onceflow.runtime.constants import SEARCH_ATTRIBUTES
from onceflow.runtime.worker import build_worker
from onceflow.sdk.payloads import AgentRunInput

sized = Toolset("bench-history")


@sized.tool(read())
async def fetch_text(size: int) -> str:
    """Text of the given size."""
    return "x" * size


def _agent(turns: int, result_bytes: int) -> Agent:
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "fetch_text", "arguments": {"size": result_bytes}}]} for _ in range(turns)
    ]
    script.append({"final": "done"})
    config = AgentConfig.model_validate(
        {"model": {"provider": "scripted", "script": script}, "instructions": "Fetch.", "toolsets": []}
    )
    return Agent("history-bench", config, {t.name: t for t in sized.tools})


async def main(turns: int, result_bytes: int) -> None:
    temporal = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as tmp:
        admin = start_embedded_postgres(Path(tmp) / "pg")
        dsn = await create_database(admin, f"bench_{uuid.uuid4().hex[:8]}")
        await migrate(dsn)
        ledger = await Ledger.connect(dsn)
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal,
            search_attributes=SEARCH_ATTRIBUTES,
            data_converter=pydantic_data_converter,
            dev_server_log_level="error",
        )
        try:
            registry = AgentRegistry({"history-bench": _agent(turns, result_bytes)})
            queue = f"bench-{uuid.uuid4().hex[:8]}"
            async with build_worker(env.client, ledger, registry, task_queue=queue):
                handle = await start_run(
                    env.client,
                    AgentRunInput(agent="history-bench", tenant="bench", input="{}", max_turns=turns + 1),
                    task_queue=queue,
                )
                await handle.result()
                history = await handle.fetch_history()
        finally:
            await env.shutdown()
            await ledger.close()

    per_turn: list[int] = []
    for event in history.events:
        attributes = event.activity_task_scheduled_event_attributes
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and (
            attributes.activity_type.name == "call_model"
        ):
            per_turn.append(0)
        if per_turn:
            per_turn[-1] += event.ByteSize()
    total = sum(e.ByteSize() for e in history.events)
    print(f"{turns} turns, each reading {result_bytes} bytes; {len(history.events)} events, {total} bytes")
    print("turn  bytes added by the turn")
    for turn in sorted({1, 2, 10, 25, 50, 100, 150, 200, turns} & set(range(1, turns + 1))):
        print(f"{turn:>4}  {per_turn[turn - 1]:>8}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=150)
    parser.add_argument("--result-bytes", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.result_bytes))
