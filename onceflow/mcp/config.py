"""How agents.yaml declares an MCP server as a toolset (`mcp_servers:`). No SDK import here.

mcp_servers:
  billing-mcp:                                   # the toolset name agents list
    command: python                              # stdio: command, args, env, cwd
    args: [-m, examples.billing_mcp, --db, credits.db]
    env: {BILLING_MCP_FAULTS: "${FAULTS}"}       # ${VAR} comes from the worker's environment
  remote-billing:
    url: https://billing.example/mcp             # streamable HTTP
    headers: {Authorization: "Bearer ${BILLING_TOKEN}"}
    allow: [lookup_order, issue_credit]          # only these reach agents (default: all)
    tools:
      issue_credit: {effect: external, timeout: 3s, reconcile: find_credit, dedup_window: 24h}
      lookup_order: {effect: read}               # overrides what the annotations say
      issue_refund:
        guards: {entity: order_id, amount: amount_cents, limit_from: refundable_balance}
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from onceflow.ledger import SideEffect
from onceflow.sdk.tools import Guards

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_MCP_TIMEOUT = timedelta(seconds=10)


class McpConfigError(ValueError):
    """An MCP server's configuration cannot be used as written (e.g. an unset ${VAR})."""


def _duration(value: Any) -> timedelta:
    # Imported here: onceflow.runtime.agents imports this module to validate agents.yaml.
    from onceflow.runtime.agents import parse_duration

    duration = parse_duration(value)
    if duration <= timedelta(0):
        raise ValueError("must be positive")
    return duration


def expand_variables(value: str, where: str) -> str:
    """Replace each ${VAR} with the environment's value; an unset variable is an error naming it."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        found = os.environ.get(name)
        if found is None:
            raise McpConfigError(f"{where} uses ${{{name}}}, which is not set in the environment")
        return found

    return _VARIABLE.sub(substitute, value)


class McpGuardsConfig(BaseModel):
    """`guards:` of one tool: what the ledger checks before a call is sent (see `onceflow.Guards`).

    Checked here for what needs no server (a budget needs an entity and one limit); what needs the
    tool's input schema (the arguments exist and are required) is checked when the server is listed.
    """

    model_config = ConfigDict(extra="forbid")

    intent: Literal["hold", "reuse", "allow"] = "hold"
    entity: str | None = Field(None, min_length=1)
    on_busy: Literal["hold", "refuse", "allow"] = "hold"
    amount: str | None = Field(None, min_length=1)
    limit: Decimal | None = Field(None, allow_inf_nan=False)
    limit_from: str | None = Field(None, min_length=1)
    replaceable: bool = False
    currency: str | None = Field(None, min_length=1)  # the argument carrying the amount's currency

    @field_validator("limit", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not (value is None or isinstance(value, int | float)):
            raise ValueError("must be a number (the entity's total budget)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> McpGuardsConfig:
        declared = {name for name in (self.entity, self.amount, self.currency) if name}
        problems = self.guards().problems(declared)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def guards(self) -> Guards:
        return Guards(
            intent=self.intent,
            entity=self.entity,
            on_busy=self.on_busy,
            amount=self.amount,
            limit=self.limit,
            limit_from=self.limit_from,
            replaceable=self.replaceable,
            currency=self.currency,
        )


class McpToolConfig(BaseModel):
    """What agents.yaml says about one tool of a server, over what the server's annotations say."""

    model_config = ConfigDict(extra="forbid")

    effect: Literal["read", "write", "external", "destructive"] | None = None
    timeout: timedelta | None = None
    approval: bool = False
    # A read tool of the same server that the reconciler calls with the call's key (see docs/mcp.md).
    reconcile: str | None = None
    # Intent, entity and budget guards (docs/mcp.md); only for tools that change the world.
    guards: McpGuardsConfig | None = None
    # How long the server honours a repeated key: within it, an unknown call may be settled by
    # sending it again with the same key (docs/reliability.md). Must exceed the tool's timeout.
    dedup_window: timedelta | None = None

    @field_validator("timeout", "dedup_window", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> timedelta | None:
        return None if value is None else _duration(value)

    @property
    def side_effect(self) -> SideEffect | None:
        return None if self.effect is None else SideEffect(self.effect)


class McpServerConfig(BaseModel):
    """One MCP server: how to reach it (stdio `command` or HTTP `url`) and which tools it offers."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = {}
    allow: list[str] | None = None
    tools: dict[str, McpToolConfig] = {}
    # Hints are untrusted by the spec. false: a readOnlyHint is ignored, so every tool without an
    # `effect` override gets one attempt.
    trust_read_only_hints: bool = True
    timeout: timedelta = DEFAULT_MCP_TIMEOUT
    connect_timeout: timedelta = Field(default=timedelta(seconds=15))

    @field_validator("timeout", "connect_timeout", mode="before")
    @classmethod
    def _durations(cls, value: Any) -> timedelta:
        return _duration(value)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (stdio) or `url` (streamable HTTP)")
        if self.url is None and self.headers:
            raise ValueError("`headers` are for `url` servers; a stdio server gets `env`")
        if self.command is None and (self.args or self.env or self.cwd):
            raise ValueError("`args`, `env` and `cwd` are for `command` servers")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} is not http(s)")
        for name, tool in self.tools.items():
            if tool.reconcile == name:
                raise ValueError(f"tools.{name}.reconcile names the tool itself")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    def lookups(self) -> dict[str, str]:
        """Lookup tool -> the first tool it reconciles (lookups are not offered to the model)."""
        found: dict[str, str] = {}
        for name, tool in self.tools.items():
            if tool.reconcile is not None:
                found.setdefault(tool.reconcile, name)
        return found

    def declared_tools(self) -> set[str]:
        """Every tool name this config relies on; each must exist on the server."""
        names = set(self.allow or ()) | set(self.tools)
        names |= {tool.reconcile for tool in self.tools.values() if tool.reconcile}
        return names
