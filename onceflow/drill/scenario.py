"""What the drill runs: the agents, their calls, and which kill point (or path) each run is planned to meet."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from onceflow.drill.points import KillPoint

AGENT = "drill-credits"
CONFLICT_AGENT = "drill-conflict"
RESET_AGENT = "drill-reset"
TENANT = "drill"

# One lookup; the order's credit, a credit of 100 and the order's credit again, all in one answer
# (twins that did not hear each other: one intent); a second lookup and a credit of 250; then the
# order's credit once more, after the model heard both twins' outcomes (a new effect, owed). Five
# model turns, two reads, five writes. The credit tool declares no intent, so the ledger's default
# rule (`hold`, ledger/guards.py) decides: the unheard twin is the same intent, the heard repeat is not.
#
# The runs of the two paths (RunPath) have an agent each with one shorter script: a lookup, the
# order's credit, the order's credit again (asked after hearing the first's outcome), the final
# answer. The conflict runs' agent uses the scripted ids (call_1_0, call_2_0); the reset runs' agent
# gets a new tool call id on every answer, as real providers give, so a reset makes it re-issue its
# credits under keys the run has not seen.
AGENTS_YAML = f"""\
toolsets:
  drill-billing: onceflow.drill.tools:toolset
agents:
  {AGENT}:
    model:
      provider: scripted
      wrapper: onceflow.drill.tools:holding_model
      script:
        - tool_calls:
            - name: lookup_order
              arguments: {{order_id: "{{{{ input.order_id }}}}"}}
        - tool_calls:
            - name: issue_credit
              arguments:
                account_id: "{{{{ results.lookup_order.account_id }}}}"
                amount_cents: "{{{{ results.lookup_order.amount_cents }}}}"
            - name: issue_credit
              arguments: {{account_id: "{{{{ results.lookup_order.account_id }}}}", amount_cents: 100}}
            - name: issue_credit
              arguments:
                account_id: "{{{{ results.lookup_order.account_id }}}}"
                amount_cents: "{{{{ results.lookup_order.amount_cents }}}}"
        - tool_calls:
            - name: lookup_order
              arguments: {{order_id: "{{{{ input.order_id }}}}"}}
            - name: issue_credit
              arguments: {{account_id: "{{{{ results.lookup_order.account_id }}}}", amount_cents: 250}}
        - tool_calls:
            - name: issue_credit
              arguments:
                account_id: "{{{{ results.lookup_order.account_id }}}}"
                amount_cents: "{{{{ results.lookup_order.amount_cents }}}}"
        - final: "last credit: {{{{ results.issue_credit }}}}"
    instructions: Credit the order's amount, 100 and 250 to its account; then credit the order's amount once more.
    toolsets: [drill-billing]
    tool_policy: &policy
      on_indeterminate: pause
      reconcile_deadline: 5m
      reconcile_initial_interval: 0.5s
      reconcile_max_interval: 2s
  {CONFLICT_AGENT}:
    model:
      provider: scripted
      wrapper: onceflow.drill.tools:holding_model
      script: &credit_twice
        - tool_calls:
            - name: lookup_order
              arguments: {{order_id: "{{{{ input.order_id }}}}"}}
        - tool_calls:
            - name: issue_credit
              arguments:
                account_id: "{{{{ results.lookup_order.account_id }}}}"
                amount_cents: "{{{{ results.lookup_order.amount_cents }}}}"
        - tool_calls:
            - name: issue_credit
              arguments:
                account_id: "{{{{ results.lookup_order.account_id }}}}"
                amount_cents: "{{{{ results.lookup_order.amount_cents }}}}"
        - final: "last credit: {{{{ results.issue_credit }}}}"
    instructions: Credit the order's amount to its account; then credit it again.
    toolsets: [drill-billing]
    tool_policy: *policy
  {RESET_AGENT}:
    model:
      provider: scripted
      wrapper: onceflow.drill.tools:fresh_id_model
      script: *credit_twice
    instructions: Credit the order's amount to its account; then credit it again.
    toolsets: [drill-billing]
    tool_policy: *policy
