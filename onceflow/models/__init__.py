"""The models an agent can talk to, behind one protocol.

`scripted` plays a fixed script (no key, no network: demos, tests, drills); `openai` speaks the Chat
Completions API through the official SDK (any OpenAI-compatible server through `base_url`);
`anthropic` speaks the Messages API through the official SDK. The SDKs are optional extras, imported
only when an agent uses them.
"""

from __future__ import annotations

from typing import Protocol

from onceflow.sdk.payloads import ModelCallInput, ModelTurn


class Model(Protocol):
    """One turn: the conversation so far in, tool calls or a final answer out.

    A provider puts its own tool call id in `ToolCall.id` ("" when it sent none); the workflow
    mints the run's ids from them (onceflow/sdk/keys.py). Failures are raised as
    `temporalio.exceptions.ApplicationError`, retryable or not (onceflow/models/errors.py).
    """

    async def respond(self, request: ModelCallInput) -> ModelTurn: ...


from onceflow.models.scripted import ScriptedModel, ScriptError, ScriptTurn  # noqa: E402

__all__ = ["Model", "ScriptError", "ScriptTurn", "ScriptedModel"]
