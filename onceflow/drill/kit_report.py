"""The receiver drill's verdict (onceflow/drill/kit.py): billing's own tables against the ledger.

Invariants (each must hold, each can fail):
- no_effect_twice: billing applied no key twice, and no run's credit (its account) twice;
- completed_calls_took_effect_once, failed_calls_took_no_effect: the ledger agrees with billing;
- no_effect_without_ledger_record: billing applied nothing the ledger does not know;
- unknowns_were_made: the faults and kills did lose answers (else the drill proved nothing);
- no_unknown_left_for_a_person: every call that went unknown was settled, and by no operator: by the
  kit (the reconciler's lookup and fence at the receiver) or by a late answer of its own owner;
- every_run_completed: every run finished, having heard its credit's outcome.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, Status

if TYPE_CHECKING:
    from onceflow.drill.kit import KitDrillConfig, KitPlan

# Read-only: the drill's calls, and which of them ever went unknown.
_ROWS = """
SELECT t.key, t.run_id, t.status, t.failure_kind, t.settled_by, t.reason, t.evidence,
       EXISTS (SELECT 1 FROM tool_execution_events e
                WHERE e.key = t.key AND e.to_status = 'indeterminate') AS went_unknown
  FROM tool_executions t WHERE t.tenant = $1
"""
KIT_SOURCE = "onceflow.receiver"


@dataclass
class KitRunEnd:
    outcome: str  # completed | failed | stuck
    detail: str = ""


@dataclass
class KitDrillReport:
    command: dict[str, Any]
    run_dir: str
    wall_seconds: float
    totals: dict[str, Any]
    invariants: dict[str, bool]
    problems: list[str]
    notes: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(self.invariants.values())

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, default=str))

    def text(self) -> str:
        t = self.totals
        lines = [
            f"runs: {t['runs']} ({t['runs_completed']} completed); kills: {t['worker_kills']} workers, "
            f"{t['receiver_kills']} of the receiver",
            f"credits applied: {t['effects_total']}; effects twice: {t['effects_twice']}",
            f"calls: {t['calls_completed']} completed, {t['calls_failed']} failed",
            f"unknowns made: {t['unknowns_made']}",
            f"  settled by the kit: {t['settled_by_kit']} ({t['settled_by_kit_completed']} completed from the "
            f"receiver's record, {t['settled_by_kit_failed']} failed: no record, fenced)",
            f"  settled by a late answer of their own: {t['settled_by_late_answer']}",
            f"  settled by a person: {t['settled_by_person']}",
            f"  left: {t['unknowns_left']}",
        ]
        lines.extend(f"note: {note}" for note in self.notes[:20])
        lines.extend(f"PROBLEM: {problem}" for problem in self.problems)
        lines.append("")
        lines.extend(f"  {'ok' if value else 'FAILED':<6} {name}" for name, value in self.invariants.items())
        lines.append(
            f"receiver drill {'PASSED' if self.ok else 'FAILED'} in {self.wall_seconds:.0f}s; folder: {self.run_dir}"
        )
        return "\n".join(lines)


def _evidence(row: Any) -> dict[str, Any]:
    evidence = row["evidence"]
    if isinstance(evidence, str):
        evidence = json.loads(evidence)
    return evidence if isinstance(evidence, dict) else {}


async def collect_kit_report(
    *,
    config: KitDrillConfig,
    run_dir: Path,
    plans: list[KitPlan],
    ends: dict[str, KitRunEnd],
    ledger: Ledger,
    database_url: str,
    billing: BillingClient,
    worker_kills: int,
    receiver_kills: int,
    notes: list[str],
    wall_seconds: float,
) -> KitDrillReport:
    conn = await asyncpg.connect(database_url)
    try:
        rows = {row["key"]: row for row in await conn.fetch(_ROWS, "drill-kit")}
    finally:
        await conn.close()
    effects = (await billing.effects()).effects
    per_account = Counter(credit.account_id for credit in await billing.credits())
    problems: list[str] = []

    def flag(invariant: str, message: str) -> None:
        problems.append(f"{invariant}: {message}")

    calls = []
    tally: Counter[str] = Counter()
    for plan in plans:
        row = rows.get(plan.key)
        applied = effects.get(plan.key, 0)
        status = row["status"] if row else None
        call = {
            "key": plan.key,
            "fault": plan.fault,
            "status": status,
            "effects": applied,
            "run": ends[plan.run_id].outcome,
        }
        if applied > 1 or per_account[plan.account_id] > 1:
            flag(
                "no_effect_twice",
                f"{plan.key}: {applied} credits under its key, {per_account[plan.account_id]} to its account",
            )
        if status == Status.COMPLETED and applied != 1:
            flag("completed_calls_took_effect_once", f"{plan.key}: completed, {applied} credits")
        if status == Status.FAILED and applied != 0:
            flag("failed_calls_took_no_effect", f"{plan.key}: failed, yet {applied} credits")
        if row is None and applied:
            flag("no_effect_without_ledger_record", f"{plan.key}: applied, no ledger record")
        if ends[plan.run_id].outcome != "completed":
            flag(
                "every_run_completed",
                f"{plan.run_id}: {ends[plan.run_id].outcome} {ends[plan.run_id].detail}".strip(),
            )
        if row is not None and row["went_unknown"]:
            tally["unknowns_made"] += 1
            call["went_unknown"] = True
            by_kit = row["settled_by"] == "reconciler" and _evidence(row).get("source") == KIT_SOURCE
            if status in (Status.INDETERMINATE, Status.STARTED):
                tally["unknowns_left"] += 1
                flag("no_unknown_left_for_a_person", f"{plan.key}: still {status}")
            elif by_kit:
                tally["settled_by_kit"] += 1
                tally[f"settled_by_kit_{status}"] += 1
            elif str(row["settled_by"] or "").startswith("operator:"):
                tally["settled_by_person"] += 1
                flag("no_unknown_left_for_a_person", f"{plan.key}: settled by {row['settled_by']}")
            else:
                tally["settled_by_late_answer"] += 1
            call["settled_by"] = row["settled_by"]
        calls.append(call)
    known = {plan.key for plan in plans}
    for key in sorted(set(effects) - known):
        flag("no_effect_without_ledger_record", f"{key}: applied, not a key of this drill")
    if tally["unknowns_made"] == 0:
        flag("unknowns_were_made", "no answer was lost: the drill proved nothing")
    names = (
        "no_effect_twice",
        "completed_calls_took_effect_once",
        "failed_calls_took_no_effect",
        "no_effect_without_ledger_record",
        "unknowns_were_made",
        "no_unknown_left_for_a_person",
        "every_run_completed",
    )
    invariants = {name: not any(p.startswith(name + ":") for p in problems) for name in names}
    statuses = Counter(str(row["status"]) for row in rows.values())
    totals = {
        "runs": len(plans),
        "runs_completed": sum(1 for end in ends.values() if end.outcome == "completed"),
        "worker_kills": worker_kills,
        "receiver_kills": receiver_kills,
        "effects_total": sum(effects.values()),
        "effects_twice": sum(1 for n in effects.values() if n > 1)
        + sum(1 for n in per_account.values() if n > 1),
        "calls_completed": statuses[Status.COMPLETED.value],
        "calls_failed": statuses[Status.FAILED.value],
        **{
            name: tally[name]
            for name in (
                "unknowns_made",
                "settled_by_kit",
                "settled_by_kit_completed",
                "settled_by_kit_failed",
                "settled_by_late_answer",
                "settled_by_person",
                "unknowns_left",
            )
        },
    }
    command = {
        "runs": config.runs,
        "seed": config.seed,
        "workers": config.workers,
        "concurrency": config.concurrency,
    }
    return KitDrillReport(
        command, str(run_dir), round(wall_seconds, 1), totals, invariants, problems, notes, calls
    )
