"""What crosses the Temporal boundary about agents and their model: a model turn's request and answer,
and the agent and tool specs the workflow is given. `Frozen` is the base of every payload."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from onceflow.ledger.status import SideEffect


class Frozen(BaseModel):
    """A payload: immutable, and no field it does not declare."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# -- the model -------------------------------------------------------------------------------------


class ToolCall(Frozen):
    # As the provider sent it ("" for none) until the workflow mints the run's own (onceflow/sdk/keys.py).
    id: str
    name: str
    arguments: dict[str, Any]
    # The provider's arguments as it sent them, when they were not a JSON object: the call is then
    # refused before it reaches the ledger, and the model is told (it can correct itself).
    invalid_arguments: str | None = None


class Message(Frozen):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = []
    tool_call_id: str | None = None
    name: str | None = None


class ModelTurn(Frozen):
    """What the model answered: tool calls to make, or a final answer. Text a model says beside its
    tool calls travels in `final` too; only an answer without tool calls ends the run."""

    tool_calls: list[ToolCall] = []
    final: str | None = None
    # By reference: the stored conversation's head once the request's messages were added to it.
    conversation_head: str | None = None
    usage: TokenUsage | None = None


class TokenUsage(Frozen):
    """Tokens one model call used, as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


class ModelCallInput(Frozen):
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


# -- agents and tools as the workflow sees them ----------------------------------------------------


class ToolSpec(Frozen):
    name: str
    side_effect: SideEffect
    timeout_seconds: float
    approval: bool
    has_reconcile: bool
    has_compensation: bool
    # The receiver honours the key for a window (a resend may settle the call). None: a spec made
    # before this was sent, which may have one.
    has_dedup_window: bool | None = None
    json_schema: dict[str, Any]


class ToolPolicySpec(Frozen):
    on_indeterminate: Literal["pause", "fail"]
    reconcile_deadline_seconds: float
    reconcile_initial_interval_seconds: float
    reconcile_max_interval_seconds: float
    escalation_owner: str | None
    approval_deadline_seconds: float = 24 * 3600
    # How often a paused call re-reads the ledger without being told to (older specs lack it).
    recheck_interval_seconds: float = 300


class ModelSpec(Frozen):
    """What the workflow needs to know of an agent's model: how long one call may take, per attempt
    and in total over all its retries."""

    provider: str = "scripted"
    model: str = "scripted"
    attempt_timeout_seconds: float = 60
    retry_budget_seconds: float = 600


class AgentSpec(Frozen):
    name: str
    instructions: str
    tools: dict[str, ToolSpec]
    policy: ToolPolicySpec
    model: ModelSpec = ModelSpec()


ModelTurn.model_rebuild()
