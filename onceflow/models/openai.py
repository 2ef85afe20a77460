"""Chat Completions through the official `openai` SDK: api.openai.com, or any OpenAI-compatible
server (vLLM, Ollama, llama.cpp, LM Studio) at `base_url`.

The conversation goes out as the API's own messages: the agent's instructions as a `system` message,
tool results as `tool` messages answering the `tool_call_id` of the assistant message before them.
An assistant message that only calls tools carries `content: ""`, not null: llama.cpp's server
refuses null. Arguments come back as a JSON string; one that is not a JSON object is kept as text in
`ToolCall.invalid_arguments` and the call is refused before it reaches the ledger.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from onceflow.ledger.canonical import strict_loads
from onceflow.models.errors import status_error, transport_error, unreadable_answer
from onceflow.sdk.payloads import Message, ModelCallInput, ModelTurn, TokenUsage, ToolCall

if TYPE_CHECKING:
    from onceflow.models.config import OpenAIConfig


def _sdk() -> Any:
    try:
        import openai
    except ImportError as exc:  # checked at worker start-up too; this is the message if not
        raise RuntimeError(
            "provider openai needs the 'openai' package: pip install 'onceflow[openai]'"
        ) from exc
    return openai


def tool_definitions(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ToolSpec.json_schema (name, description, parameters) as Chat Completions function tools."""
    definitions = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool["parameters"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        definitions.append({"type": "function", "function": function})
    return definitions


def wire_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            wire.append(
                {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
            )
        elif message.role == "assistant" and message.tool_calls:
            wire.append(
                {
                    "role": "assistant",
                    "content": message.content,  # "" when there is no text: never null
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": _arguments_text(call)},
                        }
                        for call in message.tool_calls
                    ],
                }
            )
        else:
            wire.append({"role": message.role, "content": message.content})
    return wire


def _arguments_text(call: ToolCall) -> str:
    # What the model sent, when it was not an object: it sees its own mistake next to the error.
    if call.invalid_arguments is not None:
        return call.invalid_arguments
    return json.dumps(call.arguments)


def parse_arguments(text: str | None) -> tuple[dict[str, Any], str | None]:
    """(arguments, None) for a JSON object (an empty string counts as no arguments), else ({}, text)."""
    if text is None or not text.strip():
        return {}, None
    try:
        value = strict_loads(text)  # NaN, Infinity and 1e999 are not JSON: refused, not kept as null
    except ValueError:
        return {}, text
    if not isinstance(value, dict):
        return {}, text
    return value, None


class OpenAIChatModel:
    """One agent's model over Chat Completions. Built in the worker, where its key is read."""

    provider = "openai"

    def __init__(self, config: OpenAIConfig, tools: list[dict[str, Any]]) -> None:
        openai = _sdk()
        self.config = config
        self.name = config.model
        self._api = openai
        self._tools = tool_definitions(tools)

    def _client(self) -> Any:
        return self._api.AsyncOpenAI(
            api_key=self.config.api_key(),
            base_url=self.config.base_url,
            timeout=self.config.request_timeout.total_seconds(),
            max_retries=0,  # Temporal's retry policy is the one retry loop
            default_headers=self.config.headers() or None,
        )

    def request_body(self, messages: list[Message]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.config.model, "messages": wire_messages(messages)}
        if self._tools:
            body["tools"] = self._tools
            # OpenAI's default when tools are offered, said out loud: llama-cpp-python's
            # chatml-function-calling ignores the tools unless tool_choice is given.
            body["tool_choice"] = "auto"
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if self.config.max_output_tokens is not None:
            # OpenAI's own API wants the newer name (reasoning models refuse the old one); the
            # compatible servers know `max_tokens`.
            name = "max_tokens" if self.config.base_url else "max_completion_tokens"
            body[name] = self.config.max_output_tokens
        return body

    async def respond(self, request: ModelCallInput) -> ModelTurn:
        openai = self._api
        try:
            # A client per call: the key is read when it is built, and nothing is left open when the
            # worker stops (a model call takes seconds; one more connection does not show).
            async with self._client() as client:
                completion = await client.chat.completions.create(**self.request_body(request.messages))
        except openai.APIStatusError as exc:
            raise status_error(
                self.provider,
                self.name,
                exc.status_code,
                _detail(exc),
                code=getattr(exc, "code", None),
                headers=dict(exc.response.headers),
                secrets=self.config.secrets(),
            ) from None
        except openai.APIConnectionError as exc:  # APITimeoutError is one of these
            raise transport_error(
                self.provider,
                self.name,
                timed_out=isinstance(exc, openai.APITimeoutError),
                detail=str(exc),
                secrets=self.config.secrets(),
            ) from None
        except openai.OpenAIError as exc:
            raise unreadable_answer(
                self.provider, self.name, str(exc), secrets=self.config.secrets()
            ) from None
        return self._turn(completion)

    def _turn(self, completion: Any) -> ModelTurn:
        if not getattr(completion, "choices", None):
            raise unreadable_answer(
                self.provider, self.name, "no choices in the answer", secrets=self.config.secrets()
            )
        message = completion.choices[0].message
        calls = []
        for tool_call in message.tool_calls or []:
            function = getattr(tool_call, "function", None)
            if function is None:  # a kind of tool call this agent never offered (custom tools)
                continue
            arguments, invalid = parse_arguments(function.arguments)
            calls.append(
                ToolCall(
                    id=getattr(tool_call, "id", None) or "",
                    name=function.name,
                    arguments=arguments,
                    invalid_arguments=invalid,
                )
            )
        usage = None
        if completion.usage is not None:
            usage = TokenUsage(
                input_tokens=completion.usage.prompt_tokens or 0,
                output_tokens=completion.usage.completion_tokens or 0,
            )
        # Text said beside tool calls travels in `final` too; only an answer without calls ends the run.
        return ModelTurn(tool_calls=calls, final=message.content or ("" if not calls else None), usage=usage)


def _detail(exc: Any) -> str:
    """The provider's own explanation, from its error body when it sent one."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return str(getattr(exc, "message", exc))
