"""The PostgreSQL tool-execution ledger: reserve before running, settle exactly once."""

from ledger.canonical import CanonicalPayload, canonical_payload
from ledger.errors import (
    AlreadySettledError,
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
    TenantMismatchError,
)
from ledger.guards import Guard, GuardArgumentError
from ledger.migrate import migrate
from ledger.records import Reservation, ReserveResult, ToolExecutionEvent, ToolExecutionRecord
from ledger.resends import ResendDecision
from ledger.retention import PurgeReport, purge_settled
from ledger.status import (
    OPERATOR_PREFIX,
    SETTLED,
    UNRESOLVED,
    EventSource,
    FailureKind,
    SideEffect,
    Status,
    unauthenticated_actor,
)
from ledger.store import CallIdentity, Ledger, UnresolvedPage
from ledger.tokens import OperatorToken, OperatorTokens, TokenNotFoundError

__all__ = [
    "OPERATOR_PREFIX",
    "SETTLED",
    "UNRESOLVED",
    "AlreadySettledError",
    "CallIdentity",
    "CanonicalPayload",
    "ConflictNotOpenError",
    "EventSource",
    "EvidenceRequiredError",
    "FailureKind",
    "Guard",
    "GuardArgumentError",
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
    "Reservation",
    "ReserveResult",
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
