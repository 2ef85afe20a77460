"""Tool call ids and keys: unique in a run and identical on replay, whatever the provider sends."""

from __future__ import annotations

import uuid

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import Agent, AgentRegistry
from onceflow.sdk.keys import call_key, mint_tool_call_ids
from onceflow.workflows import ALL_WORKFLOWS
from tests.support.agents import credit_agent
from tests.support.downstream import DOWNSTREAM
from tests.support.models import CarelessIdModel
from tests.workflow_harness import running_worker


def test_provider_ids_are_kept_when_well_formed_and_unused() -> None:
    used: set[str] = set()
    assert mint_tool_call_ids(["call_abc", "toolu_01XyZ"], turn=1, used=used) == ["call_abc", "toolu_01XyZ"]
    assert used == {"call_abc", "toolu_01XyZ"}


def test_missing_repeated_and_malformed_ids_are_derived_from_turn_and_position() -> None:
    used: set[str] = set()
    assert mint_tool_call_ids(["call_0", "call_0", None, ""], turn=1, used=used) == [
        "call_0",
        "t1_1",
        "t1_2",
        "t1_3",
    ]
    assert mint_tool_call_ids(["call_0", "has space", "x" * 65, "a:b"], turn=2, used=used) == [
        "t2_0",
        "t2_1",
        "t2_2",
        "t2_3",
    ]


def test_a_derived_id_never_collides_with_one_the_provider_used_earlier() -> None:
    used: set[str] = set()
    mint_tool_call_ids(["t2_0", "t2_0_1"], turn=1, used=used)
    assert mint_tool_call_ids([None], turn=2, used=used) == ["t2_0_2"]


def test_call_key_is_run_and_call() -> None:
    assert call_key("refund-1001", "call_1_0") == "refund-1001:call_1_0"


def _credit(id_: str, cents: int) -> tuple[str, str, dict[str, object]]:
    return (id_, "issue_credit", {"account_id": "acct_o1", "amount_cents": cents})


async def test_repeated_and_missing_provider_ids_never_share_a_key(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    DOWNSTREAM.reset()
    model = CarelessIdModel(
        [
            [_credit("call_0", 100), _credit("call_0", 200)],  # repeated within one answer
            [_credit("call_0", 300)],  # reused on the next turn
            [_credit("", 400), _credit("", 500)],  # no ids at all
            "done",
        ]
    )
    base = credit_agent("careless", "issue_credit")
    agent = Agent("careless", base.config, base.tools, model=model)
    async with running_worker(temporal_env.client, ledger, AgentRegistry({"careless": agent})) as h:
        run_id = f"run-{uuid.uuid4().hex[:10]}"
        handle = await h.start("careless", "{}", run_id=run_id)
        result = await handle.result()
        history = await handle.fetch_history()

    ids = ["call_0", "t1_1", "t2_0", "t3_0", "t3_1"]
    assert [c.tool_call_id for c in result.calls] == ids
    keys = [call_key(run_id, i) for i in ids]
    assert DOWNSTREAM.effects == dict.fromkeys(keys, 1)
    amounts = []
    for key in keys:
        record = await ledger.get(key, with_events=False)
        assert record.status is Status.COMPLETED
        amounts.append(record.payload["arguments"]["amount_cents"])
    assert amounts == [100, 200, 300, 400, 500]

    # The same history replays to the same ids: minting reads nothing outside it.
    await Replayer(workflows=ALL_WORKFLOWS, data_converter=pydantic_data_converter).replay_workflow(
        WorkflowHistory.from_json(run_id, history.to_json())
    )
