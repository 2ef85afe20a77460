"""The state one run's write calls share, and what the Temporal UI shows of it.

The protocol (write_sends.py), its waits (write_waits.py) and the handlers (write_handlers.py) all
read and change this state; each is a layer of one class, WriteCalls (write_calls.py), that the
hosting workflow inherits. `wait_until` is every wait of the protocol; `call_summary` the row a run
shows of one call; `with_unsent_owner` the next attempt's input after one that met the ledger away
(a compensation's too, workflows/compensation.py). Deterministic code only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from onceflow.ledger.status import Status
    from onceflow.runtime.constants import (
        ESCALATED_TO,
        HELD_KEYS,
        PHASE,
        UNRESOLVED_KEYS,
    )
    from onceflow.sdk.payloads import (
        CallSummary,
        CompensationInput,
        Phase,
        ToolCallInput,
        ToolOutcome,
    )

# Owner tokens of attempts that may have reserved while their answer was lost, kept for the next one.
_UNSENT_OWNERS_KEPT = 64
_AttemptInput = TypeVar("_AttemptInput", ToolCallInput, CompensationInput)


async def wait_until(condition: Callable[[], bool], timeout_seconds: float | None = None) -> bool:
    """Every wait of the protocol: for `condition` (a nudge, a resolution), or for a timer of
    `timeout_seconds`, whichever comes first. True if the condition held, False if the timer fired.
    No timeout, no timer. The one command it issues is the one `workflow.wait_condition` issues:
    a timer, when a timeout is given, cancelled if the condition comes first."""
    try:
        await workflow.wait_condition(condition, timeout=timeout_seconds)
    except TimeoutError:
        return False
    return True


def with_unsent_owner(attempt_input: _AttemptInput, cause: BaseException | None) -> _AttemptInput:
    """The next attempt's input (a write call's or a compensation's), naming the failed attempt's
    owner token (from the error's details): a reservation of its may have committed unsent."""
    details = cause.details if isinstance(cause, ApplicationError) else ()
    owner = details[0].get("owner") if details and isinstance(details[0], dict) else None
    if not isinstance(owner, str):
        return attempt_input
    owners = [*attempt_input.unsent_owners, owner][-_UNSENT_OWNERS_KEPT:]
    return attempt_input.model_copy(update={"unsent_owners": owners})


class WriteCallState:
    """The state of a run's write calls, and its publishing to the Temporal UI."""

    def __init__(self) -> None:
        self._phase = Phase.RUNNING
        self._tenant = ""
        self._calls: dict[str, CallSummary] = {}
        self._pending: dict[str, CallSummary] = {}
        self._resolved: dict[str, ToolOutcome] = {}
        self._last_resolve_error: str | None = None
        self._nudged: set[str] = set()
        self._escalated: dict[str, str] = {}
        # Decided once, on the first workflow task, so a run keeps one behaviour for its whole life.
        self._current = False  # agent_run.PATCH_CURRENT: every earlier patch at once
        self._recheck = False
        self._attributes_follow_ledger = False
        self._held: set[str] = set()
        self._adopted: set[str] = set()

    def _leave_pending(self, key: str) -> None:
        """The ledger settled `key`: it leaves the run's unresolved keys, and its escalation."""
        del self._pending[key]
        self._publish_unresolved()
        if self._attributes_follow_ledger and self._escalated.pop(key, None) is not None:
            self._publish_escalations()
        if not self._pending:
            self._set_phase(Phase.RUNNING)
            workflow.set_current_details("")

    # -- what the Temporal UI shows -----------------------------------------------------------------

    def _set_phase(self, phase: Phase) -> None:
        self._phase = phase
        workflow.upsert_search_attributes([PHASE.value_set(phase.value)])

    def _publish_unresolved(self) -> None:
        keys = sorted(self._pending)
        workflow.upsert_search_attributes(
            [UNRESOLVED_KEYS.value_set(keys) if keys else UNRESOLVED_KEYS.value_unset()]
        )

    def _publish_held(self) -> None:
        keys = sorted(self._held)
        workflow.upsert_search_attributes([HELD_KEYS.value_set(keys) if keys else HELD_KEYS.value_unset()])

    def _publish_escalations(self) -> None:
        owners = sorted(set(self._escalated.values()))
        workflow.upsert_search_attributes(
            [ESCALATED_TO.value_set(", ".join(owners)) if owners else ESCALATED_TO.value_unset()]
        )

    def _calls_by_key(self) -> dict[str, CallSummary]:
        return {c.key: c for c in self._calls.values() if c.key}


def call_summary(outcome: ToolOutcome) -> CallSummary:
    status = outcome.status.value if isinstance(outcome.status, Status) else outcome.status
    return CallSummary(
        tool_call_id=outcome.tool_call_id,
        tool=outcome.tool,
        key=outcome.key,
        status=status,
        detail=outcome.error,
    )
