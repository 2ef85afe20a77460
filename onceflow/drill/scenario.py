"""What the drill runs: the agent, its calls, and which kill point each run is planned to meet."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceflow.drill.points import KillPoint

AGENT = "drill-credits"
TENANT = "drill"

# One lookup, two credits in one turn, then a second lookup and a third credit; then the model asks
# for the first credit again, same arguments, new tool call id, as a model does after a lost answer
# or a reset. Five model turns, two reads, four writes: three distinct credits and the re-issue. The
# credit tool declares intent `reuse` (tools.py): the re-issue must not pay the order twice.
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
    instructions: Credit the order's account three times, once per call; then make sure of the first.
    toolsets: [drill-billing]
    tool_policy:
      on_indeterminate: pause
      reconcile_deadline: 5m
      reconcile_initial_interval: 0.5s
      reconcile_max_interval: 2s
"""
MODEL_TURNS = 5
ORIGINAL_CALL = "call_1_0"  # the order-amount credit
REISSUE_CALL = "call_3_0"  # the same credit, asked again in a later turn
WRITE_CALLS = (ORIGINAL_CALL, "call_1_1", "call_2_1", REISSUE_CALL)
# The calls that are always sent unless something fails; the re-issue is sent only when the
# original failed without effect (otherwise the ledger hands it the original's result).
SENT_CALLS = WRITE_CALLS[:3]

# Every seventh run meets no planned point, only whatever random kills strike; billing refuses its
# first credit at the door (423 locked), so the ledger records a definite "not attempted" failure
# (and the re-issue, which the ledger then lets through, is the one credit that pays).
CYCLE: tuple[KillPoint | None, ...] = (*KillPoint, None)

# Billing faults that keep the request inside the service (seconds): far beyond the tool's timeout,
# so only the kill (or the tool's own timeout) ends the wait.
HANG_SECONDS = 20.0


@dataclass
class PlannedRun:
    """One run of the drill agent and the kill point planned for it."""

    index: int
    run_id: str
    order_id: str
    point: KillPoint | None = None
    condition: dict[str, Any] = field(default_factory=dict)
    fault: str | None = None  # billing fault mode set on the account before the run starts

    @property
    def account_id(self) -> str:
        return "acct_" + self.order_id.removeprefix("ord_")

    def keys(self) -> list[str]:
        return [f"{self.run_id}:{call}" for call in WRITE_CALLS]

    def key(self, tool_call_id: str) -> str:
        return f"{self.run_id}:{tool_call_id}"


def plan_runs(runs: int, seed: int) -> list[PlannedRun]:
    """Runs in start order; run i meets CYCLE[i % 7], with details drawn from the seed.

    The first credit's answer is lost on purpose in a good share of them: `downstream` and `reconcile`
    (billing holds it), `after_answer` on it in half of those runs, and `reserve` (billing applies it
    and hangs, then the worker reserving the re-issue is killed).
    """
    rng = random.Random(seed)
    planned = []
    for index in range(runs):
        run = PlannedRun(
            index, f"drill-{seed}-{index:04d}", f"ord_d{seed}n{index}", CYCLE[index % len(CYCLE)]
        )
        if run.point is KillPoint.MODEL:
            run.condition = {"turn": rng.randrange(MODEL_TURNS)}
        elif run.point is KillPoint.BEFORE_SEND:
            run.condition = {"tool_call_id": rng.choice(SENT_CALLS)}
        elif run.point is KillPoint.AFTER_ANSWER:
            # Half of them on the first credit: applied, the answer lost, then the re-issue.
            run.condition = {"tool_call_id": rng.choice((ORIGINAL_CALL, *SENT_CALLS))}
        elif run.point is KillPoint.DOWNSTREAM:
            # The account fault strikes the run's first credit; the tool announces that same call.
            run.fault = rng.choice(("apply_then_hang", "slow"))
        elif run.point is KillPoint.RECONCILE:
            # The first credit applies and hangs past the tool's timeout: indeterminate, reconciled.
            run.fault = "apply_then_hang"
        elif run.point is KillPoint.RESERVE:
            # The first credit's answer is lost (applied, then billing hangs; the hook finds it), and
            # the worker reserving the re-issue is killed inside the reservation's transaction.
            run.condition = {"tool_call_id": REISSUE_CALL}
            run.fault = "apply_then_hang"
        else:
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
    # Tests of the drill only: the credit tool declared with this intent (allow or hold), not reuse.
    sabotage_intent: str | None = None

    def run_dir(self) -> Path:
        return self.data_dir.resolve() / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{self.seed}-runs{self.runs}"
