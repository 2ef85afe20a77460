"""The infrastructure drills' worker: worker.py, logging every ledger write it saw acknowledged.

`python -m onceflow.drill.ack_worker` registers a listener for the ledger's acknowledged call-path
writes (ledger/acknowledged.py) that appends one JSON line per write to the file named by
ONCEFLOW_DRILL_ACK_LOG, then runs the ordinary worker. After the drill the runner compares every
line with the promoted server's rows (acks.py): the worker side's own record of what it was told
had committed, not the ledger's word for itself. A line is written (unbuffered) as soon as the
write returns, so a SIGKILL loses none that were acknowledged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

from onceflow.ledger.acknowledged import on_acknowledged
from onceflow.ledger.records import ToolExecutionRecord

ACK_LOG_ENV = "ONCEFLOW_DRILL_ACK_LOG"
# Tests of the drill only (`onceflow drill --sabotage-failover-safety`): the worker ignores what a
# failover lost, as onceflow did before: no checks after a new timeline, a missing row is "not sent",
# no doubt about a lost attempt. The asynchronous failover drill must then fail.
SABOTAGE_FAILOVER_ENV = "ONCEFLOW_DRILL_SABOTAGE_FAILOVER"


def _without_failover_safety() -> None:
    from onceflow.activities import sending
    from onceflow.ledger.lost_writes import LostWrites

    async def nothing_lost(self: LostWrites, previous: int, timeline: int) -> list[ToolExecutionRecord]:
        return []

    async def no_failover(self: LostWrites, since: object) -> None:
        return None

    LostWrites.check_acknowledged = nothing_lost  # type: ignore[method-assign]
    LostWrites.failover_since = no_failover  # type: ignore[method-assign]
    sending.behind = lambda found, acknowledged: False  # the old reading: no row, nothing sent


def _logger(out: IO[str]) -> None:
    def write(record: ToolExecutionRecord, timeline: int | None) -> None:
        line = {
            "key": record.key,
            "status": record.status.value,
            "attempt": record.attempt,
            "owner": record.owner,
            "updated_at": record.updated_at.isoformat(),
            "timeline": timeline,
            "pid": os.getpid(),
        }
        out.write(json.dumps(line) + "\n")
        out.flush()

    on_acknowledged(write)


def main() -> None:
    if os.environ.get(SABOTAGE_FAILOVER_ENV):
        _without_failover_safety()
    path = os.environ.get(ACK_LOG_ENV)
    if path:
        _logger(Path(path).open("a", buffering=1))  # kept open for the process's life
    from onceflow.runtime.worker import main as worker_main

    worker_main()


if __name__ == "__main__":
    main()
