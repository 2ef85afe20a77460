"""`onceflow ledger purge`: remove (or archive) settled calls past their retention, with their events.

The age comes from `--older-than`, else ONCEFLOW_RETENTION, else 90 days; it is never less than a
day, and the database refuses younger cutoffs itself. Unresolved calls and calls with an open
conflict are never taken. See docs/operations.md, "Retention", for choosing the age.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

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

    async def run() -> None:
        await migrate(database_url)
        ledger = await Ledger.connect(database_url, max_size=1)
        try:
            report = await purge_settled(
                ledger, older_than=age, archive=archive, dry_run=dry_run, batch_size=batch_size
            )
        finally:
            await ledger.close()
        if as_json:
            typer.echo(json.dumps(report.model_dump(mode="json")))
            return
        verb = (
            "would " + ("archive" if archive else "purge")
            if dry_run
            else ("archived" if archive else "purged")
        )
        typer.echo(
            f"{verb} {report.calls} settled calls and {report.events} events "
            f"settled before {report.cutoff.isoformat()}"
        )

    asyncio.run(run())
