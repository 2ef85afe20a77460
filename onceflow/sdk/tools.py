"""Declaring tools: what they do to the world, how they are called, and how they are checked.

billing = Toolset("billing")

@billing.tool(external(approval=True), reconcile=find_credit, compensation=void_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    ...
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from onceflow.ledger import Guard, SideEffect, ToolExecutionRecord

DEFAULT_TOOL_TIMEOUT = timedelta(seconds=10)
_CURRENCY = re.compile(r"[A-Z][A-Z0-9]{1,11}")  # as ledger.guards checks it
READ_ATTEMPTS = 3


@dataclass(frozen=True)
class Effect:
    """A tool's declared side effect. Use `read()`, `write()`, `external()` or `destructive()`."""

    side_effect: SideEffect
    max_attempts: int
    timeout: timedelta = DEFAULT_TOOL_TIMEOUT
    approval: bool = False
    # How long the receiver honours a repeated idempotency key. Within it an unknown call may be
    # settled by sending it again with the same key (a reconcile strategy); after it, never.
    dedup_window: timedelta | None = None

    @property
    def changes_the_world(self) -> bool:
        return self.side_effect is not SideEffect.READ


def read(*, timeout: timedelta = DEFAULT_TOOL_TIMEOUT) -> Effect:
    """Looks, changes nothing: retried up to three times with backoff."""
    return Effect(SideEffect.READ, max_attempts=READ_ATTEMPTS, timeout=timeout)


def write(
    *,
    timeout: timedelta = DEFAULT_TOOL_TIMEOUT,
    approval: bool = False,
    dedup_window: timedelta | None = None,
) -> Effect:
    """Changes our own records: one attempt, reserved in the ledger first."""
    return Effect(SideEffect.WRITE, 1, timeout, approval, dedup_window)


def external(
    *,
    timeout: timedelta = DEFAULT_TOOL_TIMEOUT,
    approval: bool = False,
    dedup_window: timedelta | None = None,
) -> Effect:
    """Sends something to another system (money, messages): one attempt, reserved first."""
    return Effect(SideEffect.EXTERNAL, 1, timeout, approval, dedup_window)


def destructive(
    *,
    timeout: timedelta = DEFAULT_TOOL_TIMEOUT,
    approval: bool = False,
    dedup_window: timedelta | None = None,
) -> Effect:
    """Deletes or overwrites: one attempt, reserved first."""
    return Effect(SideEffect.DESTRUCTIVE, 1, timeout, approval, dedup_window)


@dataclass(frozen=True)
class Guards:
    """What the ledger checks before a write is sent, in the reservation's own transaction.

    - intent: what a twin (the same tool with the same canonical arguments, in the same run) means.
      `hold`, the default: a new effect only if the model had heard the twin's outcome when it asked
      (two equal credits can both be owed, once the model knows of the first); otherwise the same
      intent, held while the twin is unresolved, given its result once it completed (nothing sent),
      sent once it is known not applied. `reuse`: always the same intent, heard or not (same
      arguments mean one effect per run). `allow`: no check at all. See docs/guards.md.
    - entity: the argument naming the business entity (e.g. "order_id"). With it, at most one
      unresolved call of this tool per entity exists across the tenant's runs; `on_busy` says what
      happens to a second: `hold` it until the first is settled, `refuse` it, or `allow` it.
    - amount, limit | limit_from: a budget per entity. The call is reserved only if completed plus
      unresolved amounts stay within the limit: a number, or what `limit_from` (a read tool of the
      same agent, called with the entity argument alone) returns: a number, or {"limit": number}.
      The limit is the entity's total over its whole life (an order's captured amount), not what is
      left of it; the ledger subtracts what it recorded, purged calls included.
      Slots and budgets belong to this toolset's tool: another toolset's tool of the same name has
      its own.
    - currency: the argument carrying the amount's currency (e.g. "currency"). Each currency is a
      budget of its own, never summed with another; `limit_from` is then called with it too.
    - replaceable: the model may name an earlier call of this tool that this one replaces, in an
      extra `replaces` argument (its tool call id). Refused while that call is unresolved.
    """

    intent: Literal["hold", "reuse", "allow"] = "hold"
    entity: str | None = None
    on_busy: Literal["hold", "refuse", "allow"] = "hold"
    amount: str | None = None
    limit: int | float | Decimal | None = None
    limit_from: str | None = None
    replaceable: bool = False
    currency: str | None = None

    def problems(self, arguments: set[str]) -> list[str]:
        """What is wrong with this declaration for a tool with these arguments."""
        found = []
        for role, name in (("entity", self.entity), ("amount", self.amount), ("currency", self.currency)):
            if name is not None and name not in arguments:
                found.append(f"guards.{role} names {name!r}, which is not one of its arguments")
        if self.amount is not None and self.entity is None:
            found.append("a budget (guards.amount) is kept per entity: declare guards.entity too")
        if self.amount is not None and (self.limit is None) == (self.limit_from is None):
            found.append("a budget needs exactly one of guards.limit and guards.limit_from")
        if self.currency is not None and self.amount is None:
            found.append("guards.currency is the currency of a budget's amount: declare guards.amount too")
        if self.amount is None and (self.limit is not None or self.limit_from is not None):
            found.append("guards.limit and guards.limit_from need guards.amount")
        if self.limit is not None and as_amount(self.limit) is None:
            found.append("guards.limit cannot be negative, and must be a number")
        if self.replaceable and REPLACES_ARGUMENT in arguments:
            found.append(
                f"guards.replaceable adds a {REPLACES_ARGUMENT!r} argument; the tool has one already"
            )
        return found


