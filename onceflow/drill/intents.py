"""How often each *intent* took effect, counted at the receiver, against the default intent rule.

A key stops onceflow from sending one call twice; it does not stop the model from asking twice. The
drill's model asks for the order's credit three times (scenario.py): twice in one answer (the twins
did not hear each other, so by the default rule, ledger/guards.py, they are one intent) and once more
after it heard both outcomes (a new effect, owed). The credit tool declares no intent: the default
(`hold`) decides. An intent here is one run's credit of one amount to one account, made by the calls
the rule counts as one (`INTENT_OF_CALL`): the original and its twin, or the heard repeat alone.
Billing's own list of credits (`GET /credits`: key, account, amount) says how often each was paid;
the ledger says which of its calls took effect, and billing's request record how often each key
arrived.

The conflict runs (scenario.py RunPath) are judged the same way with their own intents: the model's
retry of the first credit, asked after it was told that credit "failed", is the same intent as the
first (paths.py decides from what the model was told, not from the ledger). The reset runs' intents
are the credits the model asked in its last conversation, and are judged in paths.py.

Per run and intent, with `applied` the credits billing applied for it:
- applied is at most 1 (the headline: no intent applied more than once);
- applied equals the intent's calls that completed by sending (completed, not reused), plus any
  credit under a call still unresolved (its outcome is not known yet); at most one call sent it;
- a reused call points at a completed call of the same intent that billing applied, and billing
  never received a request under the reused call's own key (nothing was sent);
- when the original completed, its twin was given its result (reused), never sent;
- the heard repeat is owed: it is sent, never handed an earlier call's result;
- a completed run shows exactly 1 for an intent whose calls completed, else 0 (each of them failed
  without effect: the twin goes out after the original failed, so 0 there needs two failures).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onceflow.drill.scenario import INTENT_OF_CALL, ORIGINAL_CALL, OWED_CALL, REISSUE_CALL, PlannedRun
from onceflow.ledger import Status

INVARIANT = "no_intent_applied_more_than_once"

Intent = tuple[str, int, str]  # (account_id, amount_cents, the intent's first call)


@dataclass(frozen=True)
class AppliedCredit:
    """One credit billing applied, as billing records it."""

    key: str
    account_id: str
    amount_cents: int
    credit_id: str = ""


@dataclass
class IntentCheck:
    account_id: str
    amount_cents: int
    calls: list[str]  # tool call ids of the run's calls with this intent
    applied: int  # credits billing applied for it (its own records)
    intent: str = ""  # the intent's first call (INTENT_OF_CALL)
    requests: int = 0  # credit requests billing received under the intent's keys
    sent_and_completed: list[str] = field(default_factory=list)  # keys that completed by sending
    reused: list[str] = field(default_factory=list)  # keys handed an earlier call's result
    held: list[str] = field(default_factory=list)  # keys the ledger held behind a twin at some point


def _call_of(key: str) -> str:
    return key.rsplit(":", 1)[-1]


def judge_intents(
    plan: PlannedRun,
    outcome: str,
    rows: Sequence[Mapping[str, Any]],
    credits: Sequence[AppliedCredit],
    received: Mapping[str, int],
    held: Collection[str] = (),
    intent_of_call: Mapping[str, str] = INTENT_OF_CALL,
) -> tuple[list[IntentCheck], list[str]]:
    """The run's intents and what is wrong with them (each problem prefixed with INVARIANT).
    `intent_of_call` names each call's intent by its first call (a call not in it is its own)."""
    prefix = plan.run_id + ":"

    def _intent_of(row: Mapping[str, Any]) -> Intent | None:
        if row.get("account_id") is None or row.get("amount_cents") is None:
            return None
        call = str(row["tool_call_id"])
        return str(row["account_id"]), int(row["amount_cents"]), intent_of_call.get(call, call)

    row_by_key = {row["key"]: row for row in rows}
    calls: dict[Intent, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        intent = _intent_of(row)
        if intent is not None:
            calls[intent].append(row)
    paid: dict[Intent, list[str]] = defaultdict(list)
    for credit in credits:
        if credit.key.startswith(prefix):
            call = _call_of(credit.key)
            paid[(credit.account_id, credit.amount_cents, intent_of_call.get(call, call))].append(credit.key)

    checks, problems = [], []

    def flag(intent: Intent | None, message: str) -> None:
        account, amount, first = intent or ("?", 0, "?")
        problems.append(f"{INVARIANT}: {plan.run_id} {account} {amount} ({first}): {message}")

    for intent in sorted(set(calls) | set(paid)):
        own = sorted(calls.get(intent, []), key=lambda row: row["key"])
        keys = paid.get(intent, [])
        check = IntentCheck(
            intent[0],
            intent[1],
            [row["tool_call_id"] for row in own],
            len(keys),
            intent=intent[2],
            requests=sum(received.get(row["key"], 0) for row in own),
        )
        check.sent_and_completed = [
            r["key"] for r in own if r["status"] == Status.COMPLETED and not r.get("reused_from")
        ]
        check.reused = [r["key"] for r in own if r["status"] == Status.COMPLETED and r.get("reused_from")]
        check.held = [r["key"] for r in own if r["key"] in held]
        unresolved = {r["key"] for r in own if Status(r["status"]).is_unresolved}
        checks.append(check)
        if check.applied > 1:
            flag(intent, f"billing applied it {check.applied} times (under {', '.join(sorted(keys))})")
        if len(check.sent_and_completed) > 1:
            flag(intent, f"{len(check.sent_and_completed)} calls sent it and completed")
        maybe = sum(1 for key in keys if key in unresolved)
        if check.applied != len(check.sent_and_completed) + maybe:
            flag(
                intent,
                f"the ledger says {len(check.sent_and_completed)} calls took effect"
                f" ({maybe} more unresolved with a credit), billing applied it {check.applied} times",
            )
        for key in check.reused:
            source = row_by_key.get(row_by_key[key]["reused_from"])
            if source is None or _intent_of(source) != intent or source["status"] != Status.COMPLETED:
                flag(intent, f"{key} reused {row_by_key[key]['reused_from']}, no completed call of it")
            elif source["key"] not in keys:
                flag(intent, f"{key} reused {source['key']}, which billing never applied")
            if received.get(key, 0):
                flag(intent, f"{key} was reused, yet billing received {received[key]} requests under it")
        if outcome == "completed":
            wanted = 1 if any(r["status"] == Status.COMPLETED for r in own) else 0
            if check.applied != wanted:
                flag(intent, f"the run completed; billing applied it {check.applied} times, not {wanted}")
    if plan.path is not None:
        return checks, problems  # the checks below are of the default agent's script
    original, twin = row_by_key.get(plan.key(ORIGINAL_CALL)), row_by_key.get(plan.key(REISSUE_CALL))
    if original is not None and twin is not None and original["status"] == Status.COMPLETED:
        reused_from = twin.get("reused_from")
        if twin["status"] != Status.COMPLETED or reused_from != original["key"]:
            flag(
                _intent_of(twin),
                f"{twin['key']} is {twin['status']} (reused from {reused_from}); the original "
                f"completed before it was heard, so the ledger should have handed the twin that result",
            )
        if received.get(twin["key"], 0):
            flag(_intent_of(twin), f"{twin['key']} was sent although its unheard twin had completed")
    owed = row_by_key.get(plan.key(OWED_CALL))
    if owed is not None and owed.get("reused_from"):
        flag(
            _intent_of(owed),
            f"{owed['key']} was asked after the model heard its twins, so it is owed; the ledger "
            f"handed it {owed['reused_from']}'s result instead of sending it",
        )
    return checks, problems
