"""What every framework adapter shares; it imports no agent framework.

A framework's agent loop runs inside a workflow the user writes. Each write call of it is routed
through the very protocol AgentRunWorkflow uses (workflows/write_calls.py): the key is
`call_key(<workflow id>, <tool call id>)`, the ledger reserves it in onceflow's write activity, the
tool runs once with the key in its ToolContext, a lost attempt is inspected, an unknown one waits
durably for its reconcile hook or an operator. The hosting workflow inherits `OnceflowHost`, which
brings the handlers (workflows/write_handlers.py) and the search attributes, so the operator API
and the CLI see its calls as they see any run's.

    WRITES = WriteTools(billing_writes, agent="billing", tool_policy={"on_indeterminate": "pause"})

    @workflow.defn
    class BillingAgentWorkflow(OnceflowHost):
        @workflow.run
        async def run(self, prompt: str) -> str:
            async with self.onceflow(tenant="acme", agent=WRITES.agent_name):
                return (await agent.run(prompt)).output

The worker gets `OnceflowPlugin(database_url, agents=[WRITES])` (onceflow/runtime/plugin.py), which
registers the tools' agent, onceflow's activities and workflows, and what the hosting workflow needs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from onceflow.adapters.heard import ModelTurns, OnceflowState, ToldCall, heard_in, told_digest
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

    `agent` names them in the ledger, the worker's registry and `OnceflowAgent`. `tool_policy` is
    agents.yaml's `tool_policy`; its `on_indeterminate` says what a call whose outcome is unknown
    (a timeout, a lost worker) does to the run: `fail` ends the run there, with an error naming the
    call, and the model is asked nothing more; `pause` makes the call wait in the workflow
    (`awaiting_reconciliation`) until its reconcile hook or an operator settles it, and then the
    model is told the settled truth. Left out (None), the tools take the `tool_policy` of the
    OnceflowPlugin that serves them, whose own default is `fail`, as in agents.yaml.
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
        self._policy_chosen = tool_policy is not None
        self._default_policy: ToolPolicy | None = None
        self.agent = Agent(agent, _config(_policy(tool_policy)), by_name)
        # Computed here, outside any workflow: the workflow side only reads it.
        self.spec: AgentSpec = self.agent.spec()

    @property
    def agent_name(self) -> str:
        return self.agent.name

    @property
    def tools(self) -> dict[str, Tool]:
        return self.agent.tools

    @property
    def tool_policy(self) -> ToolPolicy:
        return self.agent.config.tool_policy

    def use_default_policy(self, policy: ToolPolicy) -> None:
        """The serving plugin's `tool_policy`, for tools declared without one (else nothing)."""
        if self._policy_chosen:
            return
        if self._default_policy is not None and self._default_policy != policy:
            raise ValueError(
                f"WriteTools({self.agent_name!r}) declares no tool_policy and two OnceflowPlugins give it "
                "different defaults: give it its own tool_policy"
            )
        self._default_policy = policy
        self.agent.config = _config(policy)
        self.spec = self.agent.spec()

    def is_write(self, name: str) -> bool:
        tool = self.agent.tools.get(name)
        return tool is not None and tool.side_effect is not SideEffect.READ

    def writes(self) -> list[Tool]:
        return [tool for tool in self.agent.tools.values() if tool.side_effect is not SideEffect.READ]

    def register(self, registry: AgentRegistry) -> AgentRegistry:
        """Add the tools' agent to a registry (the worker's activities look tools up there)."""
        existing = registry.agents.get(self.agent.name)
        if existing is not None and existing is not self.agent:
            raise ValueError(f"the registry already has an agent named {self.agent.name!r}")
        registry.agents[self.agent.name] = self.agent
        return registry

    async def call(
        self,
        name: str,
        tool_call_id: str,
        arguments: dict[str, Any],
        *,
        conversation: Iterable[tuple[str, str]] | None = None,
    ) -> ToolOutcome:
        """Workflow code: one write call through onceflow's protocol, in the hosting workflow.
        `conversation`: the tool results in the conversation of the model turn that asked for the
        call, as (framework call id, `told_digest` of the content) (onceflow/adapters/heard.py)."""
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
        return await host.onceflow_write(self.spec, name, tool_call_id, arguments, conversation=conversation)


def _policy(given: ToolPolicy | Mapping[str, Any] | None) -> ToolPolicy:
    return given if isinstance(given, ToolPolicy) else ToolPolicy(**(given or {}))


def _config(policy: ToolPolicy) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "model": {"provider": "scripted", "script": [{"final": _NOT_A_ONCEFLOW_LOOP}]},
            "tool_policy": policy.model_dump(),
        }
    )


class OnceflowHost(WriteCallHandlers):
    """Base class of a workflow that runs another framework's agent with onceflow's writes."""

    def __init__(self) -> None:
        super().__init__()
        self._onceflow_open = False
        self._used_call_ids: set[str] = set()
        self._write_calls = 0
        self._told: list[ToldCall] = []
        # Filled by OnceflowInterceptor for frameworks whose tool hook is not given the conversation.
        self.onceflow_model_turns = ModelTurns()

    @asynccontextmanager
    async def onceflow(
        self, *, tenant: str, agent: str, state: OnceflowState | None = None
    ) -> AsyncIterator[None]:
        """Around the agent's run: the tenant its calls are recorded for, and the search attributes
        (OnceflowPhase, OnceflowTenant, OnceflowAgent) an operator finds the run by. `state`: what
        the run this one continues as new handed on (`onceflow_state()`)."""
        if not tenant.strip():
            raise ApplicationError("a onceflow run needs a tenant", type="InvalidInput", non_retryable=True)
        self._tenant = tenant
        # New workflow types: no histories from before these behaviours, so no patches.
        self._recheck = True
        self._attributes_follow_ledger = True
        if state is not None:
            self._used_call_ids |= set(state.used_call_ids)
            self._write_calls = max(self._write_calls, state.write_calls)
            self._told = [*state.told, *self._told]
            self._conflicts |= set(state.conflict_keys)
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

    def onceflow_state(self) -> OnceflowState:
        """This run's write-call state, for the run it continues as new into (OnceflowState)."""
        if self._pending:
            raise ApplicationError(
                f"cannot continue as new while write calls are unresolved: {', '.join(sorted(self._pending))}",
                non_retryable=True,
            )
        return OnceflowState(
            used_call_ids=sorted(self._used_call_ids),
            write_calls=self._write_calls,
            told=list(self._told),
            conflict_keys=sorted(self._conflicts),
        )

    async def onceflow_write(
        self,
        spec: AgentSpec,
        name: str,
        framework_call_id: str,
        arguments: dict[str, Any],
        *,
        conversation: Iterable[tuple[str, str]] | None = None,
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
        info = workflow.info()
        tool_input = ToolCallInput(
            run_id=info.workflow_id,
            tenant=self._tenant,
            agent=spec.name,
            call=ToolCall(id=call_id, name=name, arguments=arguments),
            # Claims the run id for this run (ledger/run_ids.py): a later execution under the same
            # workflow id is refused at its first write, as AgentRunWorkflow's are.
            first_execution_run_id=info.first_execution_run_id,
            heard=heard_in(self._told, conversation or (), name),
        )
        outcome = await self._call_write(spec, tool, tool_input)
        self._calls[call_id] = call_summary(outcome)
        self._told.append(
            ToldCall(
                framework_call_id=framework_call_id,
                tool=name,
                told_sha256=told_digest(outcome.for_model()),
                heard=outcome.heard(),
            )
        )
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
