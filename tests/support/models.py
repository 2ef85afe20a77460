"""Models for workflow tests: a scripted model whose provider fails on cue, as a real API does."""

from __future__ import annotations

from collections import Counter

from onceflow.models import ScriptedModel, ScriptTurn
from onceflow.sdk.payloads import ModelCallInput, ModelTurn, ToolCall


class ModelUnavailableError(ConnectionError):
    """What a model provider's outage looks like to the activity: an ordinary, retryable error."""


class FlakyModel:
    """Fails its first `failures` calls, then plays `script`. Counts calls per turn (1-based)."""

    def __init__(self, script: list[ScriptTurn], failures: int) -> None:
        self._scripted = ScriptedModel(script)
        self.failures_left = failures
        self.calls: Counter[int] = Counter()

    async def respond(self, request: ModelCallInput) -> ModelTurn:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        self.calls[turn] += 1
        if self.failures_left > 0:
            self.failures_left -= 1
            raise ModelUnavailableError("model provider answered 503: overloaded")
        return await self._scripted.respond(request)


class CarelessIdModel:
    """A provider that is careless with tool call ids: it plays `answers` in order, each a list of
    (id, tool, arguments) or a final string, ids exactly as given (repeated, empty, reused)."""

    def __init__(self, answers: list[list[tuple[str, str, dict[str, object]]] | str]) -> None:
        self.answers = answers

    async def respond(self, request: ModelCallInput) -> ModelTurn:
        index = sum(1 for m in request.messages if m.role == "assistant")
        answer = self.answers[index]
        if isinstance(answer, str):
            return ModelTurn(final=answer)
        return ModelTurn(
            tool_calls=[ToolCall(id=id_, name=name, arguments=dict(args)) for id_, name, args in answer]
        )
