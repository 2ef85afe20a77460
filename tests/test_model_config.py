"""agents.yaml's `model:` block: providers, their settings and their keys, checked at worker start-up.

A missing key stops the worker when the agent is listed in ONCEFLOW_AGENTS_ENABLED; otherwise the
agent is left unserved and says why, so a worker without a provider's key still runs the agents
that need none (the default agents.yaml has both kinds).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger
from onceflow.runtime.agents import AgentConfigError, check_models, load_agents
from onceflow.runtime.config import Settings
from onceflow.runtime.worker import run_worker
from tests.workflow_harness import running_worker

REPO = Path(__file__).resolve().parent.parent
UNREACHABLE_DATABASE = "postgresql://onceflow@127.0.0.1:1/never_reached"
KEY_ENV = "ONCEFLOW_TEST_CONFIG_KEY"

FILE = """\
toolsets:
  test-billing: tests.support.downstream:toolset
agents:
  scripted:
    model: {provider: scripted, script: [{final: done}]}
    toolsets: [test-billing]
  clerk:
    model: {MODEL}
    toolsets: [test-billing]
"""
GOOD = f"{{provider: openai, model: gpt-4o-mini, api_key_env: {KEY_ENV}}}"


def agents_file(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "agents.yaml"
    path.write_text(FILE.replace("{MODEL}", model))
    return path


def settings(path: Path, enabled: tuple[str, ...] | None = None) -> Settings:
    return Settings(
        temporal_address="127.0.0.1:1",
        temporal_namespace="default",
        task_queue="never-served",
        database_url=UNREACHABLE_DATABASE,
        agents_path=str(path),
        agents_enabled=enabled,
    )


@pytest.mark.parametrize(
    ("model", "fragments"),
    [
        ("{provider: gemini, model: x}", ["model", "unknown provider (known: scripted, openai, anthropic)"]),
        ("{provider: openai}", ["model.model", "Field required"]),
        ("{provider: openai, model: m, temperature: 5}", ["model.temperature", "less than or equal to 2"]),
        (
            "{provider: anthropic, model: m, temperature: 1.5}",
            ["model.temperature", "less than or equal to 1"],
        ),
        ("{provider: openai, model: m, request_timeout: soon}", ["model.request_timeout", "not a duration"]),
        (
            "{provider: openai, model: m, max_token: 10}",
            ["model.max_token", "Extra inputs are not permitted"],
        ),
        ("{provider: openai, model: m, base_url: 'localhost:8000'}", ["model.base_url", "not an http://"]),
        ("{provider: openai, model: m, api_key_env: sk-live-123}", ["api_key_env", "the key itself goes"]),
        (
            "{provider: anthropic, model: m, request_timeout: 2m, retry_budget: 1m}",
            ["retry_budget", "shorter than request_timeout"],
        ),
        (
            "{provider: openai, model: m, extra_headers: {'x y': v}}",
            ["extra_headers", "not an HTTP header name"],
        ),
    ],
)
async def test_invalid_model_settings_stop_the_worker_naming_file_agent_and_problem(
    tmp_path: Path, model: str, fragments: list[str]
) -> None:
    path = agents_file(tmp_path, model)
    with pytest.raises(SystemExit) as stopped:
        await run_worker(settings(path))
    message = str(stopped.value.code)
    assert message.startswith(f"cannot start the worker: {path}, agent 'clerk'")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


async def test_a_missing_key_stops_the_worker_when_the_agent_is_enabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    path = agents_file(tmp_path, GOOD)
    with pytest.raises(SystemExit) as stopped:
        await run_worker(settings(path, enabled=("clerk", "scripted")))
    message = str(stopped.value.code)
    assert message.startswith(f"cannot start the worker: {path}, agent 'clerk'")
    assert f"the environment variable {KEY_ENV} is not set" in message


async def test_a_header_naming_a_missing_variable_stops_the_worker_when_enabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-present")
    monkeypatch.delenv("ONCEFLOW_TEST_GATEWAY", raising=False)
    model = GOOD.replace("}", ", extra_headers: {X-Gateway-Token: '${ONCEFLOW_TEST_GATEWAY}'}}")
    path = agents_file(tmp_path, model)
    with pytest.raises(SystemExit) as stopped:
        await run_worker(settings(path, enabled=("clerk",)))
    assert (
        "model.extra_headers.X-Gateway-Token uses ${ONCEFLOW_TEST_GATEWAY}, which is not set in the environment"
        in str(stopped.value.code)
    )


async def test_enabling_an_agent_the_file_lacks_stops_the_worker(tmp_path: Path) -> None:
    path = agents_file(tmp_path, GOOD)
    with pytest.raises(SystemExit) as stopped:
        await run_worker(settings(path, enabled=("clerk", "payroll")))
    assert "ONCEFLOW_AGENTS_ENABLED names payroll, not in the file (known: clerk, scripted)" in str(
        stopped.value.code
    )


async def test_without_agents_enabled_a_missing_key_leaves_that_agent_unserved_and_the_worker_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    path = agents_file(tmp_path, GOOD)
    with pytest.raises(SystemExit) as stopped:
        await run_worker(settings(path))
    # Past the agents: it stopped at the (unreachable) database, the next thing it checks.
    assert "cannot reach the ledger database" in str(stopped.value.code)

    registry = load_agents(path)
    assert check_models(registry) == [
        f"agent 'clerk' is not served: model.api_key_env: the environment variable {KEY_ENV} is not set (set it to the provider's API key, or use api_key_env: null for a server without keys)"
    ]
    assert registry.model_agent("scripted").name == "scripted"
    with pytest.raises(
        LookupError, match=f"agent 'clerk' is not served by this worker: .*{KEY_ENV} is not set"
    ):
        registry.model_agent("clerk")


def test_a_keyless_local_server_needs_no_variable(tmp_path: Path) -> None:
    path = agents_file(
        tmp_path, "{provider: openai, model: smollm2, base_url: 'http://127.0.0.1:9/v1', api_key_env: null}"
    )
    registry = load_agents(path)
    assert check_models(registry, ("clerk",)) == []


def test_the_shipped_agents_file_starts_without_any_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    registry = load_agents(REPO / "agents.yaml")
    notes = check_models(registry)
    assert sorted(registry.unavailable) == ["billing-assistant-anthropic", "billing-assistant-openai"]
    assert any("OPENAI_API_KEY is not set" in note for note in notes)
    assert registry.model_agent("billing-assistant").name == "billing-assistant"
    with pytest.raises(AgentConfigError, match="ANTHROPIC_API_KEY is not set"):
        check_models(load_agents(REPO / "agents.yaml"), ("billing-assistant-anthropic",))


def test_settings_read_the_enabled_agents_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_AGENTS_ENABLED", " billing-assistant, billing-assistant-openai ,")
    assert Settings.from_env().agents_enabled == ("billing-assistant", "billing-assistant-openai")
    monkeypatch.setenv("ONCEFLOW_AGENTS_ENABLED", "")
    assert Settings.from_env().agents_enabled is None


async def test_a_run_of_an_unserved_agent_fails_at_once_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    registry = load_agents(agents_file(tmp_path, GOOD))
    check_models(registry)
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("clerk", json.dumps({"order_id": "o1"}))
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 20)
    assert (
        f"agent 'clerk' is not served by this worker: model.api_key_env: the environment variable {KEY_ENV}"
        in str(failed.value.cause.__cause__)
    )
