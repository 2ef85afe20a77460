"""What a tool does to the world, as its author declares it: `read()`, `write()`, `external()` or
`destructive()`, with the timeout, the approval and the receiver's dedup window that go with it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from onceflow.ledger import SideEffect

DEFAULT_TOOL_TIMEOUT = timedelta(seconds=10)
READ_ATTEMPTS = 3


@dataclass(frozen=True)
class Effect:
    """A tool's declared side effect. Use `read()`, `write()`, `external()` or `destructive()`."""

    side_effect: SideEffect
    max_attempts: int
    timeout: timedelta = DEFAULT_TOOL_TIMEOUT
    approval: bool = False
    # How long the receiver honours a repeated idempotency key. Within it an unknown call may be
    # settled by sending it again with the same key (a reconcile strategy); after it, never.
    dedup_window: timedelta | None = None

    @property
    def changes_the_world(self) -> bool:
        return self.side_effect is not SideEffect.READ


def read(*, timeout: timedelta = DEFAULT_TOOL_TIMEOUT) -> Effect:
    """Looks, changes nothing: retried up to three times with backoff."""
    return Effect(SideEffect.READ, max_attempts=READ_ATTEMPTS, timeout=timeout)


def write(
    *,
    timeout: timedelta = DEFAULT_TOOL_TIMEOUT,
    approval: bool = False,
    dedup_window: timedelta | None = None,
) -> Effect:
    """Changes our own records: one attempt, reserved in the ledger first."""
    return Effect(SideEffect.WRITE, 1, timeout, approval, dedup_window)


def external(
    *,
    timeout: timedelta = DEFAULT_TOOL_TIMEOUT,
    approval: bool = False,
    dedup_window: timedelta | None = None,
) -> Effect:
    """Sends something to another system (money, messages): one attempt, reserved first."""
    return Effect(SideEffect.EXTERNAL, 1, timeout, approval, dedup_window)


def destructive(
    *,
    timeout: timedelta = DEFAULT_TOOL_TIMEOUT,
    approval: bool = False,
    dedup_window: timedelta | None = None,
) -> Effect:
    """Deletes or overwrites: one attempt, reserved first."""
    return Effect(SideEffect.DESTRUCTIVE, 1, timeout, approval, dedup_window)
