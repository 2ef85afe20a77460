"""agents.yaml: which agents exist, what model drives them, which tools they get, and their policy.

toolsets:
  billing: examples.billing.tools:billing      # name -> "module:attribute" of a Toolset
agents:
  billing-assistant:
    model: {provider: scripted, script: [...]}
    instructions: You help with refunds.
    toolsets: [billing]
    tool_policy: {on_indeterminate: pause, reconcile_deadline: 10m, escalation_owner: oncall}
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from onceflow.mcp.config import McpServerConfig
from onceflow.models import Model
from onceflow.models.config import ModelConfig, resolve_model_wrapper
from onceflow.runtime.constants import DEFAULT_RECHECK
from onceflow.sdk.durations import PositiveDuration
from onceflow.sdk.guard_sources import limit_source_problems
from onceflow.sdk.payloads import AgentSpec, ToolPolicySpec, ToolSpec
from onceflow.sdk.testing import tool_contract_problems
from onceflow.sdk.tools import Tool, Toolset


class AgentConfigError(ValueError):
    """agents.yaml is malformed or names something that does not exist. Says file, agent, problem."""

    def __init__(self, path: Path | str, problem: str, agent: str | None = None) -> None:
        where = f"{path}" + (f", agent {agent!r}" if agent else "")
        super().__init__(f"{where}: {problem}")
        self.path = str(path)
        self.agent = agent
        self.problem = problem


class ToolPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    on_indeterminate: Literal["pause", "fail"] = "fail"
    reconcile_deadline: PositiveDuration = timedelta(hours=1)
    reconcile_initial_interval: PositiveDuration = timedelta(seconds=1)
    reconcile_max_interval: PositiveDuration = timedelta(minutes=5)
    escalation_owner: str | None = None
    # How long a call of an `approval=True` tool waits for an operator; then it is denied.
    approval_deadline: PositiveDuration = timedelta(hours=24)
    # A paused call re-reads the ledger this often even when no signal comes (one may be lost).
    recheck_interval: PositiveDuration = DEFAULT_RECHECK
    # A tool result larger than this (as JSON) reaches the model as an error instead of the result,
    # and is not stored: one huge result must not swell every later turn and the run's history.
    max_result_bytes: int = Field(default=128 * 1024, ge=1024, le=2 * 1024 * 1024)


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ModelConfig
    instructions: str = ""
    toolsets: list[str] = []
    tool_policy: ToolPolicy = ToolPolicy()


class AgentsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    toolsets: dict[str, str] = {}
    # MCP servers are toolsets too; their tools are listed when the worker starts (onceflow/mcp/).
    mcp_servers: dict[str, McpServerConfig] = {}
    # None is fine: a deployment whose agents are all another framework's (docs/adapters.md) has
    # toolsets at most, or no file at all.
    agents: dict[str, AgentConfig] = {}


class Agent:
    """One configured agent with its tools resolved.

    `model`, when given, is the model this agent talks to instead of the one its config describes:
    for agents built in code around a model of their own (tests, embedding applications).
    """

    def __init__(
        self, name: str, config: AgentConfig, tools: dict[str, Tool], *, model: Model | None = None
    ) -> None:
        self.name = name
        self.config = config
        self.tools = tools
        self._model = model

    @property
    def has_own_model(self) -> bool:
        return self._model is not None

    def build_model(self) -> Model:
        if self._model is not None:
            return self._model
        return self.config.model.build([tool.json_schema() for tool in self.tools.values()])

    def spec(self) -> AgentSpec:
        policy = self.config.tool_policy
        return AgentSpec(
            name=self.name,
            instructions=self.config.instructions,
            tools={
                name: ToolSpec(
                    name=name,
                    side_effect=tool.side_effect,
                    timeout_seconds=tool.effect.timeout.total_seconds(),
                    approval=tool.effect.approval,
                    has_reconcile=tool.reconcile is not None,
                    has_compensation=tool.compensation is not None,
                    has_dedup_window=tool.effect.dedup_window is not None,
                    json_schema=tool.json_schema(),
                )
                for name, tool in self.tools.items()
            },
            policy=ToolPolicySpec(
                on_indeterminate=policy.on_indeterminate,
                reconcile_deadline_seconds=policy.reconcile_deadline.total_seconds(),
                reconcile_initial_interval_seconds=policy.reconcile_initial_interval.total_seconds(),
                reconcile_max_interval_seconds=policy.reconcile_max_interval.total_seconds(),
                escalation_owner=policy.escalation_owner,
                approval_deadline_seconds=policy.approval_deadline.total_seconds(),
                recheck_interval_seconds=policy.recheck_interval.total_seconds(),
            ),
            model=self.config.model.spec(),
        )


class AgentRegistry:
    """Agents by name, and every tool any of them can call."""

    def __init__(
        self,
        agents: dict[str, Agent],
        path: str = "<memory>",
        *,
        mcp_servers: dict[str, McpServerConfig] | None = None,
    ) -> None:
        self.agents = agents
        self.path = path
        # Their tools join the agents once started: `async with onceflow.mcp.runtime.mcp_toolsets(registry)`.
        self.mcp_servers = mcp_servers or {}
        self.mcp_attached = False  # set once their tools are attached (onceflow.mcp.runtime.attach_tools)
        # Agents whose model this worker cannot build (a key not set, an SDK not installed), and why.
        # Their tools stay known, so reconcile and compensation of their calls still work here.
        self.unavailable: dict[str, str] = {}

    def model_agent(self, name: str) -> Agent:
        """The agent, if this worker can talk to its model; LookupError saying why not otherwise."""
        agent = self.agent(name)
        if name in self.unavailable:
            raise LookupError(f"agent {name!r} is not served by this worker: {self.unavailable[name]}")
        return agent

    def agent(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise LookupError(f"no agent named {name!r} in {self.path} (known: {known})") from None

    def tool(self, agent: str, name: str) -> Tool:
        tools = self.agent(agent).tools
        try:
            return tools[name]
        except KeyError:
            raise LookupError(f"agent {agent!r} has no tool {name!r}") from None

    def all_tools(self) -> list[Tool]:
        seen: dict[int, Tool] = {}
        for agent in self.agents.values():
            for tool in agent.tools.values():
                seen[id(tool)] = tool
        return list(seen.values())


def _import_toolset(path: Path | str, name: str, target: str) -> Toolset:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise AgentConfigError(path, f"toolset {name!r}: {target!r} is not 'module:attribute'")
    try:
        module = importlib.import_module(module_name)
        toolset = getattr(module, attribute)
    except (ImportError, AttributeError) as exc:
        raise AgentConfigError(path, f"toolset {name!r}: cannot import {target!r}: {exc}") from exc
    if not isinstance(toolset, Toolset):
        raise AgentConfigError(path, f"toolset {name!r}: {target!r} is not a onceflow Toolset")
    return toolset


def build_registry(data: Any, path: Path | str = "<memory>") -> AgentRegistry:
    """Validate parsed agents.yaml content and resolve every toolset and tool it names."""
    if not isinstance(data, dict):
        raise AgentConfigError(path, "expected a mapping with 'toolsets' and 'agents'")
    try:
        parsed = AgentsFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = [str(p) for p in first["loc"]]
        if (
            location[2:3] == ["model"]
            and location[3:4]
            and location[3] in ("scripted", "openai", "anthropic")
        ):
            del location[3]  # the provider's tag: `provider` already says it
        agent = location[1] if len(location) > 1 and location[0] == "agents" else None
        problem = f"{'.'.join(location)}: {first['msg']}"
        raise AgentConfigError(path, problem, agent) from None
    both = sorted(set(parsed.toolsets) & set(parsed.mcp_servers))
    if both:
        raise AgentConfigError(path, f"{', '.join(both)}: named both in toolsets and mcp_servers")
    toolsets = {name: _import_toolset(path, name, target) for name, target in parsed.toolsets.items()}
    agents: dict[str, Agent] = {}
    for agent_name, config in parsed.agents.items():
        tools: dict[str, Tool] = {}
        for toolset_name in config.toolsets:
            if toolset_name in parsed.mcp_servers:
                continue  # its tools are attached when the worker has listed them
            if toolset_name not in toolsets:
                raise AgentConfigError(path, f"unknown toolset {toolset_name!r}", agent_name)
            for tool in toolsets[toolset_name].tools:
                if tool.name in tools:
                    raise AgentConfigError(path, f"two tools are named {tool.name!r}", agent_name)
                problems = tool_contract_problems(tool)
                if problems:
                    raise AgentConfigError(
                        path,
                        f"tool {toolset_name}.{tool.name} breaks the contract: " + "; ".join(problems),
                        agent_name,
                    )
                tools[tool.name] = tool
        # An MCP server's tools come later: a limit_from naming one is checked once they are listed.
        more_to_come = any(name in parsed.mcp_servers for name in config.toolsets)
        problems = limit_source_problems(tools, more_to_come=more_to_come)
        if problems:
            raise AgentConfigError(path, "; ".join(problems), agent_name)
        if config.model.wrapper:
            try:
                resolve_model_wrapper(config.model.wrapper)
            except ValueError as exc:
                raise AgentConfigError(path, f"model.wrapper: {exc}", agent_name) from None
        agents[agent_name] = Agent(agent_name, config, tools)
    return AgentRegistry(agents, str(path), mcp_servers=parsed.mcp_servers)


def load_agents(path: Path | str) -> AgentRegistry:
    """Read and check agents.yaml. Every problem names the file and, where it can, the agent."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise AgentConfigError(path, f"cannot read: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = "; ".join(part for part in (exc.context, exc.problem) if part) or str(exc)
        agent = _agent_at_line(text, mark.line) if mark else None
        raise AgentConfigError(path, f"not valid YAML{where}: {what}", agent) from exc
    except yaml.YAMLError as exc:
        raise AgentConfigError(path, f"not valid YAML: {exc}") from exc
    return build_registry(data, path)


