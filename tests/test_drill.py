"""The crash drill: a small one through the real `onceflow drill` command, and the drill's own checks.

The small drill starts its own Temporal dev server, PostgreSQL, billing service and two worker
processes, kills workers at every kill point on purpose and at random, and must find every invariant
holding. Its JSON report is checked here again from the raw per-call figures, so a report whose
verdicts were too kind would still fail this test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from onceflow.drill.points import MARKERS_ENV, KillPoint, arm, claim, read_held, still_armed
from onceflow.drill.report import RunEnd, check_run
from onceflow.drill.scenario import WRITE_CALLS, plan_runs

RUNS = 10


def test_small_drill_loses_no_run_and_applies_no_key_twice(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    command = [str(Path(sys.executable).parent / "onceflow"), "drill", "--runs", str(RUNS), "--seed", "11"]
    command += ["--data-dir", str(tmp_path / "drills"), "--report", str(report_path), "--timeout", "170"]
    command += ["--concurrency", str(RUNS)]  # all at once: the random kills end when the points are met
    finished = subprocess.run(command, capture_output=True, text=True, timeout=220)
    output = finished.stdout[-6000:] + finished.stderr[-3000:]
    assert report_path.exists(), output
    report: dict[str, Any] = json.loads(report_path.read_text())

    assert finished.returncode == 0, output
    assert report["ok"], output
    assert all(value is True for value in report["invariants"].values()), report["invariants"]

    totals = report["totals"]
    assert totals["runs"] == RUNS
    assert totals["runs_lost"] == 0
    assert totals["duplicate_effects"] == 0
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
            if run["outcome"] == "completed":
                assert call["records"] == 1 and call["run_says"] == call["status"], call
            if call["status"] == "completed":
                assert call["effects"] == 1, call
            if call["status"] in ("failed", None):
                assert call["effects"] == 0, call
    confirmed = [hit for kill in report["kills"] if kill["cause"] == "planned" for hit in kill["hits"]]
    assert {hit["point"] for hit in confirmed if hit["verified"]} == {p.value for p in KillPoint}


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


def test_the_checks_flag_a_second_effect_and_an_effect_behind_a_failed_record() -> None:
    [plan] = plan_runs(1, seed=1)
    effects = {key: 1 for key in plan.keys()}
    assert check_run(plan, RunEnd("waiting"), _rows(plan.run_id, "completed"), effects).problems == []

    effects[plan.keys()[0]] = 2
    problems = check_run(plan, RunEnd("waiting"), _rows(plan.run_id, "completed"), effects).problems
    assert any(p.startswith("at_most_one_effect_per_key:") for p in problems)
    assert any(p.startswith("completed_calls_took_effect_once:") for p in problems)

    problems = check_run(plan, RunEnd("waiting"), _rows(plan.run_id, "failed"), {plan.keys()[1]: 1}).problems
    assert [p.split(":")[0] for p in problems] == ["failed_calls_took_no_effect"]


def test_the_checks_count_a_failed_or_stuck_run_as_lost() -> None:
    [plan] = plan_runs(1, seed=1)
    for end in (RunEnd("failed", "boom"), RunEnd("stuck"), None):
        problems = check_run(plan, end, [], {}).problems
        assert [p.split(":")[0] for p in problems] == ["no_run_lost"]
