"""Real model providers drive agent runs: the `openai` and `anthropic` SDKs over real HTTP, against
local servers that speak (and check) each API's wire format, over real Temporal and PostgreSQL.

Every test runs once per provider. The servers refuse what the real APIs refuse, and any refusal
fails the test (tests/support/model_server.py), so each run also shows that the conversation onceflow
sends is one the provider would take: tool definitions, tool results in the provider's own shape,
the ids the workflow minted on both sides.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.sdk.keys import call_key
from onceflow.sdk.payloads import AgentRunResult, TokenUsage
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.downstream import DOWNSTREAM, issue_credit, lookup_order
from tests.support.model_server import Answer, Call, Fault, Hang, ModelServer, Provider, serving
from tests.workflow_harness import Harness, running_worker

KEY_ENV = "ONCEFLOW_TEST_MODEL_KEY"
KEY = "sk-test-0123456789abcdefSECRET"
MODEL = "test-model"
ORDER = json.dumps({"order_id": "o1"})
INSTRUCTIONS = "You resolve billing complaints."
LOOKUP = Call("lookup_order", {"order_id": "o1"})
CREDIT = Call("issue_credit", {"account_id": "acct_o1", "amount_cents": 1250})


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


def tool_results(server: ModelServer, request: int) -> list[tuple[str, dict[str, Any], bool]]:
    """(tool call id, result, flagged as error) of each tool result in the `request`-th request."""
    body = server.requests[request]
    if server.provider == "openai":
        found = [m for m in body["messages"] if m["role"] == "tool"]
        return [(m["tool_call_id"], json.loads(m["content"]), False) for m in found]
    blocks = [
        b for m in body["messages"] if m["role"] == "user" for b in m["content"] if b["type"] == "tool_result"
    ]
    return [(b["tool_use_id"], json.loads(b["content"]), b.get("is_error", False)) for b in blocks]


def offered_tools(server: ModelServer, request: int) -> list[str]:
    tools = server.requests[request]["tools"]
    if server.provider == "openai":
        return [t["function"]["name"] for t in tools]
    return [t["name"] for t in tools]


async def test_read_then_write_then_final_answer_sends_the_credit_once(
    harness: Harness, server: ModelServer
) -> None:
    server.answer(Answer(calls=(LOOKUP,)), Answer(calls=(CREDIT,)), Answer(text="Credited 1250 cents."))
    run_id, result = await run(harness)

    assert result.final == "Credited 1250 cents."
    credit_id = result.calls[1].tool_call_id
    key = call_key(run_id, credit_id)
    assert DOWNSTREAM.send_attempts == 1
    assert DOWNSTREAM.effects == {key: 1}
    record = await harness.ledger.get(key)
    assert record.status is Status.COMPLETED
    # The model saw its tools every time, its instructions where the provider wants them, and each
    # result answering the id of its call.
    assert len(server.requests) == 3
    assert all(offered_tools(server, i) == ["lookup_order", "issue_credit"] for i in range(3))
    if server.provider == "openai":
        assert server.requests[0]["messages"][0] == {"role": "system", "content": INSTRUCTIONS}
    else:
        assert server.requests[0]["system"] == INSTRUCTIONS
        assert all(m["role"] != "system" for m in server.requests[0]["messages"])
    lookup_id = result.calls[0].tool_call_id
    assert tool_results(server, 1) == [
        (
            lookup_id,
            {"ok": True, "result": {"order_id": "o1", "account_id": "acct_o1", "amount_cents": 1250}},
            False,
        )
    ]
    assert tool_results(server, 2)[-1] == (credit_id, {"ok": True, "result": record.result}, False)
    # Tokens per turn and in total, in the result and in the status query.
    assert result.usage == [TokenUsage(input_tokens=21, output_tokens=8)] * 3
    assert result.usage_total == TokenUsage(input_tokens=63, output_tokens=24)
    status = await harness.client.get_workflow_handle(run_id).query(AgentRunWorkflow.status)
    assert status.usage_total == result.usage_total
    assert server.keys_seen == [KEY] * 3


async def test_several_tool_calls_in_one_answer_all_run_and_all_results_go_back(
    harness: Harness, server: ModelServer
) -> None:
    second = Call("lookup_order", {"order_id": "o2"})
    server.answer(Answer(text="Looking both up.", calls=(LOOKUP, second)), Answer(text="Both found."))
    _, result = await run(harness)

    assert result.final == "Both found."
    ids = [c.tool_call_id for c in result.calls]
    assert len(set(ids)) == 2
    assert [(id_, r["result"]["order_id"]) for id_, r, _ in tool_results(server, 1)] == [
        (ids[0], "o1"),
        (ids[1], "o2"),
    ]
    if server.provider == "anthropic":  # both results in one user message, after the assistant turn
        last = server.requests[1]["messages"][-1]
        assert last["role"] == "user" and [b["type"] for b in last["content"]] == ["tool_result"] * 2


async def test_apply_then_hang_on_the_write_is_reconciled_and_sent_once(
    harness: Harness, server: ModelServer
) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    server.answer(Answer(calls=(LOOKUP,)), Answer(calls=(CREDIT,)), Answer(text="Done."))
    run_id, result = await run(harness)

    key = call_key(run_id, result.calls[1].tool_call_id)
    assert DOWNSTREAM.send_attempts == 1
    assert DOWNSTREAM.effects == {key: 1}
    record = await harness.ledger.get(key)
    assert record.status is Status.COMPLETED and record.settled_by == "reconciler"
    assert tool_results(server, 2)[-1][1] == {
        "ok": True,
        "result": record.result,
        "settled_by": "reconciler",
        "settlement_reason": record.reason,
    }


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


async def test_repeated_and_missing_tool_call_ids_never_share_a_key(
    harness: Harness, server: ModelServer
) -> None:
    def credit(id_: str | None, cents: int) -> Call:
        return Call("issue_credit", {"account_id": "acct_o1", "amount_cents": cents}, id=id_)

    none = None if server.provider == "openai" else ""  # Anthropic's format has the field always
    server.answer(
        Answer(calls=(credit("call_0", 100), credit("call_0", 200))),  # repeated within one answer
        Answer(calls=(credit("call_0", 300),)),  # reused on the next turn
        Answer(calls=(credit(none, 400), credit(none, 500))),  # none at all
        Answer(text="Five credits."),
    )
    run_id, result = await run(harness)

    ids = [c.tool_call_id for c in result.calls]
    assert ids == ["call_0", "t1_1", "t2_0", "t3_0", "t3_1"]
    keys = [call_key(run_id, i) for i in ids]
    assert DOWNSTREAM.effects == dict.fromkeys(keys, 1)
    assert DOWNSTREAM.send_attempts == 5
    amounts = [(await harness.ledger.get(k)).payload["arguments"]["amount_cents"] for k in keys]
    assert amounts == [100, 200, 300, 400, 500]
    # The provider heard its calls back under the minted ids, answered by results with the same ids.
    assert [id_ for id_, _, _ in tool_results(server, 3)] == ids


async def test_an_unknown_tool_and_bad_arguments_reach_the_model_as_errors_it_corrects_reserving_nothing(
    harness: Harness, server: ModelServer
) -> None:
    bad = [
        Call("refund_everything", {"order_id": "o1"}),
        Call("issue_credit", {"account_id": "acct_o1", "amount_cents": "lots"}),
    ]
    if server.provider == "openai":  # a small model's broken JSON, as the API passes it through
        bad.append(Call("issue_credit", raw='{"account_id": "acct_o1", "amount_cents": 12'))
    server.answer(Answer(calls=tuple(bad)), Answer(calls=(CREDIT,)), Answer(text="Credited after all."))
    run_id, result = await run(harness)

    assert result.final == "Credited after all."
    refused = result.calls[: len(bad)]
    assert [c.status for c in refused] == ["error"] * len(bad)
    for call in refused:
        assert call.key is None
        assert await harness.ledger.find(call_key(run_id, call.tool_call_id)) is None
    errors = [r["error"] for _, r, _ in tool_results(server, 1)]
    assert "there is no tool named 'refund_everything'" in errors[0]
    assert "invalid arguments for tool 'issue_credit'" in errors[1] and "amount_cents" in errors[1]
    if server.provider == "openai":
        assert "must be a JSON object" in errors[2]
        sent_back = server.requests[1]["messages"][2]["tool_calls"][2]["function"]["arguments"]
        assert sent_back == bad[2].raw  # the model sees exactly what it sent beside the error
    else:
        assert all(flagged for _, _, flagged in tool_results(server, 1))
    assert DOWNSTREAM.send_attempts == 1
    assert await harness.ledger.get(call_key(run_id, result.calls[-1].tool_call_id)) is not None


async def test_numbers_json_cannot_carry_go_back_to_the_model_as_invalid_arguments_and_the_run_goes_on(
    harness: Harness, server: ModelServer
) -> None:
    """A huge integer could not be canonicalised for the ledger (the run failed); NaN, Infinity
    and 1e999 were quietly turned into null on the way to the tool."""
    bad = [Call("issue_credit", {"account_id": "acct_o1", "amount_cents": 10**30})]
    if server.provider == "openai":
        bad += [
            Call("issue_credit", raw='{"account_id": "acct_o1", "amount_cents": NaN}'),
            Call("issue_credit", raw='{"account_id": "acct_o1", "amount_cents": 1e999}'),
            Call("lookup_order", raw='{"order_id": "o1", "n": Infinity}'),
        ]
    server.answer(Answer(calls=tuple(bad)), Answer(calls=(CREDIT,)), Answer(text="Credited after all."))
    run_id, result = await run(harness)

    assert result.final == "Credited after all."
    refused = result.calls[: len(bad)]
    assert [c.status for c in refused] == ["error"] * len(bad)
    errors = [r["error"] for _, r, _ in tool_results(server, 1)]
    assert "invalid arguments for tool 'issue_credit'" in errors[0]
    assert "beyond" in errors[0] and str(10**30) in errors[0]
    for error in errors[1:]:
        assert "finite numbers" in error, error
    for call in refused:
        assert await harness.ledger.find(call_key(run_id, call.tool_call_id)) is None
    assert DOWNSTREAM.send_attempts == 1


@pytest.fixture(scope="module")
def exported_spans() -> Iterator[InMemorySpanExporter]:
    """Spans finished in this process while this module runs (see tests/test_tracing.py for why)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    yield exporter
    processor.shutdown()


async def test_the_model_call_span_carries_provider_model_and_token_usage_and_no_key(
    harness: Harness, server: ModelServer, exported_spans: InMemorySpanExporter
) -> None:
    exported_spans.clear()
    server.answer(Answer(text="Hello.", input_tokens=120, output_tokens=9))
    await run(harness)
    spans = [s for s in exported_spans.get_finished_spans() if s.name == "RunActivity:call_model"]
    assert len(spans) == 1
    attributes = dict(spans[0].attributes or {})
    assert attributes["gen_ai.provider.name"] == server.provider
    assert attributes["gen_ai.request.model"] == MODEL
    assert attributes["gen_ai.usage.input_tokens"] == 120
    assert attributes["gen_ai.usage.output_tokens"] == 9
    for span in exported_spans.get_finished_spans():
        assert KEY not in str(dict(span.attributes or {}))
