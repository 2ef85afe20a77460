"""Optional parts of onceflow and the extras that install them.

A production worker installs onceflow alone; the operator API, the local dev stack and the OTLP
exporter are extras (pyproject.toml). Code that needs one says which, instead of a bare
ModuleNotFoundError from deep inside an import.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

_OWN_PACKAGES = {"onceflow", "ledger", "workflows", "activities", "examples"}

# Extra -> what it is for, as the error message puts it.
EXTRAS = {
    "api": "the operator API, the example billing service and metrics for Prometheus",
    "receiver": "the receiver kit's HTTP forms (onceflow.receiver.fastapi, onceflow.receiver.asgi)",
    "mcp": "MCP servers as toolsets, and the receiver kit for MCP servers (onceflow.receiver.mcp)",
    "dev": "the local stack (`onceflow dev`, `onceflow demo`, drills)",
    "otlp": "exporting traces over OTLP",
    "pydantic-ai": "the Pydantic AI adapter (onceflow.adapters.pydantic_ai)",
    "openai-agents": "the OpenAI Agents adapter (onceflow.adapters.openai_agents)",
}


class MissingExtraError(ImportError):
    """A part of onceflow was used whose optional dependencies are not installed."""

    def __init__(self, extra: str, missing: str) -> None:
        purpose = EXTRAS.get(extra, extra)
        super().__init__(
            f"{purpose} needs the `{extra}` extra ({missing} is not installed): "
            f"pip install 'onceflow[{extra}]'",
            name=missing,
        )
        self.extra = extra
        self.missing = missing


def require_extra(extra: str, *modules: str) -> None:
    """Raise MissingExtraError unless every module can be imported."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(extra, module)


@contextmanager
def needs_extra(extra: str) -> Iterator[None]:
    """Around the imports of a module that needs an extra: a missing package names the extra."""
    try:
        yield
    except ModuleNotFoundError as exc:
        # Only a third-party package can be missing for want of an extra; a module of this
        # project that is missing is a bug, and says so itself.
        top = (exc.name or "").partition(".")[0]
        if isinstance(exc, MissingExtraError) or not top or top in _OWN_PACKAGES:
            raise
        raise MissingExtraError(extra, top) from exc
