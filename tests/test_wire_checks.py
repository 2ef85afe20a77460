"""The local model servers refuse what the real APIs refuse: the checks catch each kind of bad request
(so a provider test passing means something), and pass what onceflow's providers build."""

from __future__ import annotations

import json
from typing import Any

from onceflow.models import anthropic, openai
from onceflow.sdk.payloads import Message, ToolCall
from tests.support.downstream import issue_credit, lookup_order
from tests.support.wire_checks import anthropic_problems, openai_problems

TOOLS = [lookup_order.json_schema(), issue_credit.json_schema()]
CONVERSATION = [
    Message(role="system", content="Be brief."),
    Message(role="user", content='{"order_id": "o1"}'),
    Message(
        role="assistant",
        content="",
        tool_calls=[
            ToolCall(id="t1_0", name="lookup_order", arguments={"order_id": "o1"}),
            ToolCall(id="t1_1", name="issue_credit", arguments={}, invalid_arguments='{"account_id": '),
        ],
    ),
    Message(
        role="tool", tool_call_id="t1_0", name="lookup_order", content=json.dumps({"ok": True, "result": {}})
    ),
    Message(
        role="tool", tool_call_id="t1_1", name="issue_credit", content=json.dumps({"ok": False, "error": "x"})
    ),
]


def openai_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, **extra}


def test_what_the_openai_provider_builds_passes() -> None:
    messages = openai.wire_messages(CONVERSATION)
    assert (
        openai_problems({"model": "m", "messages": messages, "tools": openai.tool_definitions(TOOLS)}) == []
    )
    assistant = messages[2]
    assert assistant["content"] == ""  # never null
    assert assistant["tool_calls"][1]["function"]["arguments"] == '{"account_id": '


def test_openai_checks_catch_what_the_api_refuses() -> None:
    user = {"role": "user", "content": "hi"}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    cases = {
        "unknown field": openai_body([user], max_tokenz=3),
        "unknown role": openai_body([{"role": "robot", "content": "x"}]),
        "null assistant content": openai_body([user, {"role": "assistant", "content": None}]),
        "tool answering nothing": openai_body([user, {"role": "tool", "tool_call_id": "c9", "content": "x"}]),
        "unanswered call": openai_body(
            [user, {"role": "assistant", "content": "", "tool_calls": [call]}, user]
        ),
        "tool type": openai_body([user], tools=[{"type": "fn", "function": {"name": "f"}}]),
        "tool name": openai_body([user], tools=[{"type": "function", "function": {"name": "a b"}}]),
        "parameters": openai_body(
            [user], tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]
        ),
        "temperature": openai_body([user], temperature=3),
    }
    for case, body in cases.items():
        assert openai_problems(body), f"{case} passed"


def test_what_the_anthropic_provider_builds_passes() -> None:
    system, messages = anthropic.wire_messages(CONVERSATION)
    body = {"model": "m", "max_tokens": 10, "system": system, "messages": messages}
    body["tools"] = anthropic.tool_definitions(TOOLS)
    assert anthropic_problems(body) == []
    assert system == "Be brief."
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert [b["type"] for b in messages[1]["content"]] == ["tool_use", "tool_use"]  # no empty text block
    results = messages[2]["content"]
    assert [(b["tool_use_id"], b.get("is_error", False)) for b in results] == [
        ("t1_0", False),
        ("t1_1", True),
    ]


def test_anthropic_checks_catch_what_the_api_refuses() -> None:
    user = {"role": "user", "content": "hi"}
    use = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}

    def body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"model": "m", "max_tokens": 10, "messages": messages, **extra}

    cases = {
        "no max_tokens": {"model": "m", "messages": [user]},
        "system role": body([{"role": "system", "content": "x"}, user]),
        "starts with assistant": body([{"role": "assistant", "content": "x"}]),
        "not alternating": body([user, user]),
        "empty text": body([{"role": "user", "content": [{"type": "text", "text": " "}]}]),
        "tool_use id": body([user, {"role": "assistant", "content": [{**use, "id": "a:b"}]}]),
        "result answers nothing": body(
            [user, {"role": "assistant", "content": "x"}, {"role": "user", "content": [result]}]
        ),
        "use unanswered": body([user, {"role": "assistant", "content": [use]}, user]),
        "result not first": body(
            [
                user,
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [{"type": "text", "text": "x"}, result]},
            ]
        ),
        "input schema": body([user], tools=[{"name": "f", "input_schema": {"type": "string"}}]),
        "temperature": body([user], temperature=1.5),
    }
    for case, request in cases.items():
        assert anthropic_problems(request), f"{case} passed"
