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


def _logger(out: IO[str]) -> object:
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
    return write


def main() -> None:
    path = os.environ.get(ACK_LOG_ENV)
    if path:
        _logger(Path(path).open("a", buffering=1))  # kept open for the process's life
    from onceflow.runtime.worker import main as worker_main

    worker_main()


if __name__ == "__main__":
    main()
