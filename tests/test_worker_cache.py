"""ONCEFLOW_MAX_CACHED_WORKFLOWS sizes the worker's workflow cache; bad values stop the worker."""

from __future__ import annotations

import os
import uuid

import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.config import (
    CACHE_LEAST_RUNS,
    CACHE_MOST_RUNS,
    Settings,
    default_max_cached_workflows,
    memory_limit,
)
from onceflow.runtime.worker import build_worker, max_cached_workflows

MB = 1024 * 1024


def test_empty_takes_onceflows_default_sized_from_the_machine() -> None:
    assert max_cached_workflows("") == default_max_cached_workflows()
    assert max_cached_workflows("  ") == default_max_cached_workflows()
    assert CACHE_LEAST_RUNS <= default_max_cached_workflows() <= CACHE_MOST_RUNS


def test_the_default_keeps_a_thousand_paused_runs_out_of_memory() -> None:
    # At most CACHE_MOST_RUNS however large the machine (the SDK's 1,000 held every paused run);
    # an eighth of a small container's memory at 256 kB a run; never fewer than CACHE_LEAST_RUNS.
    assert default_max_cached_workflows(64 * 1024 * MB) == CACHE_MOST_RUNS < 1000
    assert default_max_cached_workflows(256 * MB) == 128
    assert default_max_cached_workflows(16 * MB) == CACHE_LEAST_RUNS


def test_the_memory_limit_is_this_machines_or_its_cgroups() -> None:
    limit = memory_limit()
    assert limit is not None and 0 < limit <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_a_whole_number_is_the_cache_size() -> None:
    assert max_cached_workflows("200") == 200
    assert max_cached_workflows("0") == 0


@pytest.mark.parametrize("text", ["-1", "ten", "2.5"])
def test_anything_else_stops_the_worker_with_a_message(text: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        max_cached_workflows(text)
    assert "ONCEFLOW_MAX_CACHED_WORKFLOWS" in str(stopped.value) and repr(text) in str(stopped.value)


def test_settings_read_it_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_MAX_CACHED_WORKFLOWS", "50")
    assert Settings.from_env().max_cached_workflows == "50"


async def test_the_worker_takes_no_more_workflow_tasks_than_its_cache_holds(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    registry = AgentRegistry({})

    def queue() -> str:  # one worker per task queue and client
        return f"cache-{uuid.uuid4().hex}"

    small = build_worker(temporal_env.client, ledger, registry, task_queue=queue(), max_cached_workflows=50)
    assert small.config()["max_cached_workflows"] == 50
    assert small.config()["max_concurrent_workflow_tasks"] == 50
    tiny = build_worker(temporal_env.client, ledger, registry, task_queue=queue(), max_cached_workflows=0)
    assert tiny.config()["max_concurrent_workflow_tasks"] == 2
    default = build_worker(temporal_env.client, ledger, registry, task_queue=queue())
    assert default.config()["max_cached_workflows"] == 1000
    assert default.config()["max_concurrent_workflow_tasks"] is None
