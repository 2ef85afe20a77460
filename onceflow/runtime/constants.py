"""Names and policies shared by workflows, activities, the worker and clients."""

from datetime import timedelta

from temporalio.common import RetryPolicy, SearchAttributeKey

TASK_QUEUE = "onceflow"

# Search attributes: what the Temporal UI can filter runs by.
PHASE = SearchAttributeKey.for_keyword("OnceflowPhase")
TENANT = SearchAttributeKey.for_keyword("OnceflowTenant")
AGENT = SearchAttributeKey.for_keyword("OnceflowAgent")
UNRESOLVED_KEYS = SearchAttributeKey.for_keyword_list("OnceflowUnresolvedKeys")
# Who an unknown call was escalated to at its reconcile deadline (on the run and its reconciler).
ESCALATED_TO = SearchAttributeKey.for_keyword("OnceflowEscalatedTo")
# Calls of the run whose late outcome contradicted the decision (open conflicts in the ledger).
CONFLICT_KEYS = SearchAttributeKey.for_keyword_list("OnceflowConflictKeys")
# Calls of the run that a guard holds (recorded, not sent) until another call is settled.
HELD_KEYS = SearchAttributeKey.for_keyword_list("OnceflowHeldKeys")
SEARCH_ATTRIBUTES = (PHASE, TENANT, AGENT, UNRESOLVED_KEYS, ESCALATED_TO, CONFLICT_KEYS, HELD_KEYS)

# Reads and model calls may be repeated; writes get exactly one attempt.
READ_RETRY = RetryPolicy(
    maximum_attempts=3,
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
)
# Model calls: no attempt count, because a worker killed mid-call or a provider's bad minute must
# not fail a run; the agent's `retry_budget` (the call's schedule-to-close timeout) bounds them, and
# errors that cannot get better (bad request, authentication...) are non-retryable (models/errors.py).
MODEL_RETRY = RetryPolicy(
    maximum_attempts=0,
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
)
WRITE_ONCE = RetryPolicy(maximum_attempts=1)
# Ledger steps only read or compare-and-set, so they may be retried as long as the database is away.
LEDGER_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    non_retryable_error_types=["RecordNotFound", "InvalidResolve"],
)

# How long Temporal waits beyond a tool's own timeout before it calls the activity lost.
ACTIVITY_MARGIN = timedelta(seconds=5)
LEDGER_STEP_TIMEOUT = timedelta(seconds=10)
MODEL_TIMEOUT = timedelta(seconds=60)
# A model call heartbeats; this long without one means its worker is gone and Temporal retries it.
MODEL_HEARTBEAT = timedelta(seconds=8)
# Backoff while the ledger database is down at reserve time: nothing was sent, so try again.
RESERVE_BACKOFF_INITIAL = timedelta(milliseconds=500)
RESERVE_BACKOFF_MAX = timedelta(seconds=30)

# ApplicationError types the write activity raises; the workflow tells them apart by these.
# Before sending: safe to try the reservation again. Its details carry the attempt's owner token: a
# reservation that committed while its answer was lost is recognised by it and never sent unknown.
ERR_LEDGER_UNAVAILABLE = "LedgerUnavailable"
# The attempt reached the ledger after its own deadline: nothing reserved, nothing sent.
ERR_ATTEMPT_EXPIRED = "AttemptExpired"
# A recorded call (held, or failed and retryable) whose `limit_from` read failed: nothing was sent,
# the row stands, and the workflow asks again as for ERR_LEDGER_UNAVAILABLE.
ERR_BUDGET_LIMIT_UNAVAILABLE = "BudgetLimitUnavailable"
ERR_OUTCOME_NOT_RECORDED = "OutcomeNotRecorded"  # sent and answered, but the ledger write failed
ERR_PAYLOAD_MISMATCH = "PayloadMismatch"
ERR_TENANT_MISMATCH = "TenantMismatch"  # the key is recorded for another tenant
ERR_RUN_ID_TAKEN = "RunIdTaken"  # another run claimed this run id (ledger/run_ids.py): nothing sent
ERR_INVALID_RUN_ID = "InvalidRunId"  # a run id keys cannot be built from (a `:` in it): nothing sent
ERR_CALL_INDETERMINATE = "CallIndeterminate"
ERR_NO_COMPENSATION = "NoCompensation"  # the tool declares no compensation hook
ERR_COMPENSATION_NOT_REQUESTED = "CompensationNotRequested"  # no operator's request to serve
ERR_NOT_A_READ = "NotARead"  # a read activity for a tool this worker classifies as changing the world

# How often a paused call re-reads the ledger unasked, unless the agent's tool_policy says otherwise.
DEFAULT_RECHECK = timedelta(minutes=5)

# A lost attempt's call still within its owner's lease is asked about again this long after the
# lease runs out (clocks differ a little between Temporal and the ledger's database).
INSPECT_AFTER_LEASE = timedelta(seconds=1)

# A held call asks the ledger again after this long, doubling up to the agent's recheck interval,
# and whenever it is nudged (activities/held.py).
HOLD_RECHECK_INITIAL = timedelta(seconds=1)
