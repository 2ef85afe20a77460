"""A trace of the protocol model (model/onceflow.pml), replayed as operations on the real ledger.

The model prints one line per ledger transition, with what it decided and the row afterwards:

    @@ reserve k=1 t=4 late=0 h0=FAILED/1 -> O_HELD | st=HELD fk=FK0 own=4 rf=255 hb=0 cf=0 v=0

Replay calls the real `Ledger` for each such line (reserve with a guard, the owner's outcome,
indeterminate, inspection, settle, the reconciler's late outcome, acknowledge a conflict, approve,
deny, release, compensation), in the trace's order, and compares the ledger's answer and its row
with the model's: status, failure kind, owner, reused from, held by, open conflict, and whether the
settlement was stamped anew. Lines with no ledger transition (the network, the receiver, a crash,
a deadline, what the model is told) are kept only for what later lines need (a call's arguments,
the settlement a heard call was told with). A lease that runs out is set in the past with SQL, as
the property test ages rows: no API sets a time.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg

from onceflow.ledger import (
    CallIdentity,
    EventSource,
    FailureKind,
    Guard,
    InvalidTransitionError,
    Ledger,
    LedgerError,
    OutcomeIgnoredError,
    Reservation,
    SideEffect,
    Status,
    guards,
)

# The ledger before issue 34 (heard as bare tool call ids, no attempt deadline, an inspector that
# ignores the lease) is replayed too, to hold the old rules' traces to the code that had them.
BEFORE_ISSUE_34 = "not_after" not in inspect.signature(Ledger.reserve).parameters
# The reconciler's "not there" waits for the owner's lease (issue 40's F1) since `after_owner_lease`.
HOOK_WAITS_FOR_LEASE = "after_owner_lease" in inspect.signature(Ledger.settle).parameters
# An attempt retries no failure settled after it began (the model's F4) since `began_at`.
TAKES_BEGAN = "began_at" in inspect.signature(Ledger.reserve).parameters

TENANT = "t1"
TOOL = "issue_credit"
TOOLSET = "billing"
ENTITY = "acct_1"
LEASE = timedelta(hours=1)
EVIDENCE = {"checked": "the receiver's records"}
OPERATOR = "operator:alice"
RECONCILER = "reconciler"
DEADLINE_ACTOR = "onceflow:approval-deadline"

_STATUS = {
    "NONE": None,
    "HELD": Status.HELD,
    "AWAIT": Status.AWAITING_APPROVAL,
    "STARTED": Status.STARTED,
    "INDET": Status.INDETERMINATE,
    "COMPLETED": Status.COMPLETED,
    "FAILED": Status.FAILED,
    "DENIED": Status.DENIED,
    "COMPENSATED": Status.COMPENSATED,
}
_KIND = {
    "FK0": None,
    "0": None,
    "NOT_ATTEMPTED": FailureKind.NOT_ATTEMPTED,
    "REJECTED": FailureKind.REJECTED,
    "NOT_APPLIED": FailureKind.NOT_APPLIED,
    "KDENIED": FailureKind.DENIED,
    "POLICY": FailureKind.POLICY_REFUSED,
    "GUARD": FailureKind.GUARD_REFUSED,
    "RELEASED": FailureKind.RELEASED,
}
_OUTCOME = {
    "O_NEW": Reservation.NEW,
    "O_RETRY": Reservation.RETRY,
    "O_AWAIT": Reservation.AWAITING_APPROVAL,
    "O_COMPLETED": Reservation.COMPLETED,
    "O_INFLIGHT": Reservation.IN_FLIGHT,
    "O_SETTLED": Reservation.SETTLED,
    "O_HELD": Reservation.HELD,
    "O_REUSED": Reservation.REUSED,
    "O_REFUSED": Reservation.REFUSED,
}
_NOKEY = "255"
# Lines with no ledger transition: the network and the receiver, an attempt's crash or deadline,
# the reconciler's look at the receiver, what the model asks and is told, a reset, the end.
NOT_LEDGER = frozenset(
    {
        "call",
        "begin",
        "tell",
        "send",
        "arrive",
        "lost",
        "lost_reply",
        "not_attempted",
        "crash",
        "deadline",
        "lookup",
        "reset",
        "end",
        "comp_arrive",
        "comp_not_compensable",
    }
)


@dataclass(frozen=True)
class Step:
    """One line of the model: its operation, its arguments, its answer and the row it left."""

    op: str
    args: dict[str, str]
    answer: str | None
    row: dict[str, str]
    line: str

    @property
    def key(self) -> int:
        return int(self.args["k"])


_PAIR = re.compile(r"(\w+)=(\S+)")


def parse(line: str) -> Step | None:
    """A model line as a Step; None for anything else (a violated assertion's `!!` line)."""
    if not line.startswith("@@ "):
        return None
    body = line[3:]
    head, _, tail = body.partition(" -> ")
    answer, _, row = tail.partition(" | ")
    op, _, rest = head.partition(" ")
    return Step(
        op=op,
        args=dict(_PAIR.findall(rest)),
        answer=answer.strip() or None,
        row=dict(_PAIR.findall(row)),
        line=line,
    )


class Disagreement(AssertionError):
    """The ledger answered otherwise than the model at one step of the trace."""

    def __init__(self, index: int, step: Step, what: str) -> None:
        super().__init__(f"step {index} `{step.line}`: {what}")
        self.index = index
        self.step = step


@dataclass
class Replay:
    """One trace on one fresh ledger. `knobs`: the model's bounds the trace was made with."""

    ledger: Ledger
    dsn: str
    run_id: str
    knobs: dict[str, int | str]
    payload: dict[int, int] = field(default_factory=dict)
    # (key, settlement number in the model) -> the ledger's settled_at for it
    settled_at: dict[tuple[int, int], datetime | None] = field(default_factory=dict)
    # attempt -> when it began, by the database's clock (its `begin` line)
    began: dict[int, datetime] = field(default_factory=dict)
    steps: int = 0

    def knob(self, name: str, default: int) -> int:
        value = self.knobs.get(name, default)
        return int(value) if not isinstance(value, int) else value

    def key(self, k: int | str) -> str:
        return f"{self.run_id}:c{k}"

    def comp_key(self, k: int | str) -> str:
        return f"{self.run_id}:c{k}:compensation"

    async def run(self, lines: list[str]) -> int:
        """Replays every line; raises Disagreement at the first step the ledger answers otherwise.
        Returns the number of ledger transitions replayed."""
        for index, line in enumerate(lines):
            step = parse(line)
            if step is None or step.op in NOT_LEDGER:
                if step is not None and step.op == "call":
                    self.payload[step.key] = int(step.args.get("pay", "0"))
                if step is not None and step.op == "begin":
                    self.began[int(step.args["t"])] = await self._now()
                continue
            await self.apply(index, step)
            self.steps += 1
        return self.steps

    async def apply(self, index: int, step: Step) -> None:
        handler = getattr(self, f"_{step.op}", None)
        if handler is None:
            raise Disagreement(index, step, f"no replay for the model's `{step.op}`")
        answer = await handler(step)
        if step.answer is not None and answer is not None and answer != step.answer:
            raise Disagreement(index, step, f"the ledger answered {answer}, the model {step.answer}")
        if step.row:
            await self._compare_row(index, step, self.key(step.key))

    # -- the call path ---------------------------------------------------------------------------

    def _guard(self, step: Step) -> Guard:
        heard: list[Any] = []
        for name, value in step.args.items():
            if name.startswith("h") and name[1:].isdigit():
                status, _, version = value.partition("/")
                j = int(name[1:])
                if BEFORE_ISSUE_34:
                    heard.append(f"c{j}")
                    continue
                heard.append(
                    guards.Heard(
                        tool_call_id=f"c{j}",
                        status=_STATUS[status],
                        settled_at=self.settled_at.get((j, int(version))),
                    )
                )
        intent = {"I_HOLD": "hold", "I_REUSE": "reuse", "I_ALLOW": "allow"}[
            str(self.knobs.get("INTENT", "I_HOLD"))
        ]
        exclusive = bool(self.knob("EXCLUSIVE", 0))
        limit = self.knob("LIMIT", 0)
        return Guard(
            intent=intent,  # type: ignore[arg-type]
            heard=frozenset(heard),
            entity=ENTITY if exclusive or limit else None,
            exclusive=exclusive,
            amount=Decimal(1) if limit else None,
            limit=Decimal(limit) if limit else None,
            toolset=TOOLSET,
        )

    async def _reserve(self, step: Step) -> str:
        late = step.args.get("late") == "1"
        now = await self._now()
        deadline: dict[str, Any] = {}
        if not BEFORE_ISSUE_34:
            deadline["not_after"] = now - timedelta(seconds=1) if late else now + LEASE
        if TAKES_BEGAN and int(step.args["t"]) in self.began:
            deadline["began_at"] = self.began[int(step.args["t"])]
        try:
            result = await self.ledger.reserve(
                CallIdentity(tenant=TENANT, run_id=self.run_id, tool_call_id=f"c{step.key}", agent="model"),
                tool_name=TOOL,
                side_effect=SideEffect.EXTERNAL,
                arguments={"account": ENTITY, "amount_cents": 100 + self.payload.get(step.key, 0)},
                owner=f"w{step.args['t']}",
                approval=bool(self.knob("APPROVAL", 0)),
                lease=LEASE,
                guard=self._guard(step),
                **deadline,
            )
        except LedgerError as exc:
            if type(exc).__name__ == "AttemptExpiredError":
                return "O_DEADLINE"
            raise
        return next(name for name, value in _OUTCOME.items() if value is result.outcome)

    async def _release_unsent(self, step: Step) -> str:
        answer = await self._owner_reports(
            step.key, f"w{step.args['lost']}", False, FailureKind.NOT_ATTEMPTED
        )
        if "t" in step.args:  # the attempt released it itself: its retry is its own (Ledger.reserve)
            self.began[int(step.args["t"])] = await self._now()
        return answer

    async def _outcome(self, step: Step) -> str:
        kind = _KIND[step.args["kind"]]
        return await self._owner_reports(step.key, f"w{step.args['t']}", step.args["completed"] == "1", kind)

    async def _owner_reports(self, k: int, owner: str, completed: bool, kind: FailureKind | None) -> str:
        key = self.key(k)
        try:
            if completed:
                await self.ledger.complete(key, owner=owner, result={"credit": key})
            else:
                assert kind is not None
                await self.ledger.fail(key, owner=owner, kind=kind, error=kind.value)
        except OutcomeIgnoredError:
            return "O_IGNORED"
        return "O_OK"

    async def _indeterminate(self, step: Step) -> str:
        await self.ledger.mark_indeterminate(
            self.key(step.key),
            actor=f"w{step.args['by']}",
            reason="no answer in time",
            source=EventSource.OWNER,
        )
        return "O_OK"

    async def _inspect(self, step: Step) -> str:
        # activities/ledger_steps.py inspect_call, as the workflow runs it once the lease ran out
        key = self.key(step.key)
        record = await self.ledger.find(key)
        if record is not None and record.status is Status.STARTED:
            lease: dict[str, Any] = {} if BEFORE_ISSUE_34 else {"lease_ended": True}
            await self.ledger.mark_indeterminate(
                key, actor="inspector", reason="activity lost", source=EventSource.INSPECTOR, **lease
            )
        return "O_OK"

    async def _lease_expired(self, step: Step) -> None:
        await self._execute(
            "UPDATE tool_executions SET lease_expires_at = clock_timestamp() - interval '1 second' "
            "WHERE key = $1",
            self.key(step.key),
        )

    # -- decisions -------------------------------------------------------------------------------

    async def _settle(self, step: Step) -> str:
        key, completed = self.key(step.key), step.args["completed"] == "1"
        status = Status.COMPLETED if completed else Status.FAILED
        reconciler = step.args["by"] == "reconciler"
        actor = RECONCILER if reconciler else OPERATOR
        source = EventSource.RECONCILER if reconciler else EventSource.API
        # activities/reconcile.py: a plain hook's "not there" is proof only after the owner's lease
        waits: dict[str, Any] = {}
        if HOOK_WAITS_FOR_LEASE and reconciler and not completed:
            waits["after_owner_lease"] = self.knobs.get("RECEIVER") != "R_KIT"
        try:
            await self.ledger.settle(
                key,
                status=status,
                actor=actor,
                reason=f"{actor} looked at the receiver",
                evidence=EVIDENCE,
                result={"credit": key} if completed else None,
                source=source,
                **waits,
            )
        except LedgerError as exc:
            if type(exc).__name__ == "OwnerLeaseLiveError":
                return "O_EARLY"  # the round leaves the call as it is; the next one asks again
            if not isinstance(exc, InvalidTransitionError):
                raise
            if reconciler:  # activities/reconcile.py: a late outcome, a conflict if it contradicts
                await self.ledger.record_late_outcome(key, actor=actor, status=status, evidence=EVIDENCE)
            return "O_SETTLED"
        return "O_OK"

    async def _acknowledge(self, step: Step) -> str:
        status = _STATUS[step.args["status"]]
        assert status is not None
        await self.ledger.acknowledge_conflict(
            self.key(step.key), actor="operator:bob", status=status, reason="looked at it", evidence=EVIDENCE
        )
        return "O_OK"

    async def _approve(self, step: Step) -> str:
        await self.ledger.approve(self.key(step.key), actor=OPERATOR)
        return "O_OK"

    async def _deny(self, step: Step) -> str:
        by_deadline = step.args.get("by") == "deadline"
        try:
            await self.ledger.deny(
                self.key(step.key),
                actor=DEADLINE_ACTOR if by_deadline else OPERATOR,
                reason="no decision in time" if by_deadline else "not now",
                source=EventSource.DEADLINE if by_deadline else EventSource.API,
            )
        except InvalidTransitionError:
            return "O_SETTLED"
        return "O_OK"

    async def _release(self, step: Step) -> str:
        await self.ledger.release(self.key(step.key), actor=OPERATOR, reason="never sent; let it go")
        return "O_OK"

    # -- compensation ----------------------------------------------------------------------------

    async def _compensate(self, step: Step) -> str:
        await self.ledger.request_compensation(self.key(step.key), actor=OPERATOR, reason="undo it")
        return "O_OK"

    async def _comp_reserve(self, step: Step) -> None:
        key = self.key(step.key)
        await self.ledger.claim_compensation_request(key, workflow_run_id=f"compensation-{step.key}")
        result = await self.ledger.reserve(
            CallIdentity(tenant=TENANT, run_id=self.run_id, tool_call_id=f"c{step.key}:compensation"),
            tool_name="void_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments={"compensates": key},
            owner=f"comp{step.key}",
            lease=LEASE,
        )
        if not result.may_send:
            raise AssertionError(f"the compensation of {key} was not handed out: {result.outcome}")

    async def _comp_outcome(self, step: Step) -> None:
        key = self.comp_key(step.key)
        if step.args["completed"] == "1":
            await self.ledger.complete(key, owner=f"comp{step.key}", result={"voided": self.key(step.key)})
        else:
            await self.ledger.mark_indeterminate(
                key, actor=f"comp{step.key}", reason="no answer in time", source=EventSource.OWNER
            )

    async def _comp_settle(self, step: Step) -> None:
        status = _STATUS[step.args["status"]]
        assert status is not None
        await self.ledger.settle(
            self.comp_key(step.key), status=status, actor=OPERATOR, reason="looked at it", evidence=EVIDENCE
        )

    async def _mark_compensated(self, step: Step) -> None:
        done = await self.ledger.find(self.comp_key(step.key))
        if step.answer == "O_OK":
            assert done is not None and done.status is Status.COMPLETED
            await self.ledger.mark_compensated(
                self.key(step.key), actor=OPERATOR, reason="undo it", source=EventSource.COMPENSATION
            )
        # O_IGNORED: finish_compensation marks nothing unless the compensation completed

    # -- comparing -------------------------------------------------------------------------------

    async def _compare_row(self, index: int, step: Step, key: str) -> None:
        record = await self.ledger.find(key)
        model = step.row
        want_status = _STATUS[model["st"]]
        got: dict[str, Any] = {
            "status": record.status if record else None,
            "failure_kind": record.failure_kind if record else None,
            "owner": record.owner if record else None,
            "reused_from": record.reused_from if record else None,
            "held_by": record.held_by if record else None,
            "conflict": record.has_conflict if record else False,
        }
        want: dict[str, Any] = {
            "status": want_status,
            "failure_kind": _KIND[model["fk"]],
            "owner": f"w{model['own']}" if model["own"] != "0" else None,
            "reused_from": None if model["rf"] == _NOKEY else self.key(model["rf"]),
            "held_by": None if model["hb"] == _NOKEY else self.key(model["hb"]),
            "conflict": model["cf"] == "1",
        }
        if want_status is None:  # no row: nothing else to compare
            got, want = {"status": got["status"]}, {"status": None}
        if got != want:
            differ = {name: (got[name], want[name]) for name in want if got[name] != want[name]}
            raise Disagreement(index, step, f"the row differs (ledger, model): {differ}")
        if record is not None and record.status.is_settled:
            version = (step.key, int(model["v"]))
            seen = self.settled_at.setdefault(version, record.settled_at)
            if seen != record.settled_at:
                raise Disagreement(
                    index, step, f"settled_at moved ({seen} -> {record.settled_at}) where the model's did not"
                )
            for (k, v), at in self.settled_at.items():
                if k == step.key and v != version[1] and at == record.settled_at:
                    raise Disagreement(index, step, "the model settled it anew, the ledger did not")

    async def _now(self) -> datetime:
        conn = await asyncpg.connect(self.dsn)
        try:
            now: datetime = await conn.fetchval("SELECT clock_timestamp()")
        finally:
            await conn.close()
        return now

    async def _execute(self, sql: str, *args: Any) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(sql, *args)
        finally:
            await conn.close()
