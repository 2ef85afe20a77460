"""Ledger errors. Each carries the facts a caller needs to decide, not just a message."""

from __future__ import annotations

from datetime import datetime


class LedgerError(Exception):
    """Base class for everything the ledger raises."""


class LedgerUnavailableError(LedgerError):
    """The database could not be reached or failed mid-statement; nothing is known to have changed."""


class RecordNotFoundError(LedgerError):
    def __init__(self, key: str) -> None:
        super().__init__(f"no tool execution with key {key!r}")
        self.key = key


class PayloadMismatchError(LedgerError):
    """The same key arrived with different arguments: a bug or an injection, never a retry."""

    def __init__(self, key: str, recorded_sha256: str, offered_sha256: str) -> None:
        super().__init__(
            f"key {key!r} is bound to payload sha256 {recorded_sha256}; "
            f"refusing a different payload with sha256 {offered_sha256}"
        )
        self.key = key
        self.recorded_sha256 = recorded_sha256
        self.offered_sha256 = offered_sha256


class TenantMismatchError(LedgerError):
    """The key is recorded for another tenant. Nothing about that tenant's call is revealed."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} belongs to another tenant; refusing to reserve it")
        self.key = key


class AttemptExpiredError(LedgerError):
    """The attempt reserving a call is past its own deadline: its workflow has given up on it and may
    have run the call again, so it reserves nothing (and sends nothing)."""

    def __init__(self, key: str, not_after: datetime | None) -> None:
        when = not_after.isoformat() if not_after is not None else "its deadline"
        super().__init__(f"{key!r} was not reserved: the attempt is past {when}; nothing was sent")
        self.key = key
        self.not_after = not_after


class InvalidTransitionError(LedgerError):
    """The record is not in a state that allows the requested change."""

    def __init__(
        self,
        key: str,
        current_status: str,
        wanted: str,
        *,
        settled_by: str | None = None,
        settled_at: datetime | None = None,
        reason: str | None = None,
    ) -> None:
        detail = f"key {key!r} is {current_status}"
        if settled_by:
            when = f" at {settled_at.isoformat()}" if settled_at else ""
            detail += f" (settled by {settled_by}{when})"
        super().__init__(f"cannot {wanted}: {detail}")
        self.key = key
        self.current_status = current_status
        self.settled_by = settled_by
        self.settled_at = settled_at
        self.reason = reason  # the one the decider gave, when the record keeps it


class AlreadySettledError(InvalidTransitionError):
    """A compare-and-set settle lost: someone else settled the call first. Names the winner."""


class OutcomeIgnoredError(InvalidTransitionError):
    """An outcome from a non-owner, or one that arrived after settling: recorded as an event only."""


class ReasonRequiredError(LedgerError, ValueError):
    def __init__(self, action: str) -> None:
        super().__init__(f"{action} needs a non-empty reason")


class ProvenanceError(LedgerError, ValueError):
    """An `operator:` actor arriving through a door other than the authenticated operator API."""

    def __init__(self, actor: str, source: str) -> None:
        super().__init__(
            f"actor {actor!r} names an operator, but only the operator API may act as one "
            f"(this came from {source})"
        )
        self.actor = actor
        self.source = source


class ConflictNotOpenError(LedgerError):
    """An acknowledgement for a call that has no open conflict."""

    def __init__(self, key: str, cleared_by: str | None = None) -> None:
        detail = f"already acknowledged by {cleared_by}" if cleared_by else "none was flagged"
        super().__init__(f"{key!r} has no open conflict ({detail})")
        self.key = key
        self.cleared_by = cleared_by


class ReusedCallError(InvalidTransitionError):
    """A compensation of a reused result: nothing was sent under its key, so there is nothing of its
    own to undo; the effect belongs to the call it reused, which is the one to compensate."""

    def __init__(self, key: str, wanted: str, *, reused_from: str) -> None:
        super().__init__(key, "completed", wanted)
        self.args = (
            f"cannot {wanted}: {key!r} is a reused result of {reused_from!r}; nothing was sent under "
            f"it, so there is nothing of its own to undo. Compensate {reused_from!r}, the call that took "
            "effect",
        )
        self.reused_from = reused_from


class HeldCallError(InvalidTransitionError):
    """A decision about a held call: it was never sent, and waits for the call that holds it.

    Settle (or approve, or deny) the blocker instead; the held call then runs, or is told the truth,
    as its tool declares.
    """

    def __init__(self, key: str, wanted: str, *, held_by: str, hold_reason: str | None) -> None:
        super().__init__(key, "held", wanted)
        why = f" ({hold_reason})" if hold_reason else ""
        self.args = (
            f"cannot {wanted}: {key!r} is held behind {held_by!r}{why}. Nothing was sent for it, so "
            f"there is nothing to settle; decide {held_by!r} and this call goes on by itself",
        )
        self.held_by = held_by
        self.hold_reason = hold_reason


class EvidenceRequiredError(ReasonRequiredError):
    """Settling an unknown call that draws on a budget as failed releases its amount: that needs
    evidence (what was looked at, and where), not a reason alone."""

    def __init__(self, key: str, amount: str, entity: str | None) -> None:
        LedgerError.__init__(
            self,
            f"settling {key!r} as failed releases {amount} of the budget of {entity or 'its entity'}; "
            "give evidence (what you checked on the other side, e.g. a ticket, a query, a reference)",
        )
        self.key = key
        self.amount = amount
        self.entity = entity


class ResendInFlightError(InvalidTransitionError):
    """A decision about an unknown call while the reconciler's resend of it is on the wire.

    The resend's answer may settle the call any moment; a decision now could contradict it. Decide
    after `until` (the resend's timeout plus a margin, by the database's clock) and before
    `quiet_until` (no other resend leaves before then), or not at all if the answer settles it.
    """

    def __init__(
        self, key: str, wanted: str, *, resend: int, until: datetime, quiet_until: datetime, actor: str
    ) -> None:
        super().__init__(key, "indeterminate", wanted)
        self.args = (
            f"cannot {wanted}: resend {resend} of {key!r} (by {actor}) is on the wire until "
            f"{until.isoformat()}; its answer may settle the call. Decide after that: no other "
            f"resend leaves before {quiet_until.isoformat()}",
        )
        self.resend = resend
        self.until = until
        self.quiet_until = quiet_until
        self.resend_actor = actor


class OwnerLeaseLiveError(InvalidTransitionError):
    """A call settled as failed (not applied) while its owner's lease is live: the owner's request may
    still be on the wire and land after "it is not there" was decided. Decide after `until` (by the
    database's clock), or settle it completed if its effect was found."""

    def __init__(self, key: str, current_status: str, wanted: str, *, until: datetime) -> None:
        super().__init__(key, current_status, wanted)
        self.args = (
            f"cannot {wanted}: the attempt that sent {key!r} holds it until {until.isoformat()}, and "
            "its request may still be on the wire; finding no effect now proves nothing. Decide "
            "after that (or settle it completed if the effect is there)",
        )
        self.until = until


class CompensationNotRequestedError(LedgerError):
    """A compensation run with no operator's request to serve: nobody asked through the operator
    API, or the request it finds was served by another run (`served_by`). Nothing is sent."""

    def __init__(self, key: str, *, served_by: str | None = None) -> None:
        why = (
            f"the latest request was already served by compensation run {served_by}"
            if served_by
            else "no operator asked for it through the operator API"
        )
        super().__init__(
            f"refusing to compensate {key!r}: {why}; ask POST /v1/tool-executions/{{key}}/compensate"
        )
        self.key = key
        self.served_by = served_by
