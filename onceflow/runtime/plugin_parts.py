"""What OnceflowPlugin (onceflow/runtime/plugin.py) puts together for a client and its workers: a data
converter that carries onceflow's payloads, the workflow sandbox taking onceflow's modules as they
are, and one agent registry from the sources it was given."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence

from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter, DefaultPayloadConverter
from temporalio.worker import WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from onceflow.adapters.host import WriteTools
from onceflow.runtime.agents import AgentRegistry, ToolPolicy, check_models, load_agents

log = logging.getLogger("onceflow.runtime.plugin")

AgentSource = str | os.PathLike[str] | AgentRegistry | WriteTools


# The sandbox imports afresh, per workflow, every module not passed through. A hosting workflow's
# module imports `onceflow.adapters...`, whose package imports the ledger and with it asyncpg: fresh
# copies of those gave the workflow a second `Status` class (so `outcome.status is Status.X` was false
# and an unknown call did not wait) and, re-initialised beside the real one, asyncpg's C extension
# crashed the worker (a segmentation fault in `execute`). onceflow's own workflows import them passed
# through; this makes it so for every workflow on the worker. (`onceflow` covers onceflow.ledger and
# onceflow.activities, the symlinked top-level folders.)
_PASSED_THROUGH = ("asyncpg", "onceflow")


def carrying_pydantic(converter: DataConverter | None) -> DataConverter:
    """A data converter for onceflow's payloads: the given one, unless it is Temporal's default, which
    cannot carry pydantic models; then the same with temporalio.contrib.pydantic's payload converter
    (a codec or failure converter it has are kept)."""
    if converter is None or converter is DataConverter.default:
        return pydantic_data_converter
    if converter.payload_converter_class is DefaultPayloadConverter:
        return dataclasses.replace(converter, payload_converter_class=PydanticPayloadConverter)
    return converter


def later_plugin_brings_a_converter(plugin: object, plugins: Sequence[object]) -> bool:
    """Does a plugin configured after this one set the data converter (OpenAIAgentsPlugin,
    PydanticAIPlugin)? Then it decides: both carry pydantic models, and OpenAI's refuses to follow
    another converter."""
    listed = list(plugins)
    later = listed[listed.index(plugin) + 1 :] if plugin in listed else []
    return any(getattr(p, "data_converter", None) is not None for p in later)


def with_pass_through(runner: WorkflowRunner | None) -> WorkflowRunner:
    if runner is None:
        raise ValueError("OnceflowPlugin: the worker has no workflow runner")
    if not isinstance(runner, SandboxedWorkflowRunner):
        return runner
    return dataclasses.replace(
        runner, restrictions=runner.restrictions.with_passthrough_modules(*_PASSED_THROUGH)
    )


def registry_from(
    agents: AgentSource | Sequence[AgentSource] | None, policy: ToolPolicy | None
) -> AgentRegistry:
    """One registry from what `agents` names, with `policy` for the agents declared without one."""
    if agents is None:
        sources: list[AgentSource] = []
    elif isinstance(agents, (str, os.PathLike, AgentRegistry, WriteTools)):
        sources = [agents]
    else:
        sources = list(agents)
    registry: AgentRegistry | None = None
    writes: list[WriteTools] = []
    for source in sources:
        if isinstance(source, WriteTools):
            writes.append(source)
            continue
        loaded = source if isinstance(source, AgentRegistry) else _load(source)
        if policy is not None:
            for agent in loaded.agents.values():
                if "tool_policy" not in agent.config.model_fields_set:
                    agent.config = agent.config.model_copy(update={"tool_policy": policy})
        if registry is None:
            registry = loaded
            continue
        both = sorted(set(registry.agents) & set(loaded.agents))
        if both:
            raise ValueError(f"OnceflowPlugin: agents named twice: {', '.join(both)}")
        registry.agents.update(loaded.agents)
        registry.mcp_servers.update(loaded.mcp_servers)
    registry = registry if registry is not None else AgentRegistry({})
    for write_tools in writes:
        if policy is not None:
            write_tools.use_default_policy(policy)
        write_tools.register(registry)
    return registry


def _load(path: str | os.PathLike[str]) -> AgentRegistry:
    registry = load_agents(os.fspath(path))
    for note in check_models(registry):
        log.warning("%s", note)
    return registry
