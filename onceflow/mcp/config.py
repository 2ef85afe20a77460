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
      issue_refund: {receiver: kit}              # the server is on onceflow's receiver kit
      issue_refund:
        guards: {entity: order_id, amount: amount_cents, limit_from: refundable_balance}
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from onceflow.ledger import SideEffect
from onceflow.mcp.meta import KIT_FENCE_TOOL, KIT_LOOKUP_TOOL
from onceflow.sdk.durations import PositiveDuration
from onceflow.sdk.tools import Guards
from onceflow.sdk.variables import UnsetVariableError

DEFAULT_MCP_TIMEOUT = timedelta(seconds=10)

# The one way an MCP server's configuration fails when it is used: a ${VAR} the environment lacks.
McpConfigError = UnsetVariableError


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
    timeout: PositiveDuration | None = None
    approval: bool = False
    # A read tool of the same server that the reconciler calls with the call's key (see docs/mcp.md).
    reconcile: str | None = None
    # `kit`: the server is on onceflow's receiver kit (onceflow.receiver.mcp); the reconciler asks its
    # own record of the key through its protocol tools (lookup, then fence), see docs/receivers.md.
    receiver: Literal["kit"] | None = None
    # Intent, entity and budget guards (docs/mcp.md); only for tools that change the world.
    guards: McpGuardsConfig | None = None
    # How long the server honours a repeated key: within it, an unknown call may be settled by
    # sending it again with the same key (docs/reliability.md). Must exceed the tool's timeout.
    dedup_window: PositiveDuration | None = None

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
    timeout: PositiveDuration = DEFAULT_MCP_TIMEOUT
    connect_timeout: PositiveDuration = timedelta(seconds=15)

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
            if tool.reconcile is not None and tool.receiver is not None:
                raise ValueError(
                    f"tools.{name}: give `reconcile` (a lookup tool) or `receiver: kit`, not both"
                )
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

    def uses_kit(self) -> bool:
        """Some tool of this server declares `receiver: kit`: its protocol tools must be there."""
        return any(tool.receiver == "kit" for tool in self.tools.values())

    def declared_tools(self) -> set[str]:
        """Every tool name this config relies on; each must exist on the server."""
        names = set(self.allow or ()) | set(self.tools)
        names |= {tool.reconcile for tool in self.tools.values() if tool.reconcile}
        if self.uses_kit():
            names |= {KIT_LOOKUP_TOOL, KIT_FENCE_TOOL}
        return names
