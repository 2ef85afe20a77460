"""What crosses the Temporal boundary for one tool call: the write activity's input and outcome, the
ledger steps a workflow schedules about a call (record, inspect, settle, escalate, expire an
approval), reconciling and compensating it, and what a result may hold."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import field_validator

from onceflow.ledger.canonical import uncarried
from onceflow.ledger.guards import Heard
from onceflow.ledger.records import ToolExecutionRecord
from onceflow.ledger.status import SETTLED, FailureKind, Status
from onceflow.runtime.constants import DEFAULT_RECHECK
from onceflow.sdk.model_payloads import Frozen, ToolCall
from onceflow.sdk.signal_payloads import ResolveSignal

# -- tool calls ------------------------------------------------------------------------------------


class ToolCallInput(Frozen):
    run_id: str
    tenant: str
    agent: str
    call: ToolCall
    # This run's calls of the same tool whose settled outcome was in the conversation the model was
    # given for the turn that produced `call`, each with what the model was told (status and the
    # settlement it came from): the intent guard's twins among them may be new effects while their
    # outcome stands as told, every other twin is the same intent (ledger/guards.py). Inputs
    # recorded before outcomes were passed hold bare tool call ids.
    heard: list[Heard] = []
    # The Temporal run id of the run's first execution; a write claims the run id with it. None in
    # inputs recorded before run ids were claimed (such a call claims nothing).
    first_execution_run_id: str | None = None
    # The owner tokens of earlier attempts at this call whose reservation may have committed while
    # the answer was lost (the ledger went away mid-statement): they sent nothing, so a reservation
    # found `started` under one of them is released as not attempted and reserved again.
    unsent_owners: list[str] = []
    # When the earliest earlier attempt at this call began, if one was lost (its activity timed out
    # or its worker died) and the ledger then had no row for it. Had the ledger failed over since,
    # that attempt's reservation may have been lost with the old primary after it sent: the call is
    # then made an unknown call rather than sent (ledger/lost_writes.py).
    lost_attempt_at: datetime | None = None

    @field_validator("heard", mode="before")
    @classmethod
    def _heard(cls, value: Any) -> Any:
        return [Heard(tool_call_id=v) if isinstance(v, str) else v for v in value]


class ToolOutcome(Frozen):
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
    # The settlement the outcome came from (the ledger row's settled_at): with the status, what the
    # model is told of a settled call, and what it is held to when the intent guard asks.
    settled_at: datetime | None = None
    # Started: until when its owner holds it (it may be on the wire until then).
    lease_expires_at: datetime | None = None

    def heard(self) -> Heard | None:
        """What the model hears of this write call when this outcome goes into the conversation:
        a settled call's status and settlement; None for anything else (unknown, a read)."""
        if self.key is None or not isinstance(self.status, Status) or self.status not in SETTLED:
            return None
        return Heard(tool_call_id=self.tool_call_id, status=self.status, settled_at=self.settled_at)

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


class OwnerOutcome(Frozen):
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
    # The row as the owner's reservation wrote it (write calls): a row a failover of the ledger lost
    # or set back is restored from it as an unknown call, never read as "not sent".
    reserved: ToolExecutionRecord | None = None

    def reported(self) -> dict[str, Any]:
        """What the owner knows of how the call ended, for the record of a call a failover lost."""
        return {
            "status": self.status,
            "result": self.value,
            "error": self.error,
            "failure_kind": self.failure_kind,
        }


class CallRef(Frozen):
    key: str
    tool: str
    tool_call_id: str
    # Owner tokens of this call's attempts whose reservation answer was lost: they never sent, so a
    # call inspected `started` under one of them is released as not attempted (ToolCallInput).
    unsent_owners: list[str] = []


class SettleInput(Frozen):
    tenant: str
    signal: ResolveSignal
    # The door the resolve came through; its actor is recorded as `<source>:<name>`, never `operator:`.
    source: Literal["signal", "update"] = "signal"


class SettleResult(Frozen):
    outcome: ToolOutcome
    refused: str | None = None  # the resolve lost to an earlier decision: who, and when


class ReconcileInput(Frozen):
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


class ReconcileResult(Frozen):
    key: str
    status: Status
    attempts: int
    settled_by: str | None = None
    escalated_to: str | None = None


class EscalateInput(Frozen):
    key: str
    owner: str
    reason: str


class ExpireApprovalInput(Frozen):
    key: str
    tenant: str
    reason: str


# -- compensation ----------------------------------------------------------------------------------


class CompensationInput(Frozen):
    """Undo one completed call, because an operator asked. Never started by the runtime itself."""

    key: str  # the completed call to undo
    tenant: str
    # What the API says it recorded; not trusted: the workflow takes who asked, and why, from the
    # `compensation_requested` event the API wrote in the ledger (ledger/compensations.py).
    actor: str
    reason: str
    # When an earlier attempt at the compensation began, set by the workflow when that attempt was
    # lost and the ledger had no row for it: if the ledger failed over since, the row may have been
    # lost with the old primary after the hook ran, and the compensation is not run again
    # (activities/sending.py, `unknown_if_failed_over`).
    lost_attempt_at: datetime | None = None
    # Owner tokens of earlier attempts that met the ledger away: a reservation of theirs may have
    # committed while its answer was lost, and they sent nothing (as ToolCallInput.unsent_owners).
    unsent_owners: list[str] = []


class CompensationPlan(Frozen):
    compensation_key: str
    hook: str
    timeout_seconds: float
    # How often an unknown compensation re-reads the ledger unasked (the agent's recheck_interval).
    recheck_interval_seconds: float = DEFAULT_RECHECK.total_seconds()


class CompensationResult(Frozen):
    key: str
    compensation_key: str
    status: Status  # of the compensation call: completed, failed or indeterminate-then-settled
    original_status: Status  # compensated when the compensation took effect
    value: Any = None


# -- what a result may hold ------------------------------------------------------------------------

# Results are not canonicalised (only arguments are), so big integers are fine; depth is bounded more
# loosely than for arguments, since a tool's answer may legitimately nest.
RESULT_MAX_DEPTH = 512


def result_problem(value: Any) -> str | None:
    """Why a tool's (or a lookup's) result cannot be stored or handed on as JSON, or None.

    `value` is in JSON form (onceflow.sdk.tools.to_jsonable keeps NaN and the infinities, so that they are
    seen here): JSON has no such numbers, and jsonb refuses them.
    """
    return uncarried(value, integers=False, max_depth=RESULT_MAX_DEPTH)
