"""What the real APIs refuse, as checks over a request body: each returns the problems it found.

OpenAI Chat Completions (platform.openai.com API reference, "Create chat completion"): known request
fields only; roles system/developer/user/assistant/tool; an assistant message with `tool_calls` is
followed by one `tool` message per call id, and a `tool` message answers an id of that assistant
message; tools are `{type: "function", function: {name, description?, parameters}}` with names of
1-64 `[A-Za-z0-9_-]` and a JSON-schema object as parameters. Stricter than OpenAI in one way, as
llama.cpp's server is: an assistant message's content may not be null.

Anthropic Messages (docs.anthropic.com, "Messages"): `max_tokens` required; no `system` role (it is a
top-level field); turns alternate, starting with `user`; text blocks are not empty; `tool_use` only
in assistant turns, with ids `[A-Za-z0-9_-]+`; `tool_result` only in user turns, first in the
message, each answering a `tool_use` id of the assistant turn just before, and every `tool_use` of
that turn answered.
"""

from __future__ import annotations

import re
from typing import Any

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ANTHROPIC_ID = re.compile(r"^[A-Za-z0-9_-]+$")
_OPENAI_FIELDS = {
    "model",
    "messages",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "stop",
    "seed",
    "stream",
    "user",
    "parallel_tool_calls",
    "response_format",
}
_ANTHROPIC_FIELDS = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "metadata",
    "stream",
}


def _schema_problems(where: str, schema: Any) -> list[str]:
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return [f"{where}: must be a JSON schema of type object"]
    if not isinstance(schema.get("properties", {}), dict):
        return [f"{where}.properties: must be an object"]
    return []


def openai_problems(body: dict[str, Any]) -> list[str]:
    problems = [
        f"Unrecognized request argument supplied: {name}" for name in sorted(set(body) - _OPENAI_FIELDS)
    ]
    if not isinstance(body.get("model"), str) or not body["model"]:
        problems.append("model: required")
    for name in ("temperature",):
        if name in body and not (isinstance(body[name], int | float) and 0 <= body[name] <= 2):
            problems.append(f"{name}: must be a number from 0 to 2")
    for index, tool in enumerate(body.get("tools", [])):
        where = f"tools[{index}]"
        if tool.get("type") != "function":
            problems.append(f"{where}.type: must be 'function'")
            continue
        function = tool.get("function") or {}
        if not _TOOL_NAME.match(str(function.get("name", ""))):
            problems.append(f"{where}.function.name: must match ^[a-zA-Z0-9_-]{{1,64}}$")
        if "parameters" in function:
            problems += _schema_problems(f"{where}.function.parameters", function["parameters"])
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*problems, "messages: must be a non-empty array"]
    expected: list[str] = []  # tool call ids of the last assistant message, not yet answered
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role")
        if role != "tool" and expected:
            problems.append(
                f"{where}: an assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id'; not answered: {', '.join(expected)}"
            )
            expected = []
        if role in ("system", "developer", "user"):
            if not isinstance(message.get("content"), str | list):
                problems.append(f"{where}.content: required")
        elif role == "assistant":
            if message.get("content") is None:
                problems.append(f"{where}.content: null (llama.cpp's server refuses it; send '')")
            for position, call in enumerate(message.get("tool_calls", [])):
                spot = f"{where}.tool_calls[{position}]"
                if call.get("type") != "function" or not isinstance(call.get("id"), str) or not call["id"]:
                    problems.append(f"{spot}: needs type 'function' and a non-empty id")
                function = call.get("function") or {}
                if not _TOOL_NAME.match(str(function.get("name", ""))):
                    problems.append(f"{spot}.function.name: invalid")
                if not isinstance(function.get("arguments"), str):
                    problems.append(f"{spot}.function.arguments: must be a string")
                expected.append(str(call.get("id")))
        elif role == "tool":
            answered = message.get("tool_call_id")
            if answered not in expected:
                problems.append(
                    f"{where}: messages with role 'tool' must be a response to a preceding message with "
                    f"'tool_calls' (tool_call_id {answered!r})"
                )
            else:
                expected.remove(answered)
            if not isinstance(message.get("content"), str | list):
                problems.append(f"{where}.content: required")
        else:
            problems.append(f"{where}.role: {role!r} is not one of system, developer, user, assistant, tool")
    if expected:
        problems.append(f"the last assistant message's tool calls were not answered: {', '.join(expected)}")
    return problems


def anthropic_problems(body: dict[str, Any]) -> list[str]:
    problems = [f"{name}: Extra inputs are not permitted" for name in sorted(set(body) - _ANTHROPIC_FIELDS)]
    if not isinstance(body.get("model"), str) or not body["model"]:
        problems.append("model: Field required")
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        problems.append("max_tokens: Field required")
    if "temperature" in body and not (
        isinstance(body["temperature"], int | float) and 0 <= body["temperature"] <= 1
    ):
        problems.append("temperature: must be from 0 to 1")
    if "system" in body and not isinstance(body["system"], str | list):
        problems.append("system: must be a string or text blocks")
    for index, tool in enumerate(body.get("tools", [])):
        if not _TOOL_NAME.match(str(tool.get("name", ""))):
            problems.append(f"tools.{index}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
        problems += _schema_problems(f"tools.{index}.input_schema", tool.get("input_schema"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*problems, "messages: at least one message is required"]
    previous_tool_uses: list[str] = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        role = message.get("role")
        if role not in ("user", "assistant"):
            problems.append(f'{where}: Unexpected role "{role}". Allowed roles are "user" and "assistant".')
            continue
        wanted = "user" if index % 2 == 0 else "assistant"
        if role != wanted:
            problems.append(f"{where}: roles must alternate between user and assistant, starting with user")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            problems.append(f"{where}.content: must be a non-empty string or list of blocks")
            continue
        tool_uses: list[str] = []
        results: list[str] = []
        for position, block in enumerate(blocks):
            spot = f"{where}.content.{position}"
            kind = block.get("type")
            if kind == "text":
                if not isinstance(block.get("text"), str) or not block["text"].strip():
                    problems.append(f"{spot}: text content blocks must contain non-whitespace text")
            elif kind == "tool_use":
                if role != "assistant":
                    problems.append(f"{spot}: tool_use blocks are only allowed in assistant messages")
                if not _ANTHROPIC_ID.match(str(block.get("id", ""))):
                    problems.append(f"{spot}.id: String should match pattern '^[a-zA-Z0-9_-]+$'")
                if not _TOOL_NAME.match(str(block.get("name", ""))):
                    problems.append(f"{spot}.name: invalid")
                if not isinstance(block.get("input"), dict):
                    problems.append(f"{spot}.input: Input should be a valid dictionary")
                tool_uses.append(str(block.get("id")))
            elif kind == "tool_result":
                if role != "user":
                    problems.append(f"{spot}: tool_result blocks are only allowed in user messages")
                if position != len(results):  # something other than a tool_result came before it
                    problems.append(f"{spot}: tool_result blocks must come first in the message")
                if block.get("tool_use_id") not in previous_tool_uses:
                    problems.append(
                        f"{spot}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block.get('tool_use_id')!r}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message."
                    )
                results.append(str(block.get("tool_use_id")))
            else:
                problems.append(f"{spot}.type: {kind!r} is not a known block type")
        unanswered = [id_ for id_ in previous_tool_uses if id_ not in results]
        if unanswered:
            problems.append(
                f"{where}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                + ", ".join(unanswered)
            )
        previous_tool_uses = tool_uses
    return problems
