"""`onceflow demo`: watch a lost response get reconciled, and a refusal that sent nothing.

Each scenario starts a real run of `billing-assistant`, makes the billing service misbehave for that
run's account only, waits for the run, then reports what the model asked, what the ledger recorded
and how many times the billing service applied the credit. Exit status 0 only if every scenario
ended as it should.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from examples.billing.client import BillingClient
from ledger import Ledger, Status, ToolExecutionRecord
from onceflow.client import connect, start_run
from onceflow.config import Settings
from onceflow.dev import StackInfo
from onceflow.payloads import AgentRunInput

AGENT = "billing-assistant"
TENANT = "demo"


@dataclass(frozen=True)
class Scenario:
    name: str
    story: str
    fault: str | None  # billing fault mode for this run's account
    expect_status: Status
    expect_effects: int
    expect_settled_by: Callable[[str | None], bool] = lambda _: True


SCENARIOS = [
    Scenario(
        "lost-response",
        "The credit is applied, but the answer never comes back within the tool's timeout. The call "
        "goes indeterminate; the reconcile hook finds the credit by its key and settles it completed.",
        fault="apply_then_hang",
        expect_status=Status.COMPLETED,
        expect_effects=1,
        expect_settled_by=lambda who: who == "reconciler",
    ),
    Scenario(
        "refused-before-sending",
        "The account is locked, so the billing service refuses at the door. The call is failed "
        "(not attempted): nothing to reconcile, and the model is told.",
        fault="locked",
        expect_status=Status.FAILED,
        expect_effects=0,
    ),
]


@dataclass
class ScenarioReport:
    name: str
    run_id: str
    ok: bool
    problems: list[str]
    final: str | None
    key: str | None
    record: dict[str, Any] | None
    effects: int
    ui_url: str | None


async def run_scenario(
    scenario: Scenario, info: StackInfo, ledger: Ledger, billing: BillingClient
) -> ScenarioReport:
    suffix = uuid.uuid4().hex[:8]
    order_id = f"ord_{scenario.name.replace('-', '_')}_{suffix}"
    account_id = f"acct_{order_id.removeprefix('ord_')}"
    if scenario.fault:
        await billing.set_account_fault(account_id, scenario.fault, delay_seconds=15, times=1)
    client = await connect(Settings.from_env())
    run_id = f"demo-{scenario.name}-{suffix}"
    handle = await start_run(
        client,
        AgentRunInput(agent=AGENT, tenant=TENANT, input=json.dumps({"order_id": order_id})),
        run_id=run_id,
        task_queue=info.task_queue,
    )
    problems: list[str] = []
    final = None
    try:
        result = await asyncio.wait_for(handle.result(), 90)
        final = result.final
    except Exception as exc:
        problems.append(f"the run did not finish: {exc}")
    key = f"{run_id}:call_1_0"
    record = await ledger.find(key)
    effects = (await billing.effects()).count(key)
    if record is None:
        problems.append("no ledger record for the credit call")
    else:
        if record.status is not scenario.expect_status:
            problems.append(f"ledger says {record.status}, expected {scenario.expect_status}")
        if not scenario.expect_settled_by(record.settled_by):
            problems.append(f"settled by {record.settled_by!r}")
    if effects != scenario.expect_effects:
        problems.append(f"billing applied the credit {effects} times, expected {scenario.expect_effects}")
    return ScenarioReport(
        name=scenario.name,
        run_id=run_id,
        ok=not problems,
        problems=problems,
        final=final,
        key=key,
        record=_record_view(await ledger.get(key)) if record else None,
        effects=effects,
        ui_url=info.run_url(run_id),
    )


def _record_view(record: ToolExecutionRecord) -> dict[str, Any]:
    return {
        "status": record.status.value,
        "key": record.key,
        "tool": record.tool_name,
        "arguments": record.payload.get("arguments"),
        "attempt": record.attempt,
        "settled_by": record.settled_by,
        "reason": record.reason or record.error,
        "history": [
            f"{e.from_status or '(new)'} -> {e.to_status} by {e.actor}" for e in record.events if e.to_status
        ],
    }


def print_report(scenario: Scenario, report: ScenarioReport) -> None:
    mark = "PASS" if report.ok else "FAIL"
    print(f"\n== {scenario.name} [{mark}]")
    print(f"   {scenario.story}")
    if report.record:
        r = report.record
        print(f"   model asked:  {r['tool']}({json.dumps(r['arguments'], sort_keys=True)})")
        print(f"   ledger:       {r['status']}  key={r['key']}  attempt={r['attempt']}")
        print(f"   settled by:   {r['settled_by']}  ({r['reason']})")
        for line in r["history"]:
            print(f"                 {line}")
    print(f"   billing:      credit applied {report.effects} time(s)")
    print(f"   model heard:  {report.final}")
    for problem in report.problems:
        print(f"   PROBLEM:      {problem}")
    if report.ui_url:
        print(f"   Temporal UI:  {report.ui_url}")


async def run_demo(info: StackInfo) -> list[ScenarioReport]:
    ledger = await Ledger.connect(info.database_url)
    reports = []
    try:
        async with BillingClient(info.billing_url) as billing:
            for scenario in SCENARIOS:
                report = await run_scenario(scenario, info, ledger, billing)
                print_report(scenario, report)
                reports.append(report)
    finally:
        await ledger.close()
    return reports
