"""The one place a tool call's ledger key is made.

A key is `<run_id>:<tool_call_id>`. The run id is the workflow id. The tool call id comes from the
model's answer, which is recorded in history, but providers are not careful with it: some send no id,
some send `call_0` on every turn, some repeat an id within one answer. So the workflow never uses a
provider's id blindly. The rule, applied in order to each call of each answer:

1. The provider's id, if it is present, looks like an id (`[A-Za-z0-9_-]`, at most 64 characters) and
   no earlier call of this run has it.
2. Otherwise `t<turn>_<position>` (turn counted from 1, position from 0 within the answer), with
   `_<n>` appended for the smallest n that makes it unused, should a provider have sent that very
   string earlier.

The minted id replaces the provider's in the conversation too, so the provider sees the same id on
its tool call and on the result that answers it. Everything the rule reads (the answer, the turn, the
ids used so far) is in history, so a replay mints the same ids.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

_WELL_FORMED = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A run id is the part of every key before the `:`: so no `:` in it, and nothing the operator API's
# key pattern refuses (white space, control characters, `/`). At most 255 characters, like there.
_RUN_ID = re.compile(r"[^\s\x00-\x1f\x7f-\x9f\ufeff:/]{1,255}")


class InvalidRunIdError(ValueError):
    """A run id that keys could not be built from unambiguously."""

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"invalid run id {run_id[:300]!r}: 1 to 255 characters, without `:`, `/`, white space or "
            "control characters (a key is `<run_id>:<tool_call_id>`)"
        )
        self.run_id = run_id


def check_run_id(run_id: str) -> str:
    """`run_id` if keys can be built from it, else InvalidRunIdError."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise InvalidRunIdError(str(run_id))
    return run_id


def call_key(run_id: str, tool_call_id: str) -> str:
    """The ledger key of one tool call."""
    return f"{run_id}:{tool_call_id}"


# Keys of the reads onceflow makes on a write's behalf. Three parts (a run id and a tool call id
# have no `:`), so none can ever equal a call's key: a server deduplicating on the key alone cannot
# answer the write with one of these reads' answers (see onceflow/mcp/meta.py).


def limit_read_key(write_key: str) -> str:
    """The key of the `limit_from` read made before reserving `write_key`."""
    return f"{write_key}:limit"


def lookup_key(write_key: str) -> str:
    """The key of one reconcile lookup for `write_key`: new for every lookup."""
    return f"{write_key}:lookup:{uuid.uuid4().hex[:12]}"


def mint_tool_call_ids(provider_ids: Iterable[str | None], *, turn: int, used: set[str]) -> list[str]:
    """Ids for one answer's tool calls, in order; adds each to `used`."""
    minted: list[str] = []
    for position, provider_id in enumerate(provider_ids):
        if provider_id and _WELL_FORMED.fullmatch(provider_id) and provider_id not in used:
            chosen = provider_id
        else:
            chosen = base = f"t{turn}_{position}"
            suffix = 1
            while chosen in used:
                chosen = f"{base}_{suffix}"
                suffix += 1
        used.add(chosen)
        minted.append(chosen)
    return minted
