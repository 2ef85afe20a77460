"""`onceflow tokens`: operator tokens for the API, created, revoked and listed in the ledger."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from onceflow.cli.stack import DataDir, use_stack_environment
from onceflow.cli.tables import table_lines

tokens_app = typer.Typer(no_args_is_help=True, help="Operator tokens for the API (stored hashed).")

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        envvar="ONCEFLOW_DATABASE_URL",
        help="The ledger database (default: the `onceflow dev` running on --data-dir).",
    ),
]


def _tokens(database_url: str | None, data_dir: Path) -> Any:
    if not database_url:
        use_stack_environment(data_dir)
        database_url = os.environ.get("ONCEFLOW_DATABASE_URL")
    if not database_url:
        typer.echo(
            f"set ONCEFLOW_DATABASE_URL or pass --database-url (no `onceflow dev` runs on {data_dir})",
            err=True,
        )
        raise typer.Exit(2)
    from onceflow.ledger import Ledger, OperatorTokens, migrate

    async def open_tokens() -> tuple[Ledger, OperatorTokens]:
        await migrate(database_url)
        ledger = await Ledger.connect(database_url, max_size=1)
        return ledger, OperatorTokens(ledger)

    return open_tokens


@tokens_app.command("create")
def tokens_create(
    tenant: Annotated[str, typer.Option(help="The tenant this token acts for.")],
    operator: Annotated[str, typer.Option(help="Who uses it; recorded on every decision.")],
    database_url: DatabaseUrl = None,
    data_dir: DataDir = Path(".onceflow"),
) -> None:
    """Create a token and print it once. Only its SHA-256 is stored."""
    from onceflow.ledger import ReasonRequiredError

    open_tokens = _tokens(database_url, data_dir)

    async def create() -> None:
        ledger, tokens = await open_tokens()
        try:
            token, secret = await tokens.create(tenant=tenant, operator=operator)
        finally:
            await ledger.close()
        typer.echo(secret)
        typer.echo(f"id {token.id}, tenant {token.tenant}, operator {token.operator}; shown once", err=True)

    try:
        asyncio.run(create())
    except ReasonRequiredError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: Annotated[str, typer.Argument(help="The token's id (tok_...), as `tokens list` shows.")],
    database_url: DatabaseUrl = None,
    data_dir: DataDir = Path(".onceflow"),
) -> None:
    """Revoke a token: every request with it answers 401 from now on, and its console sessions end."""
    from onceflow.ledger import TokenNotFoundError

    open_tokens = _tokens(database_url, data_dir)

    async def revoke() -> None:
        ledger, tokens = await open_tokens()
        try:
            token = await tokens.revoke(token_id)
        finally:
            await ledger.close()
        typer.echo(f"revoked {token.id} ({token.operator} in {token.tenant}) at {token.revoked_at}")

    try:
        asyncio.run(revoke())
    except TokenNotFoundError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(3) from None


@tokens_app.command("list")
def tokens_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's tokens.")] = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = Path(".onceflow"),
) -> None:
    """List tokens (never their secrets)."""
    open_tokens = _tokens(database_url, data_dir)

    async def show() -> None:
        ledger, tokens = await open_tokens()
        try:
            found = await tokens.list_tokens(tenant)
        finally:
            await ledger.close()
        rows = [
            [
                token.id,
                token.tenant,
                token.operator,
                f"revoked {token.revoked_at:%Y-%m-%d %H:%M}" if token.revoked_at else "active",
            ]
            for token in found
        ]
        # No header row: scripts take the id from the first column of every line.
        for line in table_lines(["ID", "TENANT", "OPERATOR", "STATE"], rows, show_header=False):
            typer.echo(line)

    asyncio.run(show())
