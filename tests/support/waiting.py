"""Waiting for something real to happen (a run to pause, a row to appear), with a bound."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30, every: float = 0.1
) -> None:
    """Poll `check` until it is true; an AssertionError naming `what` after `timeout` seconds."""

    async def poll() -> None:
        while not await check():
            await asyncio.sleep(every)

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        raise AssertionError(f"gave up after {timeout}s waiting for {what}") from None
