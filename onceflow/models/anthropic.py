"""The Messages API through the official `anthropic` SDK.

The conversation goes out in the API's own shape: the agent's instructions as the top-level
`system`, not a message; turns alternate between `user` and `assistant`, starting with `user`; an
assistant turn is text (omitted when empty: the API refuses empty text blocks) followed by its
`tool_use` blocks; the tool results of one answer go back as `tool_result` blocks inside one user
message, each answering a `tool_use` id of the turn before, flagged `is_error` when the call did not
succeed. `max_tokens` is required by the API: `max_output_tokens`, default 1024.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from onceflow.ledger.canonical import uncarried
from onceflow.models.errors import status_error, transport_error, unreadable_answer
from onceflow.sdk.payloads import Message, ModelCallInput, ModelTurn, TokenUsage, ToolCall

if TYPE_CHECKING:
    from onceflow.models.config import AnthropicConfig


def _sdk() -> Any:
    try:
        import anthropic
    except ImportError as exc:  # checked at worker start-up too; this is the message if not
        raise RuntimeError(
            "provider anthropic needs the 'anthropic' package: pip install 'onceflow[anthropic]'"
        ) from exc
    return anthropic


def tool_definitions(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ToolSpec.json_schema (name, description, parameters) as Messages API tools."""
    definitions = []
    for tool in tools:
        definition: dict[str, Any] = {"name": tool["name"], "input_schema": tool["parameters"]}
        if tool.get("description"):
            definition["description"] = tool["description"]
        definitions.append(definition)
    return definitions


def _failed(content: str) -> bool:
    """A tool result the workflow wrote as {"ok": false, ...} is an error the model should see as one."""
    try:
        value = json.loads(content)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("ok") is False


def wire_messages(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(system, messages) for the Messages API; consecutive blocks of one role share a message."""
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    wire: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})

    for message in messages:
        if message.role == "user":
            add("user", [{"type": "text", "text": message.content or "(no input)"}])
        elif message.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if message.content.strip():
                blocks.append({"type": "text", "text": message.content})
            blocks += [
                {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
                for call in message.tool_calls
            ]
            add("assistant", blocks)
        elif message.role == "tool":
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id or "",
                "content": message.content,
            }
            if _failed(message.content):
                result["is_error"] = True
            add("user", [result])
    return system, wire


class AnthropicMessagesModel:
    """One agent's model over the Messages API. Built in the worker, where its key is read."""

    provider = "anthropic"

    def __init__(self, config: AnthropicConfig, tools: list[dict[str, Any]]) -> None:
        anthropic = _sdk()
        self.config = config
        self.name = config.model
        self._api = anthropic
        self._tools = tool_definitions(tools)

    def _client(self) -> Any:
        return self._api.AsyncAnthropic(
            api_key=self.config.api_key(),
            base_url=self.config.base_url,
            timeout=self.config.request_timeout.total_seconds(),
            max_retries=0,  # Temporal's retry policy is the one retry loop
            default_headers=self.config.headers() or None,
        )

    def request_body(self, messages: list[Message]) -> dict[str, Any]:
        system, wire = wire_messages(messages)
        body: dict[str, Any] = {
            "model": self.config.model,
            "max_tokens": self.config.max_output_tokens or 1024,
            "messages": wire,
        }
        if system:
            body["system"] = system
        if self._tools:
            body["tools"] = self._tools
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        return body

    async def respond(self, request: ModelCallInput) -> ModelTurn:
        anthropic = self._api
        try:
            # A client per call: the key is read when it is built, and nothing is left open when the
            # worker stops (a model call takes seconds; one more connection does not show).
            async with self._client() as client:
                answer = await client.messages.create(**self.request_body(request.messages))
        except anthropic.APIStatusError as exc:
            raise status_error(
                self.provider,
                self.name,
                exc.status_code,
                _detail(exc),
                headers=dict(exc.response.headers),
                secrets=self.config.secrets(),
            ) from None
        except anthropic.APIConnectionError as exc:  # APITimeoutError is one of these
            raise transport_error(
                self.provider,
                self.name,
                timed_out=isinstance(exc, anthropic.APITimeoutError),
                detail=str(exc),
                secrets=self.config.secrets(),
            ) from None
        except anthropic.AnthropicError as exc:
            raise unreadable_answer(
                self.provider, self.name, str(exc), secrets=self.config.secrets()
            ) from None
        return self._turn(answer)

    def _turn(self, answer: Any) -> ModelTurn:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in answer.content or []:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                # Not an object, or one with NaN or Infinity in it (the SDK's parser lets them through;
                # the data converter would quietly turn them into null): refused, the model told.
                usable = isinstance(block.input, dict) and uncarried(block.input, integers=False) is None
                arguments = block.input if usable else {}
                invalid = None if usable else json.dumps(block.input)
                calls.append(
                    ToolCall(
                        id=block.id or "", name=block.name, arguments=arguments, invalid_arguments=invalid
                    )
                )
        usage = None
        if answer.usage is not None:
            usage = TokenUsage(
                input_tokens=answer.usage.input_tokens or 0, output_tokens=answer.usage.output_tokens or 0
            )
        text = "".join(texts)
        # Text said beside tool calls travels in `final` too; only an answer without calls ends the run.
        return ModelTurn(tool_calls=calls, final=text if (text or not calls) else None, usage=usage)


def _detail(exc: Any) -> str:
    """The provider's own explanation, from its error body when it sent one."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    return str(getattr(exc, "message", exc))
