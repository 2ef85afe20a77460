"""The signals and the update through which a run's write calls are settled, shared by every workflow
that runs writes through onceflow's protocol: AgentRunWorkflow, and workflows of other agent
frameworks that adopt it (onceflow/adapters/).

Signals: `resolve(ResolveSignal)`: settle an unknown call (compare-and-set in the ledger) or just
    re-read it; the run acts only on the ledger's answer. `escalated(EscalatedSignal)`.
    `conflict(ConflictSignal)`: a late outcome contradicted a decision (OnceflowConflictKeys).
Updates: `resolve(ResolveSignal) -> SettleResult`: the same, but the caller gets the ledger's answer
    back (won, or who decided first); a validator refuses bad input before it enters history.
Temporal finds these handlers on a workflow class through its base classes, so a subclass gains
them all by inheriting.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from onceflow.ledger.status import Status
    from onceflow.runtime.constants import CONFLICT_KEYS
    from onceflow.sdk.payloads import ConflictSignal, EscalatedSignal, ResolveSignal, SettleResult

from onceflow.workflows.write_calls import WriteCalls


class WriteCallHandlers(WriteCalls):
    """WriteCalls with the handlers an operator, a reconciler and the ledger reach a run through."""

    def __init__(self) -> None:
        super().__init__()
        self._conflicts: set[str] = set()

    @workflow.signal
    async def resolve(self, signal: ResolveSignal) -> None:
        # Kept until the call's wait consumes it, so a decision that lands before the run starts
        # waiting is not lost: the run then asks the ledger once more.
        self._nudged.add(signal.key)
        pending = self._pending.get(signal.key)
        if pending is not None and pending.status in (Status.AWAITING_APPROVAL, Status.HELD):
            return  # an approval, a denial, or a nudge: the waiting call asks the ledger itself
        if signal.key not in self._calls_by_key():
            self._last_resolve_error = f"{signal.key!r} is not a write call of this run"
            workflow.logger.warning(self._last_resolve_error)
            return
        try:
            await self._settle(signal, source="signal")
        except ActivityError as err:
            self._last_resolve_error = str(err.cause or err)
            workflow.logger.warning("resolve of %s refused: %s", signal.key, self._last_resolve_error)

    @workflow.update(name="resolve")
    async def resolve_update(self, request: ResolveSignal) -> SettleResult:
        """Like the signal, but answers: the ledger's outcome, and `refused` naming who decided first."""
        self._nudged.add(request.key)
        try:
            return await self._settle(request, source="update")
        except ActivityError as err:
            raise ApplicationError(str(err.cause or err), type="ResolveRefused") from err

    @resolve_update.validator
    def _validate_resolve(self, request: ResolveSignal) -> None:
        if request.key not in self._calls_by_key():
            raise ValueError(f"{request.key!r} is not a write call of this run")
        if request.status is not None and not (request.reason or "").strip():
            raise ValueError("a resolve that settles a call needs a reason")
        if not request.actor.strip():
            raise ValueError("a resolve needs an actor")
        pending = self._pending.get(request.key)
        if request.status is not None and pending is not None and pending.status == Status.AWAITING_APPROVAL:
            raise ValueError(f"{request.key} waits for approval: approve or deny it through the operator API")
        if request.status is not None and pending is not None and pending.status == Status.HELD:
            raise ValueError(f"{request.key} is held by a guard and was not sent: there is nothing to settle")

    @workflow.signal
    def escalated(self, signal: EscalatedSignal) -> None:
        """An unknown call of this run passed its reconcile deadline and was escalated."""
        if self._attributes_follow_ledger and signal.key not in self._pending:
            return  # settled meanwhile: nobody needs to be paged about it any more
        self._escalated[signal.key] = signal.owner
        self._publish_escalations()

    @workflow.signal
    def conflict(self, signal: ConflictSignal) -> None:
        """A late outcome contradicted the decision on one of this run's calls, or an operator
        acknowledged one. The ledger's flag is the truth; this keeps OnceflowConflictKeys in step."""
        if signal.open:
            self._conflicts.add(signal.key)
        else:
            self._conflicts.discard(signal.key)
        keys = sorted(self._conflicts)
        workflow.upsert_search_attributes(
            [CONFLICT_KEYS.value_set(keys) if keys else CONFLICT_KEYS.value_unset()]
        )
