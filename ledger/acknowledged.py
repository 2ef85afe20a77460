"""The call-path writes this process saw acknowledged, kept for a while per key (ledger/lost_writes.py
reads them again after a failover), and how to tell a row that fell behind one of them."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from onceflow.ledger.records import ToolExecutionRecord
from onceflow.ledger.status import Status

# How far a failover can reach back: asynchronous replication loses the last moments' writes, a
# standby that lagged by minutes more. Writes older than this are not kept for checking.
KEEP_FOR = timedelta(minutes=10)
KEEP_AT_MOST = 20_000

# How far along a call is; a row found at a lower phase of the same attempt lost a write.
_PHASE = {
    Status.HELD: 0,
    Status.AWAITING_APPROVAL: 0,
    Status.STARTED: 1,
    Status.INDETERMINATE: 2,
    Status.COMPLETED: 3,
    Status.FAILED: 3,
    Status.DENIED: 3,
    Status.COMPENSATED: 4,
}

# Told of every acknowledged write of every ledger in the process (the failover drill logs them).
AcknowledgedListener = Callable[[ToolExecutionRecord, int | None], None]
_LISTENERS: list[AcknowledgedListener] = []


def on_acknowledged(listener: AcknowledgedListener) -> None:
    """Call `listener(record, timeline)` after each call-path write this process sees committed."""
    _LISTENERS.append(listener)


def phase_of(status: Status | str) -> int:
    """How far along a call in this status is: waiting to be sent 0, started 1, unknown 2, settled 3,
    compensated 4."""
    return _PHASE[Status(status)]


def behind(found: ToolExecutionRecord | None, acknowledged: ToolExecutionRecord) -> bool:
    """Is the row older than what was acknowledged: missing, an older attempt, or the same attempt
    at an earlier step?"""
    if found is None or found.attempt < acknowledged.attempt:
        return True
    return found.attempt == acknowledged.attempt and _PHASE[found.status] < _PHASE[acknowledged.status]


@dataclass(frozen=True)
class Acknowledged:
    record: ToolExecutionRecord  # the row as the acknowledged write returned it
    timeline: int | None  # the server timeline the process knew then
    at: float  # time.monotonic()


class AcknowledgedWrites:
    """The latest acknowledged call-path write per key, for the last `KEEP_FOR`, oldest first."""

    def __init__(self, keep_for: timedelta = KEEP_FOR, keep_at_most: int = KEEP_AT_MOST) -> None:
        self._entries: OrderedDict[str, Acknowledged] = OrderedDict()
        self._keep_for = keep_for.total_seconds()
        self._keep_at_most = keep_at_most

    def add(self, record: ToolExecutionRecord, timeline: int | None) -> None:
        now = time.monotonic()
        self._entries.pop(record.key, None)
        self._entries[record.key] = Acknowledged(record, timeline, now)
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if len(self._entries) <= self._keep_at_most and now - oldest.at <= self._keep_for:
                break
            self._entries.popitem(last=False)
        for listener in _LISTENERS:
            listener(record, timeline)

    def latest(self, key: str) -> ToolExecutionRecord | None:
        """The row as this process's latest acknowledged write of `key` returned it, if still kept."""
        entry = self._entries.get(key)
        return None if entry is None else entry.record

    def before(self, timeline: int) -> list[Acknowledged]:
        """The writes acknowledged on an earlier timeline (or on one not known)."""
        return [e for e in self._entries.values() if e.timeline is None or e.timeline < timeline]

    def __len__(self) -> int:
        return len(self._entries)