# The argument a replaceable tool's schema gains: the tool call id of the call it replaces.
REPLACES_ARGUMENT = "replaces"


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


class ToolNotAttemptedError(Exception):
    """Raise before sending anything: the call definitely did not take effect and may run again."""


class ToolRejectedError(Exception):
    """The other system answered no: definitely not applied. The model is told the reason."""


class ToolKeyNotFoundError(ToolRejectedError):
    """The other system says it has no record of the call's idempotency key: nothing under the key
    took effect there (e.g. a lookup by key that found nothing and fenced it, or a receiver that
    answers "unknown key").

    The only refusal that settles a resent call as failed: a resend refused with "key already used
    with a different body" or "request in progress" proves the key arrived before, so the first
    request may have taken effect, and the call stays unknown. Raised by a first send it means
    what `ToolRejectedError` means; raised by a reconcile hook it means the effect is proven absent.
    """


class ToolRefusedError(Exception):
    """The other system refused on policy grounds (an authorization limit, a guardrail): not applied,
    and final. The call is never sent again, and the model is told not to try it again."""


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
    guards: Guards = Guards()

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
        if (
            not self.guards.replaceable
            or not isinstance(arguments, dict)
            or REPLACES_ARGUMENT not in arguments
        ):
            return arguments, None
        rest = {k: v for k, v in arguments.items() if k != REPLACES_ARGUMENT}
        named = arguments[REPLACES_ARGUMENT]
        if named is None or named == "":
            return rest, None
        if not isinstance(named, str):
            raise InvalidToolArgumentsError(
                self.name, [f"{REPLACES_ARGUMENT}: must be a tool call id (a string)"]
            )
        return rest, named

    def ledger_guard(
        self,
        arguments: dict[str, Any],
        *,
        replaces_key: str | None = None,
        limit: Decimal | None = None,
        heard: Iterable[str] = (),
    ) -> Guard:
        """The guard the ledger checks for one call: the declaration, with this call's values.
        `heard`: the run's tool call ids whose settled outcome the model had been given when it
        asked for this call (the intent guard's only way to tell a new effect from a retry)."""
        declared = self.guards
        entity = None
        if declared.entity is not None:
            value = arguments.get(declared.entity)
            if value is None or value == "" or isinstance(value, dict | list):
                raise InvalidToolArgumentsError(
                    self.name, [f"{declared.entity}: names the entity this call acts on, so it must be given"]
                )
            entity = str(value)
        amount = None
        if declared.amount is not None:
            amount = as_amount(arguments[declared.amount])
            if amount is None:
                raise InvalidToolArgumentsError(
                    self.name, [f"{declared.amount}: must be a number, and not negative"]
                )
            if limit is None:
                limit = Decimal(str(declared.limit)) if declared.limit is not None else None
        currency = None
        if declared.currency is not None and amount is not None:
            currency = self._currency(arguments.get(declared.currency))
        return Guard(
            intent=declared.intent,
            entity=entity,
            exclusive=entity is not None and declared.on_busy != "allow",
            on_busy="refuse" if declared.on_busy == "refuse" else "hold",
            amount=amount,
            limit=limit if amount is not None else None,
            replaces=replaces_key,
            heard=frozenset(heard) if declared.intent == "hold" else frozenset(),
            toolset=self.toolset,
            currency=currency,
        )

    def _currency(self, value: Any) -> str:
        name = self.guards.currency
        code = value.strip().upper() if isinstance(value, str) else ""
        if not _CURRENCY.fullmatch(code):
            raise InvalidToolArgumentsError(
                self.name, [f"{name}: the amount's currency, a code such as EUR, must be given"]
            )
        return code

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


def as_amount(value: Any) -> Decimal | None:
    """`value` as a finite, non-negative Decimal (a budget's amount or limit), or None if it is not one."""
    if isinstance(value, bool):
        return None
    try:
        amount = Decimal(str(value))
    except ArithmeticError:
        return None
    return amount if amount.is_finite() and amount >= 0 else None


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
                guards=guards or Guards(),
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
