"""AgentRunWorkflow: one agent run. The model proposes tool calls; the ledger decides about writes.

Signals and updates (`resolve`, `escalated`, `conflict`): workflows/write_handlers.py.
Queries: `status() -> RunStatus`: phase, pending calls and their last known ledger status.
Search attributes: OnceflowPhase, OnceflowTenant, OnceflowAgent, OnceflowUnresolvedKeys,
    OnceflowEscalatedTo, OnceflowHeldKeys. They follow the ledger: a key leaves them when its call is
    settled (or, for a held call, when a guard lets it go).
A paused run also re-reads the ledger on a slow timer (`tool_policy.recheck_interval`), so a lost
signal cannot strand it.
"""

from __future__ import annotations

import json
from datetime import timedelta

from temporalio import workflow
from temporalio.common import SearchAttributePair
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
)

with workflow.unsafe.imports_passed_through():
    from onceflow.activities.model import ModelActivities
    from onceflow.activities.tools import ToolActivities
    from onceflow.ledger.guards import Heard
    from onceflow.ledger.status import SideEffect
    from onceflow.runtime.constants import (
        ACTIVITY_MARGIN,
        AGENT,
        ERR_NOT_A_READ,
        LEDGER_STEP_TIMEOUT,
        MODEL_HEARTBEAT,
        MODEL_RETRY,
        MODEL_TIMEOUT,
        PHASE,
        READ_RETRY,
        TENANT,
    )
    from onceflow.sdk.keys import mint_tool_call_ids
    from onceflow.sdk.payloads import (
        AgentRunInput,
        AgentRunResult,
        AgentSpec,
        Message,
        Phase,
        RunStatus,
        TokenUsage,
        ToolCall,
        ToolCallInput,
        ToolOutcome,
        ToolSpec,
    )

from onceflow.workflows.conversation import Conversation
from onceflow.workflows.write_calls import call_summary
from onceflow.workflows.write_handlers import WriteCallHandlers

# Patches (workflow.patched): runs started before a patch replay without it. See docs/operations.md.
# Model turns take the conversation by reference (stored beside the ledger) instead of inline.
PATCH_CONVERSATION_BY_REFERENCE = "conversation-by-reference"
# A paused call re-reads the ledger on a slow timer instead of waiting only for a signal.
PATCH_LEDGER_RECHECK = "ledger-recheck"
# Search attributes follow the ledger: escalations are cleared when settled; a run that fails on an
# unknown call does not claim it as its own unresolved key after it has closed.
PATCH_SEARCH_ATTRIBUTES_FOLLOW_LEDGER = "search-attributes-follow-ledger"
# Each write call names the same tool's calls whose settled outcome the model had been given when
# it asked for it (ToolCallInput.heard), so that the intent guard can tell a new effect from a retry.
PATCH_INTENT_HEARD = "intent-heard"
# Every patch above (and write_waits.PATCH_WAIT_WITHOUT_RECONCILER), taken at once by a run that
# starts with it: one marker where there were up to five, and one TemporalChangeVersion upsert (a
# visibility write each) where there were as many. Such a run also skips its first search-attribute
# upsert when it was started with those values (`start_run` sets them). Runs started before replay
# the patches one by one, as they recorded them.
PATCH_CURRENT = "agent-run-2026-12-02"


def initial_search_attributes(run_input: AgentRunInput) -> list[SearchAttributePair[str]]:
    """What a run shows from its start: running, its tenant and its agent (`start_run` passes them)."""
    return [
        SearchAttributePair(PHASE, Phase.RUNNING.value),
        SearchAttributePair(TENANT, run_input.tenant),
        SearchAttributePair(AGENT, run_input.agent),
    ]


def _started_with(pairs: list[SearchAttributePair[str]]) -> bool:
    """Was the run started with these values already (the first event says so, on replay too)?"""
    started = workflow.info().typed_search_attributes
    return all(started.get(pair.key) == pair.value for pair in pairs)


