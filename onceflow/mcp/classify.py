"""From an MCP tool's annotations (and agents.yaml) to onceflow's side-effect class, with the reason.

| annotations (spec defaults in brackets)          | class       | attempts |
|--------------------------------------------------|-------------|----------|
| readOnlyHint: true                               | read        | 3        |
| else destructiveHint [true]                      | destructive | 1        |
| else openWorldHint [true]                        | external    | 1        |
| else                                             | write       | 1        |

A tool without annotations therefore is destructive: one attempt. Hints are untrusted by the spec,
so an `effect` in agents.yaml wins over all of them, and `trust_read_only_hints: false` makes a
server's readOnlyHint count for nothing. readOnlyHint is trusted by default (docs/mcp.md says why);
the worker that executes a read checks its own class first (activities/tools.py run_read_tool), so a
correction to `effect: external` also protects runs that started under the old class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onceflow.ledger import SideEffect


@dataclass(frozen=True)
class Hints:
    """The four annotation hints as the server sent them; None where it sent nothing."""

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None

    @classmethod
    def of(cls, annotations: Any) -> Hints:
        """From the SDK's ToolAnnotations (or None)."""
        if annotations is None:
            return cls()
        return cls(
            read_only=getattr(annotations, "read_only_hint", None),
            destructive=getattr(annotations, "destructive_hint", None),
            idempotent=getattr(annotations, "idempotent_hint", None),
            open_world=getattr(annotations, "open_world_hint", None),
        )

    @property
    def empty(self) -> bool:
        return all(v is None for v in (self.read_only, self.destructive, self.idempotent, self.open_world))

    def describe(self) -> str:
        names = {
            "readOnlyHint": self.read_only,
            "destructiveHint": self.destructive,
            "idempotentHint": self.idempotent,
            "openWorldHint": self.open_world,
        }
        given = [f"{name}={str(value).lower()}" for name, value in names.items() if value is not None]
        return ", ".join(given) or "no annotations"


@dataclass(frozen=True)
class Classification:
    side_effect: SideEffect
    reason: str
    overridden: bool = False


def _spec_default(value: bool | None, default: bool) -> tuple[bool, str]:
    return (default, " (spec default)") if value is None else (value, "")


def classify(
    hints: Hints, *, override: SideEffect | None = None, trust_read_only: bool = True
) -> Classification:
    """The class a tool gets, and why, in words an operator can check against the server."""
    if override is not None:
        return Classification(
            override,
            f"agents.yaml sets effect: {override} (server says: {hints.describe()})",
            overridden=True,
        )
    if hints.read_only and trust_read_only:
        return Classification(SideEffect.READ, "readOnlyHint=true")
    if hints.read_only:
        prefix = "readOnlyHint=true ignored (trust_read_only_hints: false), "
    elif hints.read_only is None:
        prefix = "no annotations: " if hints.empty else "readOnlyHint=false (spec default), "
    else:
        prefix = "readOnlyHint=false, "
    destructive, why_destructive = _spec_default(hints.destructive, True)
    if destructive:
        return Classification(SideEffect.DESTRUCTIVE, f"{prefix}destructiveHint=true{why_destructive}")
    open_world, why_open = _spec_default(hints.open_world, True)
    if open_world:
        return Classification(
            SideEffect.EXTERNAL, f"{prefix}destructiveHint=false, openWorldHint=true{why_open}"
        )
    return Classification(SideEffect.WRITE, f"{prefix}destructiveHint=false, openWorldHint=false")
