"""The PostgreSQL tool-execution ledger: reserve before running, settle exactly once."""

from ledger.canonical import CanonicalPayload, canonical_payload
from ledger.errors import (
    AlreadySettledError,
    InvalidTransitionError,
    LedgerError,
    LedgerUnavailableError,
    OutcomeIgnoredError,
    PayloadMismatchError,
    ReasonRequiredError,
    RecordNotFoundError,
    TenantMismatchError,
)
from ledger.migrate import migrate
from ledger.records import Reservation, ReserveResult, ToolExecutionEvent, ToolExecutionRecord
from ledger.status import SETTLED, UNRESOLVED, FailureKind, SideEffect, Status
from ledger.store import CallIdentity, Ledger, UnresolvedPage
from ledger.tokens import OperatorToken, OperatorTokens, TokenNotFoundError

__all__ = [
    "SETTLED",
    "UNRESOLVED",
    "AlreadySettledError",
    "CallIdentity",
    "CanonicalPayload",
    "FailureKind",
    "InvalidTransitionError",
    "Ledger",
    "LedgerError",
    "LedgerUnavailableError",
    "OperatorToken",
    "OperatorTokens",
    "OutcomeIgnoredError",
    "PayloadMismatchError",
    "ReasonRequiredError",
    "RecordNotFoundError",
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
]
