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
    Heard,
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
        heard: int | tuple[Heard, ...],
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
        self, run_id: str, call: str, heard: tuple[Heard, ...] = (), budget: bool = False
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
            # What the model was told of c0, if it heard it (a conflict: "failed", as its owner said).
            told = self.run(self.pools[0].get(key, with_events=False))
            as_told = Heard(tool_call_id="c0", status=told.status, settled_at=told.settled_at)
            twin = self.hold(run_id, "c1", heard=(as_told,) if heard and told.status.is_settled else ())
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

    # -- what the model was told, and what became of it since ------------------------------------

    def tell(self, key: str) -> Heard:
        """Put a settled call's outcome in its run's conversation, as the workflow does."""
        record = self.run(self.pools[0].get(key, with_events=False))
        assert record.status.is_settled, f"{key} is not settled: nothing to tell"
        told = Heard(tool_call_id=record.tool_call_id, status=record.status, settled_at=record.settled_at)
        self.model.told.setdefault(record.run_id, {})[record.tool_call_id] = told
        return told

    @rule(status=st.sampled_from((Status.COMPLETED, Status.FAILED, Status.COMPENSATED)))
    def conflict_acknowledged_after_the_model_heard(self, status: Status) -> None:
        """c0 fails and the model is told so; a late report says it completed (a conflict); the model
        asks again (c1, having heard "failed"): held. An operator acknowledges c0 as `status`; c1 is
        asked again. Only if c0 still stands as the model heard it ("failed") may c1 be sent."""
        run_id = self.scenario_run()
        first = self.hold(run_id, "c0")
        assert first is not None and first.may_send
        key = first.record.key
        self.run(self.pools[0].fail(key, owner="w1", kind=FailureKind.NOT_ATTEMPTED, error="503"))
        heard = (self.tell(key),)
        self.run(self.pools[1].record_late_outcome(key, actor="reconciler:hook", status=Status.COMPLETED))
        held = self.hold(run_id, "c1", heard=heard)
        assert held is not None and held.outcome is Reservation.HELD, (
            f"{run_id}:c1 was {held and held.outcome}"
        )
        self.run(
            self.pools[2].acknowledge_conflict(
                key, actor="operator:bob", status=status, reason="looked at the other side", evidence=EVIDENCE
            )
        )
        self.hold(run_id, "c1", heard=heard)  # woken: the invariants judge what it did

    @rule(heard_the_reuse=st.booleans())
    def reuse_after_the_effect_was_undone(self, heard_the_reuse: bool) -> None:
        """c0 completes; c1 (the same answer, not heard) is given its result; an operator undoes c0.
        c2 asks again, having heard nothing or only c1: it must not be told c0's effect stands."""
        run_id = self.scenario_run()
        first = self.hold(run_id, "c0")
        assert first is not None and first.may_send
        key = first.record.key
        self.run(self.pools[0].complete(key, owner="w1", result={"id": key}))
        reused = self.hold(run_id, "c1")
        assert reused is not None and reused.outcome is Reservation.REUSED
        heard = (self.tell(reused.record.key),) if heard_the_reuse else ()
        self.run(self.pools[2].mark_compensated(key, actor="operator:alice", reason="undone"))
        self.hold(run_id, "c2", heard=heard)  # check_reused and the invariants judge the answer

    @rule(after=st.integers(1, 2), one_answer=st.booleans())
    def reissues_after_a_reset(self, after: int, one_answer: bool) -> None:
        """c0 completes, the model hears it, c1 (having heard c0) completes: two effects. A reset
        empties the conversation; the model re-issues them, in one answer (none hears another) or one
        after the other (each having heard those before it): each is given one effect, never one
        twice while another stands unclaimed (check_reused)."""
        run_id = self.scenario_run()
        heard: tuple[Heard, ...] = ()
        for call in ("c0", "c1"):
            sent = self.hold(run_id, call, heard=heard)
            assert sent is not None and sent.may_send, f"{run_id}:{call} was {sent and sent.outcome}"
            self.run(self.pools[0].complete(sent.record.key, owner="w1", result={"id": call}))
            heard = (*heard, self.tell(sent.record.key))
        self.model.told.pop(run_id, None)  # the reset
        heard = ()
        for call in ("r0", "r1", "r2")[: after + 1]:
            again = self.hold(run_id, call, heard=heard)
            assert again is not None
            if again.record.status.is_settled and not one_answer:
                heard = (*heard, self.tell(again.record.key))

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