def _agent_at_line(text: str, line: int) -> str | None:
    """The agent whose block holds `line` (0-based) of a file that does not parse, judged by indentation."""
    agent: str | None = None
    in_agents = False
    indent: int | None = None
    for raw in text.splitlines()[: line + 1]:
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        depth = len(raw) - len(raw.lstrip())
        if depth == 0:
            in_agents, agent, indent = stripped.startswith("agents:"), None, None
        elif in_agents:
            indent = indent or depth  # the first line under `agents:` sets where agent names sit
            if depth == indent:
                agent = stripped.split(":", 1)[0].strip().strip("'\"") or None
    return agent


def check_models(registry: AgentRegistry, enabled: tuple[str, ...] | None = None) -> list[str]:
    """At worker start-up: can this worker build each agent's model (keys set, SDKs installed)?

    With `enabled` (ONCEFLOW_AGENTS_ENABLED), every agent named must be buildable, or this raises
    AgentConfigError naming the file, the agent and the problem; the other agents are not served.
    Without it, an agent that cannot be built is not served, and the returned lines say why (the
    worker logs them), so users without a provider's key can still run the agents that need none.
    Nothing here reads a key's value into anything but a yes or no.
    """
    if enabled is not None:
        unknown = sorted(set(enabled) - set(registry.agents))
        if unknown:
            known = ", ".join(sorted(registry.agents))
            raise AgentConfigError(
                registry.path,
                f"ONCEFLOW_AGENTS_ENABLED names {', '.join(unknown)}, not in the file (known: {known})",
            )
    notes = []
    for name, agent in registry.agents.items():
        if enabled is not None and name not in enabled:
            registry.unavailable[name] = "not in ONCEFLOW_AGENTS_ENABLED"
            continue
        problems = [] if agent.has_own_model else agent.config.model.environment_problems()
        if not problems:
            continue
        if enabled is not None:
            raise AgentConfigError(registry.path, "; ".join(problems), name)
        registry.unavailable[name] = "; ".join(problems)
        notes.append(f"agent {name!r} is not served: {registry.unavailable[name]}")
    return notes
