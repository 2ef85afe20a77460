"""`onceflow executions` as a real subprocess against the operator API served for real."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from onceflow.ledger import CallIdentity, Ledger, SideEffect, Status
from onceflow.sdk.payloads import Phase
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.downstream import DOWNSTREAM
from tests.support.operator_api import OperatorApi

# The subcommand group on its own, so these tests need nothing from onceflow/cli/commands.py.
ENTRY = "from onceflow.cli.executions import executions_app; executions_app(prog_name='onceflow executions')"
ARGUMENTS = {"account_id": "acct_cli", "amount_cents": 700}


@dataclass
class Ran:
    code: int
    out: str
    err: str


async def cli(api: OperatorApi, *args: str, token: str | None = None) -> Ran:
    env = {k: v for k, v in os.environ.items() if k not in ("ONCEFLOW_API", "ONCEFLOW_TOKEN")}
    env["ONCEFLOW_API"] = api.url
    if token is not None:
        env["ONCEFLOW_TOKEN"] = token
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ENTRY,
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


async def put_call(
    ledger: Ledger,
    *,
    tenant: str = "acme",
    tool: str = "issue_credit",
    agent: str = "credit-pause",
    approval: bool = False,
) -> str:
    """A call written straight into the ledger: indeterminate, or awaiting approval."""
    call = CallIdentity(
        tenant=tenant, run_id=f"run-{uuid.uuid4().hex[:10]}", tool_call_id="call_1_0", agent=agent
    )
    await ledger.reserve(
        call,
        tool_name=tool,
        side_effect=SideEffect.EXTERNAL,
        arguments=ARGUMENTS,
        owner="worker-cli",
        approval=approval,
        lease=timedelta(minutes=5),
    )
    if not approval:
        await ledger.mark_indeterminate(call.key, actor="inspector", reason="timed out")
    return call.key


async def wait_for_phase(handle: Any, phase: Phase, timeout: float = 20) -> None:
    async def poll() -> None:
        while (await handle.query(AgentRunWorkflow.status)).phase != phase:
            await asyncio.sleep(0.1)

    await asyncio.wait_for(poll(), timeout)


async def test_a_call_left_unknown_by_a_real_run_is_listed_shown_and_settled_once(
    operator_api: OperatorApi,
) -> None:
    order_id = f"o{uuid.uuid4().hex[:8]}"
    DOWNSTREAM.modes[f"acct_{order_id}"] = "hang_after_apply"
    handle = await operator_api.runs.start("credit-pause", json.dumps({"order_id": order_id}))
    key = f"{handle.id}:call_1_0"
    await wait_for_phase(handle, Phase.AWAITING_RECONCILIATION)
    alice = await operator_api.token(operator="alice")
    bob = await operator_api.token(operator="bob")

    listed = await cli(operator_api, "list", token=alice)
    assert listed.code == 0, listed.err
    header, *rows = listed.out.splitlines()
    assert header.split() == "KEY STATUS TOOL AGENT WAITING SINCE AGE ATTEMPT ESCALATED TO".split()
    assert len(rows) == 1
    assert rows[0].split()[:4] == [key, "indeterminate", "issue_credit_unreconciled", "credit-pause"]
    assert rows[0].split()[-2:] == ["1", "-"]

    shown = await cli(operator_api, "show", key, token=alice)
    assert shown.code == 0, shown.err
    lines = [line.split() for line in shown.out.splitlines()]
    assert ["key", key] in lines
    assert ["status", "indeterminate"] in lines
    assert '"account_id": "acct_' + order_id in shown.out
    assert "events (" in shown.out
    assert "started -> indeterminate" in shown.out

    settled = await cli(
        operator_api,
        "resolve",
        key,
        "--status",
        "completed",
        "--reason",
        "found in the billing console",
        "--evidence",
        '{"ticket": "OPS-7"}',
        "--result",
        '{"credit_id": "cr_console"}',
        token=alice,
    )
    assert settled.code == 0, settled.err
    assert settled.out.strip() == f"{key} settled completed: now completed (the run was told)"
    result = await asyncio.wait_for(handle.result(), 20)
    assert "cr_console" in result.final

    again = await cli(
        operator_api, "resolve", key, "--status", "failed", "--reason", "never landed", token=bob
    )
    assert again.code == 4
    assert "decided by operator:alice at " in again.err
    assert "current status: completed" in again.err

    record = await operator_api.ledger.get(key)
    assert (record.status, record.settled_by, record.evidence) == (
        Status.COMPLETED,
        "operator:alice",
        {"ticket": "OPS-7"},
    )
    assert [e.actor for e in record.events if e.kind == "settled"] == ["operator:alice"]

    after = await cli(operator_api, "show", key, "--json", token=bob)
    assert after.code == 0, after.err
    assert json.loads(after.out)["settled_by"] == "operator:alice"


async def test_list_pages_with_a_cursor_hint_follows_all_pages_and_prints_json_lines(
    operator_api: OperatorApi,
) -> None:
    ledger = operator_api.ledger
    keys = [await put_call(ledger) for _ in range(3)]
    refund = await put_call(ledger, tool="issue_refund")
    waiting = await put_call(ledger, approval=True)
    await put_call(ledger, tenant="globex")
    await ledger.escalate(keys[1], owner="billing-oncall", actor="reconciler", reason="deadline")
    token = await operator_api.token()

    first = await cli(operator_api, "list", "--limit", "2", token=token)
    assert first.code == 0, first.err
    assert [line.split()[0] for line in first.out.splitlines()[1:]] == keys[:2]
    assert "more: add --cursor " in first.err
    cursor = first.err.split("--cursor ")[1].split()[0]
    second = await cli(operator_api, "list", "--limit", "2", "--cursor", cursor, token=token)
    assert [line.split()[0] for line in second.out.splitlines()[1:]] == [keys[2], refund]

    everything = await cli(operator_api, "list", "--limit", "2", "--all", "--json", token=token)
    assert everything.code == 0, everything.err
    items = [json.loads(line) for line in everything.out.splitlines()]
    assert [i["key"] for i in items] == [*keys, refund, waiting]
    assert everything.err == ""

    escalated = await cli(operator_api, "list", "--escalated", token=token)
    row = escalated.out.splitlines()[1].split()
    assert (row[0], row[-1]) == (keys[1], "billing-oncall")
    by_tool = await cli(operator_api, "list", "--tool", "issue_refund", "--json", token=token)
    assert [json.loads(line)["key"] for line in by_tool.out.splitlines()] == [refund]
    approvals = await cli(operator_api, "list", "--status", "awaiting_approval", "--json", token=token)
    assert [json.loads(line)["status"] for line in approvals.out.splitlines()] == ["awaiting_approval"]

    nothing = await cli(operator_api, "list", "--agent", "nobody", token=token)
    assert (nothing.code, nothing.out.strip()) == (0, "no unresolved calls")


async def test_approve_and_deny_decide_once_and_compensate_refuses_an_unsettled_call(
    operator_api: OperatorApi,
) -> None:
    ledger = operator_api.ledger
    to_approve = await put_call(ledger, approval=True)
    to_deny = await put_call(ledger, approval=True)
    unknown = await put_call(ledger)
    token = await operator_api.token(operator="carol")

    approved = await cli(operator_api, "approve", to_approve, token=token)
    assert approved.code == 0, approved.err
    assert approved.out.startswith(f"{to_approve} approved: now awaiting_approval (no run was waiting)")
    denied = await cli(operator_api, "deny", to_deny, "--reason", "amount looks wrong", token=token)
    assert denied.code == 0, denied.err
    assert "now denied" in denied.out

    late = await cli(operator_api, "deny", to_approve, "--reason", "too late", token=token)
    assert late.code == 4
    assert "decided by operator:carol at " in late.err

    refused = await cli(operator_api, "compensate", unknown, "--reason", "undo", token=token)
    assert refused.code == 4
    assert "only a completed call can be compensated" in refused.err
    assert "current status: indeterminate" in refused.err

    assert (await ledger.get(to_approve)).approved_by == "operator:carol"
    assert (await ledger.get(to_deny)).status is Status.DENIED
    assert (await ledger.get(unknown)).status is Status.INDETERMINATE


async def test_compensate_starts_the_undo_of_a_completed_call(operator_api: OperatorApi) -> None:
    handle = await operator_api.runs.start("credit-undoable", json.dumps({"order_id": "o_undo"}))
    await asyncio.wait_for(handle.result(), 20)
    key = f"{handle.id}:call_1_0"
    token = await operator_api.token()

    started = await cli(
        operator_api, "compensate", key, "--reason", "customer was credited twice", token=token
    )
    assert started.code == 0, started.err
    assert started.out.splitlines()[1] == f"follow it: onceflow executions show {key}:compensation"
    for _ in range(200):
        if (await operator_api.ledger.get(key)).status is Status.COMPENSATED:
            break
        await asyncio.sleep(0.1)
    assert (await operator_api.ledger.get(key)).status is Status.COMPENSATED
    assert sum(DOWNSTREAM.voids.values()) == 1


async def test_exit_codes_tell_scripts_what_went_wrong(operator_api: OperatorApi) -> None:
    ledger = operator_api.ledger
    theirs = await put_call(ledger, tenant="globex")
    mine = await put_call(ledger)
    token = await operator_api.token()

    missing = await cli(operator_api, "show", "run-nope:call_1_0", token=token)
    assert missing.code == 3
    assert "not found: no tool execution with key 'run-nope:call_1_0'" in missing.err
    other_tenant = await cli(
        operator_api, "resolve", theirs, "--status", "failed", "--reason", "x", token=token
    )
    assert other_tenant.code == 3

    for bad in ("oft_not-a-real-token", "garbage"):
        unauthorized = await cli(operator_api, "list", token=bad)
        assert unauthorized.code == 5
        assert "unauthorized: unknown or revoked token" in unauthorized.err
        assert "ONCEFLOW_TOKEN" in unauthorized.err
    no_token = await cli(operator_api, "show", mine)
    assert no_token.code == 5
    assert "ONCEFLOW_TOKEN" in no_token.err

    bad_choice = await cli(operator_api, "resolve", mine, "--status", "maybe", "--reason", "x", token=token)
    assert bad_choice.code == 2
    assert "'maybe' is not one of" in bad_choice.err
    bad_filter = await cli(operator_api, "list", "--status", "completed", token=token)
    assert bad_filter.code == 2
    assert "status must be a comma-separated subset" in bad_filter.err
    blank_reason = await cli(
        operator_api, "resolve", mine, "--status", "failed", "--reason", "  ", token=token
    )
    assert blank_reason.code == 2
    assert "refused (400)" in blank_reason.err
    bad_json = await cli(
        operator_api, "resolve", mine, "--status", "failed", "--reason", "x", "--evidence", "{", token=token
    )
    assert bad_json.code == 2
    malformed_key = await cli(operator_api, "show", "no-colon-here", token=token)
    assert malformed_key.code == 2

    unreachable = await cli(operator_api, "list", "--api", "http://127.0.0.1:9", token=token)
    assert unreachable.code == 1
    assert "cannot reach the operator API at http://127.0.0.1:9" in unreachable.err

    for key in (theirs, mine):
        assert (await ledger.get(key)).status is Status.INDETERMINATE


async def test_list_and_show_mark_a_conflict_and_acknowledge_closes_it(operator_api: OperatorApi) -> None:
    key = await put_call(operator_api.ledger)
    await operator_api.ledger.settle(key, status=Status.FAILED, actor="operator:alice", reason="not seen")
    await operator_api.ledger.record_late_outcome(key, actor="reconciler", status=Status.COMPLETED)
    token = await operator_api.token()

    listed = await cli(operator_api, "list", "--conflicts", token=token)
    assert listed.code == 0, listed.err
    assert listed.out.splitlines()[1].split()[:3] == [key, "failed", "(conflict)"]
    shown = await cli(operator_api, "show", key, token=token)
    assert "conflict" in shown.out and "OPEN" in shown.out
    assert "reconciler (reconciler) reports completed; operator:alice decided failed" in shown.out
    assert "SOURCE" in shown.out and "outcome_conflict" in shown.out

    # The final status and evidence are required.
    bare = await cli(operator_api, "acknowledge-conflict", key, "--reason", "voided by hand", token=token)
    assert bare.code == 2 and "--status" in bare.err
    done = await cli(
        operator_api,
        "acknowledge-conflict",
        key,
        "--status",
        "completed",
        "--reason",
        "the credit is in billing after all",
        "--evidence",
        '{"credit": "cr_9"}',
        token=token,
    )
    assert done.code == 0, done.err
    assert "conflict acknowledged: now completed" in done.out
    assert (await operator_api.ledger.get(key)).status is Status.COMPLETED
    again = await cli(operator_api, "list", "--conflicts", token=token)
    assert again.out.strip() == "no unresolved calls"
