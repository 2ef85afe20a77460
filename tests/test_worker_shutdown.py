"""The shutdown grace: long enough for the slowest loaded tool by default, and a configured one that
is too short stops the worker at start-up. (The grace at work: tests/test_rolling_restart.py.)"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from onceflow.cli.dev import DevStack, StackConfig
from onceflow.runtime.agents import AgentRegistry, load_agents
from onceflow.runtime.config import Settings
from onceflow.runtime.constants import ACTIVITY_MARGIN
from onceflow.runtime.shutdown import SHUTDOWN_SLACK, ShutdownGraceError, shutdown_grace
from onceflow.runtime.worker import run_worker
from onceflow.sdk.durations import parse_duration
from tests.support.processes import REPO
from tests.support.rolling_tools import AGENTS_YAML, CREDIT_TIMEOUT


@pytest.fixture
def agents_file(tmp_path: Path) -> Path:
    path = tmp_path / "agents.yaml"
    path.write_text(AGENTS_YAML)
    return path


@pytest.fixture
def registry(agents_file: Path) -> AgentRegistry:
    return load_agents(agents_file)


def test_default_grace_outlasts_the_slowest_tool_and_the_activity_margin(registry: AgentRegistry) -> None:
    assert shutdown_grace(registry) == CREDIT_TIMEOUT + ACTIVITY_MARGIN + SHUTDOWN_SLACK
    assert shutdown_grace(registry, "  ") == shutdown_grace(registry)


def test_a_configured_grace_long_enough_is_used_as_given(registry: AgentRegistry) -> None:
    minimum = (CREDIT_TIMEOUT + ACTIVITY_MARGIN).total_seconds()
    assert shutdown_grace(registry, "60") == timedelta(seconds=60)
    assert shutdown_grace(registry, f"{minimum:g}") == timedelta(seconds=minimum)


def test_a_grace_shorter_than_the_slowest_call_is_refused_naming_the_tool(registry: AgentRegistry) -> None:
    with pytest.raises(ShutdownGraceError) as refused:
        shutdown_grace(registry, "10")
    message = str(refused.value)
    assert "ONCEFLOW_SHUTDOWN_GRACE=10 is too short" in message
    assert "'issue_credit' may run for 20s" in message
    assert "at least 25" in message
    assert "stop_grace_period" in message


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf", "30s"])
def test_a_grace_that_is_not_a_number_of_seconds_is_refused(registry: AgentRegistry, value: str) -> None:
    with pytest.raises(ShutdownGraceError, match="is not a number of seconds"):
        shutdown_grace(registry, value)


async def test_the_worker_refuses_to_start_with_a_grace_too_short(
    agents_file: Path, database_url: str
) -> None:
    settings = Settings(
        temporal_address="127.0.0.1:1",  # never reached: the grace is checked first
        temporal_namespace="default",
        task_queue="never-served",
        database_url=database_url,
        agents_path=str(agents_file),
        shutdown_grace="5",
    )
    with pytest.raises(SystemExit) as stopped:
        await run_worker(settings)
    assert str(stopped.value.code).startswith(
        "cannot start the worker: ONCEFLOW_SHUTDOWN_GRACE=5 is too short"
    )


def test_onceflow_dev_waits_for_the_worker_grace_before_it_kills(
    agents_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_AGENTS", str(agents_file))
    monkeypatch.delenv("ONCEFLOW_SHUTDOWN_GRACE", raising=False)
    stack = DevStack(StackConfig())
    expected = (CREDIT_TIMEOUT + ACTIVITY_MARGIN + SHUTDOWN_SLACK).total_seconds()
    assert stack._stop_timeout("worker") > expected
    monkeypatch.setenv("ONCEFLOW_SHUTDOWN_GRACE", "90")
    assert stack._stop_timeout("worker") > 90
    assert stack._stop_timeout("billing") == 10


def test_compose_stops_the_worker_only_after_its_grace() -> None:
    """docker-compose's stop_grace_period must outlast the worker's grace, or a deploy is a SIGKILL."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    worker = compose["services"]["worker"]
    configured = str(worker.get("environment", {}).get("ONCEFLOW_SHUTDOWN_GRACE", ""))
    # The image's agents file is the repository's agents.yaml (tests/test_compose.py checks that).
    grace = shutdown_grace(load_agents(REPO / "agents.yaml"), configured)
    stop = parse_duration(worker.get("stop_grace_period", "10s"))  # docker's default is 10 s
    assert stop >= grace + timedelta(seconds=10), f"stop_grace_period {stop} vs grace {grace}"
