"""The PostgreSQL tool-execution ledger: reserve before running, settle exactly once."""

from onceflow.ledger.canonical import CanonicalPayload, canonical_payload
from onceflow.ledger.compensations import CompensationRequest
from onceflow.ledger.errors import (
    AlreadySettledError,
    AttemptExpiredError,
    CompensationNotRequestedError,
    ConflictNotOpenError,
    EvidenceRequiredError,
    HeldCallError,
    InvalidTransitionError,
    LedgerError,
    LedgerUnavailableError,
    OutcomeIgnoredError,
    PayloadMismatchError,
    ProvenanceError,
    ReasonRequiredError,
    RecordNotFoundError,
    ResendInFlightError,
    ReusedCallError,
    TenantMismatchError,
)
from onceflow.ledger.guards import Guard, GuardArgumentError, Heard
from onceflow.ledger.migrate import migrate
from onceflow.ledger.records import Reservation, ReserveResult, ToolExecutionEvent, ToolExecutionRecord
from onceflow.ledger.resends import ResendDecision
from onceflow.ledger.retention import PurgeReport, purge_settled
from onceflow.ledger.status import (
    OPERATOR_PREFIX,
    SETTLED,
    UNRESOLVED,
    EventSource,
    FailureKind,
    SideEffect,
    Status,
    unauthenticated_actor,
)
from onceflow.ledger.store import CallIdentity, Ledger, UnresolvedPage
from onceflow.ledger.tokens import OperatorToken, OperatorTokens, TokenNotFoundError

__all__ = [
    "OPERATOR_PREFIX",
    "SETTLED",
    "UNRESOLVED",
    "AlreadySettledError",
    "AttemptExpiredError",
    "CallIdentity",
    "CanonicalPayload",
    "CompensationNotRequestedError",
    "CompensationRequest",
    "ConflictNotOpenError",
    "EventSource",
    "EvidenceRequiredError",
    "FailureKind",
    "Guard",
    "GuardArgumentError",
    "Heard",
    "HeldCallError",
    "InvalidTransitionError",
    "Ledger",
    "LedgerError",
    "LedgerUnavailableError",
    "OperatorToken",
    "OperatorTokens",
    "OutcomeIgnoredError",
    "PayloadMismatchError",
    "ProvenanceError",
    "PurgeReport",
    "ReasonRequiredError",
    "RecordNotFoundError",
    "ResendDecision",
    "ResendInFlightError",
    "Reservation",
    "ReserveResult",
    "ReusedCallError",
    "SideEffect",
    "Status",
    "TenantMismatchError",
    "TokenNotFoundError",
    "ToolExecutionEvent",
    "ToolExecutionRecord",
    "UnresolvedPage",
    "canonical_payload",
    "migrate",
    "purge_settled",
    "unauthenticated_actor",
]
