"""Intent, lineage, entity and budget guards, decided inside the reservation's own transaction.

A key stops the runtime from repeating one call. These stop the model, and other runs, from making
the same effect again under a new key:

- intent: the same tool and canonical payload in one run (a twin). The default (`hold`) follows one
  rule: a twin is a new effect only when the model had heard its outcome, that is when the twin's
  settled result was in the conversation the model was given for the turn that produced this call
  (`Guard.heard`, from the workflow). Every other twin is the same intent, retried in disguise: the
  call is held while the twin may still take effect (unresolved but not itself held, since a held
  twin holds nothing (migration 0017); or failed with an open conflict), gets the twin's recorded
  result once it completed (reused: nothing is sent), is refused when an operator compensated it,
  and is sent once the twin is known not applied. `reuse` treats every
  twin as the same intent, heard or not; `allow` checks nothing. A same-intent call the receiver
  refused on policy grounds is refused again. See docs/guards.md for why.
- lineage: a call names the call it replaces (same run, same tool). It is refused while that one is
  unresolved, and when another call already replaced it.
- entity: at most one unresolved call per tenant, toolset, tool and entity; a second is held or
  refused.
- budget: an entity's completed plus unresolved amounts, per toolset, tool and currency, stay within
  its limit, or the call is refused. Only a settlement releases an amount; no timer does.

Every check runs under transaction-scoped advisory locks on the intent, the entity and the replaced
call, taken in one order (`Guard.locks`), so two workers cannot both pass one. The entity guard is
also a unique index (migrations/0006, 0007), so no path that skips these checks can break it either.

The checks themselves run in the database, in one statement: `onceflow_guarded_reserve`
(migrations/0010_guarded_reserve_function.sql) is their only implementation; ledger/guarded.py calls
it. (Since migration 0018 it inserts a call with nothing in its way without walking the rules, and
hands every other call to `onceflow_guarded_decide`, which holds them.) This module holds what callers declare (`Guard`) and the names of what comes back.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from onceflow.ledger.errors import LedgerError
from onceflow.ledger.status import Status

GUARD_ACTOR = "onceflow:guard"
_CURRENCY = re.compile(r"[A-Z][A-Z0-9]{1,11}")


class GuardArgumentError(LedgerError, ValueError):
    """The call's guard arguments make no sense (it replaces a call that does not exist, a negative
    amount...). Nothing was reserved; the model is told and may correct the call."""


class Heard(BaseModel):
    """A call of the run whose outcome the model was told, and what it was told: the status and that
    outcome's settlement (the row's `settled_at`, which every settling transition stamps anew).

    A twin counts as heard only while its outcome is still the one the model was told: a conflict
    acknowledged as another status, a compensation or a re-send since makes it unheard again, and
    so does an open conflict. `status` None: recorded before the workflow passed what it told (a
    bare tool call id), judged by the twin's status as it stands.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool_call_id: str
    status: Status | None = None
    settled_at: datetime | None = None


class Guard(BaseModel):
    """What the ledger checks before a call may be sent, with the values taken from its arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    intent: Literal["hold", "reuse", "allow"] = "hold"
    entity: str | None = None  # the value of the tool's entity argument, e.g. "ord_1001"
    exclusive: bool = False  # at most one unresolved call for this entity and tool
    on_busy: Literal["hold", "refuse"] = "hold"
    amount: Decimal | None = None  # what the call draws on the entity's budget
    limit: Decimal | None = None
    replaces: str | None = None  # the key of the call this one replaces
    # The calls of this run whose settled outcome the model had heard (was given in its conversation)
    # when it asked for this call, with what it was told. Only twins among them may be new effects.
    # A bare tool call id is a Heard without a status (inputs recorded before outcomes were passed).
    heard: frozenset[Heard | str] = frozenset()
    # The toolset the tool belongs to: entity slots and budgets are its own. None: any toolset's.
    toolset: str | None = None
    currency: str | None = None  # the amount's currency: a budget of its own

    @field_validator("heard", mode="before")
    @classmethod
    def _heard(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("heard is a collection of calls, not one tool call id")
        return frozenset(Heard(tool_call_id=v) if isinstance(v, str) else v for v in value)

    @field_validator("currency")
    @classmethod
    def _currency(cls, value: str | None) -> str | None:
        if value is None:
            return None
        code = value.strip().upper()
        if not _CURRENCY.fullmatch(code):
            raise ValueError(f"a currency is a code of letters and digits (like EUR), not {value!r}")
        return code

    @model_validator(mode="after")
    def _consistent(self) -> Guard:
        if (self.exclusive or self.amount is not None) and not self.entity:
            raise ValueError("an entity guard or a budget needs the entity's value")
        if (self.amount is None) != (self.limit is None):
            raise ValueError("a budget needs both an amount and a limit")
        if self.currency is not None and self.amount is None:
            raise ValueError("a currency belongs to a budget's amount")
        return self

    def locks(self, *, tenant: str, run_id: str, tool_name: str, payload_sha256: str) -> list[str]:
        """The advisory locks this guard's checks need, in the one order every caller takes them."""
        names = []
        if self.intent != "allow":
            names.append(f"intent\x1f{run_id}\x1f{payload_sha256}")
        if self.entity is not None:
            names.append(f"entity\x1f{tenant}\x1f{tool_name}\x1f{self.entity}")
        if self.replaces is not None:
            names.append(f"lineage\x1f{self.replaces}")
        return sorted(names)


# What the guards decided for a call they wrote: sent (proceed), held behind another call, given a
# twin's recorded result (reuse), or refused.
Action = Literal["proceed", "hold", "reuse", "refuse"]
