"""Intent, lineage, entity and budget guards, decided inside the reservation's own transaction.

A key stops the runtime from repeating one call. These stop the model, and other runs, from making
the same effect again under a new key:

- intent: the same tool and canonical payload in one run. While an earlier such call is unresolved,
  the new one is held. Once the earlier one has completed, the tool's declaration decides: `hold` (the
  new call is a new effect), `reuse` (it gets the recorded result; nothing is sent), or `allow` (no
  check at all). A same-intent call the receiver refused on policy grounds is refused again.
- lineage: a call names the call it replaces (same run, same tool). It is refused while that one is
  unresolved, and when another call already replaced it.
- entity: at most one unresolved call per tenant, tool and entity; a second is held or refused.
- budget: an entity's completed plus unresolved amounts stay within its limit, or the call is refused.
  Only a settlement releases an amount; no timer does.

Every check runs under transaction-scoped advisory locks on the intent, the entity and the replaced
call, taken in one order, so two workers cannot both pass one. The entity guard is also a unique
index (migrations/0006), so no path that skips these checks can break it either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

import asyncpg
from pydantic import BaseModel, ConfigDict, model_validator

from ledger import queries
from ledger.errors import LedgerError
from ledger.records import ToolExecutionRecord, to_record
from ledger.status import FailureKind, Status

GUARD_ACTOR = "onceflow:guard"


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

    @model_validator(mode="after")
    def _consistent(self) -> Guard:
        if (self.exclusive or self.amount is not None) and not self.entity:
            raise ValueError("an entity guard or a budget needs the entity's value")
        if (self.amount is None) != (self.limit is None):
            raise ValueError("a budget needs both an amount and a limit")
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
    """Run the checks in order (lineage, intent, entity, budget); the first that objects decides."""
    for check in (_lineage, _intent, _entity, _budget):
        verdict = await check(conn, call, guard)
        if verdict is not None:
            return verdict
    return Verdict("proceed")


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
    earlier = [to_record(row) for row in rows]
    for other in earlier:
        if other.status.is_unresolved and _older(other, call):
            return Verdict(
                "hold",
                f"the same call ({other.tool_call_id}) is still {other.status}; "
                "this one waits until that one is settled",
                other,
            )
    for other in earlier:
        if other.status is Status.FAILED and other.failure_kind is FailureKind.POLICY_REFUSED:
            return Verdict(
                "refuse",
                f"the same call ({other.tool_call_id}) was refused by the receiver on policy grounds: "
                f"{other.error}",
                detail={"same_as": other.key},
            )
    if guard.intent == "reuse":
        for other in earlier:  # newest first
            if other.status is Status.COMPLETED:
                return Verdict("reuse", f"the same call ({other.tool_call_id}) already completed", other)
    return None


def _older(other: ToolExecutionRecord, call: Candidate) -> bool:
    """Can `other` hold `call`? Only a call recorded before it can, so no two wait for each other."""
    if call.created_at is None:
        return True
    return (other.created_at, other.key) < (call.created_at, call.key)


async def _entity(conn: asyncpg.Connection, call: Candidate, guard: Guard) -> Verdict | None:
    if not guard.exclusive:
        return None
    row = await conn.fetchrow(queries.ENTITY_BUSY, call.tenant, call.tool_name, guard.entity, call.key)
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
        queries.ENTITY_BUDGET_USED, call.tenant, call.tool_name, guard.entity, call.key
    )
    assert used is not None  # an aggregate always has a row
    completed, unresolved = Decimal(used["completed"]), Decimal(used["unresolved"])
    if completed + unresolved + guard.amount <= guard.limit:
        return None
    left = max(guard.limit - completed - unresolved, Decimal(0))
    reason = (
        f"{guard.amount} would exceed the limit of {guard.limit} for {guard.entity}: "
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
    return Verdict("refuse", reason, detail=detail)
