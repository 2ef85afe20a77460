"""Canonical payloads: the tool name and its arguments as RFC 8785 (JCS) JSON, and its SHA-256."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import rfc8785


@dataclass(frozen=True)
class CanonicalPayload:
    text: str
    sha256: str

    @property
    def value(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.text)
        return parsed


def canonical_payload(tool_name: str, arguments: dict[str, Any]) -> CanonicalPayload:
    """Serialize `{"tool": ..., "arguments": ...}` canonically; equal meaning gives equal bytes."""
    try:
        data = rfc8785.dumps({"tool": tool_name, "arguments": arguments})
    except (rfc8785.CanonicalizationError, TypeError) as exc:
        raise ValueError(f"arguments of {tool_name!r} are not canonical JSON: {exc}") from exc
    return CanonicalPayload(text=data.decode("utf-8"), sha256=hashlib.sha256(data).hexdigest())
