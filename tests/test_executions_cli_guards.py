"""`onceflow executions` on guarded calls, as a real subprocess against the real operator API."""

from __future__ import annotations

import json

from tests.support.guarded import unknown_refund_and_a_held_repeat
from tests.support.operator_api import OperatorApi
from tests.test_executions_cli import cli
from tests.test_ledger_lineage_and_evidence import replacement_chain


def fields(out: str) -> dict[str, str]:
    """The `label  value` lines before the first blank line, as a mapping."""
    head = out.split("\n\n", 1)[0]
    found = {}
    for line in head.splitlines():
        label, _, value = line.partition("  ")
        found[label.strip()] = value.strip()
    return found


async def test_show_prints_what_a_held_call_waits_for_and_its_budget(operator_api: OperatorApi) -> None:
    blocker, held = await unknown_refund_and_a_held_repeat(operator_api.ledger, order_id="ord_cli")
    token = await operator_api.token()
    shown = await cli(operator_api, "show", held, token=token)
    assert shown.code == 0, shown.err
    printed = fields(shown.out)
    assert printed["status"] == "held"
    assert printed["held by"].startswith(f"{blocker} (nothing was sent")
    assert "call_1_0" in printed["hold reason"]
    assert printed["entity"] == "ord_cli (one unresolved issue_refund call at a time)"
    assert printed["amount"] == "2500 (limit 5000 for the entity)"
    blocking = fields((await cli(operator_api, "show", blocker, token=token)).out)
    assert blocking["held behind it"] == held


async def test_list_with_status_held_shows_held_calls_and_the_default_does_not(
    operator_api: OperatorApi,
) -> None:
    blocker, held = await unknown_refund_and_a_held_repeat(operator_api.ledger)
    token = await operator_api.token()
    listed = await cli(operator_api, "list", "--status", "held", "--json", token=token)
    assert listed.code == 0, listed.err
    assert [(i["key"], i["held_by"]) for i in map(json.loads, listed.out.splitlines())] == [(held, blocker)]
    default = await cli(operator_api, "list", "--json", token=token)
    assert [json.loads(line)["key"] for line in default.out.splitlines()] == [blocker]
    table = await cli(operator_api, "list", "--status", "held", token=token)
    assert held in table.out and "held" in table.out


async def test_resolving_a_held_call_exits_4_and_names_its_blocker(operator_api: OperatorApi) -> None:
    blocker, held = await unknown_refund_and_a_held_repeat(operator_api.ledger)
    token = await operator_api.token()
    refused = await cli(
        operator_api, "resolve", held, "--status", "failed", "--reason", "x", "--evidence", "{}", token=token
    )
    assert refused.code == 4, (refused.out, refused.err)
    assert f"held by: {blocker}" in refused.err
    no_evidence = await cli(
        operator_api, "resolve", blocker, "--status", "failed", "--reason", "x", token=token
    )
    assert no_evidence.code == 2 and "give evidence" in no_evidence.err


async def test_show_prints_the_replacement_chain_with_this_call_marked(operator_api: OperatorApi) -> None:
    keys = await replacement_chain(operator_api.ledger)
    token = await operator_api.token()
    shown = await cli(operator_api, "show", keys[1], token=token)
    assert shown.code == 0, shown.err
    printed = fields(shown.out)
    assert printed["replaces"] == keys[0]
    assert printed["replaced by"] == f"{keys[2]}, {keys[3]}"
    chain = shown.out.split("lineage (4 calls, oldest first; * is this one)\n", 1)[1].split("\n\n", 1)[0]
    rows = [line.split() for line in chain.splitlines()[1:]]
    assert [row[0] for row in rows] == [keys[0], "*", keys[2], keys[3]]
    assert rows[1][1:4] == [keys[1], "completed", keys[0]]
    assert rows[2][2:4] == ["(rejected)", keys[1]]