"""
MODEL_TURNS = 5
ORIGINAL_CALL = "call_1_0"  # the order-amount credit
REISSUE_CALL = "call_1_2"  # its twin in the same answer: it did not hear the original, so one intent
OWED_CALL = "call_3_0"  # the order-amount credit asked after hearing both: a new effect, owed
WRITE_CALLS = (ORIGINAL_CALL, "call_1_1", REISSUE_CALL, "call_2_1", OWED_CALL)
# The calls that are always sent unless something fails; the twin is sent only when the original
# failed without effect (otherwise the ledger hands it the original's result).
SENT_CALLS = (ORIGINAL_CALL, "call_1_1", "call_2_1", OWED_CALL)
# The intents of a run's calls, as the default rule has them: the original and its unheard twin are
# one; every other call is its own.
INTENT_OF_CALL = {call: ORIGINAL_CALL if call == REISSUE_CALL else call for call in WRITE_CALLS}

# The conflict runs' calls: the credit whose answer is lost, and the model's retry of it, asked on
# turn 2 after it was told the first "failed" (the same intent, since the model asks again only
# because it heard the first did not take effect).
FIRST_CREDIT = "call_1_0"
RETRY_CREDIT = "call_2_0"
RETRY_TURN = 2
CONFLICT_CALLS = (FIRST_CREDIT, RETRY_CREDIT)
CREDIT_TURNS = (1, 2)  # the two-credit script's turns that ask for a credit


class RunPath(StrEnum):
    """Runs that meet no kill point: the drill walks them down a path by acting as an operator or
    as Temporal's reset (operator.py, resets.py) while workers are still killed at random."""

    # The first credit applies and billing hangs; its reconcile hook leaves it to the operator, who
    # settles it failed; the model is told; the owner's late "completed" opens a conflict; the
    # model's retry is held; the operator acknowledges the conflict as completed; the retry is
    # handed the first credit's result.
    CONFLICT = "conflict"
    # A Temporal reset to before a credit turn, after the run completed or while its first credit
    # is on the wire: the model re-issues its credits under new ids, and each re-issue must be
    # paired with its own earlier effect.
    RESET = "reset"


# Every run of a cycle meets one kill point, or none (billing then refuses its first credit at the
# door, 423 locked, so the ledger records a definite "not attempted" failure, and the twin, which
# the ledger then lets through, is the one credit that pays that intent), or walks one of the paths.
CYCLE: tuple[KillPoint | RunPath | None, ...] = (*KillPoint, None, *RunPath)
LOCKED = "locked"  # the name of the runs that meet no kill point and walk no path


def kind_name(kind: KillPoint | RunPath | None) -> str:
    return kind.value if kind is not None else LOCKED


KIND_NAMES = tuple(kind_name(kind) for kind in CYCLE)

# Billing faults that keep the request inside the service (seconds): far beyond the tool's timeout,
# so only the kill (or the tool's own timeout) ends the wait.
HANG_SECONDS = 20.0


@dataclass
class PlannedRun:
    """One run of a drill agent and the kill point (or path) planned for it."""

    index: int
    run_id: str
    order_id: str
    point: KillPoint | None = None
    condition: dict[str, Any] = field(default_factory=dict)
    fault: str | None = None  # billing fault mode set on the account before the run starts
    path: RunPath | None = None

    @property
    def account_id(self) -> str:
        return "acct_" + self.order_id.removeprefix("ord_")

    @property
    def agent(self) -> str:
        if self.path is RunPath.CONFLICT:
            return CONFLICT_AGENT
        return RESET_AGENT if self.path is RunPath.RESET else AGENT

    @property
    def kind(self) -> str | None:
        """What the report names the run by: its kill point or path; None for the locked runs."""
        return self.point.value if self.point else (self.path.value if self.path else None)

    @property
    def write_calls(self) -> tuple[str, ...]:
        """The tool call ids of the run's writes, known before it runs; none for a reset run, whose
        model mints a new id on every answer."""
        if self.path is RunPath.RESET:
            return ()
        return CONFLICT_CALLS if self.path is RunPath.CONFLICT else WRITE_CALLS

    def keys(self) -> list[str]:
        return [f"{self.run_id}:{call}" for call in self.write_calls]

    def key(self, tool_call_id: str) -> str:
        return f"{self.run_id}:{tool_call_id}"


