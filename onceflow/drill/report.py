"""After the drill: compare the ledger, the billing service and the runs, and say what held.

Each run is judged in judge.py (`check_run`); here the inputs are gathered from the ledger and
billing, the checks that look across runs are added, the totals counted, and the report rendered.

The headline is counted at the receiver: billing records every credit request on arrival, before
any dedup, and the drill runs it with `--no-dedup`, so a key onceflow sent twice shows twice
(sends.py). Invariants (each must hold for the drill to pass, and each can fail):
- no_key_sent_more_than_once: billing received no key's credit request more than once, except one
  more per re-reservation after a definite "not attempted" failure (counted apart as legit re-sends).
- no_intent_applied_more_than_once: billing paid no intent (a run's credit of one amount to one
  account, by the calls the default rule counts as one) more than once, whatever keys it came under,
  and exactly as often as the ledger says; an unheard twin is never paid again, a heard repeat is
  owed and sent (intents.py).
- no_request_without_ledger_record: every credit request billing received carries a key the ledger
  reserved.
- one_ledger_record_per_write_call: every write call a run reached has exactly one ledger record (a
  completed run reached all of them); no record exists for anything else.
- at_most_one_effect_per_key: billing applied no key twice.
- completed_calls_took_effect_once: a `completed` record has exactly one effect in billing (a reused
  one, handed an earlier call's result, has none).
- failed_calls_took_no_effect: a `failed` record has none.
- no_effect_without_ledger_record: billing applied nothing the ledger does not know about.
- runs_agree_with_ledger: what a finished run reports for each call is the ledger's status.
- no_run_lost: every run completed or visibly waits for an operator.
- unresolved_calls_are_visible: every call left unknown belongs to a run waiting on exactly it.
- reissues_told_their_own_original: in the conflict and reset runs, every credit the model was told
  of is one billing applied for the run, and a call handed an earlier call's result was told the
  credit billing applied under that call's key, never one told to another call (paths.py; what the
  model was told is read from the conversations it was given, told.py).
- every_kill_point_hit_on_purpose: each kill point was met, and confirmed, by a planned kill.
- every_path_walked: each path planned (a conflict, a reset) was walked to its end by at least one
  run, and no walk failed.

The conflict and reset runs are judged by the same key and intent invariants (their intents by what
the model was told), and their own figures are printed apart: requests per key, credits per intent,
and re-issues held, handed their original's result, or sent.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
from temporalio.client import Client
from temporalio.service import RPCError

from onceflow.drill.intents import AppliedCredit
from onceflow.drill.judge import CHECKED_BY_RECORDS, Downstream, RunCheck, RunEnd, check_run
from onceflow.drill.paths import path_figures
from onceflow.drill.points import KillPoint, still_armed
from onceflow.drill.scenario import OWED_CALL, REISSUE_CALL, TENANT, DrillConfig, PlannedRun, RunPath
from onceflow.drill.sends import EVENTS, reruns_by_key
from onceflow.drill.told import read_model_calls
from onceflow.drill.walks import Walk
from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import FailureKind, Ledger, Status
from onceflow.workflows.reconcile import reconcile_workflow_id

if TYPE_CHECKING:
    from onceflow.drill.kills import Killer


# Read-only: what the ledger holds for the drill's tenant (the ledger API reads one key at a time).
_ROWS = """
SELECT key, run_id, tool_call_id, tool_name, status, failure_kind, settled_by, attempt, reused_from, created_at,
       payload->'arguments'->>'account_id' AS account_id,
       (payload->'arguments'->>'amount_cents')::bigint AS amount_cents
