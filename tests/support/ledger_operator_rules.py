"""The decisions in the ledger's state machine (tests/test_ledger_properties.py): operators settling
(one, or two racing), approving, denying, releasing and acknowledging conflicts, and the reconciler
re-sending a call and settling it with the receiver's answer. Mixed into the machine like the compound
rules of tests/support/ledger_scenarios.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from onceflow.ledger import AlreadySettledError, ConflictNotOpenError, EventSource, Ledger, Status
from tests.support import ledger_invariants as inv

OPERATORS = ("operator:alice", "operator:bob")
EVIDENCE = {"checked": "the receiver's records"}
RESEND_SHORT, RESEND_LONG = timedelta(milliseconds=200), timedelta(minutes=5)


class OperatorRules:
    """Mixed into the state machine, which supplies the helpers below."""

    pools: list[Ledger]
    model: inv.Model

    def run(self, coro: Any) -> Any:
        raise NotImplementedError

    def pick(self, index: int) -> str | None:
        raise NotImplementedError

    def pick_guarded(self, index: int) -> str | None:
        raise NotImplementedError

    # -- operators -------------------------------------------------------------------------------

    @rule(
        index=st.integers(0, 50),
        status=st.sampled_from((Status.COMPLETED, Status.FAILED)),
        who=st.integers(0, 1),
    )
    def settle(self, index: int, status: Status, who: int) -> None:
        key = self.pick_guarded(index)
        if key is None:
            return
        outcome = self.run(
            inv.attempt(self.pools[2].settle(key, **inv.settlement(OPERATORS[who], status, key)))
        )
        self.model.note_decision(key, OPERATORS[who], outcome)

    @rule(
        index=st.integers(0, 50),
        first=st.sampled_from((Status.COMPLETED, Status.FAILED)),
        second=st.sampled_from((Status.COMPLETED, Status.FAILED)),
    )
    def two_operators_race(self, index: int, first: Status, second: Status) -> None:
        key = self.pick_guarded(index)
        if key is None:
            return
        alice, bob = self.run(
            inv.race(
                self.pools[1].settle(key, **inv.settlement(OPERATORS[0], first, key)),
                self.pools[2].settle(key, **inv.settlement(OPERATORS[1], second, key)),
            )
        )
        won = [
            actor
            for actor, out in zip(OPERATORS, (alice, bob), strict=True)
            if not isinstance(out, Exception)
        ]
        assert len(won) <= 1, f"both operators settled {key}"
        for actor, out in zip(OPERATORS, (alice, bob), strict=True):
            self.model.note_decision(key, actor, out)
            if won and isinstance(out, AlreadySettledError):
                assert out.settled_by == won[0], f"the loser was told {out.settled_by}, not {won[0]}"
        if won:
            loser = alice if won[0] == OPERATORS[1] else bob
            assert isinstance(loser, AlreadySettledError), f"the losing operator got {loser!r}"

    @rule(
        index=st.integers(0, 50),
        action=st.sampled_from(("approve", "deny", "release")),
        who=st.integers(0, 1),
    )
    def operator_decides(self, index: int, action: str, who: int) -> None:
        key, actor, ledger = self.pick(index), OPERATORS[who], self.pools[2]
        if key is None:
            return
        if action == "approve":
            coro = ledger.approve(key, actor=actor)
        elif action == "deny":
            coro = ledger.deny(key, actor=actor, reason="not now")
        else:
            coro = ledger.release(key, actor=actor, reason="never sent; let it go")
        self.model.note_decision(key, actor, self.run(inv.attempt(coro)))

    @rule(
        index=st.integers(0, 50),
        status=st.sampled_from((Status.COMPLETED, Status.FAILED, Status.COMPENSATED)),
        who=st.integers(0, 1),
    )
    def acknowledge_conflict(self, index: int, status: Status, who: int) -> None:
        key = self.pick_guarded(index)
        if key is None:
            return
        coro = self.pools[2].acknowledge_conflict(
            key, actor=OPERATORS[who], status=status, reason="looked at the other side", evidence=EVIDENCE
        )
        try:
            self.run(coro)
        except ConflictNotOpenError:
            pass

    @rule(index=st.integers(0, 50), inside=st.booleans(), lead=st.sampled_from((RESEND_SHORT, RESEND_LONG)))
    def reconciler_resends(self, index: int, inside: bool, lead: timedelta) -> None:
        """A resend inside the receiver's dedup window (24 h) or outside it (a window shorter than the
        lead). An allowed one is leased for `lead`: meanwhile no operator decision may land."""
        window = timedelta(hours=24) if inside else lead / 2
        key = self.pick_guarded(index)
        if key is not None:
            self.run(self.pools[1].begin_resend(key, window=window, lead=lead))

    @rule(index=st.integers(0, 50), status=st.sampled_from((Status.COMPLETED, Status.FAILED)))
    def resend_answered(self, index: int, status: Status) -> None:
        """The receiver answered a resend: the reconciler settles the call (allowed during the lease)."""
        key = self.pick_guarded(index)
        if key is None:
            return
        coro = self.pools[1].settle(
            key, **inv.settlement("reconciler", status, key), source=EventSource.RECONCILER
        )
        self.model.note_decision(key, "reconciler", self.run(inv.attempt(coro)))
