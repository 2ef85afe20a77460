"""The crash drill: a small one through the real `onceflow drill` command, and the drill's own checks.

The small drill starts its own Temporal dev server, PostgreSQL, billing service (honouring no
idempotency key) and two worker processes, kills workers at every kill point on purpose and at
random, and must find every invariant holding. Its JSON report is checked here again from the raw
per-call figures, and the credit requests per key are counted again straight from the billing
service's own record, and the credits per run, account and amount from its credits table, so a
report whose verdicts were too kind would still fail this test. A drill whose workers are sabotaged
to send a write twice must fail; so must one whose credit tool declares an intent other than the
default, paying an unheard twin again (`allow`) or never paying a repeat the model asked after
hearing (`reuse`).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from onceflow.drill.intents import INVARIANT as INTENT_INVARIANT
from onceflow.drill.intents import AppliedCredit
from onceflow.drill.judge import Downstream, RunEnd, check_run
from onceflow.drill.points import MARKERS_ENV, KillPoint, arm, claim, read_held, still_armed
from onceflow.drill.scenario import (
    INTENT_OF_CALL,
    ORIGINAL_CALL,
    OWED_CALL,
    REISSUE_CALL,
    SENT_CALLS,
    WRITE_CALLS,
    PlannedRun,
    plan_runs,
)
from onceflow.drill.sends import EVENTS, Reruns, judge_sends, reruns_by_key
from onceflow.examples.billing.models import seeded_order
from onceflow.ledger import CallIdentity, FailureKind, Ledger, SideEffect
from onceflow.sdk.payloads import AgentRunResult, CallSummary

# Two runs plan each kill point (plan_runs cycles through them, and one run meets none), so that a
# random kill that pre-empts one planned kill cannot leave its point unmet.
RUNS = 2 * len(KillPoint) + 1


def _drill(tmp_path: Path, *args: str, timeout: float = 220) -> tuple[int, dict[str, Any], str]:
    """Run `onceflow drill` with `args`; its exit code, JSON report and the tail of its output."""
    report_path = tmp_path / "report.json"
    command = [str(Path(sys.executable).parent / "onceflow"), "drill", *args]
    command += ["--data-dir", str(tmp_path / "drills"), "--report", str(report_path)]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    output = finished.stdout[-6000:] + finished.stderr[-3000:]
    assert report_path.exists(), output
    return finished.returncode, json.loads(report_path.read_text()), output


def credit_requests_per_key(report: dict[str, Any]) -> Counter[str | None]:
    """Credit requests per Idempotency-Key, read straight from the billing service's SQLite file."""
    conn = sqlite3.connect(Path(report["run_dir"]) / "billing.sqlite3")
    try:
        rows = conn.execute(
            "SELECT idempotency_key FROM received_requests WHERE method = 'POST' AND path = '/credits'"
        ).fetchall()
    finally:
        conn.close()
    return Counter(key for (key,) in rows)


def credits_per_intent(report: dict[str, Any]) -> Counter[tuple[str, str, int, str]]:
    """Credits billing applied per intent, straight from its SQLite file: (run, account, amount, and
    the intent's first call, since the original and its unheard twin are one intent, the repeat
    asked after hearing them another)."""
    conn = sqlite3.connect(Path(report["run_dir"]) / "billing.sqlite3")
    try:
        rows = conn.execute("SELECT idempotency_key, account_id, amount_cents FROM credits").fetchall()
    finally:
        conn.close()
    per_intent: Counter[tuple[str, str, int, str]] = Counter()
    for key, account, amount in rows:
        run_id, call = key.rsplit(":", 1)
        per_intent[(run_id, account, amount, INTENT_OF_CALL.get(call, call))] += 1
    return per_intent


