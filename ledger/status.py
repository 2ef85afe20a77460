"""The ledger's states. The SQL CHECK constraints in migrations/ mirror these enums exactly."""

from enum import StrEnum


class Status(StrEnum):
    """Where one tool call stands. See docs/architecture.md for the transitions."""

    AWAITING_APPROVAL = "awaiting_approval"
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    INDETERMINATE = "indeterminate"
    DENIED = "denied"
    COMPENSATED = "compensated"

    @property
    def is_unresolved(self) -> bool:
        """Nobody can yet say whether the call took effect (or it has not been sent yet)."""
        return self in UNRESOLVED

    @property
    def is_settled(self) -> bool:
        return self in SETTLED


UNRESOLVED = frozenset({Status.AWAITING_APPROVAL, Status.STARTED, Status.INDETERMINATE})
SETTLED = frozenset({Status.COMPLETED, Status.FAILED, Status.DENIED, Status.COMPENSATED})


class SideEffect(StrEnum):
    """What a tool does to the world. Only `read` may be retried."""

    READ = "read"
    WRITE = "write"
    EXTERNAL = "external"
    DESTRUCTIVE = "destructive"


class FailureKind(StrEnum):
    """Why a `failed` call failed. Every kind means: it did not take effect."""

    NOT_ATTEMPTED = "not_attempted"  # the tool refused before sending anything
    REJECTED = "rejected"  # the other system answered no
    NOT_APPLIED = "not_applied"  # settled after the fact: a reconcile hook or operator found no effect
    DENIED = "denied"  # an operator denied approval
