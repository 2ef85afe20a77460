"""What the drill did on the runs it walks down a path (RunPath): one `Walk` per run, and the wait
both walkers use.

A walk is the drill acting on a run from outside, as an operator (operator.py) or as Temporal's
reset (resets.py), while workers are killed at random. Its record says which steps were taken and
when, and what the drill passed on (the credit a late report carried, the Temporal runs of a reset);
the judge (paths.py) reads it only to say whether the path was walked, never to decide what the
model was told or what billing paid.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from temporalio.service import RPCError

T = TypeVar("T")

# Long enough for a run to come back from a killed worker a few times over (each kill can cost it an
# activity timeout); short enough that a walk stuck on a defect ends well before the drill does.
WALK_STEP_TIMEOUT = 300.0


@dataclass
class Walk:
    run_id: str
    path: str
    started: float = field(default_factory=time.monotonic)
    steps: list[str] = field(default_factory=list)
    done: bool = False
    error: str | None = None
    # Conflict runs: the credit billing applied under the first key, which the owner's late report
    # carried (None: billing had none, so no late report was made); whether the operator then
    # acknowledged the conflict; the retry's ledger status when the acknowledgement was made.
    late_report: str | None = None
    acknowledged: bool = False
    retry_status_at_acknowledgement: str | None = None
    # Reset runs: the moment planned, the Temporal run that was reset, the event it was reset to,
    # and the new run.
    moment: str | None = None
    reset_from: str | None = None
    reset_event_id: int | None = None
    reset_to: str | None = None

    def step(self, what: str) -> None:
        self.steps.append(f"{time.monotonic() - self.started:.1f}s {what}")


class WalkTimeout(Exception):
    """A step of a walk waited longer than WALK_STEP_TIMEOUT for the run to get there."""


async def until(
    probe: Callable[[], Awaitable[T]],
    reached: Callable[[T], bool],
    what: str,
    timeout: float = WALK_STEP_TIMEOUT,
) -> T:
    """Ask `probe` every 0.2 s until `reached` says yes; Temporal being busy is asked again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await probe()
            if reached(value):
                return value
        except RPCError:
            pass
        if time.monotonic() > deadline:
            raise WalkTimeout(f"waited {timeout:g}s for {what}")
        await asyncio.sleep(0.2)
