"""Running tools. Reads retry under Temporal's policy; writes go through the ledger, once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from decimal import Decimal
from typing import Any, Literal

from temporalio import activity
from temporalio.exceptions import ApplicationError

from onceflow import metrics
from onceflow.activities.conflicts import tell_run_of_conflict
from onceflow.activities.held import wake_held
from onceflow.activities.outcomes import outcome_from_record, owner_token
from onceflow.ledger import (
    CallIdentity,
    EventSource,
    FailureKind,
    GuardArgumentError,
    Ledger,
    LedgerUnavailableError,
    OutcomeIgnoredError,
    PayloadMismatchError,
    Status,
    TenantMismatchError,
    ToolExecutionRecord,
)
from onceflow.ledger.canonical import strict_loads, uncarried
from onceflow.ledger.guarded import decided_again
from onceflow.ledger.run_ids import RunIds, RunIdTakenError
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import (
    ACTIVITY_MARGIN,
    ERR_BUDGET_LIMIT_UNAVAILABLE,
    ERR_INVALID_RUN_ID,
    ERR_LEDGER_UNAVAILABLE,
    ERR_NOT_A_READ,
    ERR_OUTCOME_NOT_RECORDED,
    ERR_PAYLOAD_MISMATCH,
    ERR_RUN_ID_TAKEN,
    ERR_TENANT_MISMATCH,
)
from onceflow.sdk.keys import InvalidRunIdError, call_key, check_run_id, limit_read_key
from onceflow.sdk.payloads import OwnerOutcome, ToolCall, ToolCallInput, ToolOutcome, result_problem
from onceflow.sdk.tools import (
    Guards,
    InvalidToolArgumentsError,
    Tool,
    ToolContext,
    ToolKeyNotFoundError,
    ToolNotAttemptedError,
    ToolRefusedError,
    ToolRejectedError,
    as_amount,
    to_jsonable,
)


def _context(tool_input: ToolCallInput, attempt: int) -> ToolContext:
    key = call_key(tool_input.run_id, tool_input.call.id)
    return ToolContext(
        idempotency_key=key,
        run_id=tool_input.run_id,
        tool_call_id=tool_input.call.id,
        tenant=tool_input.tenant,
        attempt=attempt,
        logger=activity.logger,
    )


async def record_outcome(ledger: Ledger, outcome: OwnerOutcome) -> ToolOutcome:
    """Write the owner's outcome down; the ledger's answer (not ours) is what comes back."""
    try:
        if outcome.status == "completed":
            record = await ledger.complete(
                outcome.key,
                owner=outcome.owner,
                result=outcome.value,
                result_reference=outcome.result_reference,
            )
        elif outcome.status == "failed":
            assert outcome.failure_kind is not None
            record = await ledger.fail(
                outcome.key,
                owner=outcome.owner,
                kind=outcome.failure_kind,
                error=outcome.error or "",
            )
        else:
            record = await ledger.mark_indeterminate(
                outcome.key,
                actor=outcome.owner,
                reason=outcome.error or "outcome unknown",
                source=EventSource.OWNER,
            )
    except OutcomeIgnoredError:
        # Someone settled the call before our answer arrived; the ledger keeps theirs. If ours
        # contradicts it, the ledger flagged a conflict, and the run's search attributes say so.
        record = await ledger.get(outcome.key, with_events=False)
        if record.has_conflict:
            await tell_run_of_conflict(record)
    await wake_held(ledger, record)
    return outcome_from_record(record)


def _oversized(value: Any, cap: int) -> str | None:
    """Why `value` is too large to hand to the model, or None when it fits."""
    size = len(json.dumps(to_jsonable(value), separators=(",", ":")).encode())
    if size <= cap:
        return None
    return (
        f"the tool's result is {size} bytes, over this agent's cap of {cap} bytes "
        "(tool_policy.max_result_bytes); it was not kept. Ask for less (a narrower query, fewer fields)."
    )


def _checked_arguments(tool: Tool, call: ToolCall) -> dict[str, Any]:
    """The call's arguments, validated; InvalidToolArgumentsError if the model sent something else."""
    return _split_arguments(tool, call)[0]


