"""What the ledger checks before a write is sent: the author's `Guards` declaration, and the
`Guard` it becomes for one call once that call's arguments fill it in."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from onceflow.ledger import Guard, Heard
from onceflow.sdk.tools.errors import InvalidToolArgumentsError

_CURRENCY = re.compile(r"[A-Z][A-Z0-9]{1,11}")  # as ledger.guards checks it

# The argument a replaceable tool's schema gains: the tool call id of the call it replaces.
REPLACES_ARGUMENT = "replaces"


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


def as_amount(value: Any) -> Decimal | None:
    """`value` as a finite, non-negative Decimal (a budget's amount or limit), or None if it is not one."""
    if isinstance(value, bool):
        return None
    try:
        amount = Decimal(str(value))
    except ArithmeticError:
        return None
    return amount if amount.is_finite() and amount >= 0 else None


def split_replaces(declared: Guards, tool: str, arguments: Any) -> tuple[Any, str | None]:
    """The model's arguments without `replaces`, and the tool call id it names (None if none)."""
    if not declared.replaceable or not isinstance(arguments, dict) or REPLACES_ARGUMENT not in arguments:
        return arguments, None
    rest = {k: v for k, v in arguments.items() if k != REPLACES_ARGUMENT}
    named = arguments[REPLACES_ARGUMENT]
    if named is None or named == "":
        return rest, None
    if not isinstance(named, str):
        raise InvalidToolArgumentsError(tool, [f"{REPLACES_ARGUMENT}: must be a tool call id (a string)"])
    return rest, named


def ledger_guard(
    declared: Guards,
    tool: str,
    toolset: str,
    arguments: dict[str, Any],
    *,
    replaces_key: str | None = None,
    limit: Decimal | None = None,
    heard: Iterable[Heard | str] = (),
) -> Guard:
    """The guard the ledger checks for one call of `toolset`'s `tool`: the declaration, with this
    call's values. `heard`: the run's calls whose settled outcome the model had been given when it
    asked for this call, with what it was told (the intent guard's only way to tell a new effect
    from a retry); a bare tool call id is judged by the call's status as it stands."""
    entity = None
    if declared.entity is not None:
        value = arguments.get(declared.entity)
        if value is None or value == "" or isinstance(value, dict | list):
            raise InvalidToolArgumentsError(
                tool, [f"{declared.entity}: names the entity this call acts on, so it must be given"]
            )
        entity = str(value)
    amount = None
    if declared.amount is not None:
        amount = as_amount(arguments[declared.amount])
        if amount is None:
            raise InvalidToolArgumentsError(tool, [f"{declared.amount}: must be a number, and not negative"])
        if limit is None:
            limit = Decimal(str(declared.limit)) if declared.limit is not None else None
    currency = None
    if declared.currency is not None and amount is not None:
        currency = _currency(declared.currency, tool, arguments.get(declared.currency))
    return Guard(
        intent=declared.intent,
        entity=entity,
        exclusive=entity is not None and declared.on_busy != "allow",
        on_busy="refuse" if declared.on_busy == "refuse" else "hold",
        amount=amount,
        limit=limit if amount is not None else None,
        replaces=replaces_key,
        heard=frozenset(heard) if declared.intent == "hold" else frozenset(),
        toolset=toolset,
        currency=currency,
    )


def _currency(name: str, tool: str, value: Any) -> str:
    code = value.strip().upper() if isinstance(value, str) else ""
    if not _CURRENCY.fullmatch(code):
        raise InvalidToolArgumentsError(
            tool, [f"{name}: the amount's currency, a code such as EUR, must be given"]
        )
    return code
