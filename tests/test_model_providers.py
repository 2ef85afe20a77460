"""Real model providers drive agent runs: the `openai` and `anthropic` SDKs over real HTTP, against
local servers that speak (and check) each API's wire format, over real Temporal and PostgreSQL. Here,
the conversation: tools offered and results returned in each provider's shape, several calls in one
answer, tool call ids repeated or missing, and arguments the model gets wrong. What the providers'
errors do to a run is in tests/test_model_provider_errors.py.

Every test runs once per provider. The servers refuse what the real APIs refuse, and any refusal
fails the test (tests/support/model_server.py), so each run also shows that the conversation onceflow
sends is one the provider would take: tool definitions, tool results in the provider's own shape,
the ids the workflow minted on both sides.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from onceflow.ledger import Status
from onceflow.sdk.keys import call_key
from onceflow.sdk.payloads import TokenUsage
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.downstream import DOWNSTREAM
from tests.support.model_providers import INSTRUCTIONS, KEY, LOOKUP, MODEL, harness, provider, run, server
from tests.support.model_server import Answer, Call, ModelServer
from tests.workflow_harness import Harness

CREDIT = Call("issue_credit", {"account_id": "acct_o1", "amount_cents": 1250})

__all__ = ["harness", "provider", "server"]  # the fixtures, used by name


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