def _split_arguments(tool: Tool, call: ToolCall) -> tuple[dict[str, Any], str | None]:
    """The call's own arguments, validated, and the tool call id it says it replaces (if any)."""
    if call.invalid_arguments is not None:
        raise InvalidToolArgumentsError(tool.name, [_not_an_object(call.invalid_arguments)])
    arguments, replaces = tool.split_replaces(call.arguments)
    valid = tool.validate_arguments(arguments)
    # What canonical JSON cannot carry (an integer beyond 2^53, say) could not be reserved: the
    # model hears it as an invalid argument and may correct itself; the run goes on.
    problem = uncarried(valid)
    if problem is not None:
        raise InvalidToolArgumentsError(tool.name, [problem])
    return valid, replaces


def _not_an_object(sent: str) -> str:
    try:
        strict_loads(sent)
    except ValueError as exc:
        if "JSON number" in str(exc) or "infinity" in str(exc):
            return f"arguments must be a JSON object of finite numbers ({exc}), got {sent[:200]!r}"
    return f"arguments must be a JSON object, got {sent[:200]!r}"


def unkeepable_result(problem: str) -> str:
    """What the model is told when a tool's answer cannot be kept (see `result_problem`)."""
    return f"the tool's result cannot be kept or handed on: {problem}"


_CLAIMS_REMEMBERED = 10_000


class BudgetLimitUnavailableError(Exception):
    """The read tool that gives a budget's limit failed or answered something else: nothing sent.
    For a new call the model is told; a recorded one is asked about again (ERR_BUDGET_LIMIT_UNAVAILABLE)."""

    def __init__(self, tool: str, reader: str, problem: str) -> None:
        super().__init__(
            f"{tool} was not sent: its budget limit comes from {reader}, which failed ({problem[:300]}); "
            "try again later"
        )


def _limit_arguments(declared: Guards, arguments: dict[str, Any]) -> dict[str, Any]:
    """What a `limit_from` read tool is asked with: the entity, and the currency when declared."""
    assert declared.entity is not None
    asked = {declared.entity: arguments[declared.entity]}
    if declared.currency is not None:
        asked[declared.currency] = arguments.get(declared.currency)
    return asked


def _refused(call: ToolCall, error: Exception, kind: FailureKind | None = None) -> ToolOutcome:
    """A call that never reached the ledger or the world: the model is told why (and, for a
    refusal on policy grounds, that it is final)."""
    return ToolOutcome(
        tool_call_id=call.id, tool=call.name, key=None, status="error", error=str(error), failure_kind=kind
    )


