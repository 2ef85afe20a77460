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
    OwnerLeaseLiveError,
    PayloadMismatchError,
    ProvenanceError,
    ReasonRequiredError,
    RecordNotFoundError,
    ResendInFlightError,
    ReusedCallError,
    TenantMismatchError,
)
from onceflow.ledger.guards import Guard, GuardArgumentError, Heard
from onceflow.ledger.migrate import migrate, schema_behind
from onceflow.ledger.records import (
    RepeatedDecision,
    Reservation,
    ReserveResult,
    ToolExecutionEvent,
    ToolExecutionRecord,
)
from onceflow.ledger.resends import ResendDecision
from onceflow.ledger.retention import PurgeReport, purge_settled
from onceflow.ledger.sessions import ConsoleSession, ConsoleSessions
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
from onceflow.ledger.tokens import OperatorToken, OperatorTokens, TokenNotFoundError, looks_like_token

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
    "ConsoleSession",
    "ConsoleSessions",
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
    "OwnerLeaseLiveError",
    "PayloadMismatchError",
    "ProvenanceError",
    "PurgeReport",
    "ReasonRequiredError",
    "RecordNotFoundError",
    "RepeatedDecision",
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
    "looks_like_token",
    "migrate",
    "purge_settled",
    "schema_behind",
    "unauthenticated_actor",
]