def test_small_drill_loses_no_run_and_pays_no_key_or_intent_twice(tmp_path: Path) -> None:
    # All at once: the random kills end when the points are met.
    code, report, output = _drill(
        tmp_path, "--runs", str(RUNS), "--seed", "11", "--timeout", "170", "--concurrency", str(RUNS)
    )
    assert code == 0, output
    assert report["ok"], output
    assert all(value is True for value in report["invariants"].values()), report["invariants"]
    assert report["receiver"]["dedup"] is False, "the drill must count at a receiver that honours no key"

    totals = report["totals"]
    assert totals["runs"] == RUNS
    assert totals["runs_lost"] == 0
    assert totals["keys_sent_more_than_once"] == 0
    assert totals["intents_applied_more_than_once"] == 0
    assert totals["ledger_records_per_call"] == 1.0
    assert totals["duplicate_effects"] == 0
    # The runs meeting no planned point had a credit refused at the door (423): received once,
    # applied never, failed ("not attempted", or "not applied" if a random kill beat the answer).
    unplanned = [run for run in report["runs"] if run["point"] is None]
    assert unplanned
    for run in unplanned:
        assert any((c["status"], c["received"], c["effects"]) == ("failed", 1, 0) for c in run["calls"]), run
    assert totals["kills_planned"] >= len(KillPoint)
    for point in KillPoint:
        assert report["kills_per_point"][point.value]["planned"] >= 1, point

    # The raw figures, checked again without trusting the report's verdicts.
    assert len(report["runs"]) == RUNS
    for run in report["runs"]:
        assert run["outcome"] in ("completed", "waiting"), run
        assert [call["key"].rsplit(":", 1)[1] for call in run["calls"]] == list(WRITE_CALLS)
        for call in run["calls"]:
            assert call["records"] <= 1 and call["effects"] <= 1, call
            assert call["received"] <= 1 + call["legit_resends"] and call["extra_sends"] == 0, call
            if run["outcome"] == "completed":
                assert call["records"] == 1 and call["run_says"] == call["status"], call
            if call["status"] == "completed":
                assert call["effects"] == (0 if call["reused_from"] else 1), call
            if call["reused_from"]:
                assert call["received"] == 0 and call["key"].endswith(REISSUE_CALL), call
            if call["status"] in ("failed", None):
                assert call["effects"] == 0, call
    confirmed = [hit for kill in report["kills"] if kill["cause"] == "planned" for hit in kill["hits"]]
    assert {hit["point"] for hit in confirmed if hit["verified"]} == {p.value for p in KillPoint}

    # The sends, counted again from the receiver's own record: every key at most once (this drill
    # re-reserves nothing, so no re-send is legitimate), none without a key, none the report missed.
    raw = credit_requests_per_key(report)
    reported = {call["key"]: call["received"] for run in report["runs"] for call in run["calls"]}
    assert None not in raw, raw
    assert set(raw) <= set(reported), set(raw) - set(reported)
    assert {key: raw.get(key, 0) for key in reported} == reported
    assert max(raw.values()) == 1, [key for key, n in raw.items() if n > 1]
    assert totals["legit_resends_after_not_attempted"] == 0
    assert totals["credit_requests_received"] == sum(raw.values())

    # The intents, counted again from billing's own credits: no intent paid twice; every completed
    # run paid the original-and-twin intent once unless both failed without effect, and the repeat
    # asked after hearing them once more, as a new effect, when it completed (it is never reused).
    paid = credits_per_intent(report)
    assert paid and max(paid.values()) == 1, [intent for intent, n in paid.items() if n > 1]
    lost_answer_then_reused = 0
    for run in report["runs"]:
        calls = {call["key"].rsplit(":", 1)[1]: call for call in run["calls"]}
        first, twin, owed = calls[ORIGINAL_CALL], calls[REISSUE_CALL], calls[OWED_CALL]
        assert owed["reused_from"] is None, run
        if run["outcome"] != "completed":
            continue
        order_paid = Counter(
            intent
            for (run_id, _, amount, intent), n in paid.items()
            if run_id == run["run_id"] and amount > 250
            for _ in range(n)
        )
        assert order_paid[ORIGINAL_CALL] == (0 if first["status"] == twin["status"] == "failed" else 1), run
        assert order_paid[OWED_CALL] == (1 if owed["status"] == "completed" else 0), run
        if first["status"] == "completed":
            assert twin["reused_from"] == first["key"] and twin["received"] == 0, run
            lost_answer_then_reused += first["settled_by"] == "reconciler"
    assert lost_answer_then_reused >= 1, "no run lost the first credit's answer and then had its twin reused"


def test_a_drill_whose_workers_send_a_write_twice_fails_and_counts_the_keys(tmp_path: Path) -> None:
    # No kills: the runs planned for `downstream` and `reconcile` have billing hold their first credit
    # past the tool's timeout, and the sabotaged write activity then sends it again with the same key.
    code, report, output = _drill(
        tmp_path,
        *("--runs", "5", "--seed", "3", "--timeout", "120", "--concurrency", "5"),
        *("--no-random-kills", "--no-planned-kills", "--sabotage-resend-after-timeout"),
    )
    assert code == 1, output
    assert not report["ok"]
    assert report["invariants"]["no_key_sent_more_than_once"] is False, report["invariants"]
    assert report["totals"]["keys_sent_more_than_once"] >= 1, report["totals"]
    assert report["totals"]["legit_resends_after_not_attempted"] == 0
    raw = credit_requests_per_key(report)
    twice = sorted(key for key, n in raw.items() if key is not None and n > 1)
    flagged = sorted(c["key"] for run in report["runs"] for c in run["calls"] if c["extra_sends"])
    assert twice and flagged == twice, (raw, flagged)
    assert "SABOTAGED" in output


@pytest.mark.parametrize("intent", ["allow", "reuse"])
def test_a_drill_whose_credit_tool_declares_another_intent_fails_the_intent_check(
    tmp_path: Path, intent: str
) -> None:
    # No kills and no faults on these two runs: each first credit completes. Declared `allow`, its
    # unheard twin is sent under its own key and paid again; declared `reuse`, the repeat the model
    # asked after hearing both is handed their result, so a credit owed is never paid.
    code, report, output = _drill(
        tmp_path,
        *("--runs", "2", "--seed", "3", "--timeout", "120", "--concurrency", "2"),
        *("--no-random-kills", "--no-planned-kills", "--sabotage-intent", intent),
    )
    assert code == 1, output
    assert not report["ok"]
    invariants = report["invariants"]
    assert invariants["no_intent_applied_more_than_once"] is False, invariants
    # Every key was sent and applied at most once: a check of keys alone would have passed.
    assert invariants["no_key_sent_more_than_once"] is True, invariants
    assert invariants["at_most_one_effect_per_key"] is True, invariants
    assert max(credit_requests_per_key(report).values()) == 1
    paid = credits_per_intent(report)
    runs = sorted(run["run_id"] for run in report["runs"])
    if intent == "allow":
        assert report["totals"]["intents_applied_more_than_once"] == 2, report["totals"]
        twice = sorted(
            run_id for (run_id, _, _, first), n in paid.items() if n > 1 and first == ORIGINAL_CALL
        )
        assert twice == runs, paid
    else:
        assert report["totals"]["owed_repeats_paid"] == 0, report["totals"]
        assert not any(first == OWED_CALL for (_, _, _, first) in paid), paid
        assert all(f"{run_id}:{OWED_CALL} was asked after the model heard" in output for run_id in runs)
    assert "SABOTAGED" in output


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
