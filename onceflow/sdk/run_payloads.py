"""An agent run's input and result, and the answer to its `status` query."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from onceflow.sdk.model_payloads import Frozen, TokenUsage

# -- agent runs ------------------------------------------------------------------------------------


class AgentRunInput(Frozen):
    """Start an agent run. The workflow id is the run id, and keys are built from it."""

    agent: str
    tenant: str
    input: str
    max_turns: int = Field(default=20, ge=1, le=200)


class AgentRunResult(Frozen):
    run_id: str
    final: str
    turns: int
    calls: list[CallSummary]
    # Tokens per model turn, in order (zero for models that do not count, like the scripted one).
    usage: list[TokenUsage] = []
    usage_total: TokenUsage = Field(default_factory=lambda: TokenUsage())


class Phase(StrEnum):
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    HELD = "held"  # a guard holds a call until another one is settled
    AWAITING_RECONCILIATION = "awaiting_reconciliation"
    COMPLETED = "completed"
    FAILED = "failed"


class CallSummary(Frozen):
    tool_call_id: str
    tool: str
    key: str | None  # None for reads, which are not in the ledger
    status: str  # a ledger Status for writes; "ok"/"error" for reads
    detail: str | None = None


# -- queries ---------------------------------------------------------------------------------------


class RunStatus(Frozen):
    """Answer to the `status` query."""

    phase: Phase
    turns: int
    pending: list[CallSummary]
    calls: list[CallSummary]
    last_resolve_error: str | None = None
    usage: list[TokenUsage] = []
    usage_total: TokenUsage = Field(default_factory=lambda: TokenUsage())


AgentRunResult.model_rebuild()
