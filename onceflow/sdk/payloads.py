"""Everything that crosses the Temporal boundary: workflow, activity and signal inputs and outputs."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from onceflow.ledger.canonical import uncarried
from onceflow.ledger.status import FailureKind, SideEffect, Status


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- agent runs -----------------------------------------------------------------------------------


class AgentRunInput(_Frozen):
    """Start an agent run. The workflow id is the run id, and keys are built from it."""

    agent: str
    tenant: str
    input: str
    max_turns: int = Field(default=20, ge=1, le=200)


class AgentRunResult(_Frozen):
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


class CallSummary(_Frozen):
    tool_call_id: str
    tool: str
    key: str | None  # None for reads, which are not in the ledger
    status: str  # a ledger Status for writes; "ok"/"error" for reads
    detail: str | None = None


class RunStatus(_Frozen):
    """Answer to the `status` query."""

    phase: Phase
    turns: int
    pending: list[CallSummary]
    calls: list[CallSummary]
    last_resolve_error: str | None = None
    usage: list[TokenUsage] = []
    usage_total: TokenUsage = Field(default_factory=lambda: TokenUsage())


class ResolveSignal(BaseModel):
    """Ask the run to act on the ledger's answer for `key`.

    With `status`, it first settles the call (compare-and-set, `reason` required); without, it only
    re-reads the ledger. Either way the run acts on what the ledger says, never on the signal.
    """

    model_config = ConfigDict(extra="forbid")

    key: str
    status: Literal["completed", "failed"] | None = None
    reason: str | None = None
    actor: str = "signal"
    evidence: dict[str, Any] | None = None
    result: Any = None


# -- the model --------------------------------------------------------------------------------------


class ToolCall(_Frozen):
    # As the provider sent it ("" for none) until the workflow mints the run's own (onceflow/sdk/keys.py).
    id: str
    name: str
    arguments: dict[str, Any]
    # The provider's arguments as it sent them, when they were not a JSON object: the call is then
    # refused before it reaches the ledger, and the model is told (it can correct itself).
    invalid_arguments: str | None = None


class Message(_Frozen):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = []
    tool_call_id: str | None = None
    name: str | None = None


class ModelTurn(_Frozen):
    """What the model answered: tool calls to make, or a final answer. Text a model says beside its
    tool calls travels in `final` too; only an answer without tool calls ends the run."""

    tool_calls: list[ToolCall] = []
    final: str | None = None
    # By reference: the stored conversation's head once the request's messages were added to it.
    conversation_head: str | None = None
    usage: TokenUsage | None = None


class TokenUsage(_Frozen):
    """Tokens one model call used, as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


class ModelCallInput(_Frozen):
    """One model turn's request.

    Inline (runs started before conversations were stored): `messages` is the whole conversation.
    By reference: `messages` are only those added since the stored conversation ending at `head`
    (None before the first turn), which holds `length` messages; the activity stores and reads it.
    """

    agent: str
    run_id: str
    messages: list[Message]
    by_reference: bool = False
    tenant: str = ""
    head: str | None = None
    length: int = 0


# -- agents and tools as the workflow sees them -------------------------------------------------------


class ToolSpec(_Frozen):
    name: str
    side_effect: SideEffect
    timeout_seconds: float
    approval: bool
    has_reconcile: bool
    has_compensation: bool
    json_schema: dict[str, Any]


class ToolPolicySpec(_Frozen):
    on_indeterminate: Literal["pause", "fail"]
    reconcile_deadline_seconds: float
    reconcile_initial_interval_seconds: float
    reconcile_max_interval_seconds: float
    escalation_owner: str | None
    approval_deadline_seconds: float = 24 * 3600
    # How often a paused call re-reads the ledger without being told to (older specs lack it).
    recheck_interval_seconds: float = 300


class ModelSpec(_Frozen):
    """What the workflow needs to know of an agent's model: how long one call may take, per attempt
    and in total over all its retries."""

    provider: str = "scripted"
    model: str = "scripted"
    attempt_timeout_seconds: float = 60
    retry_budget_seconds: float = 600


class AgentSpec(_Frozen):
    name: str
    instructions: str
    tools: dict[str, ToolSpec]
    policy: ToolPolicySpec
    model: ModelSpec = ModelSpec()


# -- tool calls ------------------------------------------------------------------------------------------


class ToolCallInput(_Frozen):
    run_id: str
    tenant: str
    agent: str
    call: ToolCall
    # The tool call ids of this run's calls of the same tool whose settled outcome was in the
    # conversation the model was given for the turn that produced `call`: the intent guard's twins
    # among them may be new effects, every other twin is the same intent (ledger/guards.py).
    heard: list[str] = []
    # The Temporal run id of the run's first execution; a write claims the run id with it. None in
    # inputs recorded before run ids were claimed (such a call claims nothing).
    first_execution_run_id: str | None = None


