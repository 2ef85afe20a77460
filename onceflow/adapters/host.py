"""What every framework adapter shares; it imports no agent framework.

A framework's agent loop runs inside a workflow the user writes. Each write call of it is routed
through the very protocol AgentRunWorkflow uses (workflows/write_calls.py): the key is
`call_key(<workflow id>, <tool call id>)`, the ledger reserves it in onceflow's write activity, the
tool runs once with the key in its ToolContext, a lost attempt is inspected, an unknown one waits
durably for its reconcile hook or an operator. The hosting workflow inherits `OnceflowHost`, which
brings the handlers (workflows/write_handlers.py) and the search attributes, so the operator API
and the CLI see its calls as they see any run's.

    writes = WriteTools(billing_writes, agent="billing-pydantic-ai")

    @workflow.defn
    class BillingAgentWorkflow(OnceflowHost):
        @workflow.run
        async def run(self, prompt: str) -> str:
            async with self.onceflow(tenant="acme", agent=writes.agent_name):
                return (await agent.run(prompt)).output

The worker registers the tools' agent (`writes.register(registry)`) and the workflow
(`build_worker(..., workflows=[BillingAgentWorkflow])`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError
from temporalio.plugin import SimplePlugin
from temporalio.worker import WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

with workflow.unsafe.imports_passed_through():
    from onceflow.ledger.status import SideEffect
    from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry, ToolPolicy
    from onceflow.runtime.constants import AGENT, TENANT
    from onceflow.sdk.guard_sources import limit_source_problems
    from onceflow.sdk.keys import mint_tool_call_ids
    from onceflow.sdk.payloads import AgentSpec, Phase, RunStatus, ToolCall, ToolCallInput, ToolOutcome
    from onceflow.sdk.testing import tool_contract_problems
    from onceflow.sdk.tools import Tool, Toolset

from onceflow.workflows.write_calls import call_summary
from onceflow.workflows.write_handlers import WriteCallHandlers

# What the onceflow agent of a framework's tools answers if someone starts an AgentRunWorkflow for it.
_NOT_A_ONCEFLOW_LOOP = "This agent's tools are driven by another agent framework, not by onceflow's loop."
ERR_NOT_HOSTED = "OnceflowNotHosted"


class WriteTools:
    """Tools declared with onceflow's decorators (`@toolset.tool(external(), reconcile=...)`),
    offered to another framework's agent. Each is a onceflow tool in every respect: its key, its
    ledger record, its guards, approval, reconcile and compensation hooks.

    `agent` names them in the ledger, the worker's registry and `OnceflowAgent`; `tool_policy` is
    agents.yaml's `tool_policy` (on_indeterminate, reconcile_deadline, recheck_interval, ...).
    Read tools may sit in the toolset for the guards that ask them (`Guards(limit_from=...)`); the
    framework's own read tools keep its retries.
    """

    def __init__(
        self,
        tools: Toolset | Iterable[Tool],
        *,
        agent: str,
        tool_policy: ToolPolicy | Mapping[str, Any] | None = None,
    ) -> None:
        listed = list(tools.tools if isinstance(tools, Toolset) else tools)
        by_name: dict[str, Tool] = {}
        problems: list[str] = []
        for tool in listed:
            if tool.name in by_name:
                problems.append(f"two tools are named {tool.name!r}")
            by_name[tool.name] = tool
            problems += [f"{tool.name}: {p}" for p in tool_contract_problems(tool)]
        problems += limit_source_problems(by_name, more_to_come=False)
        if not agent.strip():
            problems.append("agent must name the tools' agent (it keys the ledger's records)")
        if not any(tool.side_effect is not SideEffect.READ for tool in listed):
            problems.append("no write, external or destructive tool: there is nothing to route")
        if problems:
            raise ValueError(f"WriteTools({agent!r}): " + "; ".join(problems))
        policy = tool_policy if isinstance(tool_policy, ToolPolicy) else ToolPolicy(**(tool_policy or {}))
        config = AgentConfig.model_validate(
            {
                "model": {"provider": "scripted", "script": [{"final": _NOT_A_ONCEFLOW_LOOP}]},
                "tool_policy": policy.model_dump(),
            }
        )
        self.agent = Agent(agent, config, by_name)
        # Computed here, outside any workflow: the workflow side only reads it.
        self.spec: AgentSpec = self.agent.spec()

    @property
    def agent_name(self) -> str:
        return self.agent.name

    @property
    def tools(self) -> dict[str, Tool]:
        return self.agent.tools

    def is_write(self, name: str) -> bool:
        tool = self.agent.tools.get(name)
        return tool is not None and tool.side_effect is not SideEffect.READ

    def writes(self) -> list[Tool]:
        return [tool for tool in self.agent.tools.values() if tool.side_effect is not SideEffect.READ]

    def register(self, registry: AgentRegistry) -> AgentRegistry:
        """Add the tools' agent to the worker's registry (its activities look tools up there)."""
        existing = registry.agents.get(self.agent.name)
        if existing is not None and existing is not self.agent:
            raise ValueError(f"the registry already has an agent named {self.agent.name!r}")
        registry.agents[self.agent.name] = self.agent
        return registry

    async def call(self, name: str, tool_call_id: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Workflow code: one write call through onceflow's protocol, in the hosting workflow."""
        host = workflow.instance()
        # By name, not isinstance: the sandbox may have imported the workflow's module (and its
        # OnceflowHost) afresh while this module was passed through.
        if not callable(getattr(host, "onceflow_write", None)):
            raise ApplicationError(
                f"{name} is a onceflow write tool: the workflow running the agent "
                f"({type(host).__name__}) must inherit onceflow.adapters.host.OnceflowHost",
                type=ERR_NOT_HOSTED,
                non_retryable=True,
            )
        return await host.onceflow_write(self.spec, name, tool_call_id, arguments)


