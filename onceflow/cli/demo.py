"""`onceflow demo`: the reference post's four scenarios, plus approval and a model that asks again,
on a real stack.

Each scenario starts real runs of a billing agent, makes the billing service misbehave for that
run's account only, plays the operator where the story needs one (over the operator HTTP API, with
a token of the demo tenant), waits for the run, then reports what the model asked, what the ledger
recorded and what the billing service did. Exit status 0 only if every scenario ended as it should.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from temporalio.client import Client

from onceflow.cli.dev import StackInfo
from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, OperatorTokens, Status, ToolExecutionRecord
from onceflow.runtime.client import connect, start_run
from onceflow.runtime.config import Settings
from onceflow.sdk.payloads import AgentRunInput, Phase
from onceflow.workflows.agent_run import AgentRunWorkflow

TENANT = "demo"
CREDIT_CALL = "call_1_0"  # the second model turn's only call: issue_credit
REPEAT_CALL = "call_2_0"  # billing-assistant-repeat: the third turn asks for the same credit again


@dataclass
class Demo:
    """What a scenario can use: the stack, the ledger, the billing service and an operator's API."""

    info: StackInfo
    client: Client
    ledger: Ledger
    billing: BillingClient
    api: httpx.AsyncClient

    async def start(self, agent: str, order_id: str, run_id: str) -> Any:
        return await start_run(
            self.client,
            AgentRunInput(agent=agent, tenant=TENANT, input=json.dumps({"order_id": order_id})),
            run_id=run_id,
            task_queue=self.info.task_queue,
        )

    async def wait_for_phase(self, run_id: str, phase: Phase, timeout: float = 60) -> None:
        handle = self.client.get_workflow_handle_for(AgentRunWorkflow.run, run_id)
        async with asyncio.timeout(timeout):
            while (await handle.query(AgentRunWorkflow.status)).phase != phase:
                await asyncio.sleep(0.2)

    async def operator(self, key: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.api.post(f"/v1/tool-executions/{key}/{action}", json=body)
        if response.status_code >= 300:
            raise RuntimeError(f"{action} {key}: HTTP {response.status_code}: {response.text}")
        answer: dict[str, Any] = response.json()
        return answer


@dataclass
class RunReport:
    run_id: str
    key: str
    final: str | None
    record: dict[str, Any] | None
    effects: int
    voided: bool
    ui_url: str | None


@dataclass
class ScenarioReport:
    name: str
    story: str
    ok: bool
    problems: list[str]
    runs: list[RunReport] = field(default_factory=list)


@dataclass(frozen=True)
class Expect:
    status: Status
    effects: int
    settled_by: str | None = None  # a prefix, e.g. "reconciler" or "operator:"
    voided: bool = False


@dataclass(frozen=True)
class Scenario:
    name: str
    story: str
    agent: str
    fault: str | None
    expect: list[Expect]
    # What the operator does while the runs wait: given the demo and the credit calls' keys.
    operator: Callable[[Demo, list[str]], Awaitable[None]] | None = None
    # What must become of each run's repeated credit (REPEAT_CALL), for agents that ask twice.
    repeat: Expect | None = None


async def _settle_never_landed(demo: Demo, keys: list[str]) -> None:
    (key,) = keys
    await demo.wait_for_phase(key.rsplit(":", 1)[0], Phase.AWAITING_RECONCILIATION)
    # Ask billing by key, fencing it so that a late arrival can never land; then say what we found.
    found = await demo.billing.fence_key(key)
    if found is not None:
        raise RuntimeError(f"billing has a credit under {key}; this scenario expects none")
    await demo.operator(
        key,
        "resolve",
        {
            "status": "failed",
            "reason": "billing has no credit under this key; the key is fenced",
            "evidence": {"billing_lookup": "none", "fenced": True},
        },
    )


async def _compensate(demo: Demo, keys: list[str]) -> None:
    (key,) = keys
    run_id = key.rsplit(":", 1)[0]
    await demo.client.get_workflow_handle(run_id).result()
    started = await demo.operator(
        key, "compensate", {"reason": "duplicate complaint: the customer was credited twice"}
    )
    await demo.client.get_workflow_handle(started["workflow_id"]).result()


async def _approve_one_deny_one(demo: Demo, keys: list[str]) -> None:
    approve, deny = keys
    for key in keys:
        await demo.wait_for_phase(key.rsplit(":", 1)[0], Phase.AWAITING_APPROVAL)
    await demo.operator(approve, "approve", {"reason": "amount matches the order"})
    await demo.operator(deny, "deny", {"reason": "order already refunded by the store"})


SCENARIOS = [
    Scenario(
        "lost-response",
        "The credit is applied, but the answer never comes back within the tool's timeout. The call "
        "goes indeterminate; the reconcile hook finds the credit by its key and settles it completed.",
        agent="billing-assistant",
        fault="apply_then_hang",
        expect=[Expect(Status.COMPLETED, effects=1, settled_by="reconciler")],
    ),
    Scenario(
        "never-landed",
        "The billing service fails before applying and says so only with a 503, so nobody knows. "
        "This tool has no reconcile hook: an operator checks billing by key (none; the key is fenced) "
        "and settles the call failed over the HTTP API. The run goes on and the model hears it failed.",
        agent="billing-assistant-manual",
        fault="fail_before_apply",
        expect=[Expect(Status.FAILED, effects=0, settled_by="operator:")],
        operator=_settle_never_landed,
    ),
    Scenario(
        "compensated",
        "The credit is applied and recorded. Later an operator asks for it to be undone: a "
        "CompensationWorkflow voids it once, under its own key, and the call becomes compensated.",
        agent="billing-assistant",
        fault=None,
        expect=[Expect(Status.COMPENSATED, effects=1, voided=True)],
        operator=_compensate,
    ),
    Scenario(
        "refused-before-sending",
        "The account is locked, so the billing service refuses at the door. The call is failed "
        "(not attempted): nothing to reconcile, and the model is told.",
        agent="billing-assistant",
        fault="locked",
        expect=[Expect(Status.FAILED, effects=0)],
    ),
    Scenario(
        "approval",
        "Two credits need an operator's approval; nothing is sent while they wait. One is approved "
        "and applied once; the other is denied and never sent.",
        agent="billing-assistant-approval",
        fault=None,
        expect=[
            Expect(Status.COMPLETED, effects=1),
            Expect(Status.DENIED, effects=0, settled_by="operator:"),
        ],
        operator=_approve_one_deny_one,
    ),
    Scenario(
        "asked-again",
        "The credit is applied but its answer is lost; the reconcile hook finds it. The model then "
        "asks for the same credit again under a new call id. The tool declares a repeat to be the "
        "same intent, so the ledger hands back the first credit and billing is asked once.",
        agent="billing-assistant-repeat",
        fault="apply_then_hang",
        expect=[Expect(Status.COMPLETED, effects=1, settled_by="reconciler")],
        repeat=Expect(Status.COMPLETED, effects=0, settled_by="onceflow:guard"),
    ),
]


async def run_scenario(scenario: Scenario, demo: Demo) -> ScenarioReport:
    report = ScenarioReport(scenario.name, scenario.story, ok=False, problems=[])
    suffix = uuid.uuid4().hex[:8]
    run_ids = [f"demo-{scenario.name}-{suffix}-{i}" for i in range(len(scenario.expect))]
    orders = [f"ord_{scenario.name.replace('-', '_')}_{suffix}_{i}" for i in range(len(run_ids))]
    if scenario.fault:
        for order_id in orders:
            account = f"acct_{order_id.removeprefix('ord_')}"
            await demo.billing.set_account_fault(account, scenario.fault, delay_seconds=15, times=1)
    handles = [await demo.start(scenario.agent, o, r) for o, r in zip(orders, run_ids, strict=True)]
    keys = [f"{run_id}:{CREDIT_CALL}" for run_id in run_ids]
    try:
        if scenario.operator:
            await asyncio.wait_for(scenario.operator(demo, keys), 90)
    except Exception as exc:
        report.problems.append(f"the operator's part failed: {exc}")
    for handle, key, expect in zip(handles, keys, scenario.expect, strict=True):
        report.runs.append(await _check_run(demo, handle, key, expect, report.problems))
        if scenario.repeat:
            repeat = f"{handle.id}:{REPEAT_CALL}"
            report.runs.append(await _check_run(demo, handle, repeat, scenario.repeat, report.problems))
    report.ok = not report.problems
    return report


async def _check_run(demo: Demo, handle: Any, key: str, expect: Expect, problems: list[str]) -> RunReport:
    final = None
    try:
        final = (await asyncio.wait_for(handle.result(), 90)).final
    except Exception as exc:
        problems.append(f"{handle.id} did not finish: {exc}")
    record = await demo.ledger.find(key)
    effect = await demo.billing.effect(key)
    if record is None:
        problems.append(f"{key}: no ledger record")
    else:
        if record.status is not expect.status:
            problems.append(f"{key}: ledger says {record.status}, expected {expect.status}")
        if expect.settled_by and not (record.settled_by or "").startswith(expect.settled_by):
            problems.append(f"{key}: settled by {record.settled_by!r}, expected {expect.settled_by}...")
    if effect.applied != expect.effects:
        problems.append(f"{key}: billing applied it {effect.applied} times, expected {expect.effects}")
    if effect.voided != expect.voided:
        problems.append(f"{key}: voided is {effect.voided}, expected {expect.voided}")
    return RunReport(
        run_id=handle.id,
        key=key,
        final=final,
        record=_record_view(await demo.ledger.get(key)) if record else None,
        effects=effect.applied,
        voided=effect.voided,
        ui_url=demo.info.run_url(handle.id),
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
        "reused_from": record.reused_from,
        "history": [
            f"{e.from_status or '(new)'} -> {e.to_status or e.kind} by {e.actor}"
            for e in record.events
            if e.to_status or e.kind in ("approved", "compensated", "escalated")
        ],
    }


def print_report(report: ScenarioReport) -> None:
    mark = "PASS" if report.ok else "FAIL"
    print(f"\n== {report.name} [{mark}]")
    print(f"   {report.story}")
    for run in report.runs:
        if run.record:
            r = run.record
            print(f"   model asked:  {r['tool']}({json.dumps(r['arguments'], sort_keys=True)})")
            print(f"   ledger:       {r['status']}  key={r['key']}  attempt={r['attempt']}")
            why = f"  ({r['reason']})" if r["reason"] else ""
            print(f"   settled by:   {r['settled_by']}{why}")
            if r["reused_from"]:
                print(f"   reused:       the result of {r['reused_from']}; nothing sent")
            for line in r["history"]:
                print(f"                 {line}")
        voided = ", then voided" if run.voided else ""
        print(f"   billing:      credit applied {run.effects} time(s){voided}")
        print(f"   model heard:  {run.final}")
        if run.ui_url:
            print(f"   Temporal UI:  {run.ui_url}")
    for problem in report.problems:
        print(f"   PROBLEM:      {problem}")


async def run_demo(info: StackInfo) -> list[ScenarioReport]:
    if not info.api_url:
        raise RuntimeError("the stack has no operator API")
    ledger = await Ledger.connect(info.database_url)
    reports = []
    try:
        _, token = await OperatorTokens(ledger).create(tenant=TENANT, operator="demo-operator")
        client = await connect(Settings.from_env())
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            BillingClient(info.billing_url) as billing,
            httpx.AsyncClient(base_url=info.api_url, headers=headers, timeout=30) as api,
        ):
            demo = Demo(info, client, ledger, billing, api)
            for scenario in SCENARIOS:
                report = await run_scenario(scenario, demo)
                print_report(report)
                reports.append(report)
    finally:
        await ledger.close()
    return reports