FROM tool_executions WHERE tenant = $1
"""


@dataclass
class Unresolved:
    key: str
    status: str
    why: str
    reconciler: str


@dataclass
class DrillReport:
    command: dict[str, Any]
    run_dir: str
    wall_seconds: float
    totals: dict[str, Any]
    kills_per_point: dict[str, dict[str, int]]
    invariants: dict[str, bool | None]
    runs: list[RunCheck]
    unresolved: list[Unresolved]
    kills: list[dict[str, Any]]
    never_reached: list[str]
    notes: list[str]
    problems: list[str]
    receiver: dict[str, Any] = field(default_factory=dict)  # how billing was run (dedup or not)
    teardown_seconds: float = 0.0  # stopping the processes, after the checks
    # Per kind of run (kill point, path, or "locked"): runs, keys sent twice, intents paid twice.
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    paths: dict[str, dict[str, int]] = field(default_factory=dict)  # conflict and reset figures

    @property
    def ok(self) -> bool:
        return all(value is not False for value in self.invariants.values())

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, default=str))

    def text(self) -> str:
        lines = ["run                 planned        outcome     calls (ledger status/received/effects)"]
        for run in self.runs:
            calls = "  ".join(
                f"{c.key.rsplit(':', 1)[1]} {'reused' if c.reused_from else c.status or '-'}"
                f"/{c.received}/{c.effects}" + ("" if c.records <= 1 else f" x{c.records}")
                for c in run.calls
            )
            walked = ""
            if run.path is not None:
                walked = (
                    "  [walked]"
                    if run.path.walked
                    else "  [not walked: "
                    + ", ".join(f"{call} {said}" for call, said in run.path.told.items())
                    + "]"
                )
            mark = "" if not run.problems else "  <-- " + "; ".join(run.problems)
            lines.append(f"{run.run_id:<19} {run.point or '-':<14} {run.outcome:<11} {calls}{walked}{mark}")
        lines.append("")
        lines.append("per kind of run      runs  keys sent more than once  intents applied more than once")
        for kind, counts in self.by_kind.items():
            lines.append(
                f"  {kind:<18} {counts['runs']:>4}  {counts['keys_sent_more_than_once']:>24}"
                f"  {counts['intents_applied_more_than_once']:>30}"
            )
        for path, counts in self.paths.items():
            lines.append(f"{path} runs: " + ", ".join(f"{name} {value}" for name, value in counts.items()))
        lines.append("")
        lines.append("kills per point      planned(confirmed)  planned(unconfirmed)  random")
        for point, counts in self.kills_per_point.items():
            lines.append(
                f"  {point:<18} {counts['planned']:>18}  {counts['unconfirmed']:>20}  {counts['random']:>6}"
            )
        lines.append(f"receiver: {'dedups by key' if self.receiver.get('dedup') else 'honours no key'}")
        if self.command.get("sabotage"):
            lines.append("SABOTAGED: the workers send a write again after its timeout (a test of the drill)")
        if self.command.get("sabotage_intent"):
            lines.append(
                f"SABOTAGED: the credit tool declares intent {self.command['sabotage_intent']}, not the default"
                " (a test of the drill)"
            )
        for name, value in self.totals.items():
            lines.append(f"{name}: {value}")
        for item in self.unresolved:
            lines.append(f"left {item.status}: {item.key}: {item.why} (reconciler: {item.reconciler})")
        lines.extend(f"note: {note}" for note in self.notes)
        lines.extend(f"PROBLEM: {problem}" for problem in self.problems)
        lines.append("")
        for name, value in self.invariants.items():
            verdict = "n/a" if value is None else ("ok" if value else "FAILED")
            lines.append(f"  {verdict:<6} {name}")
        lines.append(
            f"drill {'PASSED' if self.ok else 'FAILED'} in {self.wall_seconds:.0f}s "
            f"(+{self.teardown_seconds:.0f}s to stop the processes); folder: {self.run_dir}"
        )
        return "\n".join(lines)


async def _explain(key: str, status: str, ledger: Ledger, client: Client) -> Unresolved:
    record = await ledger.get(key)
    reasons = [e.reason for e in record.events if e.reason]
    why = record.reason or (reasons[-1] if reasons else "no reason recorded")
    try:
        described = await client.get_workflow_handle(reconcile_workflow_id(key)).describe()
        reconciler = described.status.name if described.status else "unknown"
    except RPCError:
        reconciler = "never started"
    return Unresolved(key, status, why, reconciler)


async def collect_report(
    *,
    config: DrillConfig,
    run_dir: Path,
    plans: list[PlannedRun],
    ends: dict[str, RunEnd | None],
    walks: dict[str, Walk],
    told: Path,
    killer: Killer,
    client: Client,
    ledger: Ledger,
    billing: BillingClient,
    database_url: str,
    wall_seconds: float,
) -> DrillReport:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(_ROWS, TENANT)
        events = await conn.fetch(EVENTS, TENANT)
    finally:
        await conn.close()
    effects = (await billing.effects()).effects
    received = await billing.received_counts("POST", "/credits")
    credits = [
        AppliedCredit(c.idempotency_key, c.account_id, c.amount_cents, c.credit_id)
        for c in await billing.credits()
    ]
    held = frozenset(e["key"] for e in events if e["to_status"] == Status.HELD)
    downstream = Downstream(effects, received.counts, reruns_by_key(dict(e) for e in events), credits, held)
    rows_by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        rows_by_run[row["run_id"]].append(dict(row))
    model_calls = read_model_calls(told)
    runs = [
        check_run(
            plan,
            ends.get(plan.run_id),
            rows_by_run[plan.run_id],
            downstream,
            model_calls.get(plan.run_id, []),
            walks.get(plan.run_id),
        )
        for plan in plans
    ]

    problems = [p for run in runs for p in run.problems]
    known = {row["key"] for row in rows}
    planned_keys = {key for plan in plans for key in plan.keys()}
    strays = sorted(key for key in effects if key not in known)
    problems += [f"no_effect_without_ledger_record: {key}: applied, unknown to the ledger" for key in strays]
    unknown_sends = sorted(key for key in received.counts if key not in known and key not in planned_keys)
    problems += [
        f"no_request_without_ledger_record: {key}: received {received.count(key)} times, unknown to the ledger"
        for key in unknown_sends
    ]
    if received.keyless:
        problems.append(f"no_request_without_ledger_record: {received.keyless} credit requests without a key")
    unresolved = [
        await _explain(row["key"], row["status"], ledger, client)
        for row in rows
        if row["status"] in (Status.STARTED, Status.INDETERMINATE)
    ]
    waiting = {run.run_id for run in runs if run.outcome == "waiting"}
    invisible = [u.key for u in unresolved if u.key.rsplit(":", 1)[0] not in waiting]
    problems += [
        f"unresolved_calls_are_visible: {key}: unresolved, its run is not waiting" for key in invisible
    ]

    per_point = {p.value: {"planned": 0, "unconfirmed": 0, "random": 0} for p in KillPoint}
    for kill in killer.kills:
        for hit in kill.hits:
            column = "random" if kill.cause == "random" else ("planned" if hit.verified else "unconfirmed")
            per_point[hit.point.value][column] += 1
    never_reached = [f"{run_id} {point.value}" for run_id, point in still_armed(killer.markers)]
    all_calls = [c for run in runs for c in run.calls]
    all_intents = [i for run in runs for i in run.intents]

    invariants: dict[str, bool | None] = {
        name: not any(p.startswith(name + ":") for p in problems) for name in CHECKED_BY_RECORDS
    }
    invariants["at_most_one_effect_per_key"] = invariants["at_most_one_effect_per_key"] and all(
        n <= 1 for n in effects.values()
    )
    # Fewer runs than points cannot plan every point (nor can a plan of some kinds only); with
    # planned kills off, none is armed.
    covered = config.planned_kills and {plan.point for plan in plans} >= set(KillPoint)
    missed = [point for point, counts in per_point.items() if counts["planned"] < 1 and covered]
    invariants["every_kill_point_hit_on_purpose"] = not missed if covered else None
    problems += [f"every_kill_point_hit_on_purpose: {point}: no confirmed planned kill" for point in missed]
    planned_paths = {plan.path for plan in plans if plan.path is not None}
    walked = {RunPath(run.path.path) for run in runs if run.path is not None and run.path.walked}
    problems += [
        f"every_path_walked: {path.value}: no run walked it to its end" for path in planned_paths - walked
    ]
    invariants["every_path_walked"] = (
        not any(p.startswith("every_path_walked:") for p in problems) if planned_paths else None
    )
    outcomes = Counter(run.outcome for run in runs)
    reached = [c for c in all_calls if c.records or c.received]
    totals = {
        "runs": len(plans),
        "runs_lost": len(plans) - outcomes["completed"] - outcomes["waiting"],
        # The headline, counted at the receiver: goal 0.
        "keys_sent_more_than_once": sum(1 for c in all_calls if c.extra_sends)
        + sum(1 for key in unknown_sends if received.count(key) > 1),
        # The model's twin of it, counted from billing's credits per run, account and amount: goal 0.
        "intents_applied_more_than_once": sum(1 for i in all_intents if i.applied > 1),
        "legit_resends_after_not_attempted": sum(c.legit_resends for c in all_calls),
        "ledger_records_per_call": round(len(rows) / len(reached), 3) if reached else None,
        "credit_requests_received": received.total,
        "runs_completed": outcomes["completed"],
        "runs_waiting": outcomes["waiting"],
        "write_calls_reached": len(reached),
        "write_calls_recorded": len(rows),
        "calls_completed": sum(1 for c in all_calls if c.status == Status.COMPLETED),
        "calls_reused": sum(1 for c in all_calls if c.reused_from),
        # The unheard twins of the first credit (one intent with it): held while it was unresolved,
        # handed its result once it completed, sent once it was known not applied.
        "reissues_held": sum(1 for c in all_calls if c.key.endswith(":" + REISSUE_CALL) and c.key in held),
        "reissues_reused": sum(1 for c in all_calls if c.key.endswith(":" + REISSUE_CALL) and c.reused_from),
        "reissues_sent": sum(1 for c in all_calls if c.key.endswith(":" + REISSUE_CALL) and c.received),
        # The repeats asked after hearing both twins: new effects, owed, so sent (never a violation).
        "owed_repeats_sent": sum(1 for c in all_calls if c.key.endswith(":" + OWED_CALL) and c.received),
        "owed_repeats_paid": sum(1 for c in all_calls if c.key.endswith(":" + OWED_CALL) and c.effects),
        "intents": len(all_intents),
        "calls_failed": sum(1 for c in all_calls if c.status == Status.FAILED),
        "calls_failed_not_attempted": sum(
            1 for row in rows if row["failure_kind"] == FailureKind.NOT_ATTEMPTED
        ),
        "calls_settled_by_reconciler": sum(1 for c in all_calls if c.settled_by == "reconciler"),
        "calls_left_unresolved": len(unresolved),
        "effects_total": sum(effects.values()),
        "duplicate_effects": sum(max(0, n - 1) for n in effects.values()),
        "kills": len(killer.kills),
        "kills_planned": sum(1 for k in killer.kills if k.cause == "planned"),
        "kills_random": sum(1 for k in killer.kills if k.cause == "random"),
        "workers_killed": sum(len(k.pids) for k in killer.kills),
        # The conflict and reset runs, judged by what their model was told: goal 0 for each.
        "credit_ids_told_twice": sum(r.path.credit_ids_told_twice for r in runs if r.path),
        "told_another_calls_credit": sum(r.path.told_another_result for r in runs if r.path),
        "credits_paid_never_told": sum(r.path.untold_credits for r in runs if r.path),
    }
    by_kind: dict[str, dict[str, int]] = {}
    for run in runs:
        counts = by_kind.setdefault(
            run.point or "locked",
            {"runs": 0, "keys_sent_more_than_once": 0, "intents_applied_more_than_once": 0},
        )
        counts["runs"] += 1
        counts["keys_sent_more_than_once"] += sum(1 for c in run.calls if c.extra_sends)
        counts["intents_applied_more_than_once"] += sum(1 for i in run.intents if i.applied > 1)
    paths = {}
    for path in RunPath:
        mine = [run for run in runs if run.path is not None and run.path.path == path.value]
        paths[path.value] = path_figures(
            path,
            [run.path for run in mine if run.path is not None],
            [walks[run.run_id] for run in mine if run.run_id in walks],
            keys_sent_twice=sum(1 for run in mine for c in run.calls if c.extra_sends),
            intents_paid_twice=sum(1 for run in mine for i in run.intents if i.applied > 1),
        )
    command = {
        "runs": config.runs,
        "seed": config.seed,
        "workers": config.workers,
        "concurrency": config.concurrency,
        "random_kills": config.random_kills,
        "planned_kills": config.planned_kills,
        "kill_interval": list(config.kill_interval),
        "sabotage": config.sabotage,
        "sabotage_intent": config.sabotage_intent,
        "only": list(config.only),
    }
    return DrillReport(
        command=command,
        run_dir=str(run_dir),
        wall_seconds=round(wall_seconds, 1),
        totals=totals,
        kills_per_point=per_point,
        invariants=invariants,
        runs=runs,
        unresolved=unresolved,
        kills=[kill.to_json() for kill in killer.kills],
        never_reached=never_reached,
        notes=killer.notes,
        problems=problems,
        receiver={"dedup": await billing.dedups(), "url": killer.processes.billing_url},
        by_kind=by_kind,
        paths=paths,
    )
