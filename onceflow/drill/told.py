"""What each drill run's model was told: every model call's conversation, written down as the model
receives it, and read back by the judge.

The ledger decides what a call's outcome is; this record is what the model actually heard, written
by the drill's model wrapper inside the worker (tools.py) and kept apart from the ledger, so the
checks of the conflict and reset runs (paths.py) never take the ledger's word for what the model
was told. One JSON file per model call attempt, `<folder>/<run id>.<Temporal run id>.<turn>.<pid>.<n>.json`,
written under a scratch name and renamed, so a worker killed mid-write leaves no half file.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio import activity

from onceflow.sdk.payloads import ModelCallInput

TOLD_ENV = "ONCEFLOW_DRILL_TOLD"
_SEQUENCE = itertools.count()


def told_dir() -> Path | None:
    value = os.environ.get(TOLD_ENV)
    return Path(value) if value else None


def write_down(request: ModelCallInput) -> None:
    """In the worker: keep the conversation this model call was given (a no-op outside a drill)."""
    folder = told_dir()
    if folder is None:
        return
    try:
        temporal_run_id = activity.info().workflow_run_id or ""
    except RuntimeError:  # not inside an activity
        temporal_run_id = ""
    turn = sum(1 for message in request.messages if message.role == "assistant")
    body = {
        "run_id": request.run_id,
        "temporal_run_id": temporal_run_id,
        "turn": turn,
        "messages": [message.model_dump(mode="json") for message in request.messages],
    }
    name = f"{request.run_id}.{temporal_run_id}.{turn}.{os.getpid()}.{next(_SEQUENCE)}"
    scratch = folder / f"{name}.tmp"
    scratch.write_text(json.dumps(body))
    os.replace(scratch, folder / f"{name}.json")


@dataclass(frozen=True)
class ToldCall:
    """One tool call in a conversation, and what the model was told of it (None: nothing yet)."""

    tool_call_id: str
    name: str
    arguments: dict[str, Any]
    turn: int  # the model answer that asked for it, counted from 0
    told: dict[str, Any] | None

    @property
    def took_effect(self) -> bool:
        """Told it took effect (`ok`), sent or handed an earlier call's result."""
        return bool(self.told and self.told.get("ok") is True)

    @property
    def told_failed(self) -> bool:
        """Told it did not take effect."""
        return bool(self.told and self.told.get("ok") is False and self.told.get("took_effect") is False)

    @property
    def reused_from(self) -> str | None:
        """The earlier call whose result the model was handed instead of a send (its tool call id)."""
        value = self.told.get("reused_from") if self.told else None
        return str(value) if value else None

    @property
    def credit_id(self) -> str | None:
        """The credit the model was told about, if its result names one."""
        result = self.told.get("result") if self.told else None
        value = result.get("credit_id") if isinstance(result, dict) else None
        return str(value) if value else None


@dataclass(frozen=True)
class ModelCall:
    """One model call attempt: the conversation the model was given for answer `turn`."""

    run_id: str
    temporal_run_id: str
    turn: int
    messages: list[dict[str, Any]]

    def calls(self, tool: str | None = None) -> list[ToldCall]:
        """The conversation's tool calls (of `tool` only, if given), in the order they were asked."""
        told: dict[str, dict[str, Any] | None] = {}
        for message in self.messages:
            if message.get("role") == "tool" and message.get("tool_call_id"):
                try:
                    content = json.loads(message.get("content") or "null")
                except ValueError:
                    content = {"unreadable": message.get("content")}
                told[message["tool_call_id"]] = content if isinstance(content, dict) else {"value": content}
        found, turn = [], 0
        for message in self.messages:
            if message.get("role") != "assistant":
                continue
            for call in message.get("tool_calls") or []:
                if tool is None or call.get("name") == tool:
                    found.append(
                        ToldCall(
                            call["id"], call["name"], call.get("arguments") or {}, turn, told.get(call["id"])
                        )
                    )
            turn += 1
        return found


def read_model_calls(folder: Path) -> dict[str, list[ModelCall]]:
    """Every model call written down in `folder`, per run id, in the order they were written."""
    found: list[tuple[float, ModelCall]] = []
    for path in folder.glob("*.json"):
        try:
            body = json.loads(path.read_text())
            stamp = path.stat().st_mtime
        except (FileNotFoundError, ValueError):
            continue
        found.append(
            (stamp, ModelCall(body["run_id"], body["temporal_run_id"], body["turn"], body["messages"]))
        )
    per_run: dict[str, list[ModelCall]] = {}
    for _, call in sorted(found, key=lambda item: item[0]):
        per_run.setdefault(call.run_id, []).append(call)
    return per_run


def last_conversation(calls: list[ModelCall], temporal_run_id: str | None) -> ModelCall | None:
    """The longest conversation given to the model in one Temporal run of a workflow (its latest,
    after a reset): it holds every call that run made and what the model was told of each."""
    mine = [call for call in calls if temporal_run_id is None or call.temporal_run_id == temporal_run_id]
    return max(mine, key=lambda call: (call.turn, len(call.messages)), default=None)
