"""The operator queue in figures, read in one query for the operator API's gauges (onceflow.metrics)."""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase


@dataclass(frozen=True)
class QueueFigure:
    """Calls of one tenant, tool and status (`conflict`: settled calls with an open conflict)."""

    tenant: str
    tool: str
    status: str
    calls: int
    oldest_seconds: float
    overdue: int  # indeterminate calls past their agent's reconcile deadline


async def queue_figures(ledger: LedgerBase, deadlines: dict[str, float], default: float) -> list[QueueFigure]:
    """`deadlines`: each agent's reconcile deadline in seconds; `default` for an agent not named."""
    agents = sorted(deadlines)
    async with ledger.connection("queue_figures") as conn:
        rows = await conn.fetch(queries.QUEUE_FIGURES, agents, [deadlines[a] for a in agents], default)
    return [
        QueueFigure(
            tenant=row["tenant"],
            tool=row["tool"],
            status=row["status"],
            calls=row["calls"],
            oldest_seconds=max(row["oldest_seconds"] or 0.0, 0.0),
            overdue=row["overdue"],
        )
        for row in rows
    ]
