"""How MCP annotations and agents.yaml decide a tool's class, how servers are declared, and how a
lookup tool's answer is read. Pure functions: no server needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.types import CallToolResult, ContentBlock, TextContent, ToolAnnotations
from mcp.types import Tool as McpListedTool

from onceflow.ledger import SideEffect
from onceflow.mcp import Hints, McpConfigError, McpServerConfig, classify
from onceflow.mcp.meta import REFUSED_META_KEY
from onceflow.mcp.runtime import plan_server
from onceflow.mcp.tools import is_policy_refusal, lookup_outcome
from onceflow.runtime.agents import AgentConfigError, build_registry, load_agents
from onceflow.sdk.tools import OutcomeStatus
from onceflow.sdk.variables import expand_variables


@pytest.mark.parametrize(
    ("hints", "expected", "because"),
    [
        (Hints(read_only=True), SideEffect.READ, "readOnlyHint=true"),
        (Hints(), SideEffect.DESTRUCTIVE, "no annotations: destructiveHint=true (spec default)"),
        (Hints(read_only=False), SideEffect.DESTRUCTIVE, "destructiveHint=true (spec default)"),
        (
            Hints(read_only=False, destructive=True, open_world=False),
            SideEffect.DESTRUCTIVE,
            "destructiveHint=true",
        ),
        (Hints(destructive=False), SideEffect.EXTERNAL, "openWorldHint=true (spec default)"),
        (
            Hints(read_only=False, destructive=False, open_world=True),
            SideEffect.EXTERNAL,
            "openWorldHint=true",
        ),
        (
            Hints(read_only=False, destructive=False, open_world=False),
            SideEffect.WRITE,
            "openWorldHint=false",
        ),
        # idempotentHint changes nothing: one attempt is the rule for anything that writes.
        (
            Hints(destructive=False, idempotent=True, open_world=False),
            SideEffect.WRITE,
            "openWorldHint=false",
        ),
    ],
)
def test_annotations_decide_the_class_as_the_table_says(
    hints: Hints, expected: SideEffect, because: str
) -> None:
    found = classify(hints)
    assert found.side_effect is expected
    assert because in found.reason
    assert not found.overridden


def test_agents_yaml_override_wins_over_annotations_and_says_so() -> None:
    found = classify(Hints(read_only=True, open_world=False), override=SideEffect.WRITE)
    assert found.side_effect is SideEffect.WRITE
    assert found.overridden
    assert (
        found.reason == "agents.yaml sets effect: write (server says: readOnlyHint=true, openWorldHint=false)"
    )


def test_an_untrusted_server_gets_no_retries_from_its_read_only_hint() -> None:
    found = classify(Hints(read_only=True, destructive=False, open_world=False), trust_read_only=False)
    assert found.side_effect is SideEffect.WRITE
    assert "readOnlyHint=true ignored" in found.reason


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({}, "exactly one of `command` (stdio) or `url`"),
        ({"command": "x", "url": "http://h/mcp"}, "exactly one of"),
        ({"url": "ftp://h/mcp"}, "is not http(s)"),
        ({"url": "http://h/mcp", "env": {"A": "b"}}, "for `command` servers"),
        ({"command": "x", "headers": {"A": "b"}}, "for `url` servers"),
        ({"command": "x", "tools": {"t": {"effect": "sometimes"}}}, "tools.t.effect"),
        ({"command": "x", "tools": {"t": {"reconcile": "t"}}}, "names the tool itself"),
        ({"command": "x", "timeout": "0s"}, "must be positive"),
        ({"command": "x", "surprise": 1}, "surprise"),
    ],
)
def test_a_malformed_server_declaration_is_refused_naming_the_server(
    config: dict[str, Any], problem: str
) -> None:
    data = {
        "mcp_servers": {"billing-mcp": config},
        "agents": {
            "a": {"model": {"provider": "scripted", "script": [{"final": "x"}]}, "toolsets": ["billing-mcp"]}
        },
    }
    with pytest.raises(AgentConfigError) as refused:
        build_registry(data, "agents.yaml")
    assert "mcp_servers.billing-mcp" in str(refused.value)
    assert problem in str(refused.value)


def test_a_name_used_for_a_python_toolset_and_an_mcp_server_is_refused() -> None:
    data = {
        "toolsets": {"billing": "onceflow.examples.billing.tools:billing"},
        "mcp_servers": {"billing": {"command": "x"}},
        "agents": {"a": {"model": {"provider": "scripted", "script": [{"final": "x"}]}}},
    }
    with pytest.raises(AgentConfigError, match="billing: named both in toolsets and mcp_servers"):
        build_registry(data)


def test_declared_servers_load_without_starting_and_agents_may_list_them() -> None:
    registry = build_registry(
        {
            "mcp_servers": {"git": {"command": "mcp-server-git", "tools": {"git_commit": {"timeout": "3s"}}}},
            "agents": {
                "a": {"model": {"provider": "scripted", "script": [{"final": "x"}]}, "toolsets": ["git"]}
            },
        }
    )
    assert registry.mcp_servers["git"].tools["git_commit"].timeout is not None
    assert registry.agent("a").tools == {}  # attached once the worker has listed the server


def test_variables_come_from_the_environment_and_an_unset_one_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONCEFLOW_TEST_TOKEN", "s3cret")
    assert expand_variables("Bearer ${ONCEFLOW_TEST_TOKEN}", "h") == "Bearer s3cret"
    monkeypatch.delenv("ONCEFLOW_TEST_TOKEN")
    with pytest.raises(
        McpConfigError, match=r"mcp_servers.x.headers.Authorization uses \$\{ONCEFLOW_TEST_TOKEN\}"
    ):
        expand_variables("Bearer ${ONCEFLOW_TEST_TOKEN}", "mcp_servers.x.headers.Authorization")


def _answer(structured: Any = None, text: str | None = None, is_error: bool = False) -> CallToolResult:
    content: list[ContentBlock] = [TextContent(type="text", text=text)] if text is not None else []
    return CallToolResult(content=content, structured_content=structured, is_error=is_error)


def test_lookup_answers_become_reconcile_outcomes() -> None:
    found = lookup_outcome(
        _answer({"status": "completed", "result": {"id": 7}, "reference": 7}), "mcp b.find"
    )
    assert found.status is OutcomeStatus.COMPLETED
    assert found.value == {"id": 7}
    assert found.result_reference == "7"
    assert found.evidence["source"] == "mcp b.find"
    absent = lookup_outcome(_answer(text='{"status": "failed", "evidence": {"fenced": true}}'), "s")
    assert absent.status is OutcomeStatus.FAILED
    assert absent.evidence == {"fenced": True, "source": "s"}


@pytest.mark.parametrize(
    "answer",
    [
        _answer(text="boom", is_error=True),
        _answer({"status": "probably"}),
        _answer(text="not json"),
        _answer({"found": True}),
    ],
)
def test_a_lookup_error_or_a_malformed_answer_is_unknown_never_a_settlement(answer: CallToolResult) -> None:
    assert lookup_outcome(answer, "s").status is OutcomeStatus.UNKNOWN


def test_server_config_lists_what_it_relies_on() -> None:
    config = McpServerConfig.model_validate(
        {"command": "x", "allow": ["a"], "tools": {"b": {"reconcile": "c"}, "d": {"effect": "read"}}}
    )
    assert config.declared_tools() == {"a", "b", "c", "d"}
    assert config.lookups() == {"c": "b"}


def test_the_example_agents_file_declares_the_example_server() -> None:
    registry = load_agents(
        Path(__file__).resolve().parent.parent / "examples" / "billing_mcp" / "agents.yaml"
    )
    config = registry.mcp_servers["billing-mcp"]
    assert config.transport == "stdio"
    assert config.lookups() == {"find_credit": "issue_credit"}
    assert registry.agent("billing-assistant-mcp").config.toolsets == ["billing-mcp"]


def _listed(name: str, read_only: bool | None = None, destructive: bool | None = None) -> McpListedTool:
    given = read_only is not None or destructive is not None
    annotations = ToolAnnotations(read_only_hint=read_only, destructive_hint=destructive) if given else None
    schema = (
        {"type": "object", "properties": {"idempotency_key": {"type": "string"}}} if name == "find" else {}
    )
    return McpListedTool(name=name, input_schema={"type": "object", **schema}, annotations=annotations)


LISTING = [
    _listed("look", read_only=True),
    _listed("find", read_only=True),
    _listed("pay", read_only=False, destructive=False),
    _listed("wipe"),
]


def test_plan_offers_allowed_tools_hides_lookups_and_carries_timeouts_and_approval() -> None:
    config = McpServerConfig.model_validate(
        {
            "command": "x",
            "allow": ["look", "pay"],
            "timeout": "7s",
            "tools": {"pay": {"reconcile": "find", "timeout": "2s", "approval": True}},
        }
    )
    plans, errors = plan_server(config, LISTING)
    assert errors == []
    by_name = {plan.name: plan for plan in plans}
    assert {name: plan.offered for name, plan in by_name.items()} == {
        "look": True,
        "find": False,
        "pay": True,
        "wipe": False,
    }
    assert by_name["find"].note == "reconcile lookup for pay, not offered to the model"
    assert by_name["wipe"].note == "not in allow"
    pay = by_name["pay"].effect
    assert pay is not None
    assert (pay.side_effect, pay.max_attempts, pay.timeout.total_seconds(), pay.approval) == (
        SideEffect.EXTERNAL,
        1,
        2.0,
        True,
    )
    look = by_name["look"].effect
    assert look is not None
    assert (look.max_attempts, look.timeout.total_seconds()) == (3, 7.0)
    assert by_name["wipe"].classification.side_effect is SideEffect.DESTRUCTIVE


def test_plan_refuses_approval_on_a_read() -> None:
    config = McpServerConfig.model_validate({"command": "x", "tools": {"look": {"approval": True}}})
    _, errors = plan_server(config, LISTING)
    assert errors == ["tools.look: approval is for tools that change the world, not reads"]


def test_plan_carries_a_dedup_window_to_the_tools_effect() -> None:
    config = McpServerConfig.model_validate(
        {"command": "x", "tools": {"pay": {"timeout": "2s", "dedup_window": "24h"}}}
    )
    plans, errors = plan_server(config, LISTING)
    assert errors == []
    pay = next(plan for plan in plans if plan.name == "pay").effect
    assert pay is not None and pay.dedup_window is not None
    assert pay.dedup_window.total_seconds() == 24 * 3600
    look = next(plan for plan in plans if plan.name == "look").effect
    assert look is not None and look.dedup_window is None


@pytest.mark.parametrize(
    ("tools", "problem"),
    [
        ({"look": {"dedup_window": "1h"}}, "tools.look: a dedup window is for tools that change the world"),
        ({"pay": {"timeout": "5s", "dedup_window": "5s"}}, "must be longer than the tool's timeout"),
    ],
)
def test_plan_refuses_a_dedup_window_that_cannot_work(tools: dict[str, Any], problem: str) -> None:
    config = McpServerConfig.model_validate({"command": "x", "tools": tools})
    _, errors = plan_server(config, LISTING)
    assert len(errors) == 1 and problem in errors[0]


def test_a_dedup_window_must_be_a_positive_duration() -> None:
    with pytest.raises(ValueError, match="dedup_window"):
        McpServerConfig.model_validate({"command": "x", "tools": {"pay": {"dedup_window": "0s"}}})


def test_only_an_error_result_marked_in_meta_is_a_policy_refusal() -> None:
    text: list[ContentBlock] = [TextContent(type="text", text="above the limit")]
    marked = {REFUSED_META_KEY: True}
    assert is_policy_refusal(CallToolResult(content=text, is_error=True, _meta=marked))
    assert not is_policy_refusal(CallToolResult(content=text, is_error=True))  # an ordinary rejection
    assert not is_policy_refusal(CallToolResult(content=text, _meta=marked))  # a result, not an error
    assert not is_policy_refusal(CallToolResult(content=text, is_error=True, _meta={REFUSED_META_KEY: "yes"}))
