"""What the routes take: the key in the path, the status filter, JSON bodies and checked queries.

The patterns are published in the OpenAPI document so clients (and fuzzers) know the contract; the
handlers enforce them with problem types of their own (invalid-key, invalid-status) rather than a
generic 400.
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends, Path, Request

from onceflow.api.inputs import checked_query_dependency
from onceflow.api.problems import Problem
from onceflow.ledger import Status

# No whitespace, slashes or control characters (PostgreSQL cannot store NUL at all). Written so that
# Python and JSON Schema (ECMA-262) regexes mean the same set: their `\s` differ only in characters
# that are excluded explicitly anyway (C0/C1 controls and U+FEFF).
_KEY_CHAR = r"[^\s\x00-\x1f\x7f-\x9f\ufeff/]"
_KEY_START = r"[^\s\x00-\x1f\x7f-\x9f\ufeff:/]"
KEY_PATTERN = rf"^{_KEY_START}{_KEY_CHAR}{{0,254}}:{_KEY_CHAR}{{1,255}}$"
# Free-text filters: anything PostgreSQL can store, this long at most; and a page's cursor.
STORABLE = r"^[^\x00]*$"
TEXT_FILTER_MAX = 200
CURSOR_MAX = 1000
_KEY = re.compile(KEY_PATTERN)
_LISTABLE = {Status.INDETERMINATE, Status.STARTED, Status.AWAITING_APPROVAL, Status.HELD}

Key = Annotated[
    str,
    Path(
        description="`<run_id>:<tool_call_id>`",
        max_length=511,
        json_schema_extra={"pattern": KEY_PATTERN},
    ),
]
_STATUS_NAME = "(indeterminate|started|awaiting_approval|held)"
STATUS_FILTER_PATTERN = rf"^{_STATUS_NAME}(,{_STATUS_NAME})*$"


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key):  # fullmatch: `$` alone would let a trailing newline through
        raise Problem(
            400, "invalid-key", "Invalid key", "a key is `<run_id>:<tool_call_id>`, without spaces or slashes"
        )
    return key


def statuses(status: str | None) -> list[Status]:
    """The statuses a `status` filter names; none named: what an operator has to act on."""
    if status is None:
        # Held calls are asked for by name: each waits for another call, which is already listed,
        # and settling that one is what moves it (see docs/operations.md).
        return [Status.INDETERMINATE, Status.STARTED, Status.AWAITING_APPROVAL]
    try:
        named = [Status(s.strip()) for s in status.split(",") if s.strip()]
    except ValueError:
        named = []
    if not named or not set(named) <= _LISTABLE:
        raise Problem(
            400,
            "invalid-status",
            "Invalid status filter",
            f"status must be a comma-separated subset of {', '.join(sorted(_LISTABLE))}",
        )
    return named


def _require_json(request: Request) -> None:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise Problem(415, "unsupported-media-type", "Unsupported media type", "send application/json")


# POST routes take JSON only; checked before the body is parsed.
JSON = [Depends(_require_json)]
# Every route's query is checked (unknown or repeated parameters are refused) by inputs.py; this
# names the same check for routes that want to say so.
QUERY = [checked_query_dependency()]
