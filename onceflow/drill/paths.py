"""Judge the runs the drill walked down a path (scenario.py RunPath) by what their model was told.

What the model was told is read from the conversations the drill's model wrapper wrote down as the
model received them (told.py), never from the ledger; what was paid, from billing's own credits
(key, account, amount, credit id) and its record of the requests it received. Nothing here reads
the ledger; judge.py adds, as a figure only, how often a re-issue was held (the ledger's events).

Conflict runs: the first credit c1 (call_1_0) and the model's retry c2 (call_2_0), asked after the
model was told how c1 ended. Told "failed", c2 is the same intent as c1: with billing showing a
credit under c1, c2 must be told it took effect with c1's credit (`reused_from` c1, the credit id
billing applied under c1's key) and billing must have received nothing under c2's key; with no
credit under c1, c2 is the one payment and must be told its own credit.

Reset runs: the credits asked in the last conversation of the run's last Temporal run are its
intents (each asked after hearing the one before: owed); the calls asked again after the reset are
its re-issues. Every credit the model was told must be one billing applied for the run, no credit id
may be told twice (two re-issues of two earlier effects get one each), a call told it was handed an
earlier call's result must be told the credit billing applied under that call's key and must not
have been sent itself, a call told it took effect by its own send must be told its own credit, and
once the run completed billing must have paid nothing the model was not told of (a payment beyond
the credits it asked for: an intent paid twice).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onceflow.drill.intents import INVARIANT as INTENT_INVARIANT
from onceflow.drill.intents import AppliedCredit, IntentCheck
from onceflow.drill.scenario import FIRST_CREDIT, RETRY_CREDIT, RETRY_TURN, PlannedRun, RunPath
from onceflow.drill.told import ModelCall, ToldCall, last_conversation
from onceflow.drill.walks import Walk

if TYPE_CHECKING:
    from onceflow.drill.judge import RunEnd

TOLD_INVARIANT = "reissues_told_their_own_original"
CREDIT_TOOL = "issue_credit"


@dataclass
class PathCheck:
    path: str
    walked: bool = False  # the drill took the run down the whole path and the run finished it
    walk_steps: list[str] = field(default_factory=list)
    walk_error: str | None = None
    told: dict[str, str] = field(default_factory=dict)  # call -> what the model was told, in short
    reissues: list[str] = field(
        default_factory=list
    )  # keys: the retry, or the calls asked again after the reset
    reused: list[str] = field(default_factory=list)  # of those, told an earlier call's result
    sent: list[str] = field(default_factory=list)  # of those, received by billing under their own key
    held: list[str] = field(default_factory=list)  # of those, held by the ledger at some point (its events)
    credit_ids_told_twice: int = 0
    told_another_result: int = 0  # told a credit that is not its own (or its original's)
    untold_credits: int = 0  # credits billing applied for the run that the model was never told of
    intent_of: dict[str, str] = field(default_factory=dict)
    intents: list[IntentCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _said(call: ToldCall | None) -> str:
    if call is None or call.told is None:
        return "nothing yet"
    if call.took_effect:
        handed = f", handed {call.reused_from}'s result" if call.reused_from else ""
        return f"took effect (credit {call.credit_id}{handed})"
    return "did not take effect" if call.told_failed else f"unknown ({call.told.get('error')})"


def _of(conversation: ModelCall | None, tool_call_id: str) -> ToldCall | None:
    if conversation is None:
        return None
    return next((c for c in conversation.calls(CREDIT_TOOL) if c.tool_call_id == tool_call_id), None)


def _start(plan: PlannedRun, walk: Walk | None, path: RunPath) -> PathCheck:
    check = PathCheck(path.value)
    if walk is not None:
        check.walk_steps, check.walk_error = list(walk.steps), walk.error
        if walk.error:
            check.problems.append(f"every_path_walked: {plan.run_id}: the drill's walk failed: {walk.error}")
    return check


def judge_conflict(
    plan: PlannedRun,
    end: RunEnd | None,
    credits: Sequence[AppliedCredit],
    received: Mapping[str, int],
    told: Sequence[ModelCall],
    walk: Walk | None,
) -> PathCheck:
    """The conflict run's told checks, and its intents for judge_intents (`intent_of`)."""
    check = _start(plan, walk, RunPath.CONFLICT)
    temporal = end.temporal_run_id if end is not None else None
    mine = [c for c in told if temporal is None or c.temporal_run_id == temporal]
    last = last_conversation(list(mine), None)
    at_retry = [c for c in mine if c.turn == RETRY_TURN]
    heard_first = _of(at_retry[-1], FIRST_CREDIT) if at_retry else None
    retry_is_a_retry = heard_first is not None and heard_first.told_failed
    check.intent_of = {
        FIRST_CREDIT: FIRST_CREDIT,
        RETRY_CREDIT: FIRST_CREDIT if retry_is_a_retry else RETRY_CREDIT,
    }
    check.told = {
        f"{FIRST_CREDIT} at turn {RETRY_TURN}": _said(heard_first),
        RETRY_CREDIT: _said(_of(last, RETRY_CREDIT)),
    }

    def flag(message: str) -> None:
        check.problems.append(f"{TOLD_INVARIANT}: {plan.run_id}: {message}")

    by_key = {c.key: c for c in credits if c.key.startswith(plan.run_id + ":")}
    first_paid = by_key.get(plan.key(FIRST_CREDIT))
    retry = _of(last, RETRY_CREDIT)
    retry_key = plan.key(RETRY_CREDIT)
    if retry is not None and retry.told is not None:
        check.reissues = [retry_key]
        check.reused = [retry_key] if retry.reused_from else []
        check.sent = [retry_key] if received.get(retry_key) else []
        if first_paid is not None and retry_is_a_retry:
            if not (retry.reused_from == FIRST_CREDIT and retry.credit_id == first_paid.credit_id):
                check.told_another_result += 1
                flag(
                    f"billing applied {FIRST_CREDIT} ({first_paid.credit_id}) and the model, told it failed, "
                    f"asked again; the retry {RETRY_CREDIT} was told {_said(retry)}, not that credit"
                )
            if received.get(retry_key):
                flag(
                    f"the retry {RETRY_CREDIT} was sent ({received[retry_key]} requests) though {FIRST_CREDIT} had paid"
                )
        elif retry.took_effect and not retry.reused_from:
            own = by_key.get(retry_key)
            if own is None or own.credit_id != retry.credit_id:
                check.told_another_result += 1
                flag(
                    f"{RETRY_CREDIT} was told {_said(retry)}; billing applied {own and own.credit_id} under its key"
                )
    _told_credits_exist(last, {c.credit_id for c in credits if c.key.startswith(plan.run_id + ":")}, flag)
    check.walked = bool(
        walk is not None
        and walk.late_report is not None
        and walk.acknowledged
        and retry_is_a_retry
        and retry is not None
        and retry.reused_from == FIRST_CREDIT
        and first_paid is not None
        and retry.credit_id == first_paid.credit_id
        and not received.get(retry_key)
    )
    return check


