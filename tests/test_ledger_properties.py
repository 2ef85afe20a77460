"""Interleavings explored, not only examples: a Hypothesis state machine drives the real ledger.

Each example gets a fresh database (a copy of the migrated template) and three `Ledger` pools that
act as workers, reconcilers and operators. Rules reserve (plain and guarded), report outcomes (by the
owner, a former owner, a stranger), mark calls indeterminate, settle (one operator, or two racing),
re-send, flag conflicts, acknowledge them, approve, deny, release, purge and read budgets. After every
step the invariants of tests/support/ledger_invariants.py are checked against the ledger's own tables;
at the end of each example every call still open is driven out by the decision someone may make.

The ledger is async and pytest-asyncio runs async tests in one session loop, while Hypothesis drives
rules synchronously. So the test itself is synchronous: each example's coroutines run on an event
loop of their own in a thread (`LoopThread`), and the pools live there. The session loop is used only
by the `template_dsn` fixture, before the first example.

The operators' and the reconciler's decisions are rules mixed in from
tests/support/ledger_operator_rules.py, the compound rules from tests/support/ledger_scenarios.py.

Bounded in the default suite; `make properties` runs many more examples (the `properties` marker and
the Hypothesis profile `ONCEFLOW_PROPERTIES=long`).
"""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from onceflow.ledger import (
    CallIdentity,
    FailureKind,
    Guard,
    Heard,
    Ledger,
    LedgerUnavailableError,
    OutcomeIgnoredError,
    PayloadMismatchError,
    Reservation,
    ReserveResult,
    SideEffect,
    Status,
    purge_settled,
)
from onceflow.ledger.run_ids import RunIdTakenError
from onceflow.local.postgres import create_database, drop_database
from onceflow.sdk.keys import call_key
from tests.conftest import TEMPLATE
from tests.support import ledger_invariants as inv
from tests.support.ledger_operator_rules import OperatorRules
from tests.support.ledger_scenarios import CompoundRules
from tests.support.loop_thread import LoopThread
from tests.support.pg_proxy import AnswerDroppingProxy

LIMIT = inv.LIMIT
GUARDED_TOOL, PLAIN_TOOL = inv.GUARDED_TOOL, "send_note"
CALL_IDS = ("c0", "c1", "c2", "c3", "c4", "c5")
WORKERS = ("w1", "w2", "w3")
SHORT, LONG = timedelta(milliseconds=1), timedelta(hours=1)

# How a guarded call is reserved: the intent rule, what the model had heard (a choice among what the
# test told it of its run: bit i picks the i-th told call), entity and budget.
GUARDS = st.fixed_dictionaries(
    {
        "intent": st.sampled_from(("hold", "hold", "reuse", "allow")),
        "heard": st.integers(0, 63),
        "exclusive": st.booleans(),
        "budget": st.booleans(),
        "owner": st.sampled_from(WORKERS),
        "lease": st.sampled_from((SHORT, LONG)),
        "via": st.integers(0, 2),
    }
)

