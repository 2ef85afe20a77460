"""What a run started now records at its start: one patch marker, and no upsert of what it started with.

`start_run` sets OnceflowPhase, OnceflowTenant and OnceflowAgent at the start, so the run shows them
before its first task and need not upsert them; a run started another way (a bare Temporal client)
still upserts them itself. Either way it takes every earlier patch under one marker
(workflows/agent_run.py, PATCH_CURRENT). Runs recorded before replay the patches one by one
(tests/test_replay.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger
from onceflow.runtime.constants import AGENT, PHASE, TENANT
from onceflow.sdk.payloads import AgentRunInput, AgentRunResult
from onceflow.workflows.agent_run import PATCH_CURRENT, AgentRunWorkflow
from tests.support.agents import support_registry
from tests.support.downstream import DOWNSTREAM
from tests.workflow_harness import Harness, running_worker

ORDER = json.dumps({"order_id": "o1"})


@pytest.fixture
async def harness(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[Harness]:
    DOWNSTREAM.reset()
    async with running_worker(temporal_env.client, ledger, support_registry()) as h:
        yield h


async def _start_events(
    handle: WorkflowHandle[AgentRunWorkflow, AgentRunResult],
) -> tuple[list[str], list[list[str]]]:
    """The run's patch markers' ids and its search-attribute upserts' names, in order."""
    history = await handle.fetch_history()
    markers: list[str] = []
    upserts: list[list[str]] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            details = event.marker_recorded_event_attributes.details["patch-data"].payloads[0].data
            markers.append(json.loads(details)["id"])
        elif event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            upserts.append(sorted(fields))
    return markers, upserts


async def test_a_run_from_start_run_shows_its_attributes_at_once_and_records_one_marker(
    harness: Harness,
) -> None:
    handle = await harness.start("credit-reconciled", ORDER, tenant="acme")
    started = (await handle.describe()).typed_search_attributes
    assert (started.get(PHASE), started.get(TENANT), started.get(AGENT)) == (
        "running",
        "acme",
        "credit-reconciled",
    )
    await handle.result()
    markers, upserts = await _start_events(handle)
    assert markers == [PATCH_CURRENT]
    # The patch's own TemporalChangeVersion, then the phase at the end: nothing at the start.
    assert upserts == [["TemporalChangeVersion"], [PHASE.name]]
    assert (await handle.describe()).typed_search_attributes.get(PHASE) == "completed"


async def test_a_run_started_without_them_upserts_them_itself(harness: Harness) -> None:
    handle = await harness.client.start_workflow(
        AgentRunWorkflow.run,
        AgentRunInput(agent="credit-reconciled", tenant="acme", input=ORDER, max_turns=20),
        id=f"run-{uuid.uuid4().hex[:10]}",
        task_queue=harness.task_queue,
    )
    await handle.result()
    markers, upserts = await _start_events(handle)
    assert markers == [PATCH_CURRENT]
    assert upserts[1] == sorted([AGENT.name, PHASE.name, TENANT.name])
    described = (await handle.describe()).typed_search_attributes
    assert (described.get(TENANT), described.get(AGENT)) == ("acme", "credit-reconciled")
