"""Toolsets that break the tool contract, for the worker's start-up checks. Never called."""

from __future__ import annotations

from datetime import timedelta

from onceflow import Effect, ToolContext, Toolset, write
from onceflow.ledger import SideEffect

retried_write = Toolset("retried-write")


@retried_write.tool(Effect(SideEffect.WRITE, max_attempts=3, timeout=timedelta(seconds=1)))
async def change_address(account_id: str, address: str, context: ToolContext) -> str:
    """Change an account's postal address; declared with three attempts, which a write never gets."""
    raise AssertionError("never called: the worker refuses to start with this tool")


key_argument = Toolset("key-argument")


@key_argument.tool(write())
async def send_invoice(account_id: str, idempotency_key: str, context: ToolContext) -> str:
    """Send an invoice; lets the model choose the idempotency key, which it must never do."""
    raise AssertionError("never called: the worker refuses to start with this tool")
