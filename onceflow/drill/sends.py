"""How often each key was *sent*, counted at the receiver, and which re-sends the ledger allows.

The billing service writes down every request on arrival, before its own dedup, fencing or faults
(examples/billing/received.py), and the drill runs it with `--no-dedup`, so nothing downstream hides
a second send. A key may reach the receiver more than once only when the ledger re-reserved it after
a definite "not attempted" failure (`failed` with failure_kind `not_attempted`, then `reserved`
again from `failed` with attempt + 1): each such re-reservation allows one more send. Any other
second request for a key is onceflow sending one call twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from onceflow.ledger import FailureKind, Status

# Read-only: every event of the tenant's calls, in the order they were written.
EVENTS = """
SELECT e.key, e.kind, e.from_status, e.to_status, e.reason
FROM tool_execution_events e JOIN tool_executions t ON t.key = e.key
WHERE t.tenant = $1
ORDER BY e.id
"""


@dataclass(frozen=True)
class Reruns:
    """Re-reservations of one key out of `failed`, by what the failure before each one was."""

    after_not_attempted: int = 0
    after_other_failure: int = 0


def _failed_not_attempted(event: Mapping[str, Any]) -> bool:
    # Only the owner reports "not attempted"; its `failed` event gives the kind first in its reason
    # (ledger/queries/calls.py FAIL_STARTED: "<failure_kind>: <error>").
    reason = event.get("reason") or ""
    return event["kind"] == "failed" and reason.startswith(f"{FailureKind.NOT_ATTEMPTED.value}:")


def reruns_by_key(events: Iterable[Mapping[str, Any]]) -> dict[str, Reruns]:
    """Per key, how often it was reserved again after a failure; events must come oldest first."""
    last_failure_not_attempted: dict[str, bool] = {}
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for event in events:
        key = event["key"]
        if event["to_status"] == Status.FAILED:
            last_failure_not_attempted[key] = _failed_not_attempted(event)
        elif event["kind"] == "reserved" and event["from_status"] == Status.FAILED:
            counts[key][0 if last_failure_not_attempted.get(key) else 1] += 1
    return {key: Reruns(*pair) for key, pair in counts.items()}


@dataclass(frozen=True)
class Sends:
    """One key's sends: requests the receiver got, and how many of them were beyond what is allowed."""

    received: int
    legit_resends: int  # second (third...) sends that follow a "not attempted" failure
    extra: int  # sends beyond the first that nothing allows: the figure that must stay 0


def judge_sends(received: int, reruns: Reruns | None) -> Sends:
    """Allowed: one send, plus one per re-reservation after a "not attempted" failure."""
    allowed_again = reruns.after_not_attempted if reruns else 0
    again = max(0, received - 1)
    legit = min(again, allowed_again)
    return Sends(received=received, legit_resends=legit, extra=again - legit)
