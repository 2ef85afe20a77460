"""Canonical payloads: the tool name and its arguments as RFC 8785 (JCS) JSON, and its SHA-256."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import rfc8785

# What RFC 8785 can carry exactly: integers an IEEE 754 double holds without rounding.
MAX_SAFE_INTEGER = 2**53 - 1
# Deeper than this is not a payload anyone meant; PostgreSQL and Python's parsers give up near here.
MAX_DEPTH = 64


def uncarried(value: Any, *, integers: bool = True, max_depth: int = MAX_DEPTH) -> str | None:
    """Why `value` (parsed JSON) cannot be stored and compared as canonical JSON, or None if it can.

    Refused: NaN and the infinities (JSON has no such numbers; PostgreSQL's jsonb refuses them),
    nesting deeper than `max_depth`, and (with `integers`) integers beyond +-MAX_SAFE_INTEGER, which
    canonical JSON cannot write without changing their value. The answer names where: `$.a[0]`.
    """
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > max_depth:
            return f"{path}: nested deeper than {max_depth} levels"
        if isinstance(item, bool) or item is None or isinstance(item, str):
            continue
        if isinstance(item, float) and not math.isfinite(item):
            return f"{path}: {item!r} is not a JSON number (only finite numbers are)"
        if integers and isinstance(item, int) and abs(item) > MAX_SAFE_INTEGER:
            return (
                f"{path}: the integer {item} is beyond +-{MAX_SAFE_INTEGER}, which JSON cannot carry exactly"
            )
        if isinstance(item, dict):
            stack.extend((v, f"{path}.{k}", depth + 1) for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))
    return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (only finite numbers are)")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is beyond what a JSON number can be (it would read as infinity)")
    return number


def strict_loads(text: str | bytes) -> Any:
    """`json.loads` that refuses what JSON does not allow and Python's parser lets through: NaN,
    Infinity, numbers that overflow to infinity (1e999), bytes that are not UTF-8, nesting deeper
    than MAX_DEPTH. Raises ValueError saying which."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    problem = uncarried(value, integers=False)
    if problem is not None:
        raise ValueError(problem)
    return value


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
