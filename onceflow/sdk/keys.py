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
from collections.abc import Iterable

_WELL_FORMED = re.compile(r"[A-Za-z0-9_-]{1,64}")


def call_key(run_id: str, tool_call_id: str) -> str:
    """The ledger key of one tool call."""
    return f"{run_id}:{tool_call_id}"


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
