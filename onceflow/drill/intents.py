"""How often each *intent* took effect, counted at the receiver, against what the ledger says.

A key stops onceflow from sending one call twice; it does not stop the model from asking twice. The
drill's model asks for the first credit again under a new tool call id (scenario.py), and the credit
tool declares intent `reuse`. An intent here is what billing pays: one run's credit of one amount to
one account. Billing's own list of credits (`GET /credits`) says how often each was paid, whatever
keys it came under; the ledger says which of its calls took effect.

Per run and intent, with `applied` the credits billing applied for it:
- applied is at most 1 (the headline: no intent applied more than once);
- applied equals the intent's calls that completed by sending (completed, not reused), plus any
  credit under a call still unresolved (its outcome is not known yet); at most one call sent it;
- a reused call points at a completed call of the same intent that billing applied, and billing
  never received a request under the reused call's own key (nothing was sent);
- when the original completed, the re-issue was given its result (reused), never sent;
- a completed run shows exactly 1 if any of the intent's calls completed, else 0 (every one of them
  failed without effect; the re-issue goes out again after a failure, so 0 needs two failures).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onceflow.drill.scenario import ORIGINAL_CALL, REISSUE_CALL, PlannedRun
from onceflow.ledger import Status

INVARIANT = "no_intent_applied_more_than_once"

Intent = tuple[str, int]  # (account_id, amount_cents)


@dataclass(frozen=True)
class AppliedCredit:
    """One credit billing applied, as billing records it."""

    key: str
    account_id: str
    amount_cents: int


@dataclass
class IntentCheck:
    account_id: str
    amount_cents: int
    calls: list[str]  # tool call ids of the run's calls with this intent
    applied: int  # credits billing applied for it (its own records)
    sent_and_completed: list[str] = field(default_factory=list)  # keys that completed by sending
    reused: list[str] = field(default_factory=list)  # keys handed an earlier call's result


def _intent_of(row: Mapping[str, Any]) -> Intent | None:
    if row.get("account_id") is None or row.get("amount_cents") is None:
        return None
    return str(row["account_id"]), int(row["amount_cents"])


def judge_intents(
    plan: PlannedRun,
    outcome: str,
    rows: Sequence[Mapping[str, Any]],
    credits: Sequence[AppliedCredit],
    received: Mapping[str, int],
) -> tuple[list[IntentCheck], list[str]]:
    """The run's intents and what is wrong with them (each problem prefixed with INVARIANT)."""
    prefix = plan.run_id + ":"
    row_by_key = {row["key"]: row for row in rows}
    calls: dict[Intent, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        intent = _intent_of(row)
        if intent is not None:
            calls[intent].append(row)
    paid: dict[Intent, list[str]] = defaultdict(list)
    for credit in credits:
        if credit.key.startswith(prefix):
            paid[(credit.account_id, credit.amount_cents)].append(credit.key)

    checks, problems = [], []

    def flag(intent: Intent, message: str) -> None:
        problems.append(f"{INVARIANT}: {plan.run_id} {intent[0]} {intent[1]}: {message}")

    for intent in sorted(set(calls) | set(paid)):
        own = sorted(calls.get(intent, []), key=lambda row: row["key"])
        keys = paid.get(intent, [])
        check = IntentCheck(intent[0], intent[1], [row["tool_call_id"] for row in own], len(keys))
        check.sent_and_completed = [
            r["key"] for r in own if r["status"] == Status.COMPLETED and not r.get("reused_from")
        ]
        check.reused = [r["key"] for r in own if r["status"] == Status.COMPLETED and r.get("reused_from")]
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
    original, again = row_by_key.get(plan.key(ORIGINAL_CALL)), row_by_key.get(plan.key(REISSUE_CALL))
    if original is not None and again is not None and original["status"] == Status.COMPLETED:
        reused_from = again.get("reused_from")
        if again["status"] != Status.COMPLETED or reused_from != original["key"]:
            intent = _intent_of(again) or ("?", 0)
            flag(
                intent,
                f"{again['key']} is {again['status']} (reused from {reused_from}); the original "
                f"completed, so the ledger should have handed it that result",
            )
        if received.get(again["key"], 0):
            intent = _intent_of(again) or ("?", 0)
            flag(intent, f"{again['key']} was sent although the original had completed")
    return checks, problems
