"""The one duration type and the one ${VAR} expansion every configuration uses (onceflow/sdk/)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel, ValidationError

from onceflow.mcp.config import McpServerConfig
from onceflow.models.config import OpenAIConfig
from onceflow.runtime.agents import ToolPolicy
from onceflow.sdk.durations import Duration, PositiveDuration
from onceflow.sdk.variables import UnsetVariableError, expand_variables, malformed_references, references


class _Settings(BaseModel):
    any: Duration = timedelta(0)
    positive: PositiveDuration = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("250ms", timedelta(milliseconds=250)),
        ("1.5h", timedelta(minutes=90)),
        (" 10 m ", timedelta(minutes=10)),
        ("45", timedelta(seconds=45)),
        (45, timedelta(seconds=45)),
        (0.5, timedelta(milliseconds=500)),
        (timedelta(minutes=3), timedelta(minutes=3)),
    ],
)
def test_a_duration_is_read_from_text_seconds_or_a_timedelta(written: object, meant: timedelta) -> None:
    assert _Settings.model_validate({"any": written, "positive": written}) == _Settings(
        any=meant, positive=meant
    )


@pytest.mark.parametrize("written", ["soon", "5 minutes", "-5s", "1w", "", True, None])
def test_what_is_not_a_duration_is_refused_with_examples(written: object) -> None:
    with pytest.raises(ValidationError, match="is not a duration \\(examples: 30s, 10m, 2h\\)"):
        _Settings.model_validate({"any": written})


def test_a_positive_duration_refuses_zero() -> None:
    assert _Settings.model_validate({"any": "0s"}).any == timedelta(0)
    with pytest.raises(ValidationError, match=r"positive\n.*must be positive"):
        _Settings.model_validate({"positive": "0s"})


def test_agents_yaml_models_and_mcp_servers_read_durations_alike() -> None:
    assert ToolPolicy.model_validate({"reconcile_deadline": "1d"}).reconcile_deadline == timedelta(days=1)
    model = OpenAIConfig.model_validate({"provider": "openai", "model": "m", "request_timeout": "90s"})
    assert model.request_timeout == timedelta(seconds=90)
    server = McpServerConfig.model_validate({"command": "x", "timeout": 3, "tools": {"t": {"timeout": "2s"}}})
    assert (server.timeout, server.tools["t"].timeout) == (timedelta(seconds=3), timedelta(seconds=2))
    for invalid in (
        lambda: ToolPolicy.model_validate({"recheck_interval": 0}),
        lambda: OpenAIConfig.model_validate({"provider": "openai", "model": "m", "retry_budget": "0m"}),
        lambda: McpServerConfig.model_validate({"command": "x", "connect_timeout": "0s"}),
    ):
        with pytest.raises(ValidationError, match="must be positive"):
            invalid()


def test_a_variable_is_replaced_and_an_unset_one_is_named_with_where_it_was_used() -> None:
    environ = {"TOKEN": "s3cret"}
    assert expand_variables("Bearer ${TOKEN}", "h", environ) == "Bearer s3cret"
    with pytest.raises(UnsetVariableError) as unset:
        expand_variables("${TOKEN}:${MISSING}", "mcp_servers.x.env.KEY", environ)
    assert str(unset.value) == "mcp_servers.x.env.KEY uses ${MISSING}, which is not set in the environment"
    assert (unset.value.name, unset.value.where) == ("MISSING", "mcp_servers.x.env.KEY")


def test_only_a_well_formed_name_is_a_reference() -> None:
    # A shell command may mean ${A:-b} for the shell: it is left as written, and reported as malformed.
    assert expand_variables("echo ${A:-b} ${1X}", "args", {}) == "echo ${A:-b} ${1X}"
    assert references("${A} ${A:-b} ${_b2}") == ["A", "_b2"]
    assert malformed_references("${A} ${A:-b} ${} ${1X}") == ["A:-b", "", "1X"]


def test_model_headers_and_mcp_servers_share_the_unset_variable_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ONCEFLOW_TEST_UNSET", raising=False)
    model = OpenAIConfig.model_validate(
        {
            "provider": "openai",
            "model": "m",
            "api_key_env": None,
            "extra_headers": {"X-T": "${ONCEFLOW_TEST_UNSET}"},
        }
    )
    assert model.environment_problems() == [
        "model.extra_headers.X-T uses ${ONCEFLOW_TEST_UNSET}, which is not set in the environment"
    ]
    with pytest.raises(ValidationError, match=r"header 'X-T': \$\{A B\} is not an environment variable name"):
        OpenAIConfig.model_validate({"provider": "openai", "model": "m", "extra_headers": {"X-T": "${A B}"}})
