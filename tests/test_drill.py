"""The crash drill: a small one through the real `onceflow drill` command, and the drill's own checks.

The small drill starts its own Temporal dev server, PostgreSQL, billing service (honouring no
idempotency key) and two worker processes, kills workers at every kill point on purpose and at
random, and must find every invariant holding. Its JSON report is checked here again from the raw
per-call figures, and the credit requests per key are counted again straight from the billing
service's own record, so a report whose verdicts were too kind would still fail this test. A drill
whose workers are sabotaged to send a write twice must fail.
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

from ledger import CallIdentity, FailureKind, Ledger, SideEffect
from onceflow.drill.points import MARKERS_ENV, KillPoint, arm, claim, read_held, still_armed
from onceflow.drill.report import Downstream, RunEnd, check_run
from onceflow.drill.scenario import WRITE_CALLS, plan_runs
from onceflow.drill.sends import EVENTS, Reruns, judge_sends, reruns_by_key

RUNS = 10


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


def test_small_drill_loses_no_run_and_sends_no_key_twice(tmp_path: Path) -> None:
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
                assert call["effects"] == 1, call
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


def test_every_kill_point_is_planned_within_six_runs() -> None:
    plans = plan_runs(6, seed=5)
    assert {plan.point for plan in plans} == {*KillPoint, None}
    assert all(plan.fault for plan in plans if plan.point in (KillPoint.DOWNSTREAM, KillPoint.RECONCILE))


def _rows(run_id: str, status: str) -> list[dict[str, Any]]:
    return [
        {"tool_call_id": call, "key": f"{run_id}:{call}", "status": status, "settled_by": None}
        for call in WRITE_CALLS
    ]


def _once(keys: list[str], **changes: int) -> dict[str, int]:
    return {**dict.fromkeys(keys, 1), **changes}


def _flagged(problems: list[str]) -> list[str]:
    return sorted(p.split(":")[0] for p in problems)


def test_the_checks_flag_a_second_effect_and_an_effect_behind_a_failed_record() -> None:
    [plan] = plan_runs(1, seed=1)
    keys = plan.keys()
    completed = _rows(plan.run_id, "completed")
    assert check_run(plan, RunEnd("waiting"), completed, Downstream(_once(keys), _once(keys))).problems == []

    effects = _once(keys, **{keys[0]: 2})
    problems = check_run(plan, RunEnd("waiting"), completed, Downstream(effects, _once(keys))).problems
    assert _flagged(problems) == ["at_most_one_effect_per_key", "completed_calls_took_effect_once"]

    seen = Downstream({keys[1]: 1}, {keys[1]: 1})
    problems = check_run(plan, RunEnd("waiting"), _rows(plan.run_id, "failed"), seen).problems
    assert _flagged(problems) == ["failed_calls_took_no_effect"]


def test_the_checks_flag_a_key_sent_twice_even_when_billing_applied_it_once() -> None:
    [plan] = plan_runs(1, seed=1)
    keys = plan.keys()
    seen = Downstream(_once(keys), _once(keys, **{keys[2]: 2}))
    check = check_run(plan, RunEnd("waiting"), _rows(plan.run_id, "completed"), seen)
    assert _flagged(check.problems) == ["no_key_sent_more_than_once"]
    assert [(c.received, c.extra_sends) for c in check.calls] == [(1, 0), (1, 0), (2, 1)]


def test_the_checks_allow_one_resend_per_rerun_after_not_attempted_and_no_other() -> None:
    [plan] = plan_runs(1, seed=1)
    keys = plan.keys()
    received = _once(keys, **{keys[0]: 2, keys[1]: 2, keys[2]: 3})
    rows = [{**row, "attempt": 2} for row in _rows(plan.run_id, "completed")]
    reruns = {
        keys[0]: Reruns(after_not_attempted=1),
        keys[1]: Reruns(after_other_failure=1),
        keys[2]: Reruns(after_not_attempted=1),
    }
    check = check_run(plan, RunEnd("waiting"), rows, Downstream(_once(keys), received, reruns))
    assert [(c.legit_resends, c.extra_sends) for c in check.calls] == [(1, 0), (0, 1), (1, 1)]
    assert _flagged(check.problems) == ["no_key_sent_more_than_once"] * 2
    assert judge_sends(0, Reruns(after_not_attempted=2)) == judge_sends(0, None)

    # A re-reservation the events do not explain: re-sends can no longer be told apart.
    rows[0]["attempt"] = 3
    check = check_run(plan, RunEnd("waiting"), rows, Downstream(_once(keys), received, reruns))
    assert sum("events show 1 re-reservations" in p for p in check.problems) == 1


def test_the_checks_flag_a_request_the_ledger_never_reserved() -> None:
    [plan] = plan_runs(1, seed=1)
    rows = [row for row in _rows(plan.run_id, "completed") if row["tool_call_id"] != "call_2_1"]
    keys = plan.keys()
    check = check_run(plan, RunEnd("waiting"), rows, Downstream(_once(keys[:2]), _once(keys)))
    assert _flagged(check.problems) == ["no_request_without_ledger_record"]


def test_the_checks_count_a_failed_or_stuck_run_as_lost() -> None:
    [plan] = plan_runs(1, seed=1)
    for end in (RunEnd("failed", "boom"), RunEnd("stuck"), None):
        problems = check_run(plan, end, [], Downstream({}, {})).problems
        assert [p.split(":")[0] for p in problems] == ["no_run_lost"]


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
