"""Compound rules of the ledger's state machine (tests/test_ledger_properties.py): the dangerous paths
taken as one step, each in a run of its own, so a bounded number of examples reaches them.

Random single steps reach a twin of a settled call, or a retry after an acknowledged conflict, only
after several steps in one order; within the default budget they rarely did. Each rule here drives
one such sequence from the start (a fresh run, so nothing else decides the verdict), checks the
ledger's answer against the rule right there, and leaves its calls live for the single-step rules
and the general invariants (checked after every step, as for any other rule).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from onceflow.ledger import (
    AlreadySettledError,
    CallIdentity,
    EventSource,
    FailureKind,
    Ledger,
    ResendInFlightError,
    Reservation,
    ReserveResult,
    SideEffect,
    Status,
)
from tests.support import ledger_invariants as inv

LONG = timedelta(hours=1)
RESEND_LONG = timedelta(minutes=5)
EVIDENCE = inv.EVIDENCE

# What a call's twin finds it as: the state the first call is driven to before the twin is reserved.
TWIN_STATES = ("started", "indeterminate", "completed", "failed", "conflict")


def twin_verdict(state: str, heard: bool) -> Reservation:
    """The intent rule for a twin reserved with `hold` in a run with one other call of its payload: a
    twin the model heard settled is another effect (sent); one it did not hear is the same intent
    (reused if completed); an unsettled twin, or one failed with an open conflict, holds it."""
    if state in ("started", "indeterminate", "conflict"):
        return Reservation.HELD
    if state == "completed":
        return Reservation.NEW if heard else Reservation.REUSED
    return Reservation.NEW  # failed without effect: nothing to repeat


class CompoundRules:
    """Mixed into the state machine, which supplies the helpers below."""

    pools: list[Ledger]
    model: inv.Model
    guarded_calls: dict[str, tuple[str, str, int]]
    scenarios: int

    def run(self, coro: Any) -> Any:
        raise NotImplementedError

    def pool(self, index: int) -> Ledger:
        raise NotImplementedError

    def guarded(
        self,
        run_id: str,
        call: str,
        amount: int,
        *,
        intent: str,
        heard: frozenset[str],
        exclusive: bool,
        budget: bool,
        owner: str,
        lease: timedelta,
        via: int,
    ) -> ReserveResult | None:
        raise NotImplementedError

    def purge(self) -> None:
        raise NotImplementedError

    def read_budget(self, via: int) -> None:
        raise NotImplementedError

    def scenario_run(self) -> str:
        self.scenarios += 1
        return f"s{self.scenarios}"

    def hold(
        self, run_id: str, call: str, heard: frozenset[str] = frozenset(), budget: bool = False
    ) -> ReserveResult | None:
        """A guarded call with `hold`, a long lease and no entity slot; budget 1 if `budget`."""
        return self.guarded(
            run_id,
            call,
            1,
            intent="hold",
            heard=heard,
            exclusive=False,
            budget=budget,
            owner="w1",
            lease=LONG,
            via=0,
        )

    def into_conflict(self, key: str, kind: FailureKind) -> None:
        """The owner reports a failure, then a reconciler's late report says it took effect."""
        self.run(self.pools[0].fail(key, owner="w1", kind=kind, error=kind.value))
        record = self.run(
            self.pools[1].record_late_outcome(key, actor="reconciler:hook", status=Status.COMPLETED)
        )
        assert record.has_conflict, f"a late completed report on failed {key} raised no conflict"

    # -- the intent rule, with and without `heard` ----------------------------------------------

    @rule(
        cases=st.lists(
            st.tuples(st.sampled_from(TWIN_STATES), st.booleans()), min_size=1, max_size=5, unique=True
        ),
        kind=st.sampled_from((FailureKind.NOT_ATTEMPTED, FailureKind.REJECTED)),
        release=st.booleans(),
    )
    def twin_of_a_call(self, cases: list[tuple[str, bool]], kind: FailureKind, release: bool) -> None:
        """For each case, in a run of its own: call c0 is driven to a state, then its twin c1 is
        reserved with `hold`, having heard c0 or not; the verdict must be the rule's. A held twin may
        then be released by an operator (it must be: it was never sent)."""
        for state, heard in cases:
            run_id = self.scenario_run()
            first = self.hold(run_id, "c0")
            assert first is not None and first.may_send, f"{run_id}:c0, the run's first call, was not sent"
            key = first.record.key
            if state == "completed":
                self.run(self.pools[0].complete(key, owner="w1", result={"id": key}))
            elif state == "failed":
                self.run(self.pools[0].fail(key, owner="w1", kind=kind, error=kind.value))
            elif state == "conflict":
                self.into_conflict(key, kind)
            elif state == "indeterminate":
                self.run(self.pools[0].mark_indeterminate(key, actor="inspector", reason="activity lost"))
            twin = self.hold(run_id, "c1", heard=frozenset({"c0"}) if heard else frozenset())
            assert twin is not None
            expected = twin_verdict(state, heard)
            assert twin.outcome is expected, (
                f"the twin {twin.record.key} of c0 ({state}, {'heard' if heard else 'not heard'}) was "
                f"{twin.outcome.value}, the intent rule says {expected.value}"
            )
            if release and twin.outcome is Reservation.HELD:
                released = self.run(
                    inv.attempt(
                        self.pools[2].release(twin.record.key, actor="operator:alice", reason="never sent")
                    )
                )
                assert not isinstance(released, Exception), f"releasing held {twin.record.key}: {released!r}"
                assert (released.status, released.failure_kind) == (Status.FAILED, FailureKind.RELEASED), (
                    f"released {twin.record.key} is {released.status} ({released.failure_kind})"
                )

    # -- an acknowledged conflict is final ------------------------------------------------------

    @rule(
        guarded=st.booleans(),
        kind=st.sampled_from((FailureKind.NOT_ATTEMPTED, FailureKind.REJECTED)),
        status=st.sampled_from((Status.FAILED, Status.COMPLETED, Status.COMPENSATED)),
        retries=st.integers(1, 2),
    )
    def conflict_acknowledged_then_retried(
        self, guarded: bool, kind: FailureKind, status: Status, retries: int
    ) -> None:
        """A call fails, a contradicting late report flags a conflict, an operator acknowledges it
        (failed, completed or compensated), then its key is reserved again: nothing may be sent."""
        run_id = self.scenario_run()
        first = self.hold(run_id, "c0") if guarded else self.plain(run_id)
        assert first is not None and first.may_send
        key = first.record.key
        self.into_conflict(key, kind)
        self.run(
            self.pools[2].acknowledge_conflict(
                key, actor="operator:bob", status=status, reason="looked at the other side", evidence=EVIDENCE
            )
        )
        for _ in range(retries):
            again = self.hold(run_id, "c0") if guarded else self.plain(run_id)
            assert again is not None and not again.may_send, (
                f"{key}, acknowledged {status.value} after a conflict, was handed out again ({again and again.outcome})"
            )
            assert again.record.status is status, (
                f"{key} acknowledged {status.value} is now {again.record.status}"
            )

    def plain(self, run_id: str) -> ReserveResult:
        identity = CallIdentity(tenant="t1", run_id=run_id, tool_call_id="c0")
        result: ReserveResult = self.run(
            self.pools[0].reserve(
                identity,
                tool_name="send_note",
                side_effect=SideEffect.EXTERNAL,
                arguments={"to": "ops"},
                owner="w1",
                lease=LONG,
            )
        )
        self.model.live.add(result.record.key)
        return result

    # -- a resend's lease -----------------------------------------------------------------------

    @rule(
        status=st.sampled_from((Status.COMPLETED, Status.FAILED)),
        answered_first=st.booleans(),
        operators=st.integers(1, 2),
    )
    def resend_then_operator(self, status: Status, answered_first: bool, operators: int) -> None:
        """An unknown call is resent (5 min lease); an operator (or two) settle it meanwhile: refused
        while the resend is on the wire, told who settled it once its answer came back."""
        run_id = self.scenario_run()
        first = self.hold(run_id, "c0")
        assert first is not None and first.may_send
        key = first.record.key
        self.run(self.pools[0].mark_indeterminate(key, actor="inspector", reason="activity lost"))
        resend = self.run(self.pools[1].begin_resend(key, window=timedelta(hours=24), lead=RESEND_LONG))
        assert resend.allowed, f"a resend of {key} inside its window was refused: {resend.reason}"
        answer = inv.settlement("reconciler", status, key)
        if answered_first:
            self.run(self.pools[1].settle(key, **answer, source=EventSource.RECONCILER))
        for who in ("operator:alice", "operator:bob")[:operators]:
            out = self.run(inv.attempt(self.pools[2].settle(key, **inv.settlement(who, Status.FAILED, key))))
            wanted = AlreadySettledError if answered_first else ResendInFlightError
            assert isinstance(out, wanted), f"{who} settling {key} with a resend on the wire got {out!r}"
        if not answered_first:
            self.run(self.pools[1].settle(key, **answer, source=EventSource.RECONCILER))

    # -- what purged calls drew -----------------------------------------------------------------

    @rule(via=st.integers(0, 2))
    def spend_then_purge(self, via: int) -> None:
        """A call draws 1 on the budget and completes; retention purges it; the budget still counts it."""
        result = self.hold(self.scenario_run(), "c0", budget=True)
        if result is not None and result.may_send:
            key = result.record.key
            self.run(self.pools[0].complete(key, owner="w1", result={"id": key}))
        self.purge()
        self.read_budget(via)
