"""How long a stopping worker lets in-flight activities finish: ONCEFLOW_SHUTDOWN_GRACE.

On SIGTERM the worker stops polling at once and gives the activities it is running this long to
end on their own (temporalio's `graceful_shutdown_timeout`); only then are they cancelled. A write
cut off mid-call is `indeterminate` and needs its reconcile hook or a person, so the grace must
outlast the longest call a worker can be in: the slowest tool's own timeout, plus ACTIVITY_MARGIN
(the same margin Temporal's start-to-close timeout gives the activity to reserve and record around
the call). A shorter grace is refused at start-up rather than warned about: a warning scrolls by,
and the cost shows up days later as unknown calls after an ordinary deploy.

Model calls are not counted: a model call cut off by a shutdown changes nothing in the world and
Temporal runs it again on another worker (MODEL_RETRY). Waiting for MODEL_TIMEOUT on every
deploy would make rollouts slow for no safety gained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import ACTIVITY_MARGIN

SHUTDOWN_GRACE_ENV = "ONCEFLOW_SHUTDOWN_GRACE"
# Beyond the minimum when nothing is configured: time to report the last completions to Temporal.
SHUTDOWN_SLACK = timedelta(seconds=5)


class ShutdownGraceError(ValueError):
    """ONCEFLOW_SHUTDOWN_GRACE is not a number of seconds, or is too short for the loaded tools."""


@dataclass(frozen=True)
class SlowestTool:
    name: str
    timeout: timedelta

    @property
    def minimum_grace(self) -> timedelta:
        return self.timeout + ACTIVITY_MARGIN


def slowest_tool(registry: AgentRegistry) -> SlowestTool:
    """The tool with the longest timeout among every agent's tools (its hooks share that timeout)."""
    tools = registry.all_tools()
    if not tools:
        return SlowestTool("(no tools)", timedelta(0))
    tool = max(tools, key=lambda t: t.effect.timeout)
    return SlowestTool(tool.name, tool.effect.timeout)


def shutdown_grace(registry: AgentRegistry, configured: str = "") -> timedelta:
    """The grace to use: `configured` (seconds) if given and long enough, else the default."""
    slowest = slowest_tool(registry)
    if not configured.strip():
        return slowest.minimum_grace + SHUTDOWN_SLACK
    try:
        seconds = float(configured)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ShutdownGraceError(f"{SHUTDOWN_GRACE_ENV}={configured!r} is not a number of seconds")
    grace = timedelta(seconds=seconds)
    if grace < slowest.minimum_grace:
        need = slowest.minimum_grace.total_seconds()
        raise ShutdownGraceError(
            f"{SHUTDOWN_GRACE_ENV}={configured} is too short: tool {slowest.name!r} may run for "
            f"{slowest.timeout.total_seconds():g}s, plus {ACTIVITY_MARGIN.total_seconds():g}s to reserve "
            f"and record it, so a deploy could cut a write mid-call and leave it indeterminate. "
            f"Set it to at least {need:g} (and the supervisor's stop timeout, e.g. docker-compose "
            f"stop_grace_period, longer still), or unset it for {need + SHUTDOWN_SLACK.total_seconds():g}."
        )
    return grace
