"""Running tools. Reads retry under Temporal's policy; writes go through the ledger, once.

Beside it: tool_io.py (the model's arguments checked, what the model is told back), budget_limits.py
(a budget's `limit_from` read) and sending.py (one send, and its outcome recorded).
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from onceflow import metrics
from onceflow.activities.budget_limits import BudgetLimitUnavailableError, budget_limit
from onceflow.activities.outcomes import (
    as_told,
    attempt_began,
    attempt_deadline,
    outcome_from_record,
    owner_token,
)
from onceflow.activities.sending import (
    record_sent_outcome,
    send_once,
    unkeepable_result,
    unknown_if_failed_over,
)
from onceflow.activities.tool_io import checked_arguments, oversized, refused, split_arguments, tool_context
from onceflow.ledger import (
    AttemptExpiredError,
    CallIdentity,
    FailureKind,
    GuardArgumentError,
    Ledger,
    LedgerUnavailableError,
    PayloadMismatchError,
    Status,
    TenantMismatchError,
    ToolExecutionRecord,
)
from onceflow.ledger.records import Reservation, ReserveResult
from onceflow.ledger.run_ids import RunIdTakenError
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import (
    ACTIVITY_MARGIN,
    ERR_ATTEMPT_EXPIRED,
    ERR_BUDGET_LIMIT_UNAVAILABLE,
    ERR_INVALID_RUN_ID,
    ERR_LEDGER_UNAVAILABLE,
    ERR_NOT_A_READ,
    ERR_PAYLOAD_MISMATCH,
    ERR_RUN_ID_TAKEN,
    ERR_TENANT_MISMATCH,
)
from onceflow.sdk.keys import InvalidRunIdError, call_key, check_run_id
from onceflow.sdk.payloads import OwnerOutcome, ToolCallInput, ToolOutcome, result_problem
from onceflow.sdk.tools import (
    InvalidToolArgumentsError,
    Tool,
    ToolContext,
    ToolNotAttemptedError,
    ToolRefusedError,
    ToolRejectedError,
)

_CLAIMS_REMEMBERED = 10_000


class ToolActivities:
    def __init__(self, ledger: Ledger, registry: AgentRegistry, worker_identity: str) -> None:
        self.ledger = ledger
        self.registry = registry
        self.worker_identity = worker_identity
        # Run ids this worker saw claimed by the run at hand: a claim never changes hands.
        self._claimed: set[tuple[str, str]] = set()

    @activity.defn(name="run_read_tool")
    async def run_read_tool(self, tool_input: ToolCallInput) -> ToolOutcome:
        """A read: no ledger, and an exception means Temporal tries again (three attempts).

        The run chose this activity from the classes it was told at its start; this worker's own
        class for the tool decides. A tool it classifies as changing the world (an annotation
        corrected to `effect: external` since the run started) is refused, non-retryably, before
        anything is called: it would otherwise run up to three times without a ledger key.
        """
        tool = self.registry.tool(tool_input.agent, tool_input.call.name)
        call = tool_input.call
        if tool.effect.changes_the_world:
            raise ApplicationError(
                f"{call.name} was not called: this worker classifies it as {tool.side_effect}, not "
                "read, and a call that changes the world is never sent as a read (retried, with no "
                "ledger key). Runs started after the change send it as a write.",
                type=ERR_NOT_A_READ,
                non_retryable=True,
            )
        try:
            arguments = checked_arguments(tool, call)
        except InvalidToolArgumentsError as exc:
            return refused(call, exc)
        context = tool_context(tool_input, activity.info().attempt)
        try:
            value = await asyncio.wait_for(
                tool.invoke(arguments, context), tool.effect.timeout.total_seconds()
            )
        except (ToolNotAttemptedError, ToolRejectedError) as exc:
            return refused(call, exc)
        except ToolRefusedError as exc:
            return refused(call, exc, FailureKind.POLICY_REFUSED)
        unkeepable = result_problem(value)
        if unkeepable is not None:
            # A read changed nothing: the model is told, and nothing pretends to be its answer.
            return refused(call, ValueError(unkeepable_result(unkeepable)))
        too_large = oversized(value, self._result_cap(tool_input))
        if too_large:
            return ToolOutcome(
                tool_call_id=call.id, tool=call.name, key=None, status="error", error=too_large
            )
        return ToolOutcome(tool_call_id=call.id, tool=call.name, key=None, status="ok", value=value)

    def _result_cap(self, tool_input: ToolCallInput) -> int:
        return self.registry.agent(tool_input.agent).config.tool_policy.max_result_bytes

    @activity.defn(name="run_write_tool")
    async def run_write_tool(self, tool_input: ToolCallInput) -> ToolOutcome:
        """Reserve the key, run the tool once with it, record what happened."""
        tool = self.registry.tool(tool_input.agent, tool_input.call.name)
        call = tool_input.call
        # First of all: a run id keys can be built from. Whether it is this run's own is decided by
        # the reservation, which claims it on the run's first write (ledger/run_ids.py).
        execution = self._claim_needed(tool_input)
        try:
            arguments, replaces = split_arguments(tool, call)
        except InvalidToolArgumentsError as exc:
            return refused(call, exc)  # nothing reserved, nothing sent: the model is told
        # The ledger before the budget's `limit_from` read (the only thing read before it): a call
        # asked again (a held call woken, an approval, a reset replaying the key) is answered by its
        # row, and a failed read never turns into a refusal of it.
        key = call_key(tool_input.run_id, call.id)
        recorded = await self._recorded(key) if tool.guards.limit_from is not None else None
        try:
            limit = await budget_limit(self.registry, tool_input, tool, arguments, recorded)
        except BudgetLimitUnavailableError as exc:
            if recorded is None and await self._recorded(key) is None:  # not even just now
                return refused(call, exc)  # nothing reserved, nothing sent: the model may try again
            # A recorded call stays as it is, and is asked about again: never refused for this.
            raise ApplicationError(str(exc), type=ERR_BUDGET_LIMIT_UNAVAILABLE, non_retryable=True) from exc
        try:
            guard = tool.ledger_guard(
                arguments,
                replaces_key=call_key(tool_input.run_id, replaces) if replaces else None,
                limit=limit,
                heard=tool_input.heard,
            )
        except InvalidToolArgumentsError as exc:
            return refused(call, exc)
        owner = owner_token(self.worker_identity)
        identity = CallIdentity(
            tenant=tool_input.tenant, run_id=tool_input.run_id, tool_call_id=call.id, agent=tool_input.agent
        )
        try:
            reservation = await self.ledger.reserve(
                identity,
                tool_name=tool.name,
                side_effect=tool.side_effect,
                arguments=arguments,
                owner=owner,
                approval=tool.effect.approval,
                # Past this the owner is gone: the activity's own deadline has passed too.
                lease=tool.effect.timeout + ACTIVITY_MARGIN,
                guard=guard,
                execution=execution,
                not_after=attempt_deadline(),
                began_at=attempt_began(),
                # Earlier attempts whose answer was lost: a reservation of theirs was never sent.
                unsent_owners=tool_input.unsent_owners,
            )
        except GuardArgumentError as exc:
            return refused(call, exc)
        except RunIdTakenError as exc:
            raise ApplicationError(str(exc), type=ERR_RUN_ID_TAKEN, non_retryable=True) from exc
        except AttemptExpiredError as exc:
            raise ApplicationError(str(exc), type=ERR_ATTEMPT_EXPIRED, non_retryable=True) from exc
        except LedgerUnavailableError as exc:
            # Perhaps the reservation committed and only its answer was lost: the next attempt
            # recognises it by this attempt's owner token.
            raise ApplicationError(
                f"not sent: {exc}", {"owner": owner}, type=ERR_LEDGER_UNAVAILABLE, non_retryable=True
            ) from exc
        except PayloadMismatchError as exc:
            raise ApplicationError(str(exc), type=ERR_PAYLOAD_MISMATCH, non_retryable=True) from exc
        except TenantMismatchError as exc:
            raise ApplicationError(str(exc), type=ERR_TENANT_MISMATCH, non_retryable=True) from exc
        self._remember_claim(tool_input)
        if not reservation.may_send:
            return await self._answered(reservation)
        if tool_input.lost_attempt_at is not None:
            unknown = await unknown_if_failed_over(
                self.ledger, tool_input.lost_attempt_at, reservation.record
            )
            if unknown is not None:
                return outcome_from_record(unknown)
        context = tool_context(tool_input, reservation.record.attempt)
        outcome = await self._send(tool, arguments, context, owner)
        outcome = outcome.model_copy(update={"reserved": reservation.record})
        metrics.record_send(tool.name, outcome.status)
        too_large = outcome.status == "completed" and oversized(outcome.value, self._result_cap(tool_input))
        if too_large:
            # It took effect; only the answer is dropped. The ledger and the model say so.
            outcome = outcome.model_copy(update={"value": {"result_omitted": too_large}})
        return await record_sent_outcome(self.ledger, outcome)

    async def _answered(self, reservation: ReserveResult) -> ToolOutcome:
        """What the model is told of a call the ledger answered for (a reused call whose source was
        undone since is told so: `as_told`)."""
        record = reservation.record
        replayed = record.status is Status.COMPLETED
        if reservation.outcome is not Reservation.REUSED:
            return outcome_from_record(record, replayed=replayed)
        try:
            return await as_told(self.ledger, record, replayed=replayed)
        except LedgerUnavailableError as exc:
            raise ApplicationError(
                f"not sent: {exc}", type=ERR_LEDGER_UNAVAILABLE, non_retryable=True
            ) from exc

    async def _recorded(self, key: str) -> ToolExecutionRecord | None:
        try:
            return await self.ledger.find(key)
        except LedgerUnavailableError as exc:
            raise ApplicationError(
                f"not sent: {exc}", type=ERR_LEDGER_UNAVAILABLE, non_retryable=True
            ) from exc

    def _claim_needed(self, tool_input: ToolCallInput) -> str | None:
        """The execution to claim this run's run id for, or None when this worker already saw the
        claim hold (or the run predates claims). Refuses a run id keys cannot be built from."""
        try:
            check_run_id(tool_input.run_id)
        except InvalidRunIdError as exc:
            raise ApplicationError(str(exc), type=ERR_INVALID_RUN_ID, non_retryable=True) from exc
        execution = tool_input.first_execution_run_id
        if execution is None or (tool_input.run_id, execution) in self._claimed:
            return None
        return execution

    def _remember_claim(self, tool_input: ToolCallInput) -> None:
        execution = tool_input.first_execution_run_id
        if execution is None:
            return
        if len(self._claimed) >= _CLAIMS_REMEMBERED:
            self._claimed.clear()
        self._claimed.add((tool_input.run_id, execution))

    async def _send(
        self, tool: Tool, arguments: dict[str, Any], context: ToolContext, owner: str
    ) -> OwnerOutcome:
        return await send_once(
            lambda: tool.invoke(arguments, context),
            tool_name=tool.name,
            timeout=tool.effect.timeout.total_seconds(),
            context=context,
            owner=owner,
        )
