"""The signals a run is sent: settle or re-read a call, an escalation, a conflict."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from onceflow.sdk.model_payloads import Frozen

# -- signals ---------------------------------------------------------------------------------------


class ResolveSignal(BaseModel):
    """Ask the run to act on the ledger's answer for `key`.

    With `status`, it first settles the call (compare-and-set, `reason` required); without, it only
    re-reads the ledger. Either way the run acts on what the ledger says, never on the signal.
    `assertion`: an operator assertion the operator API signed for this key
    (activities/signal_door.py); a deployment with ONCEFLOW_SIGNALS=verified settles only with one.
    """

    model_config = ConfigDict(extra="forbid")

    key: str
    status: Literal["completed", "failed"] | None = None
    reason: str | None = None
    actor: str = "signal"
    evidence: dict[str, Any] | None = None
    result: Any = None
    assertion: str | None = None


class EscalatedSignal(Frozen):
    """Tells a run that one of its unknown calls was escalated (for its search attributes)."""

    key: str
    owner: str


class ConflictSignal(Frozen):
    """Tells a run that a late outcome contradicted the decision on one of its calls.

    The ledger's flag is the source of truth; this only puts the key in the run's
    `OnceflowConflictKeys` search attribute so that the Temporal UI can find it.
    """

    key: str
    detail: str
    open: bool = True  # False: an operator acknowledged it, and the key leaves the attribute
