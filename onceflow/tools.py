"""Declaring tools: what they do to the world, how they are called, and how they are checked.

billing = Toolset("billing")

@billing.tool(external(approval=True), reconcile=find_credit, compensation=void_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    ...
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from ledger import SideEffect, ToolExecutionRecord

DEFAULT_TOOL_TIMEOUT = timedelta(seconds=10)
READ_ATTEMPTS = 3


@dataclass(frozen=True)
class Effect:
    """A tool's declared side effect. Use `read()`, `write()`, `external()` or `destructive()`."""

    side_effect: SideEffect
    max_attempts: int
    timeout: timedelta = DEFAULT_TOOL_TIMEOUT
    approval: bool = False

    @property
    def changes_the_world(self) -> bool:
        return self.side_effect is not SideEffect.READ


def read(*, timeout: timedelta = DEFAULT_TOOL_TIMEOUT) -> Effect:
    """Looks, changes nothing: retried up to three times with backoff."""
    return Effect(SideEffect.READ, max_attempts=READ_ATTEMPTS, timeout=timeout)


def write(*, timeout: timedelta = DEFAULT_TOOL_TIMEOUT, approval: bool = False) -> Effect:
    """Changes our own records: one attempt, reserved in the ledger first."""
    return Effect(SideEffect.WRITE, max_attempts=1, timeout=timeout, approval=approval)


def external(*, timeout: timedelta = DEFAULT_TOOL_TIMEOUT, approval: bool = False) -> Effect:
    """Sends something to another system (money, messages): one attempt, reserved first."""
    return Effect(SideEffect.EXTERNAL, max_attempts=1, timeout=timeout, approval=approval)


def destructive(*, timeout: timedelta = DEFAULT_TOOL_TIMEOUT, approval: bool = False) -> Effect:
    """Deletes or overwrites: one attempt, reserved first."""
    return Effect(SideEffect.DESTRUCTIVE, max_attempts=1, timeout=timeout, approval=approval)


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


class ToolNotAttemptedError(Exception):
    """Raise before sending anything: the call definitely did not take effect and may run again."""


class ToolRejectedError(Exception):
    """The other system answered no: definitely not applied. The model is told the reason."""


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


class InvalidToolArgumentsError(ValueError):
    """The model asked for a call whose arguments do not fit the tool's schema."""

    def __init__(self, tool: str, problems: list[str]) -> None:
        super().__init__(f"invalid arguments for tool {tool!r}: " + "; ".join(problems))
        self.tool = tool
        self.problems = problems


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

    @property
    def side_effect(self) -> SideEffect:
        return self.effect.side_effect

    def json_schema(self) -> dict[str, Any]:
        """The schema the model sees: the signature without `context`."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.arguments_model.model_json_schema(),
        }

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
        outcome = await self.reconcile(**self._call_kwargs(arguments, context))
        if not isinstance(outcome, ReconcileOutcome):
            raise TypeError(
                f"reconcile hook of {self.name!r} returned {type(outcome).__name__}, "
                "expected ReconcileOutcome"
            )
        return outcome


def to_jsonable(value: Any) -> Any:
    return TypeAdapter(Any).dump_python(value, mode="json")


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
    ) -> Callable[[ToolFunction], Tool]:
        def register(fn: ToolFunction) -> Tool:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(f"tool {fn.__name__!r} must be an async function")
            tool_name = name or fn.__name__
            if tool_name in self._tools:
                raise ValueError(f"toolset {self.name!r} already has a tool named {tool_name!r}")
            context_parameter = _context_parameter(fn)
            tool = Tool(
                name=tool_name,
                toolset=self.name,
                fn=fn,
                effect=effect,
                description=description or inspect.getdoc(fn) or tool_name,
                arguments_model=_arguments_model(fn, tool_name, context_parameter),
                context_parameter=context_parameter,
                reconcile=reconcile,
                compensation=compensation,
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
