"""`onceflow ledger purge`: remove (or archive) settled calls past their retention, with their events,
and the stored conversations of runs nothing can read again.

The age comes from `--older-than`, else ONCEFLOW_RETENTION, else 90 days; it is never less than a
day, and the database refuses younger cutoffs itself. Unresolved calls and calls with an open
conflict are never taken. Conversations go only for runs Temporal (TEMPORAL_ADDRESS,
TEMPORAL_NAMESPACE) reports closed before the cutoff and whose history its namespace no longer keeps
(ledger/retention.py); without an answer from Temporal they are kept and the command exits 1. See
docs/operations.md, "Retention", for choosing the age.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from onceflow.ledger import Ledger
    from onceflow.ledger.retention import ConversationPurgeReport

RETENTION_ENV = "ONCEFLOW_RETENTION"

ledger_app = typer.Typer(no_args_is_help=True, help="Ledger maintenance: retention.")


@ledger_app.command()
def purge(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            envvar=RETENTION_ENV,
            help="Settled longer ago than this: 90d, 36h... At least 1d. Env: ONCEFLOW_RETENTION.",
        ),
    ] = "90d",
    archive: Annotated[
        bool,
        typer.Option(help="Move into tool_executions_archive / tool_execution_events_archive instead."),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would go; change nothing.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, max=10_000, help="Calls per transaction.")] = 500,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
    conversations: Annotated[
        bool,
        typer.Option(
            help="Also delete the stored conversations of runs Temporal reports closed and past reset."
        ),
    ] = True,
    database_url: Annotated[
        str | None, typer.Option(envvar="ONCEFLOW_DATABASE_URL", help="The ledger database.")
    ] = None,
) -> None:
    """Purge settled calls (completed, failed, denied, compensated) older than the retention age."""
    from onceflow.ledger import Ledger, migrate
    from onceflow.ledger.retention import parse_age, purge_settled

    if not database_url:
        typer.echo("set ONCEFLOW_DATABASE_URL or pass --database-url", err=True)
        raise typer.Exit(2)
    try:
        age = parse_age(older_than)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--older-than") from None

    async def run() -> bool:
        await migrate(database_url)
        ledger = await Ledger.connect(database_url, max_size=1)
        try:
            report = await purge_settled(
                ledger, older_than=age, archive=archive, dry_run=dry_run, batch_size=batch_size
            )
            talk, talked = (
                await _purge_conversations(ledger, age, dry_run, batch_size) if conversations else ("", None)
            )
        finally:
            await ledger.close()
        if as_json:
            found = report.model_dump(mode="json")
            if conversations:
                found["conversations"] = talked.model_dump(mode="json") if talked else None
            typer.echo(json.dumps(found))
            return talked is not None or not conversations
        verb = (
            "would " + ("archive" if archive else "purge")
            if dry_run
            else ("archived" if archive else "purged")
        )
        typer.echo(
            f"{verb} {report.calls} settled calls and {report.events} events "
            f"settled before {report.cutoff.isoformat()}"
        )
        if talk:
            typer.echo(talk, err=talked is None)
        return talked is not None or not conversations

    if not asyncio.run(run()):
        raise typer.Exit(1)


async def _purge_conversations(
    ledger: Ledger, age: timedelta, dry_run: bool, batch_size: int
) -> tuple[str, ConversationPurgeReport | None]:
    """The conversations' part: a line to print, and the report (None: Temporal did not answer)."""
    from temporalio.service import RPCError

    from onceflow.ledger.retention import purge_conversations
    from onceflow.runtime.client import connect
    from onceflow.runtime.config import Settings
    from onceflow.runtime.run_ends import temporal_run_ends

    settings = Settings.from_env()
    try:
        client = await connect(settings)
        run_ends = await temporal_run_ends(client)
        talked = await purge_conversations(
            ledger, run_ends, older_than=age, dry_run=dry_run, batch_size=batch_size
        )
    except (RuntimeError, OSError, RPCError) as exc:
        return (
            f"conversations kept: Temporal at {settings.temporal_address} "
            f"(namespace {settings.temporal_namespace}) did not answer: {exc}",
            None,
        )
    verb = "would purge" if dry_run else "purged"
    return (
        f"{verb} the stored conversations of {talked.runs} closed runs ({talked.messages} messages, "
        f"{talked.bytes} bytes); {talked.kept_open} runs kept (running, or still resettable)",
        talked,
    )