def _told_credits_exist(conversation: ModelCall | None, applied: set[str], flag: Any) -> None:
    """Every credit id the model was told is one billing applied for this run."""
    for call in conversation.calls(CREDIT_TOOL) if conversation else []:
        if call.took_effect and call.credit_id not in applied:
            flag(f"{call.tool_call_id} was told {_said(call)}; billing applied no such credit for the run")


def judge_reset(
    plan: PlannedRun,
    end: RunEnd | None,
    credits: Sequence[AppliedCredit],
    received: Mapping[str, int],
    told: Sequence[ModelCall],
    walk: Walk | None,
) -> PathCheck:
    """The reset run's told checks and its intents (one per credit of its last conversation)."""
    check = _start(plan, walk, RunPath.RESET)
    outcome = end.outcome if end is not None else "not started"
    temporal = end.temporal_run_id if end is not None else None
    last = last_conversation(list(told), temporal)
    asks = last.calls(CREDIT_TOOL) if last else []
    reset_made = walk is not None and walk.reset_to is not None and temporal == walk.reset_to
    first_turn = int(plan.condition.get("turn", 1))
    run_credits = [c for c in credits if c.key.startswith(plan.run_id + ":")]
    by_id = {c.credit_id: c for c in run_credits}
    check.told = {ask.tool_call_id: _said(ask) for ask in asks}

    def flag(message: str, invariant: str = TOLD_INVARIANT) -> None:
        check.problems.append(f"{invariant}: {plan.run_id}: {message}")

    told_ids: dict[str, str] = {}
    for ask in asks:
        key = plan.key(ask.tool_call_id)
        if reset_made and ask.turn >= first_turn:
            check.reissues.append(key)
            check.reused += [key] if ask.reused_from else []
            check.sent += [key] if received.get(key) else []
        if not ask.took_effect:
            continue
        credit = by_id.get(ask.credit_id or "")
        source = plan.key(ask.reused_from) if ask.reused_from else key
        if ask.credit_id in told_ids:
            check.credit_ids_told_twice += 1
            flag(
                f"credit {ask.credit_id} was told to {told_ids[ask.credit_id]} and again to {ask.tool_call_id}"
            )
        elif ask.credit_id:
            told_ids[ask.credit_id] = ask.tool_call_id
        if credit is None:
            flag(f"{ask.tool_call_id} was told {_said(ask)}; billing applied no such credit for the run")
        elif credit.key != source:
            check.told_another_result += 1
            own = "its own" if source == key else f"{ask.reused_from}'s"
            flag(f"{ask.tool_call_id} was told {_said(ask)}, the credit under {credit.key}, not {own}")
        if ask.reused_from and received.get(key):
            flag(
                f"{ask.tool_call_id} was told it was handed {ask.reused_from}'s result, yet billing "
                f"received {received[key]} requests under its key"
            )

    # Intents: one per credit the model asked in its last conversation, paid as billing says.
    account = plan.account_id
    for ask in asks:
        key = plan.key(ask.tool_call_id)
        told_credit = by_id.get(ask.credit_id or "") if ask.took_effect else None
        calls = [ask.tool_call_id] + ([ask.reused_from] if ask.reused_from else [])
        check.intents.append(
            IntentCheck(
                account,
                int(ask.arguments.get("amount_cents") or 0),
                calls,
                1 if told_credit else 0,
                intent=ask.tool_call_id,
                requests=sum(received.get(plan.key(call), 0) for call in calls),
                sent_and_completed=[key] if ask.took_effect and not ask.reused_from else [],
                reused=[key] if ask.reused_from else [],
            )
        )
    if outcome == "completed":
        # Paid and never told, whatever the ledger says of its call (one the model heard "failed"
        # of, or one still unknown from the history the reset discarded, count too): the model
        # does not know of it, so it is a payment beyond the credits it asked for.
        untold = [c for c in run_credits if c.credit_id not in told_ids]
        check.untold_credits = len(untold)
        for credit in untold:
            same = [i for i in check.intents if i.amount_cents == credit.amount_cents]
            if same:
                same[0].applied += 1
            flag(
                f"billing applied {credit.credit_id} under {credit.key} ({credit.amount_cents}), and the "
                "model was told of no such credit: a payment beyond the credits it asked for",
                INTENT_INVARIANT,
            )
    for intent in check.intents:
        if intent.applied > 1:
            flag(f"the credit asked as {intent.intent} was paid {intent.applied} times", INTENT_INVARIANT)
    check.walked = reset_made and outcome == "completed" and bool(check.reissues)
    return check


