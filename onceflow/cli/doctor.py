"""`onceflow doctor`: can the ledger's database lose a write it acknowledged? Every check, its value and
verdict; exit 1 when the profile would stop a worker on it (ledger/durability.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from onceflow.runtime.config import Settings


def doctor(
    database_url: Annotated[
        str | None, typer.Option(envvar="ONCEFLOW_DATABASE_URL", help="The ledger database.")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(help="development or production (default: ONCEFLOW_PROFILE, else development)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    """Check the ledger database's durability: fsync, synchronous_commit, full_page_writes, a
    synchronous standby, isolation, keepalives, poolers."""
    from onceflow.cli.tables import table_lines
    from onceflow.ledger import Ledger
    from onceflow.ledger.durability import as_rows, check_durability, refused
    from onceflow.runtime.ledger_check import profile_of

    settings = Settings.from_env()
    if not database_url:
        typer.echo("set ONCEFLOW_DATABASE_URL or pass --database-url", err=True)
        raise typer.Exit(2)
    if profile is not None:
        settings = Settings(**{**settings.__dict__, "profile": profile})
    try:
        chosen, replication = profile_of(settings)
    except SystemExit as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None

    async def run() -> list[dict[str, str]]:
        ledger = await Ledger.connect(database_url, max_size=2)
        try:
            checks = await check_durability(ledger, replication=replication)
        finally:
            await ledger.close()
        stop = {c.name for c in refused(checks, chosen)}
        return [{**row, "refused": "yes" if row["check"] in stop else ""} for row in as_rows(checks)]

    rows = asyncio.run(run())
    failing = [row for row in rows if row["refused"]]
    if as_json:
        typer.echo(json.dumps({"profile": chosen.value, "ok": not failing, "checks": rows}, indent=2))
    else:
        lines = table_lines(
            ["check", "value", "verdict", "why"],
            [
                [r["check"], r["value"], r["verdict"] + (" (refused)" if r["refused"] else ""), r["why"]]
                for r in rows
            ],
            wrap={"why", "value"},
        )
        typer.echo("\n".join(lines))
        verdict = "refuses to start" if failing else "would start"
        typer.echo(f"\n{chosen.value} profile: a worker {verdict} on this database")
    if failing:
        raise typer.Exit(1)
