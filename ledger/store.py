"""The ledger's operations over an asyncpg pool. The ledger decides; callers act on its answer.

`Ledger` is assembled from parts that share one pool (`LedgerBase`, ledger.base), each in its own
module and each about one thing:

- ledger.calls: the call path: `reserve`, with ledger.outcomes: the owner's `complete`/`fail`,
  `mark_indeterminate`;
- ledger.reads: `get`, `find`, `list_unresolved`;
- ledger.decisions: what operators and reconcilers decide about a call that was sent (settle,
  escalate, compensated, late outcomes), with ledger.conflicts (flag and acknowledge a conflict);
- ledger.approvals: what operators decide about a call never sent (approve, deny, release);
- ledger.guarded: reservations under guards, one server-side function;
- ledger.lineage: replacement chains and held calls;
- ledger.resends: resends within a receiver's dedup window;
- ledger.compensations: an operator's compensation requests and their claims;
- ledger.lost_writes: calls a failover of the ledger lost, made visible unknowns again (with
  ledger.timelines and ledger.acknowledged).

Tokens, conversations, run ids, retention and the queue's figures take a ledger (its pool) rather
than being part of it: they are not about one call's record.
"""

from __future__ import annotations

import asyncpg

from onceflow.ledger.approvals import Approvals
from onceflow.ledger.calls import CallIdentity, CallPath
from onceflow.ledger.compensations import CompensationRequests
from onceflow.ledger.decisions import OperatorDecisions
from onceflow.ledger.lineage import LineageReads
from onceflow.ledger.lost_writes import LostWrites
from onceflow.ledger.reads import Reads, UnresolvedPage
from onceflow.ledger.resends import Resends
from onceflow.ledger.timelines import Timelines

__all__ = ["CallIdentity", "Ledger", "UnresolvedPage"]


class Ledger(
    CallPath, Reads, OperatorDecisions, Approvals, LineageReads, Resends, CompensationRequests, LostWrites
):
    """The tool-execution ledger. Create with `await Ledger.connect(dsn)`; close with `close()`.

    Every operation is a method here; the module docstring says which part holds it.
    """

    def __init__(self, pool: asyncpg.Pool, timelines: Timelines | None = None) -> None:
        super().__init__(pool, timelines)
        self._restored_listeners = []
        # A failover seen by this process: read again what it saw acknowledged before.
        self.timelines.listen(self._after_failover)

    async def _after_failover(self, previous: int, timeline: int) -> None:
        await self.check_acknowledged(previous, timeline)
