"""Model calls and agent descriptions."""

from __future__ import annotations

import asyncio

from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from onceflow.activities.conversation import whole_conversation
from onceflow.ledger.conversations import Conversations
from onceflow.models import Model, ScriptError
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import MODEL_HEARTBEAT
from onceflow.sdk.payloads import AgentSpec, ModelCallInput, ModelTurn


class ModelActivities:
    def __init__(self, registry: AgentRegistry, conversations: Conversations) -> None:
        self.registry = registry
        self.conversations = conversations
        self._models: dict[str, Model] = {}

    def _model(self, agent: str) -> Model:
        if agent not in self._models:
            try:
                self._models[agent] = self.registry.model_agent(agent).build_model()
            except (LookupError, RuntimeError) as exc:  # no such agent here; its key or SDK missing
                raise ApplicationError(str(exc), type="ModelNotBuilt", non_retryable=True) from None
        return self._models[agent]

    @activity.defn(name="describe_agent")
    async def describe_agent(self, agent: str) -> AgentSpec:
        """The agent's tools and policy, recorded in history so a run keeps what it started with."""
        try:
            return self.registry.model_agent(agent).spec()
        except LookupError as exc:
            raise ApplicationError(str(exc), type="UnknownAgent", non_retryable=True) from exc

    @activity.defn(name="call_model")
    async def call_model(self, request: ModelCallInput) -> ModelTurn:
        """One model turn. It heartbeats while the model thinks, so a dead worker is noticed in
        seconds (MODEL_HEARTBEAT) rather than at the end of the model's whole timeout."""
        model = self._model(request.agent)
        spec = self.registry.agent(request.agent).config.model.spec()
        span = trace.get_current_span()
        # OpenTelemetry's GenAI semantic conventions, so that trace tools know what they show.
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.provider.name", spec.provider)
        span.set_attribute("gen_ai.request.model", spec.model)
        beating = asyncio.create_task(_heartbeat_until_cancelled())
        try:
            head = None
            if request.by_reference:
                request, head = await whole_conversation(self.conversations, request)
            turn = await model.respond(request)
            if head is not None:
                turn = turn.model_copy(update={"conversation_head": head})
        except ScriptError as exc:
            raise ApplicationError(str(exc), type="ScriptError", non_retryable=True) from exc
        finally:
            beating.cancel()
        if turn.usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", turn.usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", turn.usage.output_tokens)
        return turn


async def _heartbeat_until_cancelled() -> None:
    interval = MODEL_HEARTBEAT.total_seconds() / 4
    while True:
        activity.heartbeat()
        await asyncio.sleep(interval)
