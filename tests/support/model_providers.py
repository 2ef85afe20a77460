"""Agent runs whose model is a real provider SDK (`openai`, `anthropic`) talking over real HTTP to a
local server that speaks and checks the provider's wire format (tests/support/model_server.py): the
agent, its key, one server per provider (every test that uses it runs once per provider) and a worker.
Used by tests/test_model_providers.py and tests/test_model_provider_errors.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.sdk.payloads import AgentRunResult
from tests.support.downstream import DOWNSTREAM, issue_credit, lookup_order
from tests.support.model_server import Call, ModelServer, Provider, serving
from tests.workflow_harness import Harness, running_worker

KEY_ENV = "ONCEFLOW_TEST_MODEL_KEY"
KEY = "sk-test-0123456789abcdefSECRET"
MODEL = "test-model"
ORDER = json.dumps({"order_id": "o1"})
INSTRUCTIONS = "You resolve billing complaints."
LOOKUP = Call("lookup_order", {"order_id": "o1"})


@pytest.fixture(params=["openai", "anthropic"])
def provider(request: pytest.FixtureRequest) -> Provider:
    chosen: Provider = request.param
    return chosen


@pytest.fixture
async def server(provider: Provider) -> AsyncIterator[ModelServer]:
    async with serving(provider, KEY) as running:
        yield running
    assert running.problems == [], f"requests the real {provider} API would refuse: {running.problems}"


def provider_agent(server: ModelServer, **model: Any) -> Agent:
    config = AgentConfig.model_validate(
        {
            "model": {
                "provider": server.provider,
                "model": MODEL,
                "base_url": server.url,
                "api_key_env": KEY_ENV,
                "request_timeout": "2s",
                "retry_budget": "30s",
                **model,
            },
            "instructions": INSTRUCTIONS,
            "toolsets": ["test-billing"],
            "tool_policy": {
                "on_indeterminate": "pause",
                "reconcile_deadline": "20s",
                "reconcile_initial_interval": "0.2s",
                "reconcile_max_interval": "1s",
            },
        }
    )
    return Agent("assistant", config, {t.name: t for t in (lookup_order, issue_credit)})


@pytest.fixture
async def harness(
    server: ModelServer, temporal_env: WorkflowEnvironment, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Harness]:
    DOWNSTREAM.reset()
    monkeypatch.setenv(KEY_ENV, KEY)
    registry = AgentRegistry({"assistant": provider_agent(server)})
    async with running_worker(temporal_env.client, ledger, registry) as running:
        yield running


async def run(harness: Harness) -> tuple[str, AgentRunResult]:
    handle = await harness.start("assistant", ORDER)
    return handle.id, await asyncio.wait_for(handle.result(), 60)