class ToolOutcome(_Frozen):
    """What became of one tool call, from the ledger's point of view for writes."""

    tool_call_id: str
    tool: str
    key: str | None
    status: Status | Literal["ok", "error"]
    value: Any = None
    error: str | None = None
    failure_kind: FailureKind | None = None
    replayed: bool = False  # the ledger already had the result; the tool was not called
    settled_by: str | None = None  # who settled it, when not the attempt that sent it
    settlement_reason: str | None = None
    # The tool call id of the same call whose recorded result this one was given (intent `reuse`).
    reused_from: str | None = None
    held_by: str | None = None  # held: the key of the call it waits for

    def for_model(self) -> dict[str, Any]:
        """The truth, as the model is told it."""
        told = self._told()
        if self.settled_by:
            told["settled_by"] = self.settled_by
            told["settlement_reason"] = self.settlement_reason
        return told

    def _told(self) -> dict[str, Any]:
        if self.status is Status.COMPLETED and self.reused_from:
            return {
                "ok": True,
                "result": self.value,
                "reused_from": self.reused_from,
                "note": f"the same call ({self.reused_from}) already took effect; this is its result, "
                "and nothing was sent again",
            }
        if self.status in (Status.COMPLETED, "ok"):
            return {"ok": True, "result": self.value}
        # A read refused on policy grounds is final too (status "error": reads have no ledger row).
        refused = self.status is Status.FAILED or self.status == "error"
        if refused and self.failure_kind is not None and self.failure_kind.is_final:
            released = self.failure_kind is FailureKind.RELEASED
            return {
                "ok": False,
                "took_effect": False,
                "reason": self.failure_kind,
                "final": True,
                "error": self.error,
                "note": "released by an operator before it was sent: it did not take effect, and "
                "this call will not be sent"
                if released
                else "refused, and final: do not make this call again",
            }
        if self.status is Status.COMPENSATED:
            return {"ok": False, "took_effect": True, "compensated": True, "result": self.value}
        if self.status in (Status.FAILED, Status.DENIED):
            return {
                "ok": False,
                "took_effect": False,
                "reason": self.failure_kind or self.status,
                "error": self.error,
            }
        if self.status is Status.INDETERMINATE:
            return {"ok": False, "took_effect": "unknown", "error": self.error}
        return {"ok": False, "error": self.error}


class OwnerOutcome(_Frozen):
    """An outcome the write activity could not record; the workflow records it with retries."""

    key: str
    owner: str
    tool: str
    tool_call_id: str
    status: Literal["completed", "failed", "indeterminate"]
    value: Any = None
    result_reference: str | None = None
    failure_kind: FailureKind | None = None
    error: str | None = None
    # The receiver said it has no record of the key (ToolKeyNotFoundError): the one refusal that
    # proves a resent call never took effect.
    no_record_of_key: bool = False


class CallRef(_Frozen):
    key: str
    tool: str
    tool_call_id: str


class SettleInput(_Frozen):
    tenant: str
    signal: ResolveSignal
    # The door the resolve came through; its actor is recorded as `<source>:<name>`, never `operator:`.
    source: Literal["signal", "update"] = "signal"


class SettleResult(_Frozen):
    outcome: ToolOutcome
    refused: str | None = None  # the resolve lost to an earlier decision: who, and when


class ReconcileInput(_Frozen):
    key: str
    run_id: str
    tenant: str
    agent: str
    tool: str
    deadline_seconds: float
    initial_interval_seconds: float
    max_interval_seconds: float
    tool_timeout_seconds: float
    escalation_owner: str | None = None


class ReconcileResult(_Frozen):
    key: str
    status: Status
    attempts: int
    settled_by: str | None = None
    escalated_to: str | None = None


class EscalateInput(_Frozen):
    key: str
    owner: str
    reason: str


class EscalatedSignal(_Frozen):
    """Tells a run that one of its unknown calls was escalated (for its search attributes)."""

    key: str
    owner: str


class ExpireApprovalInput(_Frozen):
    key: str
    tenant: str
    reason: str


# -- compensation ----------------------------------------------------------------------------------


class CompensationInput(_Frozen):
    """Undo one completed call, because an operator asked. Never started by the runtime itself."""

    key: str  # the completed call to undo
    tenant: str
    # What the API says it recorded; not trusted: the workflow takes who asked, and why, from the
    # `compensation_requested` event the API wrote in the ledger (ledger/compensations.py).
    actor: str
    reason: str


class CompensationPlan(_Frozen):
    compensation_key: str
    hook: str
    timeout_seconds: float


class CompensationResult(_Frozen):
    key: str
    compensation_key: str
    status: Status  # of the compensation call: completed, failed or indeterminate-then-settled
    original_status: Status  # compensated when the compensation took effect
    value: Any = None


AgentRunResult.model_rebuild()


# -- conflicts ------------------------------------------------------------------------------------


class ConflictSignal(_Frozen):
    """Tells a run that a late outcome contradicted the decision on one of its calls.

    The ledger's flag is the source of truth; this only puts the key in the run's
    `OnceflowConflictKeys` search attribute so that the Temporal UI can find it.
    """

    key: str
    detail: str
    open: bool = True  # False: an operator acknowledged it, and the key leaves the attribute


RunStatus.model_rebuild()
ModelTurn.model_rebuild()


# -- what a result may hold ---------------------------------------------------------------------------

# Results are not canonicalised (only arguments are), so big integers are fine; depth is bounded more
# loosely than for arguments, since a tool's answer may legitimately nest.
RESULT_MAX_DEPTH = 512


def result_problem(value: Any) -> str | None:
    """Why a tool's (or a lookup's) result cannot be stored or handed on as JSON, or None.

    `value` is in JSON form (onceflow.sdk.tools.to_jsonable keeps NaN and the infinities, so that they are
    seen here): JSON has no such numbers, and jsonb refuses them.
    """
    return uncarried(value, integers=False, max_depth=RESULT_MAX_DEPTH)
