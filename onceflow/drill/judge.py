"""Judge one drill run: each of its write calls against the ledger's records and what billing
received and applied, and, for the runs the drill walks down a path, against what the model was
told (told.py, paths.py).

`check_run` flags a problem per invariant it finds broken (the list is in report.py's docstring);
the invariants it alone decides are CHECKED_BY_RECORDS. Pure: it reads only what it is given, so a
test can hand it rows and counts (tests/test_drill_checks.py). report.py gathers the inputs, adds the
checks that look across runs, and renders the verdict.

The calls judged are the run's planned ones (scenario.py `write_calls`); a reset run's model mints
new ids, so its calls are whatever the ledger recorded and billing received under its run id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onceflow.drill.intents import INVARIANT as INTENT_INVARIANT
from onceflow.drill.intents import AppliedCredit, IntentCheck, judge_intents
from onceflow.drill.paths import TOLD_INVARIANT, PathCheck, judge_conflict, judge_reset
from onceflow.drill.scenario import FIRST_CREDIT, INTENT_OF_CALL, PlannedRun, RunPath
from onceflow.drill.sends import Reruns, judge_sends
from onceflow.drill.told import ModelCall
from onceflow.drill.walks import Walk
from onceflow.ledger import Status
from onceflow.sdk.payloads import AgentRunResult

CHECKED_BY_RECORDS = (
    "no_key_sent_more_than_once",
    INTENT_INVARIANT,
    TOLD_INVARIANT,
    "no_request_without_ledger_record",
    "one_ledger_record_per_write_call",
    "at_most_one_effect_per_key",
    "completed_calls_took_effect_once",
    "failed_calls_took_no_effect",
    "no_effect_without_ledger_record",
    "runs_agree_with_ledger",
    "no_run_lost",
    "unresolved_calls_are_visible",
)


@dataclass
class RunEnd:
    outcome: str  # completed | failed | waiting | stuck
    detail: str = ""
    result: AgentRunResult | None = None
    temporal_run_id: str | None = None  # the workflow's latest Temporal run, the one judged


@dataclass(frozen=True)
class Downstream:
    """What billing and the ledger's history say per key: credits applied, credit requests received,
    and re-reservations after failures."""

    effects: Mapping[str, int]
    received: Mapping[str, int]
    reruns: Mapping[str, Reruns] = field(default_factory=dict)
    credits: Sequence[AppliedCredit] = ()  # every credit billing applied: key, account, amount
    held: frozenset[str] = frozenset()  # keys the ledger held behind a twin at some point (events)


@dataclass
class CallCheck:
    key: str
    records: int
    status: str | None
    effects: int
    run_says: str | None = None
    settled_by: str | None = None
    received: int = 0  # credit requests billing received with this key
    legit_resends: int = 0  # of those, re-sends after a "not attempted" failure
    extra_sends: int = 0  # of those, re-sends nothing allows
    reused_from: str | None = None  # handed this earlier call's result by the intent guard; not sent


@dataclass
class RunCheck:
    run_id: str
    point: str | None
    outcome: str
    detail: str
    calls: list[CallCheck]
    problems: list[str] = field(default_factory=list)
    intents: list[IntentCheck] = field(default_factory=list)
    path: PathCheck | None = None  # conflict and reset runs: what the model was told, judged


def _calls_of(plan: PlannedRun, rows: Sequence[Mapping[str, Any]], received: Mapping[str, int]) -> list[str]:
    """The tool call ids to judge: the planned ones, or (reset runs) every one the ledger recorded,
    oldest first, then any billing received under the run's id without a record."""
    if plan.write_calls:
        return list(plan.write_calls)
    recorded = [row["tool_call_id"] for row in sorted(rows, key=lambda row: row.get("created_at") or 0)]
    prefix = plan.run_id + ":"
    unrecorded = sorted(
        key.removeprefix(prefix) for key in received if key.startswith(prefix) and key.count(":") == 1
    )
    return recorded + [call for call in unrecorded if call not in recorded]


