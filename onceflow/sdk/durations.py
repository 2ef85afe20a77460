"""Durations as agents.yaml, tool declarations and settings write them: "30s", "5m", "2h", "1d".

`Duration` is a `timedelta` that pydantic also reads from such a string, or from a number of seconds;
`PositiveDuration` refuses zero and less. Both are plain `timedelta`s once validated.

    class Policy(BaseModel):
        deadline: PositiveDuration = timedelta(hours=1)      # accepts "10m", 600, timedelta(...)
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value: Any) -> timedelta:
    """A timedelta from a timedelta, a number of seconds, or text such as "90s" or "1.5h"."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration (examples: 30s, 10m, 2h)")
    return timedelta(seconds=float(match.group(1)) * _SECONDS[match.group(2)])


def parse_positive_duration(value: Any) -> timedelta:
    duration = parse_duration(value)
    if duration <= timedelta(0):
        raise ValueError("must be positive")
    return duration


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
PositiveDuration = Annotated[timedelta, BeforeValidator(parse_positive_duration)]
