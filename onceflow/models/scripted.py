"""`ScriptedModel` plays a fixed script: the model for demos, tests and crash drills.

A scripted model needs no API key and no network, and answers the same way on every run, which is
what demos, tests and crash drills need. A script is a list of turns; each turn is either tool calls
or a final answer. String values may refer to the run's input and to earlier results:

    - tool_calls: [{name: lookup_order, arguments: {order_id: "{{ input.order_id }}"}}]
    - tool_calls: [{name: issue_credit, arguments: {amount_cents: "{{ results.lookup_order.amount_cents }}"}}]
    - final: "Credited {{ results.issue_credit.amount_cents }} cents."

A placeholder that is the whole string keeps the value's type; inside a longer string it is text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from onceflow.sdk.payloads import Message, ModelCallInput, ModelTurn, ToolCall

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_.\-]+)\s*\}\}")


class ScriptError(ValueError):
    """The script refers to something the conversation does not have."""


class ScriptedCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] = {}


class ScriptTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool_calls: list[ScriptedCall] = []
    final: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ScriptTurn:
        if bool(self.tool_calls) == (self.final is not None):
            raise ValueError("a turn has either tool_calls or final, not both and not neither")
        return self


def _lookup(path: str, scope: dict[str, Any]) -> Any:
    value: Any = scope
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise ScriptError(f"{{{{ {path} }}}}: nothing at {part!r}")
    return value


def render(template: Any, scope: dict[str, Any]) -> Any:
    if isinstance(template, dict):
        return {k: render(v, scope) for k, v in template.items()}
    if isinstance(template, list):
        return [render(v, scope) for v in template]
    if not isinstance(template, str):
        return template
    whole = _PLACEHOLDER.fullmatch(template.strip())
    if whole:
        return _lookup(whole.group(1), scope)

    def text(match: re.Match[str]) -> str:
        value = _lookup(match.group(1), scope)
        return value if isinstance(value, str) else json.dumps(value)

    return _PLACEHOLDER.sub(text, template)


def conversation_scope(messages: list[Message]) -> dict[str, Any]:
    """What a script may refer to: the first user message, and the latest result of each tool."""
    first_user = next((m.content for m in messages if m.role == "user"), "")
    try:
        parsed_input: Any = json.loads(first_user)
    except ValueError:
        parsed_input = first_user
    results: dict[str, Any] = {}
    for message in messages:
        if message.role == "tool" and message.name:
            content = json.loads(message.content) if message.content else None
            if isinstance(content, dict) and content.get("ok"):
                results[message.name] = content.get("result")
            else:
                results[message.name] = content
    return {"input": parsed_input, "results": results}


class ScriptedModel:
    """Plays turn N of its script on the model's N-th answer. Tool call ids are stable per run."""

    def __init__(self, script: list[ScriptTurn]) -> None:
        self.script = script

    async def respond(self, request: ModelCallInput) -> ModelTurn:
        index = sum(1 for m in request.messages if m.role == "assistant")
        if index >= len(self.script):
            return ModelTurn(final="(the script has no more turns)")
        turn = self.script[index]
        scope = conversation_scope(request.messages)
        if turn.final is not None:
            return ModelTurn(final=str(render(turn.final, scope)))
        return ModelTurn(
            tool_calls=[
                ToolCall(id=f"call_{index}_{i}", name=call.name, arguments=render(call.arguments, scope))
                for i, call in enumerate(turn.tool_calls)
            ]
        )