class OnceflowHost(WriteCallHandlers):
    """Base class of a workflow that runs another framework's agent with onceflow's writes."""

    def __init__(self) -> None:
        super().__init__()
        self._onceflow_open = False
        self._used_call_ids: set[str] = set()
        self._write_calls = 0

    @asynccontextmanager
    async def onceflow(self, *, tenant: str, agent: str) -> AsyncIterator[None]:
        """Around the agent's run: the tenant its calls are recorded for, and the search attributes
        (OnceflowPhase, OnceflowTenant, OnceflowAgent) an operator finds the run by."""
        if not tenant.strip():
            raise ApplicationError("a onceflow run needs a tenant", type="InvalidInput", non_retryable=True)
        self._tenant = tenant
        # New workflow types: no histories from before these behaviours, so no patches.
        self._recheck = True
        self._attributes_follow_ledger = True
        self._onceflow_open = True
        workflow.upsert_search_attributes([TENANT.value_set(tenant), AGENT.value_set(agent)])
        self._set_phase(Phase.RUNNING)
        try:
            yield
        except BaseException:
            self._set_phase(Phase.FAILED)
            raise
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._set_phase(Phase.COMPLETED)

    async def onceflow_write(
        self, spec: AgentSpec, name: str, framework_call_id: str, arguments: dict[str, Any]
    ) -> ToolOutcome:
        if not self._onceflow_open:
            raise ApplicationError(
                f"{name} was called outside `async with self.onceflow(tenant=..., agent=...)`: "
                "the run has no tenant to record it for",
                type=ERR_NOT_HOSTED,
                non_retryable=True,
            )
        tool = spec.tools.get(name)
        if tool is None or tool.side_effect is SideEffect.READ:
            raise ApplicationError(f"{name!r} is not a write tool of {spec.name}", non_retryable=True)
        # The framework's id, unless this run used it already (a test model's fixed ids, a provider
        # that repeats them): keys.py's rule, over everything this run did, all of it in history.
        self._write_calls += 1
        (call_id,) = mint_tool_call_ids([framework_call_id], turn=self._write_calls, used=self._used_call_ids)
        tool_input = ToolCallInput(
            run_id=workflow.info().workflow_id,
            tenant=self._tenant,
            agent=spec.name,
            call=ToolCall(id=call_id, name=name, arguments=arguments),
        )
        outcome = await self._call_write(spec, tool, tool_input)
        self._calls[call_id] = call_summary(outcome)
        return outcome

    @workflow.query
    def status(self) -> RunStatus:
        return RunStatus(
            phase=self._phase,
            turns=0,
            pending=list(self._pending.values()),
            calls=list(self._calls.values()),
            last_resolve_error=self._last_resolve_error,
        )


# The sandbox imports afresh, per workflow, every module not passed through. A hosting workflow's
# module imports `onceflow.adapters...`, whose package imports the ledger and with it asyncpg: fresh
# copies of those gave the workflow a second `Status` class (so `outcome.status is Status.X` was false
# and an unknown call did not wait) and, re-initialised beside the real one, asyncpg's C extension
# crashed the worker (a segmentation fault in `execute`). onceflow's own workflows import them passed
# through; this makes it so for every workflow on the worker. (`onceflow` covers onceflow.ledger and
# onceflow.activities, the symlinked top-level folders.)
_PASSED_THROUGH = ("asyncpg", "onceflow")


def _pass_through(runner: WorkflowRunner | None) -> WorkflowRunner:
    assert runner is not None
    if not isinstance(runner, SandboxedWorkflowRunner):
        return runner
    return dataclasses.replace(
        runner, restrictions=runner.restrictions.with_passthrough_modules(*_PASSED_THROUGH)
    )


def sandbox_plugin() -> SimplePlugin:
    """A worker plugin for workers that host another framework's agents: the workflow sandbox takes
    onceflow's modules, the ledger and asyncpg as they are (see _PASSED_THROUGH)."""
    return SimplePlugin("onceflow.sandbox", workflow_runner=_pass_through)