def plan_runs(runs: int, seed: int, only: tuple[str, ...] = ()) -> list[PlannedRun]:
    """Runs in start order; run i meets CYCLE[i % len(CYCLE)], with details drawn from the seed
    (`only`, for tests of the drill: the cycle keeps just the kinds named, KIND_NAMES).

    The first credit's answer is lost on purpose in a good share of them: `downstream` and `reconcile`
    (billing holds it), `after_answer` on it in half of those runs, `reserve` (billing applies it
    and hangs, then the worker reserving its twin is killed), every conflict run, and the reset runs
    reset while it is on the wire.
    """
    unknown = set(only) - set(KIND_NAMES)
    if unknown:
        raise ValueError(
            f"no kind of run named {', '.join(sorted(unknown))}; there are {', '.join(KIND_NAMES)}"
        )
    cycle = [kind for kind in CYCLE if not only or kind_name(kind) in only]
    rng = random.Random(seed)
    planned = []
    for index in range(runs):
        kind = cycle[index % len(cycle)]
        run = PlannedRun(index, f"drill-{seed}-{index:04d}", f"ord_d{seed}n{index}")
        if isinstance(kind, RunPath):
            run.path = kind
        else:
            run.point = kind
        if run.path is RunPath.CONFLICT:
            run.fault = "apply_then_hang"
        elif run.path is RunPath.RESET:
            # Reset once the run completed (every earlier credit settled), or while the first credit
            # is held by billing (applied, its answer not yet back); to before either credit turn.
            moment = "done" if rng.random() < 0.5 else "in_flight"
            run.condition = {"moment": moment, "turn": rng.choice(CREDIT_TURNS)}
            run.fault = "apply_then_hang" if moment == "in_flight" else None
        elif run.point is KillPoint.MODEL:
            run.condition = {"turn": rng.randrange(MODEL_TURNS)}
        elif run.point is KillPoint.BEFORE_SEND:
            run.condition = {"tool_call_id": rng.choice(SENT_CALLS)}
        elif run.point is KillPoint.AFTER_ANSWER:
            # Half of them on the first credit: applied, the answer lost, then its twin.
            others = SENT_CALLS[1:]
            run.condition = {"tool_call_id": ORIGINAL_CALL if rng.random() < 0.5 else rng.choice(others)}
        elif run.point is KillPoint.DOWNSTREAM:
            # The account fault strikes the run's first credit; the tool announces that same call.
            run.fault = rng.choice(("apply_then_hang", "slow"))
        elif run.point is KillPoint.RECONCILE:
            # The first credit applies and hangs past the tool's timeout: indeterminate, reconciled.
            run.fault = "apply_then_hang"
        elif run.point is KillPoint.RESERVE:
            # The first credit's answer is lost (applied, then billing hangs; the hook finds it), and
            # the worker reserving its twin is killed inside the reservation's transaction.
            run.condition = {"tool_call_id": REISSUE_CALL}
            run.fault = "apply_then_hang"
        elif run.point is None:
            run.fault = "locked"
        planned.append(run)
    return planned


@dataclass(frozen=True)
class DrillConfig:
    runs: int = 200
    seed: int = 1
    data_dir: Path = Path(".onceflow/drills")
    report: Path | None = None
    workers: int = 2
    concurrency: int = 8  # runs in flight at once
    random_kills: bool = True
    planned_kills: bool = True  # arm the kill points (off: only faults, and random kills if on)
    kill_interval: tuple[float, float] = (3.0, 10.0)  # seconds between random kills
    timeout: float = 1800.0  # give up on runs still going this long after the drill started
    # Tests of the drill only: workers that send a write again after its timeout (sabotage.py).
    sabotage: bool = False
    # Tests of the drill only: the credit tool declared with this intent (allow or reuse), not the default.
    sabotage_intent: str | None = None
    # Tests of the drill only: plan just these kinds of run (KIND_NAMES); all of them when empty.
    only: tuple[str, ...] = ()

    def run_dir(self) -> Path:
        return self.data_dir.resolve() / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{self.seed}-runs{self.runs}"