class ToolActivities:
    def __init__(self, ledger: Ledger, registry: AgentRegistry, worker_identity: str) -> None:
        self.ledger = ledger
        self.registry = registry
        self.worker_identity = worker_identity
        self.run_ids = RunIds(ledger)
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
            arguments = _checked_arguments(tool, call)
        except InvalidToolArgumentsError as exc:
            return _refused(call, exc)
        context = _context(tool_input, activity.info().attempt)
        try:
            value = await asyncio.wait_for(
                tool.invoke(arguments, context), tool.effect.timeout.total_seconds()
            )
        except (ToolNotAttemptedError, ToolRejectedError) as exc:
            return _refused(call, exc)
        except ToolRefusedError as exc:
            return _refused(call, exc, FailureKind.POLICY_REFUSED)
        unkeepable = result_problem(value)
        if unkeepable is not None:
            # A read changed nothing: the model is told, and nothing pretends to be its answer.
            return _refused(call, ValueError(unkeepable_result(unkeepable)))
        too_large = _oversized(value, self._result_cap(tool_input))
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
        # First of all, before the ledger or any limit read is asked: is this run's run id its own?
        await self._claim_run_id(tool_input)
        try:
            arguments, replaces = _split_arguments(tool, call)
        except InvalidToolArgumentsError as exc:
            return _refused(call, exc)  # nothing reserved, nothing sent: the model is told
        # The ledger before the budget's `limit_from` read (the only thing read before it): a call
        # asked again (a held call woken, an approval, a reset replaying the key) is answered by its
        # row, and a failed read never turns into a refusal of it.
        key = call_key(tool_input.run_id, call.id)
        recorded = await self._recorded(key) if tool.guards.limit_from is not None else None
        try:
            limit = await self._budget_limit(tool_input, tool, arguments, recorded)
        except BudgetLimitUnavailableError as exc:
            if recorded is None and await self._recorded(key) is None:  # not even just now
                return _refused(call, exc)  # nothing reserved, nothing sent: the model may try again
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
            return _refused(call, exc)
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
            )
        except GuardArgumentError as exc:
            return _refused(call, exc)
        except LedgerUnavailableError as exc:
            raise ApplicationError(
                f"not sent: {exc}", type=ERR_LEDGER_UNAVAILABLE, non_retryable=True
            ) from exc
        except PayloadMismatchError as exc:
            raise ApplicationError(str(exc), type=ERR_PAYLOAD_MISMATCH, non_retryable=True) from exc
        except TenantMismatchError as exc:
            raise ApplicationError(str(exc), type=ERR_TENANT_MISMATCH, non_retryable=True) from exc
        if not reservation.may_send:
            return outcome_from_record(
                reservation.record, replayed=reservation.record.status is Status.COMPLETED
            )
        context = _context(tool_input, reservation.record.attempt)
        outcome = await self._send(tool, arguments, context, owner)
        metrics.record_send(tool.name, outcome.status)
        too_large = outcome.status == "completed" and _oversized(outcome.value, self._result_cap(tool_input))
        if too_large:
            # It took effect; only the answer is dropped. The ledger and the model say so.
            outcome = outcome.model_copy(update={"value": {"result_omitted": too_large}})
        try:
            return await record_outcome(self.ledger, outcome)
        except LedgerUnavailableError as exc:
            # The effect may have happened and we know how it ended; hand the outcome to the
            # workflow, which records it with a retrying ledger step.
            raise ApplicationError(
                f"outcome not recorded: {exc}",
                outcome.model_dump(mode="json"),
                type=ERR_OUTCOME_NOT_RECORDED,
                non_retryable=True,
            ) from exc

    async def _recorded(self, key: str) -> ToolExecutionRecord | None:
        try:
            return await self.ledger.find(key)
        except LedgerUnavailableError as exc:
            raise ApplicationError(
                f"not sent: {exc}", type=ERR_LEDGER_UNAVAILABLE, non_retryable=True
            ) from exc

    async def _claim_run_id(self, tool_input: ToolCallInput) -> None:
        """Before anything is reserved: the run id must be one keys can be built from, and this run's
        (claimed by its first write; refused to any other run forever, ledger/run_ids.py)."""
        try:
            check_run_id(tool_input.run_id)
        except InvalidRunIdError as exc:
            raise ApplicationError(str(exc), type=ERR_INVALID_RUN_ID, non_retryable=True) from exc
        execution = tool_input.first_execution_run_id
        if execution is None or (tool_input.run_id, execution) in self._claimed:
            return
        try:
            await self.run_ids.claim(
                tool_input.run_id, execution=execution, tenant=tool_input.tenant, agent=tool_input.agent
            )
        except RunIdTakenError as exc:
            raise ApplicationError(str(exc), type=ERR_RUN_ID_TAKEN, non_retryable=True) from exc
        except LedgerUnavailableError as exc:
            raise ApplicationError(
                f"not sent: {exc}", type=ERR_LEDGER_UNAVAILABLE, non_retryable=True
            ) from exc
        if len(self._claimed) >= _CLAIMS_REMEMBERED:
            self._claimed.clear()
        self._claimed.add((tool_input.run_id, execution))

    async def _budget_limit(
        self,
        tool_input: ToolCallInput,
        tool: Tool,
        arguments: dict[str, Any],
        recorded: ToolExecutionRecord | None,
    ) -> Decimal | None:
        """The entity's limit, read from the tool's `limit_from` read tool, when it declares one.

        A recorded call that the guards will not decide again (approved, in flight, settled) keeps
        the limit it was reserved under: nothing is read for it.
        """
        declared = tool.guards
        if declared.limit_from is None or declared.entity is None:
            return None
        if recorded is not None and recorded.budget_limit is not None and not decided_again(recorded):
            return recorded.budget_limit
        reader = self.registry.tool(tool_input.agent, declared.limit_from)
        write_key = call_key(tool_input.run_id, tool_input.call.id)
        # The read's own key, the write's beside it: a cache keyed on the key alone must not answer
        # the write with this read's answer (onceflow/mcp/meta.py).
        context = replace(
            _context(tool_input, 1), idempotency_key=limit_read_key(write_key), for_key=write_key
        )
        try:
            value = await asyncio.wait_for(
                reader.invoke(_limit_arguments(declared, arguments), context),
                reader.effect.timeout.total_seconds(),
            )
        except Exception as exc:  # any failure: nothing is reserved, and the model is told
            raise BudgetLimitUnavailableError(tool.name, reader.name, f"{type(exc).__name__}: {exc}") from exc
        limit = as_amount(value.get("limit") if isinstance(value, dict) else value)
        if limit is None:
            raise BudgetLimitUnavailableError(tool.name, reader.name, f"returned {value!r}, not a limit")
        return limit

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


