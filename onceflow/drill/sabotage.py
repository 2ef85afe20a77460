"""A deliberately broken worker, to prove that the drill's send count can fail. Never run it otherwise.

`python -m onceflow.drill.sabotage` serves like `python worker.py`, except that its write activity,
when the tool gives no answer within its timeout, invokes the tool a second time with the same key:
the very bug the ledger exists to prevent, committed behind the ledger's back. (A second Temporal
attempt of the activity would prove nothing: the reservation already refuses it.) The drill starts
its workers this way with `onceflow drill --sabotage-resend-after-timeout`, and
tests/test_drill.py checks that the drill then counts keys sent more than once and fails.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

from temporalio import activity
from temporalio.worker import Worker

from onceflow.activities import all_activities, default_identity
from onceflow.activities.tools import ToolActivities
from onceflow.runtime.client import connect
from onceflow.runtime.config import Settings
from onceflow.runtime.process_exit import exit_after_cleanup
from onceflow.runtime.worker import open_agents_and_ledger
from onceflow.sdk.payloads import OwnerOutcome
from onceflow.sdk.tools import Tool, ToolContext
from onceflow.workflows import ALL_WORKFLOWS

log = logging.getLogger("onceflow.drill.sabotage")


class ResendingToolActivities(ToolActivities):
    """The write activity with the bug: an unanswered send is sent again, same key, same attempt."""

    async def _send(
        self, tool: Tool, arguments: dict[str, Any], context: ToolContext, owner: str
    ) -> OwnerOutcome:
        outcome = await super()._send(tool, arguments, context, owner)
        if outcome.status == "indeterminate" and (outcome.error or "").startswith("no answer within"):
            activity.logger.warning("SABOTAGE: sending %s again after its timeout", context.idempotency_key)
            outcome = await super()._send(tool, arguments, context, owner)
        return outcome


async def serve(settings: Settings) -> None:
    registry, ledger = await open_agents_and_ledger(settings, "worker")
    try:
        client = await connect(settings)
        identity = default_identity()
        broken = ResendingToolActivities(ledger, registry, identity).run_write_tool
        activities = [
            broken if getattr(fn, "__name__", "") == "run_write_tool" else fn
            for fn in all_activities(ledger, registry, identity)
        ]
        assert broken in activities, "the write activity was not found to replace"
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=ALL_WORKFLOWS,
            activities=activities,
            identity=identity,
        )
        log.warning(
            "SABOTAGED worker on task queue %s: writes are sent again after a timeout", settings.task_queue
        )
        async with worker:
            await stop.wait()
    finally:
        await ledger.close()


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    asyncio.run(serve(Settings.from_env()))
    exit_after_cleanup(0)  # as worker.py does: no teardown for the SDK's native threads to crash


if __name__ == "__main__":
    main()
