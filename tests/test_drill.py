"""The crash drill, a small one through the real `onceflow drill` command.

The small drill starts its own Temporal dev server, PostgreSQL, billing service (honouring no
idempotency key) and two worker processes, kills workers at every kill point on purpose and at
random, and must find every invariant holding. Its JSON report is checked here again from the raw
per-call figures, and the credit requests per key are counted again straight from the billing
service's own record, and the credits per run, account and amount from its credits table, so a
report whose verdicts were too kind would still fail this test. A drill whose workers are sabotaged
to send a write twice must fail; so must one whose credit tool declares an intent other than the
default, paying an unheard twin again (`allow`) or never paying a repeat the model asked after
hearing (`reuse`). The conflict and reset runs are counted again too, from billing's credits and
the conversations the drill's model wrapper wrote down (its `told` folder), and a drill whose
credit tool lets every repeat through (`allow`) must fail them. The drill's own checks, handed rows
and counts without a drill, are in tests/test_drill_checks.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from onceflow.drill.points import KillPoint
from onceflow.drill.processes import BILLING_DATABASE
from onceflow.drill.scenario import (
    CONFLICT_CALLS,
    CYCLE,
    FIRST_CREDIT,
    INTENT_OF_CALL,
    ORIGINAL_CALL,
    OWED_CALL,
    REISSUE_CALL,
    RETRY_CREDIT,
    WRITE_CALLS,
    RunPath,
)
from onceflow.local.postgres import EmbeddedPostgres, dsn_with_database

# Two runs plan each kill point (plan_runs cycles through them, then one run meets none, one walks
# the conflict path and one the reset path), so that a random kill that pre-empts one planned kill
# cannot leave its point unmet.
RUNS = len(CYCLE) + len(KillPoint)
PATHS = {path.value for path in RunPath}


def _drill(tmp_path: Path, *args: str, timeout: float = 220) -> tuple[int, dict[str, Any], str]:
    """Run `onceflow drill` with `args`; its exit code, JSON report and the tail of its output."""
    report_path = tmp_path / "report.json"
    command = [str(Path(sys.executable).parent / "onceflow"), "drill", *args]
    command += ["--data-dir", str(tmp_path / "drills"), "--report", str(report_path)]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    output = finished.stdout[-6000:] + finished.stderr[-3000:]
    assert report_path.exists(), output
    return finished.returncode, json.loads(report_path.read_text()), output


def billing_rows(report: dict[str, Any], query: str) -> list[tuple[Any, ...]]:
    """Rows straight from the billing service's own database, which the drill left in its folder:
    its PostgreSQL is started again on that data, read, and stopped."""
    server = EmbeddedPostgres(Path(report["run_dir"]) / "postgres")

    async def read() -> list[tuple[Any, ...]]:
        conn = await asyncpg.connect(dsn_with_database(server.dsn, BILLING_DATABASE))
        try:
            return [tuple(row) for row in await conn.fetch(query)]
        finally:
            await conn.close()

    try:
        return asyncio.run(read())
    finally:
        server.stop()


def credit_requests_per_key(report: dict[str, Any]) -> Counter[str | None]:
    """Credit requests per Idempotency-Key, read straight from the billing service's record."""
    rows = billing_rows(
        report,
        "SELECT idempotency_key FROM billing_received_requests WHERE method = 'POST' AND path = '/credits'",
    )
    return Counter(key for (key,) in rows)


def credits_by_key(report: dict[str, Any]) -> dict[str, list[str]]:
    """The credit ids billing applied under each key, straight from its own database."""
    rows = billing_rows(report, "SELECT idempotency_key, credit_id FROM billing_credits ORDER BY seq")
    found: dict[str, list[str]] = {}
    for key, credit_id in rows:
        found.setdefault(key, []).append(credit_id)
    return found


def last_told(report: dict[str, Any], run_id: str) -> dict[str, dict[str, Any]]:
    """What the model was told of each credit in the last conversation it was given in the run,
    read straight from the files the drill's model wrapper wrote (the latest written of the highest
    turn: after a reset, the new run's), by tool call id."""
    files = sorted(Path(report["run_dir"], "told").glob(f"{run_id}.*.json"), key=lambda p: p.stat().st_mtime)
    bodies = [json.loads(path.read_text()) for path in files]
    last = max(bodies, key=lambda body: body["turn"])  # max() keeps the first of equals: take the latest
    last = [body for body in bodies if body["turn"] == last["turn"]][-1]
    return {
        message["tool_call_id"]: json.loads(message["content"])
        for message in last["messages"]
        if message["role"] == "tool" and message["name"] == "issue_credit"
    }


