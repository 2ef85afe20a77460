"""Agents for workflow tests, built in code rather than from a file."""

from __future__ import annotations

from typing import Any

from onceflow.models.config import ScriptedConfig
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from tests.support.downstream import toolset
from tests.support.models import FlakyModel

CREDIT_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "lookup_order", "arguments": {"order_id": "{{ input.order_id }}"}}]},
    {
        "tool_calls": [
            {
                "name": "{{ tool }}",
                "arguments": {
                    "account_id": "{{ results.lookup_order.account_id }}",
                    "amount_cents": "{{ results.lookup_order.amount_cents }}",
                },
            }
        ]
    },
    {"final": "credit result: {{ results.TOOL }}"},
]


def credit_agent(name: str, tool: str, on_indeterminate: str = "pause", **policy: str) -> Agent:
    script = [dict(turn) for turn in CREDIT_SCRIPT]
    script[1] = {"tool_calls": [{**script[1]["tool_calls"][0], "name": tool}]}
    script[2] = {"final": "credit result: {{ results." + tool + " }}"}
    config = AgentConfig.model_validate(
        {
            "model": {"provider": "scripted", "script": script},
            "instructions": "You issue credits for orders.",
            "toolsets": ["test-billing"],
            "tool_policy": {
                "on_indeterminate": on_indeterminate,
                "reconcile_deadline": "20s",
                "reconcile_initial_interval": "0.2s",
                "reconcile_max_interval": "1s",
                **policy,
            },
        }
    )
    return Agent(name, config, {t.name: t for t in toolset.tools})


def refund_agent(name: str, tool: str) -> Agent:
    """Looks the order up, then refunds it in full with `tool` (one of the guarded refund tools)."""
    agent = credit_agent(name, tool, "pause")
    script = [dict(turn) for turn in CREDIT_SCRIPT]
    script[1] = {
        "tool_calls": [
            {
                "name": tool,
                "arguments": {
                    "order_id": "{{ input.order_id }}",
                    "amount_cents": "{{ results.lookup_order.amount_cents }}",
                },
            }
        ]
    }
    script[2] = {"final": "refund result: {{ results." + tool + " }}"}
    model = ScriptedConfig.model_validate({"provider": "scripted", "script": script})
    return Agent(name, agent.config.model_copy(update={"model": model}), agent.tools)


def reissue_agent(name: str, tool: str) -> Agent:
    """The credit conversation, with the model asking for the same credit once more (a new call id)."""
    agent = credit_agent(name, tool, "pause")
    assert isinstance(agent.config.model, ScriptedConfig)
    script = agent.config.model.model_dump()["script"]
    script.insert(2, script[1])
    model = ScriptedConfig.model_validate({"provider": "scripted", "script": script})
    return Agent(name, agent.config.model_copy(update={"model": model}), agent.tools)


def twins_agent(name: str, tool: str) -> Agent:
    """Two identical credits in one answer (neither has heard of the other), then one more after
    hearing both. Under the default guards the second of the pair is a repeat in ignorance (it gets
    the first's result), and the third is owed (it is sent)."""
    agent = credit_agent(name, tool, "pause")
    assert isinstance(agent.config.model, ScriptedConfig)
    script = agent.config.model.model_dump()["script"]
    credit = script[1]["tool_calls"][0]
    script[1:2] = [{"tool_calls": [credit, credit]}, {"tool_calls": [credit]}]
    model = ScriptedConfig.model_validate({"provider": "scripted", "script": script})
    return Agent(name, agent.config.model_copy(update={"model": model}), agent.tools)


def flaky_model_agent(name: str, failures: int) -> tuple[Agent, FlakyModel]:
    """The credit agent, talking to a model whose first `failures` calls fail."""
    agent = credit_agent(name, "issue_credit")
    assert isinstance(agent.config.model, ScriptedConfig)
    model = FlakyModel(agent.config.model.script, failures)
    return Agent(name, agent.config, agent.tools, model=model), model


def support_registry() -> AgentRegistry:
    agents = [
        credit_agent("credit-reconciled", "issue_credit", "pause"),
        credit_agent("credit-pause", "issue_credit_unreconciled", "pause"),
        credit_agent("credit-fail", "issue_credit_unreconciled", "fail"),
        # Its compensation re-reads the ledger every second when unknown (test_write_path_runs.py).
        credit_agent("credit-undoable", "issue_credit_undoable", "fail", recheck_interval="1s"),
        credit_agent("credit-approval", "issue_credit_approved", "pause"),
        credit_agent("credit-approval-short", "issue_credit_approved", "pause", approval_deadline="1s"),
        credit_agent(
            "credit-escalating",
            "issue_credit_unreconciled",
            "pause",
            reconcile_deadline="1s",
            escalation_owner="billing-oncall",
        ),
        refund_agent("refund", "refund_order"),
        reissue_agent("credit-reissued", "issue_credit_reusing"),
        twins_agent("credit-twins", "issue_credit_unreconciled"),
    ]
    return AgentRegistry({a.name: a for a in agents})
