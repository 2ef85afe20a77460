"""The ledger's states. The SQL CHECK constraints in migrations/ mirror these enums exactly."""

from enum import StrEnum


class Status(StrEnum):
    """Where one tool call stands. See docs/architecture.md for the transitions."""

    AWAITING_APPROVAL = "awaiting_approval"
    HELD = "held"  # recorded, not sent: waits for another call to settle (ledger/guards.py)
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


UNRESOLVED = frozenset({Status.AWAITING_APPROVAL, Status.HELD, Status.STARTED, Status.INDETERMINATE})
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
    # Final: never re-reserved under the key, and the model is told not to try again.
    POLICY_REFUSED = "policy_refused"  # the other system refused on policy grounds (a limit, a rule)
    GUARD_REFUSED = "guard_refused"  # a guard of the ledger refused before anything was sent
    RELEASED = "released"  # an operator released a held or approved call that was never sent

    @property
    def is_final(self) -> bool:
        """A refusal that stands: the same call is not worth sending again."""
        return self in _FINAL_KINDS


# Never re-reserved under the key. RESERVE in ledger/queries/calls.py lists the same kinds.
_FINAL_KINDS = frozenset({FailureKind.POLICY_REFUSED, FailureKind.GUARD_REFUSED, FailureKind.RELEASED})


class EventSource(StrEnum):
    """Where an event came from: which door the decision walked through.

    Only `api` events are made by an authenticated operator (actor `operator:<name>`); a name typed
    into a signal is recorded as `signal:<name>`, so it can never pass for one.
    """

    OWNER = "owner"  # the attempt that reserved the call (fencing token)
    INSPECTOR = "inspector"  # the ledger step that looks at a call whose activity was lost
    SIGNAL = "signal"  # a `resolve` signal sent to the run (the Temporal CLI, any client)
    UPDATE = "update"  # a `resolve` Workflow Update
    API = "api"  # the operator HTTP API, behind a bearer token
    RECONCILER = "reconciler"  # a tool's reconcile hook, or its escalation
    DEADLINE = "deadline"  # a deadline ran out (approval)
    COMPENSATION = "compensation"  # the compensation workflow an operator asked for
    GUARD = "guard"  # an intent, entity or budget guard, inside a reservation
    UNRECORDED = "unrecorded"  # events written before sources were recorded


# The actor prefix only the operator API may write.
OPERATOR_PREFIX = "operator:"


_DOORS = (OPERATOR_PREFIX, "signal:", "update:")


def unauthenticated_actor(source: EventSource, claimed: str) -> str:
    """The actor recorded for a name nobody authenticated: `signal:alice`, never `operator:alice`.

    Whatever door prefix the sender typed is dropped, and the door it really came through is put in
    front; "operator:alice" sent in a signal is recorded as `signal:alice`.
    """
    name = claimed.strip()
    for prefix in _DOORS:
        name = name.removeprefix(prefix)
    name = name.strip()
    return source.value if not name or name == source.value else f"{source.value}:{name}"