def check_run(
    plan: PlannedRun,
    end: RunEnd | None,
    rows: Sequence[Mapping[str, Any]],
    downstream: Downstream,
    told: Sequence[ModelCall] = (),
    walk: Walk | None = None,
) -> RunCheck:
    """Judge one run; `told` (the model calls written down for it) and `walk` (what the drill did
    to it) matter only for the runs of a path."""
    by_call = Counter(row["tool_call_id"] for row in rows)
    row_of = {row["tool_call_id"]: row for row in rows}
    says = {}
    if end is not None and end.result is not None:
        says = {c.tool_call_id: c.status for c in end.result.calls}
    outcome = end.outcome if end else "not started"
    check = RunCheck(plan.run_id, plan.kind, outcome, end.detail if end else "", [])

    def flag(invariant: str, message: str) -> None:
        check.problems.append(f"{invariant}: {message}")

    calls = _calls_of(plan, rows, downstream.received)
    for call in calls:
        key = f"{plan.run_id}:{call}"
        row = row_of.get(call)
        status = row["status"] if row else None
        sends = judge_sends(downstream.received.get(key, 0), downstream.reruns.get(key))
        found = CallCheck(
            key,
            by_call[call],
            status,
            downstream.effects.get(key, 0),
            says.get(call),
            row["settled_by"] if row else None,
            received=sends.received,
            legit_resends=sends.legit_resends,
            extra_sends=sends.extra,
            reused_from=row.get("reused_from") if row else None,
        )
        check.calls.append(found)
        if found.extra_sends:
            flag(
                "no_key_sent_more_than_once",
                f"{key}: billing received it {found.received} times"
                f" ({found.legit_resends} re-sends after not-attempted allowed)",
            )
        reruns = downstream.reruns.get(key, Reruns())
        if row and row.get("attempt", 1) - 1 != reruns.after_not_attempted + reruns.after_other_failure:
            # The events must explain every re-reservation, or re-sends cannot be told apart.
            flag(
                "no_key_sent_more_than_once",
                f"{key}: attempt {row['attempt']}, yet its events show "
                f"{reruns.after_not_attempted + reruns.after_other_failure} re-reservations",
            )
        if found.received and status is None:
            flag("no_request_without_ledger_record", f"{key}: sent without a ledger record")
        if found.records > 1:
            flag("one_ledger_record_per_write_call", f"{key}: {found.records} ledger records")
        if found.records == 0 and outcome == "completed" and (plan.write_calls or call in says):
            flag("one_ledger_record_per_write_call", f"{key}: the run completed, the ledger has no record")
        if found.effects > 1:
            flag("at_most_one_effect_per_key", f"{key}: applied {found.effects} times")
        wanted = 0 if found.reused_from else 1  # a reused call was never sent
        if status == Status.COMPLETED and found.effects != wanted:
            flag("completed_calls_took_effect_once", f"{key}: completed, {found.effects} effects in billing")
        if status == Status.FAILED and found.effects != 0:
            flag("failed_calls_took_no_effect", f"{key}: failed, yet applied {found.effects} times")
        if status is None and found.effects:
            flag("no_effect_without_ledger_record", f"{key}: took effect without a ledger record")
        # A reset run's result names the calls of its last Temporal run only; the earlier ones
        # were made in the history the reset discarded. A conflict run acted on the operator's
        # "failed" for its first credit: the conflict acknowledged later changes the ledger's row,
        # not what the run was told (its retry was then handed the credit's result).
        told_status = status
        if plan.path is RunPath.CONFLICT and call == FIRST_CREDIT and walk is not None and walk.acknowledged:
            told_status = Status.FAILED
        if outcome == "completed" and found.run_says != told_status and (plan.write_calls or call in says):
            flag("runs_agree_with_ledger", f"{key}: the run says {found.run_says}, the ledger {status}")
    for call in set(by_call) - set(calls):
        flag(
            "one_ledger_record_per_write_call", f"{plan.run_id}:{call}: a record for a call that is no write"
        )
    if outcome not in ("completed", "waiting"):
        flag("no_run_lost", f"{plan.run_id}: {outcome} {check.detail}".strip())
    if plan.path is RunPath.RESET:
        check.path = judge_reset(plan, end, downstream.credits, downstream.received, told, walk)
        check.intents = check.path.intents
    else:
        intent_of: Mapping[str, str] = INTENT_OF_CALL
        if plan.path is RunPath.CONFLICT:
            check.path = judge_conflict(plan, end, downstream.credits, downstream.received, told, walk)
            intent_of = check.path.intent_of
        check.intents, problems = judge_intents(
            plan, outcome, rows, downstream.credits, downstream.received, downstream.held, intent_of
        )
        check.problems += problems
    if check.path is not None:
        check.path.held = [key for key in check.path.reissues if key in downstream.held]
        check.problems += check.path.problems
    return check
