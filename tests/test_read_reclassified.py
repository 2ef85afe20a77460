"""A run already in flight when a tool is reclassified: the worker that executes a read activity
decides by its own class for the tool, and refuses one it classifies as changing the world.

Real parts: the session's Temporal dev server, a fresh ledger, two workers one after the other on one
task queue (before and after a corrected declaration), and a counter of calls at the tool."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from onceflow import Toolset, external, read
from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.runtime.client import start_run
from onceflow.runtime.constants import ERR_NOT_A_READ
from onceflow.runtime.worker import build_worker
from onceflow.sdk.payloads import AgentRunInput, Phase, ResolveSignal
from tests.support.downstream import DOWNSTREAM
from tests.support.downstream import toolset as downstream_tools
from tests.support.history import history_events
from tests.test_agent_run import wait_for_phase

CALLED: Counter[str] = Counter()

# `sync_mailbox` is declared a read at first (a wrong readOnlyHint, say); it sends mail.
as_read = Toolset("mail-as-read")
as_external = Toolset("mail-as-external")


async def sync_mailbox(folder: str) -> dict[str, Any]:
    """Synchronise a mail folder (and, as it turns out, send what is in its outbox)."""
    CALLED[folder] += 1
    return {"folder": folder, "sent": 1}


as_read.tool(read(timeout=timedelta(seconds=2)), name="sync_mailbox")(sync_mailbox)
as_external.tool(external(timeout=timedelta(seconds=2)), name="sync_mailbox")(sync_mailbox)

SCRIPT = [
    # An unknown credit first, so the run waits (paused) while the worker is replaced.
    {
        "tool_calls": [
            {
                "name": "issue_credit_unreconciled",
                "arguments": {"account_id": "acct_hangs_r", "amount_cents": 1},
            }
        ]
    },
    {"tool_calls": [{"name": "sync_mailbox", "arguments": {"folder": "{{ input.folder }}"}}]},
    {"final": "mailbox: {{ results.sync_mailbox }}"},
]


def registry(mail: Toolset) -> AgentRegistry:
    config = AgentConfig.model_validate(
        {
            "model": {"provider": "scripted", "script": SCRIPT},
            "toolsets": ["test-billing", mail.name],
            "tool_policy": {"on_indeterminate": "pause", "reconcile_deadline": "60s"},
        }
    )
    tools = {
        downstream_tools.get("issue_credit_unreconciled").name: downstream_tools.get(
            "issue_credit_unreconciled"
        )
    }
    tools["sync_mailbox"] = mail.get("sync_mailbox")
    return AgentRegistry({"mailer": Agent("mailer", config, tools)})


async def test_a_read_the_executing_worker_classifies_external_is_refused_and_never_called(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    DOWNSTREAM.reset()
    DOWNSTREAM.modes["acct_hangs_r"] = "hang_after_apply"
    client = temporal_env.client
    queue = f"tq-{uuid.uuid4().hex[:10]}"
    folder = f"outbox-{uuid.uuid4().hex[:6]}"
    run = f"run-{uuid.uuid4().hex[:10]}"
    # The run starts under the old declaration: its spec says sync_mailbox is a read.
    async with build_worker(client, ledger, registry(as_read), task_queue=queue):
        handle = await start_run(
            client,
            AgentRunInput(agent="mailer", tenant="acme", input=json.dumps({"folder": folder})),
            run_id=run,
            task_queue=queue,
        )
        await wait_for_phase(handle, Phase.AWAITING_RECONCILIATION)
    # A worker with the corrected declaration (effect: external) takes over the run in flight.
    async with build_worker(client, ledger, registry(as_external), task_queue=queue):
        credit = f"{run}:call_0_0"
        await handle.signal(
            "resolve",
            ResolveSignal(key=credit, status="completed", actor="alice", reason="seen in billing", result={}),
        )
        result = await asyncio.wait_for(handle.result(), 60)

    assert CALLED[folder] == 0  # never called, not even once
    assert (await ledger.get(credit, with_events=False)).status is Status.COMPLETED
    assert await ledger.find(f"{run}:call_1_0") is None  # and not sent as a write behind the run's back
    events = await history_events(client, run)
    scheduled = [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "run_read_tool"
    ]
    assert len(scheduled) == 1
    failed = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]
    assert len(failed) == 1
    failure = failed[0].activity_task_failed_event_attributes.failure
    assert failure.application_failure_info.type == ERR_NOT_A_READ
    assert failure.application_failure_info.non_retryable
    started = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert max(e.activity_task_started_event_attributes.attempt for e in started) == 1
    assert "was not called" in result.final and "external" in result.final
