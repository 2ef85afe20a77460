"""An event loop of its own in a thread, for synchronous drivers (Hypothesis's state machines) of the
async ledger. pytest-asyncio's session loop is left alone: coroutines are handed to this loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

T = TypeVar("T")
STEP_TIMEOUT = 120.0  # seconds one coroutine may take before the test calls it stuck


class LoopThread:
    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ledger-loop", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the thread's loop and wait for its result (or its exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=STEP_TIMEOUT)
