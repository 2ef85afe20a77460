"""The crash drill's own checks, without running a drill: kill points claimed and planned, the judge
(`check_run`) handed ledger rows and billing's counts and flagging each broken invariant, and the
re-sends a real ledger's events allow. The small drill itself, through the `onceflow drill` command,
is in tests/test_drill.py.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from onceflow.drill.gates import (
    close_turn,
    leave_to_operator,
    left_to_operator,
    open_turn,
    turn_reached,
    wait_at_turn,
)
from onceflow.drill.intents import INVARIANT as INTENT_INVARIANT
from onceflow.drill.intents import AppliedCredit
from onceflow.drill.judge import Downstream, RunCheck, RunEnd, check_run
from onceflow.drill.paths import TOLD_INVARIANT
from onceflow.drill.points import MARKERS_ENV, KillPoint, arm, claim, read_held, still_armed
from onceflow.drill.scenario import (
    CONFLICT_AGENT,
    CYCLE,
    FIRST_CREDIT,
    ORIGINAL_CALL,
    OWED_CALL,
    REISSUE_CALL,
    RESET_AGENT,
    RETRY_CREDIT,
    SENT_CALLS,
    WRITE_CALLS,
    PlannedRun,
    RunPath,
    kind_name,
    plan_runs,
)
from onceflow.drill.sends import EVENTS, Reruns, judge_sends, reruns_by_key
from onceflow.drill.told import TOLD_ENV, ModelCall, read_model_calls, write_down
from onceflow.drill.walks import Walk
from onceflow.examples.billing.models import seeded_order
from onceflow.ledger import CallIdentity, FailureKind, Ledger, SideEffect
from onceflow.sdk.payloads import AgentRunResult, CallSummary, Message, ModelCallInput, ToolCall


def test_a_point_is_claimed_once_and_only_when_its_condition_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARKERS_ENV, str(tmp_path))
    arm(tmp_path, "run-1", KillPoint.BEFORE_SEND, tool_call_id="call_1_1")

    assert not claim("run-1", KillPoint.BEFORE_SEND, "run-1:call_1_0", tool_call_id="call_1_0")
    assert not claim("run-2", KillPoint.BEFORE_SEND, "run-2:call_1_1", tool_call_id="call_1_1")
    assert claim("run-1", KillPoint.BEFORE_SEND, "run-1:call_1_1", tool_call_id="call_1_1")
    assert not claim("run-1", KillPoint.BEFORE_SEND, "run-1:call_1_1", tool_call_id="call_1_1")

    [(_, held)] = read_held(tmp_path)
    assert (held.run_id, held.point, held.key) == ("run-1", KillPoint.BEFORE_SEND, "run-1:call_1_1")
    assert still_armed(tmp_path) == []


def test_every_kill_point_is_planned_within_one_cycle_and_the_first_credit_loses_its_answer() -> None:
    plans = plan_runs(7, seed=5)
    assert {plan.point for plan in plans} == {*KillPoint, None}
    assert all(
        plan.fault
        for plan in plans
        if plan.point in (KillPoint.DOWNSTREAM, KillPoint.RECONCILE, KillPoint.RESERVE)
    )
    # Across many runs, half of the after-answer kills strike the first credit (the one with a twin).
    targets = Counter(
        plan.condition["tool_call_id"]
        for plan in plan_runs(700, seed=5)
        if plan.point is KillPoint.AFTER_ANSWER
    )
    assert set(targets) == set(SENT_CALLS) and 0.4 < targets[ORIGINAL_CALL] / sum(targets.values()) < 0.6


AMOUNTS = {"call_1_1": 100, "call_2_1": 250}  # the others (original, twin, repeat): the order's


def _amount(plan: PlannedRun, call: str) -> int:
    order = seeded_order(plan.order_id)
    assert order is not None
    return AMOUNTS.get(call, order.amount_cents)


def _row(plan: PlannedRun, call: str, status: str, reused_from: str | None = None) -> dict[str, Any]:
    return {
        "tool_call_id": call,
        "key": plan.key(call),
        "status": status,
        "settled_by": None,
        "account_id": plan.account_id,
        "amount_cents": _amount(plan, call),
        "reused_from": reused_from,
    }


def _rows(plan: PlannedRun, status: str) -> list[dict[str, Any]]:
    """Every call with `status`; a completed twin was handed the first credit's result (the repeat
    asked after hearing it was sent, as owed)."""
    reused = plan.key(ORIGINAL_CALL) if status == "completed" else None
    return [_row(plan, call, status, reused if call == REISSUE_CALL else None) for call in WRITE_CALLS]


def _once(keys: list[str], **changes: int) -> dict[str, int]:
    return {**dict.fromkeys(keys, 1), **changes}


def _seen(
    plan: PlannedRun,
    effects: dict[str, int],
    received: dict[str, int],
    reruns: dict[str, Reruns] | None = None,
) -> Downstream:
    """What billing shows: its credits (account and amount per call) exactly as `effects` counts."""
    credits = [
        AppliedCredit(plan.key(call), plan.account_id, _amount(plan, call))
        for call in WRITE_CALLS
        for _ in range(effects.get(plan.key(call), 0))
    ]
    return Downstream(effects, received, reruns or {}, credits)


def _completed(rows: list[dict[str, Any]]) -> RunEnd:
    """A completed run that reports each call as the ledger has it."""
    calls = [
        CallSummary(tool_call_id=r["tool_call_id"], tool="issue_credit", key=r["key"], status=r["status"])
        for r in rows
    ]
    return RunEnd("completed", result=AgentRunResult(run_id="r", final="", turns=5, calls=calls))


def _flagged(problems: list[str]) -> list[str]:
    return sorted(p.split(":")[0] for p in problems)


def _sent(plan: PlannedRun) -> list[str]:
    return [plan.key(call) for call in SENT_CALLS]


def test_the_checks_flag_a_second_effect_and_an_effect_behind_a_failed_record() -> None:
    [plan] = plan_runs(1, seed=1)
    sent = _sent(plan)
    completed = _rows(plan, "completed")
    assert (
        check_run(plan, _completed(completed), completed, _seen(plan, _once(sent), _once(sent))).problems
        == []
    )

    effects = _once(sent, **{sent[0]: 2})
    problems = check_run(plan, RunEnd("waiting"), completed, _seen(plan, effects, _once(sent))).problems
    assert _flagged(problems) == [
        "at_most_one_effect_per_key",
        "completed_calls_took_effect_once",
        *[INTENT_INVARIANT] * 2,  # applied twice; the ledger says once
    ]

    problems = check_run(
        plan, RunEnd("waiting"), _rows(plan, "failed"), _seen(plan, {sent[1]: 1}, {sent[1]: 1})
    ).problems
    assert _flagged(problems) == ["failed_calls_took_no_effect", INTENT_INVARIANT]


def test_the_checks_flag_a_key_sent_twice_even_when_billing_applied_it_once() -> None:
    [plan] = plan_runs(1, seed=1)
    sent = _sent(plan)
    seen = _seen(plan, _once(sent), _once(sent, **{sent[2]: 2}))
    check = check_run(plan, RunEnd("waiting"), _rows(plan, "completed"), seen)
    assert _flagged(check.problems) == ["no_key_sent_more_than_once"]
    assert [(c.received, c.extra_sends) for c in check.calls] == [(1, 0), (1, 0), (0, 0), (2, 1), (1, 0)]


def test_the_checks_allow_one_resend_per_rerun_after_not_attempted_and_no_other() -> None:
    [plan] = plan_runs(1, seed=1)
    sent = _sent(plan)
    received = _once(sent, **{sent[0]: 2, sent[1]: 2, sent[2]: 3})
    rows = [{**row, "attempt": 2 if row["key"] in sent[:3] else 1} for row in _rows(plan, "completed")]
    reruns = {
        sent[0]: Reruns(after_not_attempted=1),
        sent[1]: Reruns(after_other_failure=1),
        sent[2]: Reruns(after_not_attempted=1),
    }
    check = check_run(plan, RunEnd("waiting"), rows, _seen(plan, _once(sent), received, reruns))
    assert [(c.legit_resends, c.extra_sends) for c in check.calls] == [(1, 0), (0, 1), (0, 0), (1, 1), (0, 0)]
    assert _flagged(check.problems) == ["no_key_sent_more_than_once"] * 2
    assert judge_sends(0, Reruns(after_not_attempted=2)) == judge_sends(0, None)

    # A re-reservation the events do not explain: re-sends can no longer be told apart.
    rows[0]["attempt"] = 3
    check = check_run(plan, RunEnd("waiting"), rows, _seen(plan, _once(sent), received, reruns))
    assert sum("events show 1 re-reservations" in p for p in check.problems) == 1


def test_the_checks_flag_a_request_the_ledger_never_reserved() -> None:
    [plan] = plan_runs(1, seed=1)
    rows = [row for row in _rows(plan, "completed") if row["tool_call_id"] != "call_2_1"]
    sent = _sent(plan)
    applied = [key for key in sent if not key.endswith(":call_2_1")]
    check = check_run(plan, RunEnd("waiting"), rows, _seen(plan, _once(applied), _once(sent)))
    assert _flagged(check.problems) == ["no_request_without_ledger_record"]


def test_the_checks_count_a_failed_or_stuck_run_as_lost() -> None:
    [plan] = plan_runs(1, seed=1)
    for end in (RunEnd("failed", "boom"), RunEnd("stuck"), None):
        problems = check_run(plan, end, [], Downstream({}, {})).problems
        assert [p.split(":")[0] for p in problems] == ["no_run_lost"]


def test_an_unheard_twin_that_paid_again_under_its_own_key_fails_only_the_intent_check() -> None:
    """Each key sent once and applied once, as a key-only check wants; one intent was paid twice."""
    [plan] = plan_runs(1, seed=1)
    keys = plan.keys()
    rows = [_row(plan, call, "completed") for call in WRITE_CALLS]  # the twin sent, not reused
    check = check_run(plan, _completed(rows), rows, _seen(plan, _once(keys), _once(keys)))
    assert set(_flagged(check.problems)) == {INTENT_INVARIANT}
    [paid_twice] = [i for i in check.intents if i.applied > 1]
    assert (paid_twice.amount_cents, paid_twice.calls, paid_twice.requests) == (
        _amount(plan, ORIGINAL_CALL),
        [ORIGINAL_CALL, REISSUE_CALL],
        2,
    )
    assert any("the original completed" in p for p in check.problems), check.problems
    # The repeat asked after hearing is its own intent, paid once: owed, not a violation.
    [owed] = [i for i in check.intents if i.intent == OWED_CALL]
    assert (owed.applied, owed.calls) == (1, [OWED_CALL])


def test_a_repeat_asked_after_hearing_is_owed_and_handing_it_the_twins_result_fails() -> None:
    [plan] = plan_runs(1, seed=1)
    sent = _sent(plan)
    rows = _rows(plan, "completed")
    assert check_run(plan, _completed(rows), rows, _seen(plan, _once(sent), _once(sent))).problems == []
    # What `reuse` would do: the repeat handed the original's result, nothing sent, nothing paid.
    rows[-1]["reused_from"] = plan.key(ORIGINAL_CALL)
    unpaid = [key for key in sent if not key.endswith(OWED_CALL)]
    problems = check_run(plan, _completed(rows), rows, _seen(plan, _once(unpaid), _once(unpaid))).problems
    assert set(_flagged(problems)) == {INTENT_INVARIANT} and len(problems) == 3, problems
    assert any("it is owed" in p for p in problems), problems


def test_after_a_failed_original_its_twin_is_the_one_payment_and_two_failures_are_none() -> None:
    [plan] = plan_runs(1, seed=1)
    sent = _sent(plan)
    first, twin = plan.key(ORIGINAL_CALL), plan.key(REISSUE_CALL)
    rows = [_row(plan, call, "failed" if call == ORIGINAL_CALL else "completed") for call in WRITE_CALLS]
    paid = _once([*sent[1:], twin])
    assert check_run(plan, _completed(rows), rows, _seen(plan, paid, _once([*sent, twin]))).problems == []

    # Both failed without effect: nothing paid for that intent is exactly right; a payment would not be.
    rows[2] = _row(plan, REISSUE_CALL, "failed")
    assert check_run(plan, _completed(rows), rows, _seen(plan, _once(sent[1:]), _once(sent))).problems == []
    problems = check_run(plan, _completed(rows), rows, _seen(plan, _once(sent), _once(sent))).problems
    assert INTENT_INVARIANT in _flagged(problems)

    # A completed original paid nothing: the run says one payment, billing shows none.
    rows = _rows(plan, "completed")
    problems = check_run(plan, _completed(rows), rows, _seen(plan, _once(sent[1:]), _once(sent))).problems
    assert _flagged(problems) == ["completed_calls_took_effect_once", *[INTENT_INVARIANT] * 3]
    assert first in " ".join(problems)


def test_a_reused_call_must_point_at_a_payment_and_send_nothing() -> None:
    [plan] = plan_runs(1, seed=1)
    sent, twin = _sent(plan), plan.key(REISSUE_CALL)
    rows = _rows(plan, "completed")
    problems = check_run(
        plan, _completed(rows), rows, _seen(plan, _once(sent), _once([*sent, twin]))
    ).problems
    assert _flagged(problems) == ["no_intent_applied_more_than_once"] * 2  # reused, yet sent
    rows[2]["reused_from"] = plan.key("call_1_1")  # another credit's result
    problems = check_run(plan, _completed(rows), rows, _seen(plan, _once(sent), _once(sent))).problems
    assert _flagged(problems) == [INTENT_INVARIANT] * 2 and "reused" in problems[0]


def test_an_unresolved_original_with_a_payment_is_not_a_mismatch() -> None:
    [plan] = plan_runs(1, seed=1)
    first = plan.key(ORIGINAL_CALL)
    rows = [_row(plan, ORIGINAL_CALL, "indeterminate")]  # the run waits on it: nothing after it
    assert (
        check_run(plan, RunEnd("waiting"), rows, _seen(plan, _once([first]), _once([first]))).problems == []
    )


async def test_reruns_are_read_from_the_ledgers_events_by_the_failure_before_them(
    ledger: Ledger, database_url: str
) -> None:
    """Real ledger: a key failed "not attempted" and reserved again is a legit re-send; after a
    rejection, and for a key reserved once, it is not."""

    async def reserve(call: str) -> None:
        await ledger.reserve(
            CallIdentity(tenant="t-reruns", run_id="run-r", tool_call_id=call, agent="a"),
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments={"n": 1},
            owner=f"owner-{call}",
            approval=False,
            lease=timedelta(seconds=30),
        )

    for call, kind in (("c-not-attempted", FailureKind.NOT_ATTEMPTED), ("c-rejected", FailureKind.REJECTED)):
        await reserve(call)
        await ledger.fail(f"run-r:{call}", owner=f"owner-{call}", kind=kind, error="no")
        await reserve(call)
    await reserve("c-once")
    conn = await asyncpg.connect(database_url)
    try:
        events = [dict(e) for e in await conn.fetch(EVENTS, "t-reruns")]
    finally:
        await conn.close()
    assert reruns_by_key(events) == {
        "run-r:c-not-attempted": Reruns(after_not_attempted=1),
        "run-r:c-rejected": Reruns(after_other_failure=1),
    }


# -- the conflict and reset runs, judged by what the model was told ----------------------------------


def test_the_plan_walks_each_path_once_a_cycle_and_can_be_narrowed_to_some_kinds() -> None:
    plans = plan_runs(len(CYCLE), seed=5)
    assert [plan.kind for plan in plans] == [kind_name(kind) if kind else None for kind in CYCLE]
    conflict, reset = plans[-2:]
    assert (conflict.path, conflict.agent, conflict.fault) == (
        RunPath.CONFLICT,
        CONFLICT_AGENT,
        "apply_then_hang",
    )
    assert (reset.path, reset.agent, reset.write_calls) == (RunPath.RESET, RESET_AGENT, ())
    moments = Counter(plan.condition["moment"] for plan in plan_runs(90, seed=5, only=("reset",)))
    assert set(moments) == {"done", "in_flight"}
    assert [plan.kind for plan in plan_runs(3, seed=5, only=("conflict", "locked"))] == [
        None,
        "conflict",
        None,
    ]
    with pytest.raises(ValueError, match="no kind of run named nope"):
        plan_runs(1, seed=5, only=("nope",))


def test_what_the_model_was_told_is_read_back_as_it_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOLD_ENV, str(tmp_path))
    asked = ToolCall(id="call_1_0", name="issue_credit", arguments={"amount_cents": 5})
    told = {"ok": True, "result": {"credit_id": "cr_1"}, "reused_from": "call_0_9"}
    messages = [
        Message(role="user", content="{}"),
        Message(role="assistant", tool_calls=[asked]),
        Message(role="tool", tool_call_id="call_1_0", name="issue_credit", content=json.dumps(told)),
    ]
    write_down(ModelCallInput(agent="a", run_id="run-1", messages=messages))
    [call] = read_model_calls(tmp_path)["run-1"]
    assert (call.turn, call.temporal_run_id) == (1, "")  # outside an activity: no Temporal run
    [credit] = call.calls("issue_credit")
    assert (credit.tool_call_id, credit.turn, credit.took_effect) == ("call_1_0", 0, True)
    assert (credit.credit_id, credit.reused_from) == ("cr_1", "call_0_9")


async def test_a_gated_turn_says_it_waits_and_goes_on_once_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARKERS_ENV, str(tmp_path))
    await asyncio.wait_for(wait_at_turn("run-1", 2), 1)  # no gate: nothing waits
    close_turn(tmp_path, "run-1", 2)
    waiting = asyncio.create_task(wait_at_turn("run-1", 2))
    while not turn_reached(tmp_path, "run-1", 2):
        await asyncio.sleep(0.01)
    assert not waiting.done()
    open_turn(tmp_path, "run-1", 2)
    await asyncio.wait_for(waiting, 1)
    leave_to_operator(tmp_path, "run-1", "call_1_0")
    assert left_to_operator("run-1", "call_1_0") and not left_to_operator("run-1", "call_2_0")


def _conversation(
    plan: PlannedRun, temporal: str, asks: Sequence[tuple[str, dict[str, Any] | None]]
) -> ModelCall:
    """The conversation of a two-credit run: the lookup, then one credit per answer, each told."""
    amount = _amount(plan, ORIGINAL_CALL)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "{}"},
        {"role": "assistant", "tool_calls": [{"id": "call_0_0", "name": "lookup_order", "arguments": {}}]},
        {"role": "tool", "tool_call_id": "call_0_0", "name": "lookup_order", "content": '{"ok": true}'},
    ]
    for call, told in asks:
        arguments = {"account_id": plan.account_id, "amount_cents": amount}
        messages.append(
            {
                "role": "assistant",
                "tool_calls": [{"id": call, "name": "issue_credit", "arguments": arguments}],
            }
        )
        if told is not None:
            messages.append(
                {"role": "tool", "tool_call_id": call, "name": "issue_credit", "content": json.dumps(told)}
            )
    return ModelCall(plan.run_id, temporal, 1 + len(asks), messages)


def _took(credit: str, reused_from: str | None = None) -> dict[str, Any]:
    return {
        "ok": True,
        "result": {"credit_id": credit},
        **({"reused_from": reused_from} if reused_from else {}),
    }


FAILED = {"ok": False, "took_effect": False, "reason": "not_applied"}


def _credit_row(plan: PlannedRun, call: str, status: str, reused_from: str | None = None) -> dict[str, Any]:
    return {**_row(plan, call, status), "reused_from": reused_from and plan.key(reused_from)}


def check_downstream(plan: PlannedRun, credits: dict[str, str]) -> Downstream:
    """Billing with these credits (id -> key), each key received once."""
    applied = [
        AppliedCredit(key, plan.account_id, _amount(plan, ORIGINAL_CALL), credit)
        for credit, key in credits.items()
    ]
    received = dict(Counter(credits.values()))
    return Downstream(received, received, {}, applied)


def test_a_conflict_run_whose_retry_was_handed_the_first_credit_passes_and_one_sent_again_fails() -> None:
    [plan] = plan_runs(1, seed=1, only=("conflict",))
    walk = Walk(plan.run_id, "conflict", late_report="cr_1", acknowledged=True)
    at_retry = _conversation(plan, "t1", [(FIRST_CREDIT, FAILED)])
    rows = [
        _credit_row(plan, FIRST_CREDIT, "completed"),
        _credit_row(plan, RETRY_CREDIT, "completed", FIRST_CREDIT),
    ]
    # The run reports the first credit as it told the model: failed (the acknowledgement came later).
    rows_told = [{**rows[0], "status": "failed"}, rows[1]]
    good = _conversation(plan, "t1", [(FIRST_CREDIT, FAILED), (RETRY_CREDIT, _took("cr_1", FIRST_CREDIT))])
    end = _completed(rows_told)
    end.temporal_run_id = "t1"
    check = check_run(
        plan, end, rows, check_downstream(plan, {"cr_1": plan.key(FIRST_CREDIT)}), [at_retry, good], walk
    )
    assert check.problems == [] and check.path is not None and check.path.walked
    assert [(i.calls, i.applied) for i in check.intents] == [([FIRST_CREDIT, RETRY_CREDIT], 1)]

    # The retry sent while the conflict was open: two credits for the one intent, and the retry told
    # its own credit, not the first's.
    sent = _conversation(plan, "t1", [(FIRST_CREDIT, FAILED), (RETRY_CREDIT, _took("cr_2"))])
    rows[1]["reused_from"] = None
    credits = {"cr_1": plan.key(FIRST_CREDIT), "cr_2": plan.key(RETRY_CREDIT)}
    end = _completed(rows_told)
    end.temporal_run_id = "t1"
    check = check_run(plan, end, rows, check_downstream(plan, credits), [at_retry, sent], walk)
    assert {INTENT_INVARIANT, TOLD_INVARIANT} <= set(_flagged(check.problems)), check.problems
    assert check.path is not None and not check.path.walked and check.path.told_another_result == 1
    assert [(i.calls, i.applied) for i in check.intents] == [([FIRST_CREDIT, RETRY_CREDIT], 2)]


def _reset_run(plan: PlannedRun, told: list[tuple[str, dict[str, Any]]], credits: dict[str, str]) -> RunCheck:
    """A run reset to before its first credit turn after it had paid c_a and c_b; its new run asked
    r1 and r2, told as given."""
    plan.condition = {"moment": "done", "turn": 1}
    walk = Walk(plan.run_id, "reset", reset_from="t1", reset_to="t2")
    rows = [_credit_row(plan, call, "completed") for call in ("c_a", "c_b")]
    rows += [_credit_row(plan, call, "completed", t.get("reused_from")) for call, t in told]
    end = _completed(rows[2:])
    end.temporal_run_id = "t2"
    old = _conversation(plan, "t1", [("c_a", _took("cr_a")), ("c_b", _took("cr_b"))])
    new = _conversation(plan, "t2", told)
    return check_run(plan, end, rows, check_downstream(plan, credits), [old, new], walk)


def test_reissues_after_a_reset_must_each_be_told_their_own_original_and_nothing_paid_untold() -> None:
    [plan] = plan_runs(1, seed=1, only=("reset",))
    paid = {"cr_a": plan.key("c_a"), "cr_b": plan.key("c_b")}
    check = _reset_run(plan, [("r1", _took("cr_a", "c_a")), ("r2", _took("cr_b", "c_b"))], paid)
    assert check.problems == [] and check.path is not None and check.path.walked
    assert check.path.reissues == [plan.key("r1"), plan.key("r2")] == check.path.reused

    # Both re-issues handed the first credit: one credit id told twice, the second paid and untold.
    check = _reset_run(plan, [("r1", _took("cr_a", "c_a")), ("r2", _took("cr_a", "c_a"))], paid)
    assert check.path is not None and (check.path.credit_ids_told_twice, check.path.untold_credits) == (1, 1)
    assert {INTENT_INVARIANT, TOLD_INVARIANT} <= set(_flagged(check.problems)), check.problems

    # The second re-issue sent again under its new key: three credits for the two the model asked.
    sent = {**paid, "cr_c": plan.key("r2")}
    check = _reset_run(plan, [("r1", _took("cr_a", "c_a")), ("r2", _took("cr_c"))], sent)
    assert check.path is not None and check.path.untold_credits == 1 and check.path.sent == [plan.key("r2")]
    assert INTENT_INVARIANT in _flagged(check.problems) and max(i.applied for i in check.intents) == 2

    # Handed the other original's credit: told a credit that is not its own original's.
    check = _reset_run(plan, [("r1", _took("cr_b", "c_a")), ("r2", _took("cr_a", "c_b"))], paid)
    assert check.path is not None and check.path.told_another_result == 2
    assert set(_flagged(check.problems)) == {TOLD_INVARIANT}
