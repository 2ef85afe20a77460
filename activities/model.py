"""Model calls and agent descriptions."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from onceflow.agents import AgentRegistry
from onceflow.model import Model, ScriptError
from onceflow.payloads import AgentSpec, ModelCallInput, ModelTurn


class ModelActivities:
    def __init__(self, registry: AgentRegistry) -> None:
        self.registry = registry
        self._models: dict[str, Model] = {}

    def _model(self, agent: str) -> Model:
        if agent not in self._models:
            self._models[agent] = self.registry.agent(agent).build_model()
        return self._models[agent]

    @activity.defn(name="describe_agent")
    async def describe_agent(self, agent: str) -> AgentSpec:
        """The agent's tools and policy, recorded in history so a run keeps what it started with."""
        try:
            return self.registry.agent(agent).spec()
        except LookupError as exc:
            raise ApplicationError(str(exc), type="UnknownAgent", non_retryable=True) from exc

    @activity.defn(name="call_model")
    async def call_model(self, request: ModelCallInput) -> ModelTurn:
        try:
            return await self._model(request.agent).respond(request)
        except ScriptError as exc:
            raise ApplicationError(str(exc), type="ScriptError", non_retryable=True) from exc
