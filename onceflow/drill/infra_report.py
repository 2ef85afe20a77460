"""What the infrastructure drills add to the report: the failovers and Temporal restarts with their
timings, every ledger write the workers saw acknowledged compared with the promoted server, and how
soon runs resumed once Temporal was back.

Invariants (each can fail):
- acknowledged_writes_kept (synchronous replication): every call-path write a worker logged as
  acknowledged (ack_worker.py) is on the server the drill ends on, as far along as acknowledged
  (same attempt, same step or later), and no call needed restoring.
- lost_writes_made_visible (asynchronous replication): every call whose acknowledged write the
  failover lost was made a visible unknown (`lost_in_failover` event, reason in the queue) rather
  than read as "not sent"; none was lost silently.
- failovers_done, temporal_restarts_done: the planned faults all happened.
- runs_resume_after_temporal_restart: a run whose unknown call an operator settled while Temporal was
  down left its wait within its recheck interval (plus a few seconds) of Temporal being back.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import asyncpg

from onceflow.drill.infra import RESUME_SLACK, InfraChaos
from onceflow.drill.report import DrillReport
from onceflow.drill.scenario import RECHECK_SECONDS, TENANT
from onceflow.ledger.acknowledged import phase_of
from onceflow.ledger.lost_writes import LOST_KIND

# Read-only: the drill tenant's rows and the keys that carry a `lost_in_failover` event.
_ROWS = "SELECT key, status, attempt FROM tool_executions WHERE tenant = $1"
_LOST = """
SELECT DISTINCT e.key FROM tool_execution_events e JOIN tool_executions t ON t.key = e.key
 WHERE t.tenant = $1 AND e.kind = $2
"""


def read_acks(folder: Path) -> list[dict[str, Any]]:
    """Every acknowledged write the workers logged, in the order each worker logged them."""
    lines = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                lines.append(json.loads(line))
    return lines


def furthest(acks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per key, the acknowledged write furthest along (attempt, then step)."""
    best: dict[str, dict[str, Any]] = {}
    for ack in acks:
        rank = (ack["attempt"], phase_of(ack["status"]))
        held = best.get(ack["key"])
        if held is None or rank > (held["attempt"], phase_of(held["status"])):
            best[ack["key"]] = ack
    return best


async def add_infra_report(report: DrillReport, infra: InfraChaos, run_dir: Path, database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        rows = {r["key"]: r for r in await conn.fetch(_ROWS, TENANT)}
        lost = {r["key"] for r in await conn.fetch(_LOST, TENANT, LOST_KIND)}
    finally:
        await conn.close()
    acks = read_acks(run_dir / "acks")
    acked = furthest(acks)
    behind = []
    for key, ack in acked.items():
        row = rows.get(key)
        if row is None or (row["attempt"], phase_of(row["status"])) < (
            ack["attempt"],
            phase_of(ack["status"]),
        ):
            behind.append(key)
    silent = sorted(key for key in behind if key not in lost)
    config = infra.config
    failovers = [e for e in infra.events if e.kind == "failover"]
    restarts = [e for e in infra.events if e.kind == "temporal_restart"]
    # Once the workers poll Temporal again, a run whose call was settled meanwhile reads the ledger
    # within its recheck interval (its timer, or its reconciler's next round, which signals it).
    bound = RECHECK_SECONDS + RESUME_SLACK
    late = [r for r in infra.resumes if r.after_workers_back is None or r.after_workers_back > bound]

    problems: list[str] = []
    invariants: dict[str, bool | None] = {}
    if config.replication == "sync":
        invariants["acknowledged_writes_kept"] = not behind and not lost
        problems += [
            f"acknowledged_writes_kept: {key}: behind what a worker saw acknowledged" for key in behind
        ]
        problems += [f"acknowledged_writes_kept: {key}: had to be restored" for key in sorted(lost)]
    elif config.replication == "async":
        invariants["lost_writes_made_visible"] = not silent
        problems += [f"lost_writes_made_visible: {key}: lost without a {LOST_KIND} event" for key in silent]
    if config.replication and config.failovers:
        invariants["failovers_done"] = len(failovers) == config.failovers
    if config.temporal_restarts:
        invariants["temporal_restarts_done"] = len(restarts) == config.temporal_restarts
        invariants["runs_resume_after_temporal_restart"] = not late
        problems += [
            f"runs_resume_after_temporal_restart: {r.run_id}: "
            + (
                "never seen resuming (or the workers never polled again)"
                if r.after_workers_back is None
                else f"resumed {r.after_workers_back}s after the workers polled again"
            )
            for r in late
        ]
    if not failovers and config.replication and config.failovers:
        problems.append("failovers_done: no failover happened")
    if config.partitions:
        invariants["partitions_done"] = len(infra.cuts) == len(config.partitions)
        caught = [c for c in infra.cuts if c.on_the_wire]
        invariants["partitions_caught_calls_on_the_wire"] = len(caught) == len(infra.cuts)
        problems += [
            f"partitions_caught_calls_on_the_wire: {c.kind} cut of {c.worker} at {c.at_seconds}s: no call on the wire"
            for c in infra.cuts
            if not c.on_the_wire
        ]
        still_started = [key for key, row in rows.items() if row["status"] == "started"]
        invariants["no_call_left_started"] = not still_started
        problems += [f"no_call_left_started: {key}" for key in still_started]

    by_kind: dict[str, int] = defaultdict(int)
    for ack in acks:
        by_kind[ack["status"]] += 1
    report.invariants.update(invariants)
    report.problems += problems
    report.notes += infra.notes
    report.totals.update(
        {
            "ledger_replication": config.replication or "none",
            "failovers": len(failovers),
            "acknowledged_writes_logged": len(acks),
            "acknowledged_writes_by_status": dict(by_kind),
            "acknowledged_calls": len(acked),
            "acknowledged_calls_behind_at_end": len(behind),
            "calls_restored_after_failover": len(lost),
            "calls_lost_silently": len(silent),
            "ledger_disagreed_with_temporal": len(infra.disagreements),
            "temporal_restarts": len(restarts),
            "runs_settled_by_operator_while_temporal_down": len(infra.resumes),
            "slowest_resume_after_temporal_back_s": max(
                (r.resumed_after for r in infra.resumes if r.resumed_after is not None), default=None
            ),
            "slowest_workers_back_after_temporal_s": max(
                (
                    round(r.workers_back_at - r.temporal_back_at, 2)
                    for r in infra.resumes
                    if r.workers_back_at
                ),
                default=None,
            ),
            "slowest_resume_after_workers_back_s": max(
                (r.after_workers_back for r in infra.resumes if r.after_workers_back is not None),
                default=None,
            ),
            "operator_settlements": sum(1 for e in infra.events if e.kind == "operator_settle"),
            "partitions": len(infra.cuts),
            "calls_on_the_wire_at_cuts": sum(len(c.on_the_wire) for c in infra.cuts),
            "calls_seen_started_past_lease": len(infra.past_lease),
            "longest_started_past_lease_s": round(max(infra.past_lease.values(), default=0.0), 1),
        }
    )
    report.infra = {
        "events": [vars(e) for e in infra.events],
        "resumes": [{**vars(r), "after_workers_back": r.after_workers_back} for r in infra.resumes],
        "disagreements": infra.disagreements,
        "lost_in_failover": sorted(lost),
        "behind_at_end": sorted(behind),
        "cuts": [vars(c) for c in infra.cuts],
        "started_past_lease": {k: round(v, 1) for k, v in sorted(infra.past_lease.items())},
    }