@workflow.defn
class AgentRunWorkflow(WriteCallHandlers):
    def __init__(self) -> None:
        super().__init__()
        self._turns = 0
        self._used_call_ids: set[str] = set()
        self._usage: list[TokenUsage] = []
        self._intent_heard = False

    @workflow.run
    async def run(self, run_input: AgentRunInput) -> AgentRunResult:
        self._tenant = run_input.tenant
        current = self._current = workflow.patched(PATCH_CURRENT)
        self._recheck = current or workflow.patched(PATCH_LEDGER_RECHECK)
        self._attributes_follow_ledger = current or workflow.patched(PATCH_SEARCH_ATTRIBUTES_FOLLOW_LEDGER)
        self._intent_heard = current or workflow.patched(PATCH_INTENT_HEARD)
        first = initial_search_attributes(run_input)
        if not (current and _started_with(first)):
            workflow.upsert_search_attributes([pair.key.value_set(pair.value) for pair in first])
        try:
            result = await self._converse(run_input)
        except Exception:
            self._set_phase(Phase.FAILED)
            raise
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._set_phase(Phase.COMPLETED)
        return result

    @workflow.query
    def status(self) -> RunStatus:
        return RunStatus(
            phase=self._phase,
            turns=self._turns,
            pending=list(self._pending.values()),
            calls=list(self._calls.values()),
            last_resolve_error=self._last_resolve_error,
            usage=self._usage,
            usage_total=sum(self._usage, TokenUsage()),
        )

    # -- the conversation ---------------------------------------------------------------------------

    async def _converse(self, run_input: AgentRunInput) -> AgentRunResult:
        spec = await workflow.execute_activity_method(
            ModelActivities.describe_agent,
            run_input.agent,
            start_to_close_timeout=LEDGER_STEP_TIMEOUT,
            retry_policy=MODEL_RETRY,
            summary=f"load agent {run_input.agent}",
        )
        conversation = Conversation(
            run_id=workflow.info().workflow_id,
            tenant=run_input.tenant,
            agent=spec.name,
            by_reference=self._current or workflow.patched(PATCH_CONVERSATION_BY_REFERENCE),
        )
        messages = conversation.messages
        if spec.instructions:
            messages.append(Message(role="system", content=spec.instructions))
        messages.append(Message(role="user", content=run_input.input))
        # Per tool: the write calls whose settled outcome is in the conversation so far, with what
        # the model was told of each (status and settlement). Rebuilt by replay from this run's own
        # history, so after a reset a call of the discarded branch is not in it: the model never
        # heard of it.
        told: dict[str, list[Heard]] = {}
        for turn in range(1, run_input.max_turns + 1):
            self._turns = turn
            heard = {tool: list(ids) for tool, ids in told.items()}  # what this request carries
            answer = await workflow.execute_activity_method(
                ModelActivities.call_model,
                conversation.request(),
                start_to_close_timeout=max(
                    MODEL_TIMEOUT, timedelta(seconds=spec.model.attempt_timeout_seconds) + ACTIVITY_MARGIN
                ),
                schedule_to_close_timeout=timedelta(seconds=spec.model.retry_budget_seconds),
                heartbeat_timeout=MODEL_HEARTBEAT,
                retry_policy=MODEL_RETRY,
                summary=f"model turn {turn}",
            )
            conversation.sent(answer)
            self._usage.append(answer.usage or TokenUsage())
            ids = mint_tool_call_ids(
                (call.id for call in answer.tool_calls), turn=turn, used=self._used_call_ids
            )
            tool_calls = [
                call.model_copy(update={"id": id_}) for call, id_ in zip(answer.tool_calls, ids, strict=True)
            ]
            messages.append(Message(role="assistant", content=answer.final or "", tool_calls=tool_calls))
            if not tool_calls:
                return AgentRunResult(
                    run_id=workflow.info().workflow_id,
                    final=answer.final or "",
                    turns=turn,
                    calls=list(self._calls.values()),
                    usage=self._usage,
                    usage_total=sum(self._usage, TokenUsage()),
                )
            for call in tool_calls:
                # Calls of one answer do not hear each other: each is asked with this turn's `heard`.
                outcome = await self._call_tool(run_input, spec, call, heard.get(call.name, []))
                messages.append(
                    Message(
                        role="tool",
                        tool_call_id=call.id,
                        name=call.name,
                        content=json.dumps(outcome.for_model(), sort_keys=True),
                    )
                )
                heard_now = outcome.heard() if self._intent_heard else None
                if heard_now is not None:
                    told.setdefault(call.name, []).append(heard_now)
        raise ApplicationError(
            f"no final answer after {run_input.max_turns} model turns",
            type="TooManyTurns",
            non_retryable=True,
        )

    async def _call_tool(
        self, run_input: AgentRunInput, spec: AgentSpec, call: ToolCall, heard: list[Heard]
    ) -> ToolOutcome:
        tool = spec.tools.get(call.name)
        info = workflow.info()
        tool_input = ToolCallInput(
            run_id=info.workflow_id,
            tenant=run_input.tenant,
            agent=spec.name,
            call=call,
            # What the run's first write claims its run id with (ledger/run_ids.py): the same
            # across a reset or continue-as-new of this run, different for any other run.
            first_execution_run_id=info.first_execution_run_id,
            heard=heard,
        )
        if tool is None:
            outcome = ToolOutcome(
                tool_call_id=call.id,
                tool=call.name,
                key=None,
                status="error",
                error=f"there is no tool named {call.name!r}; available: {', '.join(sorted(spec.tools))}",
            )
        elif tool.side_effect is SideEffect.READ:
            outcome = await self._call_read(tool, tool_input)
        else:
            outcome = await self._call_write(spec, tool, tool_input)
        self._calls[call.id] = call_summary(outcome)
        return outcome

    async def _call_read(self, tool: ToolSpec, tool_input: ToolCallInput) -> ToolOutcome:
        call = tool_input.call
        try:
            return await workflow.execute_activity_method(
                ToolActivities.run_read_tool,
                tool_input,
                start_to_close_timeout=timedelta(seconds=tool.timeout_seconds) + ACTIVITY_MARGIN,
                retry_policy=READ_RETRY,
                summary=f"read {call.name}",
            )
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == ERR_NOT_A_READ:
                error = str(cause)  # refused before anything was called, on the first attempt
            else:
                error = f"{call.name} failed after {READ_RETRY.maximum_attempts} attempts: {cause or err}"
            return ToolOutcome(tool_call_id=call.id, tool=call.name, key=None, status="error", error=error)