def path_figures(
    path: RunPath,
    checks: Sequence[PathCheck],
    walks: Sequence[Walk],
    *,
    keys_sent_twice: int,
    intents_paid_twice: int,
) -> dict[str, int]:
    """What the drill did on one path's runs and what became of their re-issues, for the report."""
    figures = {
        "runs": len(checks),
        "walked": sum(1 for c in checks if c.walked),
        "walks_failed": sum(1 for w in walks if w.error),
    }
    if path is RunPath.CONFLICT:
        figures["late_reports"] = sum(1 for w in walks if w.late_report)
        figures["conflicts_acknowledged"] = sum(1 for w in walks if w.acknowledged)
    else:
        figures["resets_made"] = sum(1 for w in walks if w.reset_to)
        figures["resets_in_flight"] = sum(1 for w in walks if w.reset_to and w.moment == "in_flight")
    return figures | {
        "reissues": sum(len(c.reissues) for c in checks),
        "reissues_held": sum(len(c.held) for c in checks),
        "reissues_handed_their_original": sum(len(c.reused) for c in checks),
        "reissues_sent": sum(len(c.sent) for c in checks),
        "credit_ids_told_twice": sum(c.credit_ids_told_twice for c in checks),
        "told_another_calls_credit": sum(c.told_another_result for c in checks),
        "credits_paid_never_told": sum(c.untold_credits for c in checks),
        "keys_sent_more_than_once": keys_sent_twice,
        "intents_applied_more_than_once": intents_paid_twice,
    }