def credits_per_intent(report: dict[str, Any]) -> Counter[tuple[str, str, int, str]]:
    """Credits billing applied per intent, straight from its credits table: (run, account, amount,
    and the intent's first call, since the original and its unheard twin are one intent, the repeat
    asked after hearing them another)."""
    rows = billing_rows(report, "SELECT idempotency_key, account_id, amount_cents FROM billing_credits")
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
        ids = [call["key"].rsplit(":", 1)[1] for call in run["calls"]]
        if run["point"] == RunPath.CONFLICT:
            assert ids == list(CONFLICT_CALLS), run
        elif run["point"] != RunPath.RESET:
            assert ids == list(WRITE_CALLS), run
        for call in run["calls"]:
            assert call["records"] <= 1 and call["effects"] <= 1, call
            assert call["received"] <= 1 + call["legit_resends"] and call["extra_sends"] == 0, call
            if (
                run["outcome"] == "completed"
                and run["point"] == RunPath.CONFLICT
                and call["key"].endswith(FIRST_CREDIT)
            ):
                # The run reports what it told the model, "failed"; the ledger's conflict was then
                # acknowledged as completed (or the operator was right and it stays failed).
                assert call["records"] == 1 and call["run_says"] == "failed", call
            elif run["outcome"] == "completed" and (run["point"] != RunPath.RESET or call["run_says"]):
                # A reset run reports the calls of its last Temporal run only.
                assert call["records"] == 1 and call["run_says"] == call["status"], call
            if call["status"] == "completed":
                assert call["effects"] == (0 if call["reused_from"] else 1), call
            if call["reused_from"]:
                assert call["received"] == 0, call
                assert run["point"] in PATHS or call["key"].endswith(REISSUE_CALL), call
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
    default_runs = {run["run_id"] for run in report["runs"] if run["point"] not in PATHS}
    assert paid and max(n for (run_id, *_), n in paid.items() if run_id in default_runs) == 1, paid
    lost_answer_then_reused = 0
    for run in report["runs"]:
        if run["point"] in PATHS:
            continue
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
    check_paths_again(report)


def check_paths_again(report: dict[str, Any]) -> None:
    """The conflict and reset runs, from billing's credits and what the model was told (its own
    conversations as written down), without the report's verdicts."""
    credits = credits_by_key(report)
    for run in report["runs"]:
        if run["point"] not in PATHS or run["outcome"] != "completed":
            continue
        run_id = run["run_id"]
        paid = {key: ids for key, ids in credits.items() if key.startswith(run_id + ":")}
        told = last_told(report, run_id)
        told_credits = [t["result"]["credit_id"] for t in told.values() if t.get("ok")]
        every_credit = sorted(i for ids in paid.values() for i in ids)
        if run["point"] == RunPath.CONFLICT:
            # One intent: the model was told the first credit "failed" and asked again.
            assert len(every_credit) == 1, (run_id, paid)
            first = paid.get(f"{run_id}:{FIRST_CREDIT}", [])
            retry = told[RETRY_CREDIT]
            if first:
                assert (retry["reused_from"], retry["result"]["credit_id"]) == (FIRST_CREDIT, first[0]), retry
        else:
            # Every credit paid for the run was told to the model once, and nothing else was.
            assert sorted(told_credits) == every_credit, (run_id, told, paid)
            assert len(set(told_credits)) == len(told_credits), told
    for path in PATHS:
        assert report["paths"][path]["walked"] >= 1, report["paths"]


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
    # No kills and no planned faults on the first two runs: each first credit completes. Declared
    # `allow`, its unheard twin is sent under its own key and paid again; declared `reuse`, the
    # repeat the model asked after hearing both is handed their result, so a credit owed is never
    # paid. Under `allow` a conflict run and a reset run go with them (one drill, not two): the
    # retry the model asked after it was told "failed" is sent while the first credit's conflict is
    # open (two credits for one intent, and the retry is told its own credit, not the first's), and
    # the re-issues after the reset are sent again (paid beyond the two credits the model asked for).
    paths = ("--only", "model", "--only", "before_send", "--only", "conflict", "--only", "reset")
    code, report, output = _drill(
        tmp_path,
        *("--runs", "4" if intent == "allow" else "2", "--seed", "3", "--timeout", "150"),
        *("--concurrency", "4", "--no-random-kills", "--no-planned-kills", "--sabotage-intent", intent),
        *(paths if intent == "allow" else ()),
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
    runs = sorted(run["run_id"] for run in report["runs"] if run["point"] not in PATHS)
    if intent == "allow":
        twice = sorted(
            run_id for (run_id, _, _, first), n in paid.items() if n > 1 and first == ORIGINAL_CALL
        )
        assert twice == runs, paid
        check_paths_failed(report)
    else:
        assert report["totals"]["intents_applied_more_than_once"] == 0, report["totals"]
        assert report["totals"]["owed_repeats_paid"] == 0, report["totals"]
        assert not any(first == OWED_CALL for (_, _, _, first) in paid), paid
        assert all(f"{run_id}:{OWED_CALL} was asked after the model heard" in output for run_id in runs)
    assert "SABOTAGED" in output


def check_paths_failed(report: dict[str, Any]) -> None:
    """Under `allow`: the conflict run paid its one intent twice and its retry was told its own
    credit; the reset run was paid credits its model was never told of."""
    assert report["invariants"]["reissues_told_their_own_original"] is False, report["invariants"]
    assert report["totals"]["intents_applied_more_than_once"] == 4, report["totals"]
    credits = credits_by_key(report)
    [conflict] = [run["run_id"] for run in report["runs"] if run["point"] == RunPath.CONFLICT]
    [reset] = [run["run_id"] for run in report["runs"] if run["point"] == RunPath.RESET]
    assert set(credits) >= {f"{conflict}:{FIRST_CREDIT}", f"{conflict}:{RETRY_CREDIT}"}, credits
    told = last_told(report, reset)
    paid = [i for key, ids in credits.items() if key.startswith(reset + ":") for i in ids]
    told_credits = {t["result"]["credit_id"] for t in told.values() if t.get("ok")}
    assert set(paid) - told_credits, (paid, told)  # paid beyond what the model was told of
    assert report["paths"]["reset"]["credits_paid_never_told"] >= 1, report["paths"]
    assert report["paths"]["conflict"]["told_another_calls_credit"] == 1, report["paths"]