settings.register_profile(
    "default-properties",
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "long-properties",
    max_examples=int(os.environ.get("ONCEFLOW_PROPERTIES_EXAMPLES", "400")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _profile() -> settings:
    name = "long" if os.environ.get("ONCEFLOW_PROPERTIES") == "long" else "default"
    return settings.get_profile(f"{name}-properties")


class LedgerMachine(CompoundRules, OperatorRules, RuleBasedStateMachine):
    loop: LoopThread
    admin_dsn: str

    def __init__(self) -> None:
        super().__init__()
        self.name = f"onceflow_prop_{uuid.uuid4().hex[:12]}"
        self.dsn = self.run(create_database(self.admin_dsn, self.name, template=TEMPLATE))
        # Workers, reconcilers, operators: each picks one of three pools of its own.
        self.pools: list[Ledger] = [self.run(Ledger.connect(self.dsn, max_size=3)) for _ in range(3)]
        self.model = inv.Model()
        self.runs = ["r0", "r1"]
        self.plain_runs = ["p0"]
        self.fresh = 2
        self.scenarios = 0  # runs of the compound rules (tests/support/ledger_scenarios.py)
        self.guarded_calls: dict[str, tuple[str, str, int]] = {}  # key: (run, tool call id, amount)

    def run(self, coro: Any) -> Any:
        return self.loop.run(coro)

    def pool(self, index: int) -> Ledger:
        return self.pools[index % len(self.pools)]

    def live_keys(self) -> list[str]:
        return sorted(self.model.live)

    def pick_guarded(self, index: int) -> str | None:
        """A guarded call's key when there is one (where the intent and budget rules bite)."""
        calls = sorted(k for k in self.model.live if k in self.guarded_calls)
        return calls[index % len(calls)] if calls else self.pick(index)

    def pick(self, index: int) -> str | None:
        """A reserved call's key, or None before any: the rule then does nothing. No preconditions on
        the ledger's state, so what Hypothesis draws never depends on it (replays stay faithful)."""
        keys = self.live_keys()
        return keys[index % len(keys)] if keys else None

    # -- reserving -------------------------------------------------------------------------------

    @rule(
        run=st.integers(0, 3),
        call=st.sampled_from(("p0", "p1")),
        approval=st.booleans(),
        owner=st.sampled_from(WORKERS),
        lease=st.sampled_from((SHORT, LONG)),
        via=st.integers(0, 2),
    )
    def reserve_plain(
        self, run: int, call: str, approval: bool, owner: str, lease: timedelta, via: int
    ) -> None:
        identity = CallIdentity(
            tenant="t1", run_id=self.plain_runs[run % len(self.plain_runs)], tool_call_id=call
        )
        result = self.run(
            self.pool(via).reserve(
                identity,
                tool_name=PLAIN_TOOL,
                side_effect=SideEffect.EXTERNAL,
                arguments={"to": "ops"},
                owner=owner,
                approval=approval,
                lease=lease,
            )
        )
        self.model.live.add(result.record.key)

    @rule(
        run=st.sampled_from((0, 0, 0, 1)),
        call=st.sampled_from(CALL_IDS),
        amount=st.sampled_from((1, 2)),
        how=GUARDS,
    )
    def reserve_guarded(self, run: int, call: str, amount: int, how: dict[str, Any]) -> None:
        self.guarded(self.runs[run], call, amount, **how)

    @rule(index=st.integers(0, 50), how=GUARDS)
    def retry_guarded(self, index: int, how: dict[str, Any]) -> None:
        """A call's key reserved again (a retry, a reset), with its own payload."""
        calls = sorted(k for k in self.model.live if k in self.guarded_calls)
        if calls:
            self.guarded(*self.guarded_calls[calls[index % len(calls)]], **how)

    @rule(index=st.integers(0, 50), call=st.sampled_from(CALL_IDS), how=GUARDS)
    def twin_guarded(self, index: int, call: str, how: dict[str, Any]) -> None:
        """Another call of a run with the same payload as one of its calls: a twin."""
        calls = sorted(k for k in self.model.live if k in self.guarded_calls)
        if calls:
            run_id, _, amount = self.guarded_calls[calls[index % len(calls)]]
            self.guarded(run_id, call, amount, **how)

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
        execution: str | None = None,
        unsent_owners: tuple[str, ...] = (),
        ledger: Ledger | None = None,
    ) -> ReserveResult | None:
        """Reserve a guarded call as a workflow would: with what the model was told of its run (a
        mask over the test's own record, or the calls given), the run's first execution, and the
        owners of attempts whose answer was lost. The test keeps how it was asked."""
        told = self.heard_from(run_id, heard)
        guard = Guard(
            intent=intent,  # type: ignore[arg-type]
            heard=frozenset(told),
            entity=inv.ENTITY,
            exclusive=exclusive,
            amount=Decimal(amount) if budget else None,
            limit=LIMIT if budget else None,
            toolset=inv.TOOLSET,
        )
        identity = CallIdentity(tenant="t1", run_id=run_id, tool_call_id=call)
        try:
            result = self.run(
                (ledger or self.pool(via)).reserve(
                    identity,
                    tool_name=GUARDED_TOOL,
                    side_effect=SideEffect.EXTERNAL,
                    arguments={"account": inv.ENTITY, "amount": amount},
                    owner=owner,
                    lease=lease,
                    guard=guard,
                    execution=execution or self.execution(run_id),
                    unsent_owners=unsent_owners,
                )
            )
        except PayloadMismatchError:
            return None  # another amount under a recorded key: refused, nothing changed
        key = result.record.key
        self.model.live.add(key)
        self.guarded_calls.setdefault(key, (run_id, call, amount))
        twins = self.run(inv.twins_of(self.pools[0], result.record))
        if result.outcome is Reservation.REUSED and key not in self.model.reused:
            source = self.run(self.pools[0].find(result.record.reused_from or ""))
            inv.check_reused(result.record, source, told, intent, twins, self.model)
        if result.may_send:
            self.model.sent_with[key] = inv.Sent(intent=intent, heard=told, twins=twins)
            if budget:  # an admission: what the budget carries now is within the limit
                carried = self.run(inv.budget_carried(self.pools[0], self.model))
                assert carried <= LIMIT, f"admitting {key} drew the budget to {carried}"
        return result

    def heard_from(self, run_id: str, heard: int | tuple[Heard, ...]) -> tuple[Heard, ...]:
        if not isinstance(heard, int):
            return heard
        told = sorted(self.model.told.get(run_id, {}).values(), key=lambda h: h.tool_call_id)
        return tuple(h for i, h in enumerate(told) if heard >> i & 1)

    def execution(self, run_id: str) -> str:
        """The run's first execution: every write of the run claims the run id for it."""
        return f"{run_id}/e1"

    # -- the model's conversation ------------------------------------------------------------------

    @rule(index=st.integers(0, 50))
    def model_is_told(self, index: int) -> None:
        """The run puts a call's outcome in its conversation, as the workflow does once it is settled:
        the test keeps what the model was told (status and settlement), as it was then."""
        key = self.pick_guarded(index)
        if key is None or key not in self.guarded_calls:
            return
        record = self.run(self.pools[0].find(key))
        if record is not None and record.status.is_settled:
            told = Heard(tool_call_id=record.tool_call_id, status=record.status, settled_at=record.settled_at)
            self.model.told.setdefault(record.run_id, {})[record.tool_call_id] = told

    @rule(run=st.sampled_from((0, 1)))
    def reset_conversation(self, run: int) -> None:
        """A Temporal reset to before the run's writes: the model no longer knows of them, and asks
        again under new tool call ids (twin_guarded) or the same ones (retry_guarded)."""
        self.model.told.pop(self.runs[run], None)

    @rule(index=st.integers(0, 50))
    def compensate_source_of_reused(self, index: int) -> None:
        """An operator undoes the call a reused call was given (the call that took effect)."""
        reused = sorted(k for k in self.model.live if k in self.model.reused)
        if not reused:
            return
        source = self.model.reused[reused[index % len(reused)]]
        if source in self.model.live:
            self.run(
                inv.attempt(self.pools[2].mark_compensated(source, actor="operator:alice", reason="undo"))
            )

    @rule(index=st.integers(0, 50), call=st.sampled_from(CALL_IDS), how=GUARDS)
    def lost_reply_after_commit(self, index: int, call: str, how: dict[str, Any]) -> None:
        """A reservation commits and its answer is lost on the wire (the connection drops): the next
        attempt knows the lost one's owner token and reserves again. The lost attempt sent nothing;
        the call is handed out at most once, and never left in flight for the lost attempt."""
        run_id = self.runs[index % len(self.runs)]
        lost_owner = f"{how['owner']}-lost"
        self.run(self._reserve_losing_the_answer(run_id, call, how, lost_owner))
        result = self.guarded(
            run_id, call, 1, **{**how, "owner": how["owner"], "unsent_owners": (lost_owner,)}
        )
        if result is not None:
            record = result.record
            assert not (record.status is Status.STARTED and record.owner == lost_owner), (
                f"{record.key} is left in flight for an attempt whose answer was lost"
            )

    async def _reserve_losing_the_answer(
        self, run_id: str, call: str, how: dict[str, Any], owner: str
    ) -> None:
        async with AnswerDroppingProxy(self.dsn, marker=b"onceflow_guarded_reserve", times=1) as proxy:
            through = await Ledger.connect(proxy.dsn, max_size=1)
            try:
                guard = Guard(intent=how["intent"], entity=inv.ENTITY, toolset=inv.TOOLSET)
                await through.reserve(
                    CallIdentity(tenant="t1", run_id=run_id, tool_call_id=call),
                    tool_name=GUARDED_TOOL,
                    side_effect=SideEffect.EXTERNAL,
                    arguments={"account": inv.ENTITY, "amount": 1},
                    owner=owner,
                    lease=how["lease"],
                    guard=guard,
                    execution=self.execution(run_id),
                )
            except (LedgerUnavailableError, PayloadMismatchError):
                pass  # the answer was lost (or the key holds another amount: nothing written)
            finally:
                await through.close()
        found = await self.pools[0].find(call_key(run_id, call))
        if found is not None:
            self.model.live.add(found.key)
            self.guarded_calls.setdefault(found.key, (run_id, call, 1))

    @rule(index=st.integers(0, 50), call=st.sampled_from(CALL_IDS), how=GUARDS)
    def second_execution(self, index: int, call: str, how: dict[str, Any]) -> None:
        """A second execution under a run id the first claimed (a workflow id reused once the first
        closed): its writes are refused and nothing is reserved; it never shares keys or intents."""
        run_id = self.runs[index % len(self.runs)]
        if not any(self.guarded_calls[k][0] == run_id for k in self.model.live if k in self.guarded_calls):
            return  # the run has not claimed its id yet
        key = call_key(run_id, call)
        before = self.run(self.pools[0].find(key))
        with pytest.raises(RunIdTakenError):
            self.guarded(run_id, call, 1, **{**how, "heard": 0}, execution=f"{run_id}/e2")
        assert self.run(self.pools[0].find(key)) == before, f"a second execution changed {key}"

    # -- outcomes --------------------------------------------------------------------------------

    def reporter(self, key: str, who: int) -> str:
        """0: the call's owner; 1: one that owned it before (else the owner); more: a stranger."""
        owners = self.run(inv.owners(self.pools[0], key))
        return owners[min(who, len(owners) - 1)] if who < 2 else "w-stranger"

    @rule(index=st.integers(0, 50), completed=st.booleans(), via=st.integers(0, 2))
    def owner_reports(self, index: int, completed: bool, via: int) -> None:
        """The common path: the call's owner reports (completed, or not attempted)."""
        self.report_outcome(index, 0, "completed" if completed else "not_attempted", via)

    @rule(index=st.integers(0, 50), completed=st.booleans())
    def former_owner_reports(self, index: int, completed: bool) -> None:
        """A late report from an attempt that owned the call before: may contradict a decision."""
        self.report_outcome(index, 1, "completed" if completed else "rejected", 1)

    @rule(
        index=st.integers(0, 50),
        who=st.integers(0, 3),
        outcome=st.sampled_from(("completed", "not_attempted", "rejected", "policy_refused")),
        via=st.integers(0, 2),
    )
    def report_outcome(self, index: int, who: int, outcome: str, via: int) -> None:
        key = self.pick_guarded(index)
        if key is None:
            return
        owner = self.reporter(key, who)
        ledger = self.pool(via)
        try:
            if outcome == "completed":
                self.run(ledger.complete(key, owner=owner, result={"id": key}))
            else:
                self.run(ledger.fail(key, owner=owner, kind=FailureKind(outcome), error=outcome))
        except OutcomeIgnoredError:
            pass

    @rule(index=st.integers(0, 50), via=st.integers(0, 2))
    def inspector_marks_indeterminate(self, index: int, via: int) -> None:
        key = self.pick_guarded(index)
        if key is not None:
            self.run(self.pool(via).mark_indeterminate(key, actor="inspector", reason="activity lost"))

    @rule(index=st.integers(0, 50), status=st.sampled_from((Status.COMPLETED, Status.FAILED)))
    def reconciler_late_outcome(self, index: int, status: Status) -> None:
        key = self.pick_guarded(index)
        if key is not None:
            self.run(self.pools[1].record_late_outcome(key, actor="reconciler:hook", status=status))

    # -- retention and budgets -------------------------------------------------------------------

    @rule()
    def purge(self) -> None:
        """Retention with the ledger's own purge. It takes only calls settled more than a day ago, so
        the test ages its own database's rows and events by two days first (no API sets a time)."""
        before = self.run(inv.snapshot(self.pools[0]))
        self.run(inv.age_everything(self.dsn, timedelta(days=2)))
        self.run(purge_settled(self.pools[0], older_than=timedelta(days=1)))
        self.model.purged(before, self.run(inv.snapshot(self.pools[0])))
        gone = {row["run_id"] for key, row in before.items() if key not in self.model.live}
        for runs in (self.runs, self.plain_runs):
            for i, run_id in enumerate(runs):
                if run_id in gone:  # a purged run is over: new calls go to a new run
                    runs[i] = f"r{self.fresh}"
                    self.fresh += 1

    @rule(via=st.integers(0, 2))
    def read_budget(self, via: int) -> None:
        ledger_says = self.run(inv.ledger_budget(self.pool(via)))
        expected = self.run(inv.budget_carried(self.pools[0], self.model))
        assert ledger_says == expected, (
            f"the ledger reads the budget as {ledger_says}, the rows say {expected}"
        )

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def ledger_invariants(self) -> None:
        self.run(inv.check(self.pools[0], self.model))

    def teardown(self) -> None:
        try:
            self.run(inv.every_open_call_has_a_way_out(self.pools[2]))
        finally:
            for ledger in self.pools:
                self.run(ledger.close())
            self.run(drop_database(self.admin_dsn, self.name))


@pytest.fixture(scope="module")
def loop_thread() -> Any:
    with LoopThread() as loop:
        yield loop


def _explore(loop_thread: LoopThread, postgres_dsn: str, chosen: settings) -> None:
    LedgerMachine.loop = loop_thread
    LedgerMachine.admin_dsn = postgres_dsn
    run_state_machine_as_test(LedgerMachine, settings=chosen)


def test_ledger_interleavings_keep_the_invariants(
    loop_thread: LoopThread, postgres_dsn: str, template_dsn: str
) -> None:
    _explore(loop_thread, postgres_dsn, _profile())


@pytest.mark.properties
def test_ledger_interleavings_keep_the_invariants_long(
    loop_thread: LoopThread, postgres_dsn: str, template_dsn: str
) -> None:
    _explore(loop_thread, postgres_dsn, settings.get_profile("long-properties"))
