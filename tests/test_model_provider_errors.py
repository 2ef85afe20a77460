"""Real model providers failing: the `openai` and `anthropic` SDKs over real HTTP, against local
servers that speak each API's wire format and answer with its errors, over real Temporal and
PostgreSQL. A rate limit waits its Retry-After, server errors and timeouts are retried, a wrong key
or a conversation too long for the context fails the run at once (naming provider, model and cause,
never the key), and an outage fails it when the retry budget is spent. The conversation itself is in
tests/test_model_providers.py.

Every test runs once per provider, and any request the real API would refuse fails the test
(tests/support/model_server.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger
from onceflow.runtime.agents import AgentRegistry
from tests.support.downstream import DOWNSTREAM
from tests.support.model_providers import (
    KEY,
    KEY_ENV,
    LOOKUP,
    MODEL,
    ORDER,
    harness,
    provider,
    provider_agent,
    run,
    server,
)
from tests.support.model_server import Answer, Fault, Hang, ModelServer
from tests.workflow_harness import Harness, running_worker

__all__ = ["harness", "provider", "server"]  # the fixtures, used by name


async def failed_run(harness: Harness) -> tuple[str, str, str]:
    """(run id, the failure's whole text, the run's history as JSON) of a run that must fail."""
    handle = await harness.start("assistant", ORDER)
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 60)
    chain: list[str] = []
    error: BaseException | None = failed.value.cause
    while error is not None:
        chain.append(str(error))
        error = error.__cause__
    history = await handle.fetch_history()
    return handle.id, " | ".join(chain), history.to_json()


async def test_a_rate_limit_waits_the_retry_after_then_the_run_succeeds(
    harness: Harness, server: ModelServer
) -> None:
    server.answer(Fault(429, "slow down", headers={"retry-after": "2"}), Answer(text="Nothing to do."))
    _, result = await run(harness)

    assert result.final == "Nothing to do."
    assert len(server.requests) == 2
    # Temporal's own first backoff is 0.5 s: the two seconds came from the provider's Retry-After.
    assert server.times[1] - server.times[0] >= 1.9


async def test_a_server_error_then_success_is_retried(harness: Harness, server: ModelServer) -> None:
    status = 500 if server.provider == "openai" else 529  # Anthropic's "overloaded"
    server.answer(Fault(status, "try later"), Answer(calls=(LOOKUP,)), Answer(text="Found it."))
    _, result = await run(harness)
    assert result.final == "Found it."
    assert len(server.requests) == 3


async def test_a_request_that_times_out_is_tried_again(harness: Harness, server: ModelServer) -> None:
    server.answer(Hang(), Answer(text="Here now."))
    _, result = await run(harness)
    assert result.final == "Here now."
    assert len(server.requests) == 2


async def test_a_wrong_key_fails_the_run_at_once_naming_provider_model_and_cause_without_the_key(
    harness: Harness,
    server: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
) -> None:
    wrong = "sk-wrong-9876543210zyxwvuSECRET"
    monkeypatch.setenv(KEY_ENV, wrong)
    registry = AgentRegistry({"assistant": provider_agent(server)})
    caplog.set_level(logging.DEBUG)
    async with running_worker(temporal_env.client, ledger, registry) as own:
        _, failure, history = await failed_run(own)

    assert f"{server.provider} model {MODEL}: authentication failed (401)" in failure
    assert len(server.requests) == 1  # no retry storm
    assert server.keys_seen == [wrong]  # the server did get it, and quoted it back...
    for text in (failure, history, caplog.text):  # ...but nothing onceflow keeps or prints has it
        assert wrong not in text and KEY not in text
    assert DOWNSTREAM.send_attempts == 0


async def test_a_conversation_too_long_for_the_context_fails_the_run_at_once(
    harness: Harness, server: ModelServer
) -> None:
    if server.provider == "openai":
        fault = Fault(
            400, "This model's maximum context length is 128000 tokens.", code="context_length_exceeded"
        )
    else:
        fault = Fault(400, "prompt is too long: 250000 tokens > 200000 maximum")
    server.answer(fault)
    _, failure, _ = await failed_run(harness)
    assert f"{server.provider} model {MODEL}: the conversation is too long for the model's context" in failure
    assert len(server.requests) == 1


async def test_an_outage_longer_than_the_retry_budget_fails_the_run_when_the_budget_is_spent(
    server: ModelServer, temporal_env: WorkflowEnvironment, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    server.answer(*[Fault(503, "down for maintenance")] * 20)
    registry = AgentRegistry({"assistant": provider_agent(server, request_timeout="1s", retry_budget="5s")})
    started = time.monotonic()
    async with running_worker(temporal_env.client, ledger, registry) as own:
        _, failure, _ = await failed_run(own)
    # Temporal gives up as soon as the next attempt could not start within the budget.
    assert time.monotonic() - started < 5 + 10
    assert 3 <= len(server.requests) < 20
    assert "unavailable (503)" in failure
    server.script.clear()