async def send_once(
    invoke: Callable[[], Awaitable[Any]], *, tool_name: str, timeout: float, context: ToolContext, owner: str
) -> OwnerOutcome:
    """Call the world once, under `timeout`, and say how it ended: completed, failed or unknown."""

    def outcome(status: Literal["completed", "failed", "indeterminate"], **fields: Any) -> OwnerOutcome:
        return OwnerOutcome(
            key=context.idempotency_key,
            owner=owner,
            tool=tool_name,
            tool_call_id=context.tool_call_id,
            status=status,
            **fields,
        )

    try:
        value = await asyncio.wait_for(invoke(), timeout)
    except ToolNotAttemptedError as exc:
        return outcome("failed", failure_kind=FailureKind.NOT_ATTEMPTED, error=str(exc) or "not attempted")
    except ToolKeyNotFoundError as exc:
        return outcome(
            "failed",
            failure_kind=FailureKind.REJECTED,
            error=str(exc) or "no record of the key",
            no_record_of_key=True,
        )
    except ToolRejectedError as exc:
        return outcome("failed", failure_kind=FailureKind.REJECTED, error=str(exc) or "rejected")
    except ToolRefusedError as exc:  # final: the ledger never re-reserves the key
        return outcome("failed", failure_kind=FailureKind.POLICY_REFUSED, error=str(exc) or "refused")
    except TimeoutError:
        return outcome("indeterminate", error=f"no answer within {timeout:g}s")
    except Exception as exc:  # an unknown error after the request may have left is unknown
        activity.logger.warning("tool %s raised %r; outcome unknown", tool_name, exc)
        return outcome("indeterminate", error=f"{type(exc).__name__}: {exc}"[:2000])
    unkeepable = result_problem(value)
    if unkeepable is not None:
        # It took effect; only its answer cannot be stored (jsonb has no NaN) nor passed on as
        # JSON. The completion is recorded, the answer is not, and the ledger and the model say so.
        return outcome("completed", value={"result_omitted": unkeepable_result(unkeepable)})
    return outcome("completed", value=to_jsonable(value))
