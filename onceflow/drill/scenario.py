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

# One lookup; the order's credit, a credit of 100 and the order's credit again, all in one answer
# (twins that did not hear each other: one intent); a second lookup and a credit of 250; then the
# order's credit once more, after the model heard both twins' outcomes (a new effect, owed). Five
# model turns, two reads, five writes. The credit tool declares no intent, so the ledger's default
# rule (`hold`, ledger/guards.py) decides: the unheard twin is the same intent, the heard repeat is not.
# A run paused on an unknown call reads the ledger itself this often (tool_policy.recheck_interval),
# whatever signal it missed: the Temporal restart drill holds runs to it once Temporal is back.
RECHECK_SECONDS = 10.0
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
    tool_policy:
      on_indeterminate: pause
      reconcile_deadline: 5m
      reconcile_initial_interval: 0.5s
      reconcile_max_interval: 2s
      recheck_interval: {RECHECK_SECONDS:g}s
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

# Every seventh run meets no planned point, only whatever random kills strike; billing refuses its
# first credit at the door (423 locked), so the ledger records a definite "not attempted" failure
# (and the twin, which the ledger then lets through, is the one credit that pays that intent).
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
    # Its first credit's answer is lost and its reconcile hook cannot tell (an account of
    # OPERATOR_ACCOUNTS): the run waits until an operator settles the call (the infrastructure drills).
    operator: bool = False

    @property
    def account_id(self) -> str:
        return "acct_" + self.order_id.removeprefix("ord_")

    def keys(self) -> list[str]:
        return [f"{self.run_id}:{call}" for call in WRITE_CALLS]

    def key(self, tool_call_id: str) -> str:
        return f"{self.run_id}:{tool_call_id}"


# Accounts whose credits only an operator can settle: the drill's reconcile hook answers "unknown".
OPERATOR_ACCOUNTS = "acct_op"


def plan_runs(runs: int, seed: int, operator_every: int = 0) -> list[PlannedRun]:
    """Runs in start order; run i meets CYCLE[i % 7], with details drawn from the seed.

    The first credit's answer is lost on purpose in a good share of them: `downstream` and `reconcile`
    (billing holds it), `after_answer` on it in half of those runs, and `reserve` (billing applies it
    and hangs, then the worker reserving its twin is killed).
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
        else:
            run.fault = "locked"
        if operator_every and index % operator_every == operator_every - 1:
            # No kill point: its first credit applies and hangs, and no hook can say so.
            run = PlannedRun(
                index, run.run_id, f"ord_op{seed}n{index}", fault="apply_then_hang", operator=True
            )
        planned.append(run)
    return planned


@dataclass(frozen=True)
class InfraConfig:
    """The infrastructure drills (infra.py): the ledger fails over, Temporal restarts."""

    replication: str | None = None  # "sync" or "async": the ledger on a primary and a standby
    failovers: int = 0  # primary SIGKILLed and standby promoted, this many times
    failover_every: float = 20.0  # seconds between failovers (the first after this long too)
    lag_seconds: float = 0.0  # async: replication held this long before the kill (writes lost)
    temporal_restarts: int = 0  # the dev server SIGKILLed and started again, this many times
    temporal_every: float = 20.0
    temporal_down: float = 5.0  # seconds it stays down each time
    operator_every: int = 0  # every Nth run waits for an operator (OPERATOR_ACCOUNTS)
    # Network partitions (netns.py), in order, each of one worker, while it has a call on the wire:
    # "postgres", "temporal" or "both"; each lasts `partition_seconds` and starts `partition_every`
    # seconds after the last one healed.
    partitions: tuple[str, ...] = ()
    partition_seconds: float = 20.0
    partition_every: float = 10.0
    # Tests of the drill only: workers that ignore what a failover lost (ack_worker.py).
    sabotage_failover: bool = False

    @property
    def active(self) -> bool:
        return bool(self.replication or self.temporal_restarts or self.operator_every or self.partitions)


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
    infra: InfraConfig = field(default_factory=lambda: InfraConfig())

    def run_dir(self) -> Path:
        return self.data_dir.resolve() / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{self.seed}-runs{self.runs}"
