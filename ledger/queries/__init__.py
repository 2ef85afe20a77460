"""Every SQL statement the ledger runs, by name. Values always travel as $n parameters.

The statements live by the ledger's own domains, one module each (calls, the queue, decisions,
durability, failover, guards, lineage, conflicts, resends, compensations, retention, tokens, console
sessions, conversations, run ids); every name is re-exported here, so `from onceflow.ledger import
queries; queries.RESERVE` reads the
same wherever a statement lives. A new statement goes into its domain's module and into this list.

A statement that changes one call by its key, only while the call is in some state, writes that
state test as `(...) IS TRUE`. Written plainly (`status = 'started'`), the test proves the predicate
of a partial index (tool_executions_unresolved holds exactly the unresolved calls), and the planner,
whose statistics may count almost nothing in that index, reads the whole of it for the key instead
of the primary key's one entry: every completion then costs as much as the backlog of unresolved
calls, and the dead entries autovacuum has not yet removed, are long (bench/backlog.py measured
5.4 ms at 100,000 unknown calls against 0.7 ms). `IS TRUE` changes nothing in a WHERE clause (NULL
and false both leave the row out) and proves no index predicate. tests/test_key_plans.py plans
every statement and fails if one addresses a key through any index but the key's own.
"""

from onceflow.ledger.queries.calls import (
    COMPLETE_RESERVED,
    COMPLETE_STARTED,
    FAIL_STARTED,
    INSERT_EVENT,
    PAST,
    RESERVE,
    SELECT_EVENTS,
    SELECT_RECORD,
    SELECT_RECORD_FOR_UPDATE,
    SET_COMPLETED,
    SET_FAILED,
    SET_INDETERMINATE,
)
from onceflow.ledger.queries.compensations import (
    CLAIM_OF_REQUEST,
    EVENT_OF_KEY,
    LATEST_EVENT_OF_KIND,
)
from onceflow.ledger.queries.conflicts import (
    ACKNOWLEDGE_CONFLICT,
    FLAG_CONFLICT,
    WAS_OWNER,
)
from onceflow.ledger.queries.conversations import (
    INSERT_CONVERSATION_MESSAGE,
    SELECT_CONVERSATION,
)
from onceflow.ledger.queries.decisions import (
    APPROVE,
    CLAIM_APPROVED,
    DENY,
    ESCALATE,
    RELEASE,
    SELECT_FOR_DECISION,
    SET_COMPENSATED,
)
from onceflow.ledger.queries.durability import (
    BACKEND_PID,
    CLIENT_ADDRESS,
    DEFAULT_ISOLATION,
    IN_RECOVERY,
    SETTINGS,
    STANDBYS,
)
from onceflow.ledger.queries.failover import (
    RECORD_TIMELINE,
    RESTORE_BEHIND,
    RESTORE_LOST,
    SELECT_RECORDS,
    SWITCH_SEEN_SINCE,
    TIMELINE,
)
from onceflow.ledger.queries.guards import (
    ENTITY_BUDGET_USED,
    GUARDED_RESERVE,
    GUARDED_RESERVE_BRIEF,
    GUARDED_RESERVE_CLAIMING,
)
from onceflow.ledger.queries.lineage import (
    HELD_BEHIND,
    HELD_RUNS_BEHIND,
    LINEAGE,
)
from onceflow.ledger.queries.queue import (
    COUNT_UNRESOLVED,
    ENTERED_STATUS_AT,
    LIST_UNRESOLVED,
    QUEUE_FIGURES,
)
from onceflow.ledger.queries.resends import (
    LATEST_RESEND,
    SELECT_FOR_RESEND,
)
from onceflow.ledger.queries.retention import (
    ARCHIVE_EVENTS,
    ARCHIVE_EXECUTIONS,
    CONVERSATION_BYTES,
    CONVERSATION_CANDIDATES,
    COUNT_EVENTS,
    DATABASE_NOW,
    DELETE_CONVERSATIONS,
    DELETE_EVENTS,
    DELETE_EXECUTIONS,
    LOCK_PURGEABLE,
    PURGE_CANDIDATES,
    PURGE_CUTOFF,
    SET_PURGE_CUTOFF,
)
from onceflow.ledger.queries.run_ids import (
    CLAIM_RUN_ID,
)
from onceflow.ledger.queries.sessions import (
    DELETE_CONSOLE_SESSION,
    INSERT_CONSOLE_SESSION,
    TOUCH_CONSOLE_SESSION,
)
from onceflow.ledger.queries.tokens import (
    INSERT_TOKEN,
    LIST_TOKENS,
    REVOKE_TOKEN,
    SELECT_ACTIVE_TOKEN,
)

__all__ = [
    "ACKNOWLEDGE_CONFLICT",
    "APPROVE",
    "ARCHIVE_EVENTS",
    "ARCHIVE_EXECUTIONS",
    "BACKEND_PID",
    "CLAIM_APPROVED",
    "CLAIM_OF_REQUEST",
    "CLAIM_RUN_ID",
    "CLIENT_ADDRESS",
    "COMPLETE_RESERVED",
    "COMPLETE_STARTED",
    "CONVERSATION_BYTES",
    "CONVERSATION_CANDIDATES",
    "COUNT_EVENTS",
    "COUNT_UNRESOLVED",
    "DATABASE_NOW",
    "DEFAULT_ISOLATION",
    "DELETE_CONSOLE_SESSION",
    "DELETE_CONVERSATIONS",
    "DELETE_EVENTS",
    "DELETE_EXECUTIONS",
    "DENY",
    "ENTERED_STATUS_AT",
    "ENTITY_BUDGET_USED",
    "ESCALATE",
    "EVENT_OF_KEY",
    "FAIL_STARTED",
    "FLAG_CONFLICT",
    "GUARDED_RESERVE",
    "GUARDED_RESERVE_BRIEF",
    "GUARDED_RESERVE_CLAIMING",
    "HELD_BEHIND",
    "HELD_RUNS_BEHIND",
    "INSERT_CONSOLE_SESSION",
    "INSERT_CONVERSATION_MESSAGE",
    "INSERT_EVENT",
    "INSERT_TOKEN",
    "IN_RECOVERY",
    "LATEST_EVENT_OF_KIND",
    "LATEST_RESEND",
    "LINEAGE",
    "LIST_TOKENS",
    "LIST_UNRESOLVED",
    "LOCK_PURGEABLE",
    "PAST",
    "PURGE_CANDIDATES",
    "PURGE_CUTOFF",
    "QUEUE_FIGURES",
    "RECORD_TIMELINE",
    "RELEASE",
    "RESERVE",
    "RESTORE_BEHIND",
    "RESTORE_LOST",
    "REVOKE_TOKEN",
    "SELECT_ACTIVE_TOKEN",
    "SELECT_CONVERSATION",
    "SELECT_EVENTS",
    "SELECT_FOR_DECISION",
    "SELECT_FOR_RESEND",
    "SELECT_RECORD",
    "SELECT_RECORDS",
    "SELECT_RECORD_FOR_UPDATE",
    "SETTINGS",
    "SET_COMPENSATED",
    "SET_COMPLETED",
    "SET_FAILED",
    "SET_INDETERMINATE",
    "SET_PURGE_CUTOFF",
    "STANDBYS",
    "SWITCH_SEEN_SINCE",
    "TIMELINE",
    "TOUCH_CONSOLE_SESSION",
    "WAS_OWNER",
]
