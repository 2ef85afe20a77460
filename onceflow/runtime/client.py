"""Connecting to Temporal and starting runs from client code."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.common import (
    SearchAttributeKey,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.runtime import Runtime

from onceflow.runtime.config import Settings
from onceflow.runtime.constants import SEARCH_ATTRIBUTES
from onceflow.runtime.telemetry import configure_tracing, tracing_interceptor
from onceflow.sdk.keys import check_run_id
from onceflow.sdk.payloads import AgentRunInput, AgentRunResult
from onceflow.workflows.agent_run import AgentRunWorkflow, initial_search_attributes


class RunIdTakenError(ValueError):
    """A run id names one run forever: keys are built from it, so it is never reused."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run id {run_id!r} is already taken; choose a new one")
        self.run_id = run_id


T = TypeVar("T")

# How long `run` lets the Temporal client's native threads go quiet before Python shuts down.
_CLIENT_GRACE_SECONDS = 0.25


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` for short client scripts that talk to Temporal.

    The Temporal client's native (Rust) threads can still deliver a callback just after the last
    call returns; if Python is already finalizing, the process aborts ("PyGILState_Release ...
    finalizing", temporalio/sdk-python#300) although the work is done. Measured here: about one
    exit in six for the README's snippet. This waits a moment inside the event loop, after `main`,
    so those callbacks land while Python is still running.
    """

    async def main_then_settle() -> T:
        try:
            return await main
        finally:
            await asyncio.sleep(_CLIENT_GRACE_SECONDS)

    return asyncio.run(main_then_settle())


async def connect(settings: Settings | None = None, *, runtime: Runtime | None = None) -> Client:
    """A Temporal client with onceflow's data converter and tracing; `runtime`: the SDK's own
    telemetry (a worker's metrics, onceflow.runtime.metrics_export.temporal_runtime), else its default."""
    settings = settings or Settings.from_env()
    configure_tracing()
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        interceptors=[tracing_interceptor()],
        runtime=runtime,
    )


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:16]}"


async def start_run(
    client: Client,
    run_input: AgentRunInput,
    *,
    run_id: str | None = None,
    task_queue: str | None = None,
) -> WorkflowHandle[AgentRunWorkflow, AgentRunResult]:
    """Start an agent run. Refuses a run id that keys cannot be built from (InvalidRunIdError: a
    `:` in it, say) and one that an earlier run still known to Temporal has used (RunIdTakenError).

    Temporal forgets a run past its retention; the ledger does not: a run id claimed by an earlier
    run's first write is refused to this run's first write, whoever started it (ledger/run_ids.py).
    """
    run_id = check_run_id(run_id or new_run_id())
    try:
        return await client.start_workflow(
            AgentRunWorkflow.run,
            run_input,
            id=run_id,
            task_queue=task_queue or Settings.from_env().task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            static_summary=f"{run_input.agent} for {run_input.tenant}",
            # Shown from the start, and the run need not upsert them on its first task.
            search_attributes=TypedSearchAttributes(initial_search_attributes(run_input)),
        )
    except WorkflowAlreadyStartedError as exc:
        raise RunIdTakenError(run_id) from exc


def search_attribute_flags() -> list[str]:
    """`--search-attribute Name=Type` flags for `temporal server start-dev`."""
    return [f"--search-attribute={key.name}={_type_name(key)}" for key in SEARCH_ATTRIBUTES]


def _type_name(key: SearchAttributeKey[Any]) -> str:
    return (
        "KeywordList"
        if key.indexed_value_type == IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST
        else "Keyword"
    )


async def missing_search_attributes(client: Client) -> list[SearchAttributeKey[Any]]:
    """onceflow's search attributes the client's namespace does not have."""
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    existing = set(listed.custom_attributes) | set(listed.system_attributes)
    return [key for key in SEARCH_ATTRIBUTES if key.name not in existing]


async def ensure_search_attributes(client: Client) -> list[str]:
    """Register onceflow's search attributes on the namespace if missing; returns those added."""
    missing = {
        key.name: IndexedValueType.ValueType(int(key.indexed_value_type))
        for key in await missing_search_attributes(client)
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
    return sorted(missing)


def search_attribute_commands(namespace: str, keys: list[SearchAttributeKey[Any]]) -> list[str]:
    """The `temporal` commands that add these search attributes, one each (temporal CLI 1.9 creates
    only the first of several `--name`s given to one command)."""
    return [
        f"temporal operator search-attribute create --namespace {namespace} --name {key.name} "
        f"--type {_type_name(key)}"
        for key in keys
    ]
