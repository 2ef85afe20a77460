"""The workflow hosting the Pydantic AI agent of tests/support/pydantic_ai_agents.py."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    from onceflow.adapters.host import OnceflowHost
    from tests.support.pydantic_ai_agents import (
        AGENT,
        DEFAULT_POLICY_AGENT,
        DEFAULT_POLICY_WRITES,
        WRITES,
        AdapterRunInput,
        ContinuingRunInput,
    )


@workflow.defn
class PydanticBillingWorkflow(OnceflowHost):
    @workflow.run
    async def run(self, request: AdapterRunInput) -> str:
        prompt = request.model_dump_json()
        async with self.onceflow(tenant=request.tenant, agent=WRITES.agent_name):
            result = await AGENT.run(prompt)
        return result.output


@workflow.defn
class PydanticDefaultPolicyWorkflow(OnceflowHost):
    """DEFAULT_POLICY_AGENT: its writes take the serving plugin's tool_policy."""

    @workflow.run
    async def run(self, request: AdapterRunInput) -> str:
        async with self.onceflow(tenant=request.tenant, agent=DEFAULT_POLICY_WRITES.agent_name):
            result = await DEFAULT_POLICY_AGENT.run(request.model_dump_json())
        return result.output


@workflow.defn
class PydanticContinuingWorkflow(OnceflowHost):
    """Answers, then continues as new with the conversation (and OnceflowState when `pass_state`)."""

    @workflow.run
    async def run(self, request: ContinuingRunInput) -> str:
        prompt = AdapterRunInput(tenant=request.tenant, script=request.script).model_dump_json()
        history = ModelMessagesTypeAdapter.validate_json(request.history) if request.history else None
        async with self.onceflow(tenant=request.tenant, agent=WRITES.agent_name, state=request.onceflow):
            result = await AGENT.run("go on" if history else prompt, message_history=history)
        if request.executions > 1:
            workflow.continue_as_new(
                request.model_copy(
                    update={
                        "executions": request.executions - 1,
                        "history": result.all_messages_json().decode(),
                        "onceflow": self.onceflow_state() if request.pass_state else None,
                    }
                )
            )
        return result.output


@workflow.defn
class PydanticProcessWorkflow(OnceflowHost):
    """The same, for the agent of tests/support/pydantic_ai_process.py (imported only when used)."""

    @workflow.run
    async def run(self, request: AdapterRunInput) -> str:
        with workflow.unsafe.imports_passed_through():
            from tests.support.pydantic_ai_process import PROCESS_AGENT, PROCESS_WRITES

        async with self.onceflow(tenant=request.tenant, agent=PROCESS_WRITES.agent_name):
            result = await PROCESS_AGENT.run(request.model_dump_json())
        return result.output


@workflow.defn
class UnhostedPydanticWorkflow:
    """The agent in a workflow that is not an OnceflowHost: its writes must refuse to run."""

    @workflow.run
    async def run(self, request: AdapterRunInput) -> str:
        result = await AGENT.run(request.model_dump_json())
        return result.output
