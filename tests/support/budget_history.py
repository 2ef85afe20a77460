"""A random history of the ledger's own operations on calls with budgets (tests/test_budget_totals.py):
reservations (new, twins, again, unguarded, declared differently), completions, failures, unknown
outcomes, operator settlements, conflicts opened and acknowledged, compensations, approvals,
denials, releases and retention purges, one at a time, each on a row it may apply to."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import asyncpg

from onceflow.ledger import (
    CallIdentity,
    ConflictNotOpenError,
    FailureKind,
    Guard,
    InvalidTransitionError,
    Ledger,
    RecordNotFoundError,
    SideEffect,
    Status,
    purge_settled,
)
from tests.support.ledger_invariants import age_everything

TENANTS = ("t1", "t2")
TOOLS = ("refund", "credit")
ENTITIES = ("ord_1", "ord_2", "ord_3")
TOOLSETS = (None, "shop", "billing")
CURRENCIES = (None, "EUR", "USD")
AMOUNTS = (Decimal(1), Decimal("2.50"), Decimal("0.1"), Decimal(7))
EVIDENCE = {"checked": "the receiver's records"}
KINDS = (FailureKind.NOT_ATTEMPTED, FailureKind.REJECTED, FailureKind.NOT_APPLIED)
# Rows the guards decide again when asked (ledger.guarded.decided_again).
DECIDED_AGAIN = (
    "status = 'held' OR (status = 'failed' AND conflict_at IS NULL"
    " AND failure_kind IN ('not_attempted', 'rejected', 'not_applied'))"
)
REFUSED = (InvalidTransitionError, ConflictNotOpenError, RecordNotFoundError)


@dataclass(frozen=True)
class Call:
    identity: CallIdentity
    tool: str
    arguments: dict[str, Any]
    guard: Guard


class Driver:
    """A random sequence of the ledger's operations on calls with budgets, one at a time."""

    def __init__(self, ledger: Ledger, dsn: str, rng: random.Random) -> None:
        self.ledger, self.dsn, self.rng = ledger, dsn, rng
        self.calls: dict[str, Call] = {}
        self.runs: list[tuple[str, str]] = []
        self.done: Counter[str] = Counter()

    async def rows(self, where: str) -> list[asyncpg.Record]:
        async with self.ledger.connection("test_rows") as conn:
            return list(
                await conn.fetch(f"SELECT key, owner FROM tool_executions WHERE {where} ORDER BY key")
            )

    async def budget_key(self, key: str) -> tuple[Any, ...] | None:
        async with self.ledger.connection("test_rows") as conn:
            row = await conn.fetchrow(
                "SELECT entity, toolset, currency FROM tool_executions WHERE key = $1 AND amount IS NOT NULL",
                key,
            )
        return None if row is None else tuple(row)

    async def pick(self, where: str) -> asyncpg.Record | None:
        found = await self.rows(where)
        return self.rng.choice(found) if found else None

    def new_call(self) -> Call:
        rng = self.rng
        if not self.runs or rng.random() < 0.3:
            self.runs.append((rng.choice(TENANTS), f"run-{len(self.runs)}"))
        tenant, run_id = rng.choice(self.runs[-4:])
        identity = CallIdentity(tenant=tenant, run_id=run_id, tool_call_id=f"c{len(self.calls)}")
        twins = [c for c in self.calls.values() if c.identity.run_id == run_id]
        if twins and rng.random() < 0.35:  # the same payload again in the run: held, reused or sent
            twin = rng.choice(twins)
            return Call(identity, twin.tool, twin.arguments, twin.guard)
        entity = rng.choice(ENTITIES)
        guard = Guard(
            intent=rng.choice(("hold", "hold", "reuse", "allow")),
            entity=entity,
            exclusive=rng.random() < 0.2,
            amount=rng.choice(AMOUNTS),
            limit=rng.choice((Decimal(10**6), Decimal(6))),
            toolset=rng.choice(TOOLSETS),
            currency=rng.choice(CURRENCIES),
        )
        arguments = {"order": entity, "amount": str(guard.amount), "n": rng.randrange(3)}
        return Call(identity, rng.choice(TOOLS), arguments, guard)

    async def reserve(self, call: Call, *, guarded: bool = True) -> None:
        result = await self.ledger.reserve(
            call.identity,
            tool_name=call.tool,
            side_effect=SideEffect.EXTERNAL,
            arguments=call.arguments,
            owner="w1",
            approval=guarded and self.rng.random() < 0.15,
            guard=call.guard if guarded else None,
        )
        self.calls[call.identity.key] = call
        self.done[f"reserved {result.outcome.value}"] += 1

    async def step(self) -> None:
        rng, ledger = self.rng, self.ledger
        op = rng.choices(
            ("reserve", "again", "plain", "complete", "fail", "unknown", "settle", "conflict",
             "acknowledge", "compensate", "approve", "deny", "release", "purge"),
            weights=(6, 3, 1, 4, 2, 1, 1, 2, 1, 1, 1, 0.5, 0.5, 0.6),
        )[0]  # fmt: skip
        if op == "reserve":
            await self.reserve(self.new_call())
            return
        if op in ("again", "plain"):  # a recorded (or purged) key asked again, guarded or not
            waiting = await self.pick(DECIDED_AGAIN) if rng.random() < 0.7 else None
            if waiting is not None:
                call = self.calls[waiting["key"]]
            elif self.calls:
                call = rng.choice(list(self.calls.values()))
            else:
                return
            if rng.random() < 0.5:  # declared differently this time: the row moves to another budget key
                moved = {"entity": rng.choice(ENTITIES), "toolset": rng.choice(TOOLSETS)}
                moved["currency"] = rng.choice(CURRENCIES)
                call = Call(call.identity, call.tool, call.arguments, call.guard.model_copy(update=moved))
            before = await self.budget_key(call.identity.key)
            await self.reserve(call, guarded=op == "again")
            if before is not None and before != await self.budget_key(call.identity.key):
                self.done["moved to another budget key"] += 1
            return
        if op == "purge":
            await age_everything(self.dsn, timedelta(days=2))
            report = await purge_settled(ledger, older_than=timedelta(days=1))
            self.done["purged calls"] += report.calls
            return
        where = {
            "complete": "status = 'started'",
            "fail": "status = 'started'",
            "unknown": "status = 'started'",
            "settle": "status IN ('started', 'indeterminate')",
            "conflict": "status IN ('failed', 'completed') AND conflict_at IS NULL",
            "acknowledge": "conflict_at IS NOT NULL AND conflict_cleared_at IS NULL",
            "compensate": "status = 'completed' AND reused_from IS NULL",  # a reused call was never sent
            "approve": "status = 'awaiting_approval' AND approved_at IS NULL",
            "deny": "status = 'awaiting_approval' AND approved_at IS NULL",
            "release": "status = 'held'",
        }[op]
        row = await self.pick(where + " AND amount IS NOT NULL")
        if row is None:
            return
        key = row["key"]
        try:
            await self.act(op, key, row["owner"])
        except REFUSED:
            self.done[f"{op} refused"] += 1
        else:
            self.done[op] += 1

    async def act(self, op: str, key: str, owner: str | None) -> None:
        rng, ledger = self.rng, self.ledger
        if op == "complete":
            await ledger.complete(key, owner=owner or "w1", result={"id": key})
        elif op == "fail":
            kind = rng.choice(KINDS)
            await ledger.fail(key, owner=owner or "w1", kind=kind, error=kind.value)
        elif op == "unknown":
            await ledger.mark_indeterminate(key, actor="inspector", reason="activity lost")
        elif op == "settle":
            status = rng.choice((Status.COMPLETED, Status.FAILED))
            result = {"id": key} if status is Status.COMPLETED else None
            await ledger.settle(
                key, status=status, actor="operator:alice", reason="checked", evidence=EVIDENCE, result=result
            )
        elif op == "conflict":  # a late report contradicting the decision
            record = await ledger.get(key, with_events=False)
            reported = Status.FAILED if record.status is Status.COMPLETED else Status.COMPLETED
            await ledger.record_late_outcome(key, actor="reconciler:hook", status=reported)
        elif op == "acknowledge":
            await ledger.acknowledge_conflict(
                key,
                actor="operator:bob",
                status=rng.choice((Status.FAILED, Status.COMPLETED, Status.COMPENSATED)),
                reason="looked at the other side",
                evidence=EVIDENCE,
            )
        elif op == "compensate":
            await ledger.mark_compensated(key, actor="compensation", reason="undone")
        elif op == "approve":
            await ledger.approve(key, actor="operator:alice")
        elif op == "deny":
            await ledger.deny(key, actor="operator:alice", reason="no")
        elif op == "release":
            await ledger.release(key, actor="operator:alice", reason="never sent")
