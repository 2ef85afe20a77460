"""Intent, lineage, entity and budget guards, decided inside the reservation's own transaction.

A key stops the runtime from repeating one call. These stop the model, and other runs, from making
the same effect again under a new key:

- intent: the same tool and canonical payload in one run (a twin). The default (`hold`) follows one
  rule: a twin is a new effect only when the model had heard its outcome, that is when the twin's
  settled result was in the conversation the model was given for the turn that produced this call
  (`Guard.heard`, from the workflow). Every other twin is the same intent, retried in disguise: the
  call is held while the twin may still take effect (unresolved, or failed with an open conflict),
  gets the twin's recorded result once it completed (reused: nothing is sent), is refused when an
  operator compensated it, and is sent once the twin is known not applied. `reuse` treats every
  twin as the same intent, heard or not; `allow` checks nothing. A same-intent call the receiver
  refused on policy grounds is refused again. See docs/guards.md for why.
- lineage: a call names the call it replaces (same run, same tool). It is refused while that one is
  unresolved, and when another call already replaced it.
- entity: at most one unresolved call per tenant, toolset, tool and entity; a second is held or
  refused.
- budget: an entity's completed plus unresolved amounts, per toolset, tool and currency, stay within
  its limit, or the call is refused. Only a settlement releases an amount; no timer does.

Every check runs under transaction-scoped advisory locks on the intent, the entity and the replaced
call, taken in one order, so two workers cannot both pass one. The entity guard is also a unique
index (migrations/0006, 0007), so no path that skips these checks can break it either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

import asyncpg
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from onceflow.ledger import queries
from onceflow.ledger.errors import LedgerError
from onceflow.ledger.records import ToolExecutionRecord, to_record
from onceflow.ledger.status import FailureKind, Status

GUARD_ACTOR = "onceflow:guard"
_CURRENCY = re.compile(r"[A-Z][A-Z0-9]{1,11}")


class GuardArgumentError(LedgerError, ValueError):
    """The call's guard arguments make no sense (it replaces a call that does not exist, a negative
    amount...). Nothing was reserved; the model is told and may correct the call."""


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
    # The tool call ids of this run whose settled outcome the model had heard (was given in its
    # conversation) when it asked for this call. Only twins among them may be new effects.
    heard: frozenset[str] = frozenset()
    # The toolset the tool belongs to: entity slots and budgets are its own. None: any toolset's.
    toolset: str | None = None
    currency: str | None = None  # the amount's currency: a budget of its own

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


Action = Literal["proceed", "hold", "reuse", "refuse"]


@dataclass(frozen=True)
class Verdict:
    """What the guards decided. `other` is the call held behind (hold) or reused (reuse)."""

    action: Action
    reason: str = ""
    other: ToolExecutionRecord | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Candidate:
    """The call being reserved, as the guards see it. `created_at` is set when it is already recorded
    (held, or failed before): only older calls can then hold it, so two held calls never wait for
    each other."""

    key: str
    tenant: str
    run_id: str
    tool_name: str
    payload_sha256: str
    created_at: Any = None


async def take_locks(conn: asyncpg.Connection, names: list[str]) -> None:
    for name in names:
        await conn.execute(queries.GUARD_LOCK, name)


async def decide(conn: asyncpg.Connection, call: Candidate, guard: Guard) -> Verdict:
    """Run the checks in order (lineage, intent, entity, budget); the first that objects decides.
    A check may also let the call go with a note (`proceed` with detail), which later checks keep."""
    detail: dict[str, Any] = {}
    for check in (_lineage, _intent, _entity, _budget):
        verdict = await check(conn, call, guard)
        if verdict is None:
            continue
        if verdict.action != "proceed":
            return verdict
        detail.update(verdict.detail)
    return Verdict("proceed", detail=detail)


async def _lineage(conn: asyncpg.Connection, call: Candidate, guard: Guard) -> Verdict | None:
    if guard.replaces is None:
        return None
    row = await conn.fetchrow(queries.SELECT_RECORD, guard.replaces)
    original = None if row is None else to_record(row)
    if original is None or original.tenant != call.tenant or original.run_id != call.run_id:
        raise GuardArgumentError(f"it replaces {guard.replaces!r}, which is no call of this run")
    if original.key == call.key:
        raise GuardArgumentError("a call cannot replace itself")
    if original.tool_name != call.tool_name:
        raise GuardArgumentError(
            f"it replaces {original.tool_call_id}, a call of {original.tool_name}, not {call.tool_name}"
        )
    if original.status.is_unresolved:
        return Verdict(
            "refuse",
            f"the call it replaces ({original.tool_call_id}) is still {original.status}; "
            "a replacement waits until that one is settled",
            detail={"replaces": original.key, "replaces_status": original.status.value},
        )
    other = await conn.fetchval(queries.REPLACED_BY, original.key, call.key)
    if other is not None:
        return Verdict(
            "refuse",
            f"{original.tool_call_id} was already replaced by {other}; replace that one instead",
            detail={"replaces": original.key, "replaced_by": other},
        )
    return None


async def _intent(conn: asyncpg.Connection, call: Candidate, guard: Guard) -> Verdict | None:
    if guard.intent == "allow":
        return None
    rows = await conn.fetch(queries.SAME_INTENT, call.run_id, call.payload_sha256, call.key)
    twins = [to_record(row) for row in rows]  # newest first
    # The twins this call is the same intent as: every one for `reuse`; by default, those whose
    # outcome the model had not heard when it asked (a repeat in ignorance is a retry in disguise).
    same = [twin for twin in twins if guard.intent == "reuse" or not _heard(twin, guard)]
    for other in same:
        if _may_take_effect(other) and _older(other, call):
            state = "failed with an open conflict" if other.status is Status.FAILED else other.status
            return Verdict(
                "hold",
                f"the same call ({other.tool_call_id}) is still {state}; "
                "this one waits until that one is settled",
                other,
                detail={"same_as": other.key},
            )
    for other in twins:  # heard or not: the receiver's refusal on policy grounds stands
        if other.status is Status.FAILED and other.failure_kind is FailureKind.POLICY_REFUSED:
            return Verdict(
                "refuse",
                f"the same call ({other.tool_call_id}) was refused by the receiver on policy grounds: "
                f"{other.error}",
                detail={"same_as": other.key},
            )
    for other in same:
        if other.status is Status.COMPLETED:
            reason = f"the same call ({other.tool_call_id}) already completed"
            if guard.intent == "hold":
                reason = (
                    f"the same call ({other.tool_call_id}) already took effect, before you had heard "
                    "its outcome; this is its result, and nothing was sent again. If another one is "
                    "owed, make the call again: now that you know of this one, it will be sent"
                )
            return Verdict("reuse", reason, other)
    for other in same:
        if other.status is Status.COMPENSATED and guard.intent == "hold":
            return Verdict(
                "refuse",
                f"the same call ({other.tool_call_id}) took effect and an operator undid it "
                "(compensated); it is not made again without you having heard that",
                detail={"same_as": other.key},
            )
    same_keys = {twin.key for twin in same}
    heard = [twin.key for twin in twins if twin.key not in same_keys]
    if heard:  # sent as a new effect because of them: the reservation's event names them
        return Verdict("proceed", detail={"heard_twins": heard})
    return None


def _may_take_effect(twin: ToolExecutionRecord) -> bool:
    """Nobody can yet rule out that `twin` took (or will take) effect: it is unresolved, or it failed
    and a late outcome says it completed (an open conflict), as budgets and resends count it too."""
    return twin.status.is_unresolved or (twin.status is Status.FAILED and twin.has_conflict)


def _heard(twin: ToolExecutionRecord, guard: Guard) -> bool:
    """Had the model heard `twin`'s outcome when it asked for this call? Only a settled outcome that
    still stands counts: a failure the model was told of, but which a late answer contradicts, may
    have taken effect after all, and a repeat of it is a retry."""
    if twin.tool_call_id not in guard.heard or not twin.status.is_settled:
        return False
    return not (twin.status is Status.FAILED and twin.has_conflict)


def _older(other: ToolExecutionRecord, call: Candidate) -> bool:
    """Can `other` hold `call`? A held twin only when it was recorded before `call`, so no two held
    calls wait for each other. Any other unresolved twin is not waiting for anything (it was sent, or
    waits for an operator), so it holds `call` whatever its age: a retry of an older call that failed
    must not be sent while a younger twin may be taking effect."""
    if call.created_at is None or other.status is not Status.HELD:
        return True
    return (other.created_at, other.key) < (call.created_at, call.key)


async def _entity(conn: asyncpg.Connection, call: Candidate, guard: Guard) -> Verdict | None:
    if not guard.exclusive:
        return None
    row = await conn.fetchrow(
        queries.ENTITY_BUSY, call.tenant, call.tool_name, guard.entity, call.key, guard.toolset
    )
    if row is None:
        return None
    busy = to_record(row)
    reason = f"another {call.tool_name} call for {guard.entity} ({busy.key}) is still {busy.status}"
    if guard.on_busy == "refuse":
        return Verdict("refuse", reason, detail={"entity": guard.entity, "busy": busy.key})
    return Verdict("hold", reason + "; this one waits until that one is settled", busy)


async def _budget(conn: asyncpg.Connection, call: Candidate, guard: Guard) -> Verdict | None:
    if guard.amount is None or guard.limit is None:
        return None
    used = await conn.fetchrow(
        queries.ENTITY_BUDGET_USED,
        call.tenant,
        call.tool_name,
        guard.entity,
        call.key,
        guard.toolset,
        guard.currency,
    )
    assert used is not None  # an aggregate always has a row
    completed, unresolved = Decimal(used["completed"]), Decimal(used["unresolved"])
    if completed + unresolved + guard.amount <= guard.limit:
        return None
    left = max(guard.limit - completed - unresolved, Decimal(0))
    unit = f" {guard.currency}" if guard.currency else ""
    reason = (
        f"{guard.amount}{unit} would exceed the limit of {guard.limit}{unit} for {guard.entity}: "
        f"{completed} completed and {unresolved} unresolved, {left} left"
    )
    if unresolved:
        reason += " (the unresolved part is released only when those calls are settled as not applied)"
    detail = {
        "entity": guard.entity,
        "limit": str(guard.limit),
        "requested": str(guard.amount),
        "completed": str(completed),
        "unresolved": str(unresolved),
    }
    if guard.currency:
        detail["currency"] = guard.currency
    return Verdict("refuse", reason, detail=detail)
