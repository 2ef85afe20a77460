"""The toolset: tools as their author declares them, the context a call is given, and what a
reconcile hook reports.

billing = Toolset("billing")

@billing.tool(external(approval=True), reconcile=find_credit, compensation=void_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    ...
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from onceflow.ledger import Guard, Heard, SideEffect, ToolExecutionRecord
from onceflow.sdk.tools.effects import Effect
from onceflow.sdk.tools.errors import InvalidToolArgumentsError, ToolKeyNotFoundError
from onceflow.sdk.tools.guards import REPLACES_ARGUMENT, Guards, ledger_guard, split_replaces

if TYPE_CHECKING:
    from onceflow.sdk.tools.receivers import ReceiverKit


@dataclass(frozen=True)
class ToolContext:
    """What a tool is told about the call it serves. The model never sees or sets any of it."""

    idempotency_key: str
    run_id: str
    tool_call_id: str
    tenant: str
    attempt: int
    logger: logging.LoggerAdapter[logging.Logger] | logging.Logger = field(
        default_factory=lambda: logging.getLogger("onceflow.tool")
    )
    # Set on a read made for a write (a budget's `limit_from` read): the write's key, while
    # `idempotency_key` is the read's own, so no cache keyed on it answers the write with this read.
    for_key: str | None = None


class OutcomeStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    UNKNOWN = "unknown"


class ReconcileOutcome(BaseModel):
    """What a reconcile hook found out about a call whose outcome was unknown."""

    status: OutcomeStatus
    value: Any = None
    result_reference: str | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def completed(
        cls, value: Any = None, *, result_reference: str | None = None, **evidence: Any
    ) -> ReconcileOutcome:
        return cls(
            status=OutcomeStatus.COMPLETED,
            value=value,
            result_reference=result_reference,
            evidence=evidence,
        )

    @classmethod
    def failed(cls, **evidence: Any) -> ReconcileOutcome:
        """The effect is proven absent."""
        return cls(status=OutcomeStatus.FAILED, evidence=evidence)

    @classmethod
    def unknown(cls, **evidence: Any) -> ReconcileOutcome:
        return cls(status=OutcomeStatus.UNKNOWN, evidence=evidence)


ToolFunction = Callable[..., Awaitable[Any]]
ReconcileHook = Callable[..., Awaitable[ReconcileOutcome]]
CompensationHook = Callable[[ToolExecutionRecord, ToolContext], Awaitable[Any]]


def _context_parameter(fn: Callable[..., Any]) -> str | None:
    hints = get_type_hints(fn)
    for name in inspect.signature(fn).parameters:
        if hints.get(name) is ToolContext or name == "context":
            return name
    return None


@dataclass(frozen=True)
class Tool:
    """A declared tool. Call `invoke()` with validated arguments and a `ToolContext`."""

    name: str
    toolset: str
    fn: ToolFunction
    effect: Effect
    description: str
    arguments_model: type[BaseModel]
    context_parameter: str | None
    reconcile: ReconcileHook | None = None
    compensation: CompensationHook | None = None
    guards: Guards = field(default_factory=Guards)
    # Its receiver serves onceflow's reconcile protocol (onceflow.sdk.tools.receivers): `reconcile`
    # is then the protocol's lookup and fence, unless the tool declares a hook of its own.
    receiver: ReceiverKit | None = None

    @property
    def side_effect(self) -> SideEffect:
        return self.effect.side_effect

    def json_schema(self) -> dict[str, Any]:
        """The schema the model sees: the signature without `context` (and with `replaces`, for a
        replaceable tool)."""
        parameters = self.arguments_model.model_json_schema()
        if self.guards.replaceable:
            parameters.setdefault("properties", {})[REPLACES_ARGUMENT] = {
                "type": "string",
                "description": "Only to correct an earlier call of this tool in this conversation: "
                "that call's tool call id. Leave it out for a new call.",
            }
        return {"name": self.name, "description": self.description, "parameters": parameters}

    def split_replaces(self, arguments: Any) -> tuple[Any, str | None]:
        """The model's arguments without `replaces`, and the tool call id it names (None if none)."""
        return split_replaces(self.guards, self.name, arguments)

    def ledger_guard(
        self,
        arguments: dict[str, Any],
        *,
        replaces_key: str | None = None,
        limit: Decimal | None = None,
        heard: Iterable[Heard | str] = (),
    ) -> Guard:
        """The guard the ledger checks for one call (see onceflow.sdk.tools.guards.ledger_guard)."""
        return ledger_guard(
            self.guards,
            self.name,
            self.toolset,
            arguments,
            replaces_key=replaces_key,
            limit=limit,
            heard=heard,
        )

    def validate_arguments(self, arguments: Any) -> dict[str, Any]:
        """Check a model's arguments against the schema. Raises InvalidToolArgumentsError."""
        if not isinstance(arguments, dict):
            raise InvalidToolArgumentsError(self.name, ["arguments must be a JSON object"])
        try:
            parsed = self.arguments_model.model_validate(arguments)
        except ValidationError as exc:
            problems = [
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
            ]
            raise InvalidToolArgumentsError(self.name, problems) from None
        dumped: dict[str, Any] = parsed.model_dump(mode="json")
        return dumped

    def _call_kwargs(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        parsed = self.arguments_model.model_validate(arguments)
        kwargs = {name: getattr(parsed, name) for name in type(parsed).model_fields}
        if self.context_parameter:
            kwargs[self.context_parameter] = context
        return kwargs

    async def invoke(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        """Run the tool; returns its result in JSON form (what the ledger records)."""
        value = await self.fn(**self._call_kwargs(arguments, context))
        return to_jsonable(value)

    async def run_reconcile(self, arguments: dict[str, Any], context: ToolContext) -> ReconcileOutcome:
        if self.reconcile is None:
            raise LookupError(f"tool {self.name!r} has no reconcile hook")
        try:
            outcome = await self.reconcile(**self._call_kwargs(arguments, context))
        except ToolKeyNotFoundError as exc:
            return ReconcileOutcome.failed(answer=str(exc) or "no record of the key", no_record_of_key=True)
        if not isinstance(outcome, ReconcileOutcome):
            raise TypeError(
                f"reconcile hook of {self.name!r} returned {type(outcome).__name__}, "
                "expected ReconcileOutcome"
            )
        return outcome


# NaN and the infinities stay floats rather than quietly becoming null: whoever stores or hands on
# the value sees them and says so (onceflow.sdk.payloads.result_problem).
_JSONABLE = TypeAdapter(Any, config=ConfigDict(ser_json_inf_nan="constants"))


def to_jsonable(value: Any) -> Any:
    return _JSONABLE.dump_python(value, mode="json")


def _arguments_model(fn: ToolFunction, name: str, context_parameter: str | None) -> type[BaseModel]:
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.name == context_parameter:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args and **kwargs cannot be described to a model")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model_name = "".join(part.title() for part in name.split("_")) + "Arguments"
    return create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)


class Toolset:
    """A named group of tools that agents can be given by name in agents.yaml."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tools: dict[str, Tool] = {}

    def tool(
        self,
        effect: Effect,
        *,
        name: str | None = None,
        description: str | None = None,
        reconcile: ReconcileHook | None = None,
        compensation: CompensationHook | None = None,
        guards: Guards | None = None,
        receiver: ReceiverKit | None = None,
    ) -> Callable[[ToolFunction], Tool]:
        """Register a tool. `receiver=kit_receiver(...)`: the receiver uses onceflow's receiver kit,
        and unknown calls are reconciled with its lookup and fence (unless `reconcile` is given)."""

        def register(fn: ToolFunction) -> Tool:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(f"tool {fn.__name__!r} must be an async function")
            tool_name = name or fn.__name__
            if tool_name in self._tools:
                raise ValueError(f"toolset {self.name!r} already has a tool named {tool_name!r}")
            context_parameter = _context_parameter(fn)
            if receiver is not None and (context_parameter is None or not effect.changes_the_world):
                raise TypeError(
                    f"tool {tool_name!r}: a receiver on the kit is for tools that change the world and "
                    "take the ToolContext (they send its idempotency key)"
                )
            tool = Tool(
                name=tool_name,
                toolset=self.name,
                fn=fn,
                effect=effect,
                description=description or inspect.getdoc(fn) or tool_name,
                arguments_model=_arguments_model(fn, tool_name, context_parameter),
                context_parameter=context_parameter,
                reconcile=reconcile or (receiver.reconcile_hook() if receiver is not None else None),
                compensation=compensation,
                guards=guards or Guards(),
                receiver=receiver,
            )
            self._tools[tool_name] = tool
            return tool

        return register

    @property
    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools)

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise LookupError(f"toolset {self.name!r} has no tool {name!r}") from None
