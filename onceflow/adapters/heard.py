"""What the model heard, in a workflow that hosts another framework's agent; and the state such a
workflow passes on when it continues as new.

The ledger lets a repeat of a write (same tool, same arguments, same run) be a second effect only
when the model had heard how the first one ended, as it still stands (ledger/guards.py, `Heard`).
AgentRunWorkflow knows what it put in the conversation. A framework keeps the conversation itself,
so the adapters read it back: for each write call, the tool results that were in the conversation
the framework sent to the model for the turn that asked for that call. Pydantic AI hands them to
the tool hook (`RunContext.messages`); for the OpenAI Agents SDK, `OnceflowInterceptor` reads them
from the arguments of the model activity that asked for the call (the input items it sent).

A result counts only if it is one this workflow handed back for a write call of the same tool:
matched by the framework's call id and by the SHA-256 of the content handed back, each at most
once. A result from an earlier conversation given to the agent (a message history), or one the
framework or a filter changed or dropped, is not heard. Anything not matched leaves the call
unheard: then the ledger holds or reuses a repeat instead of paying it twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio import workflow
from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

with workflow.unsafe.imports_passed_through():
    from onceflow.ledger.guards import Heard


def told_digest(content: Any) -> str:
    """SHA-256 of a tool result as handed to the framework. A JSON text and the object it encodes
    digest alike, since one framework keeps the object and another the text."""
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except ValueError:
            pass
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class ToldCall(BaseModel):
    """One write call whose result this workflow handed to the framework."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    framework_call_id: str
    tool: str
    told_sha256: str
    # What the model hears of it once the result is in the conversation: a settled outcome's
    # status and settlement; None for one that was not settled (unknown when the run failed on it).
    heard: Heard | None = None


class OnceflowState(BaseModel):
    """A hosting workflow's write-call state, to pass on when it continues as new:
    `workflow.continue_as_new(MyInput(..., onceflow=self.onceflow_state()))`, then
    `async with self.onceflow(tenant=..., agent=..., state=my_input.onceflow)` in the new run.

    Without it the new run would mint call ids this run used already (the same keys: the ledger
    would answer with this run's recorded results, nothing sent) and would not know what the model
    heard of this run's calls (a repeat it asks for knowingly would be held or reused).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    used_call_ids: list[str] = []
    write_calls: int = 0
    told: list[ToldCall] = []
    conflict_keys: list[str] = []


def heard_in(told: Sequence[ToldCall], conversation: Iterable[tuple[str, str]], tool: str) -> list[Heard]:
    """What the model had heard of this workflow's earlier calls of `tool`, given the tool results in
    the conversation that produced a call ((framework call id, told_digest of the content))."""
    unmatched = list(told)
    heard: list[Heard] = []
    for call_id, digest in conversation:
        for index, record in enumerate(unmatched):
            if record.framework_call_id == call_id and record.told_sha256 == digest:
                del unmatched[index]
                if record.tool == tool and record.heard is not None:
                    heard.append(record.heard)
                break
    return heard


# -- model turns the workflow cannot see otherwise (the OpenAI Agents SDK) ---------------------------


@dataclass(frozen=True)
class ModelTurnReader:
    """How to read a framework's model activity: the tool results its request carried
    ((framework call id, content)), the call ids its answer asked for, and whether the request
    continues a conversation the provider keeps (only the new items are sent)."""

    carried: Callable[[Sequence[Any]], list[tuple[str, Any]]]
    asked: Callable[[Any], list[str]]
    continued: Callable[[Sequence[Any]], bool]


# Activity type -> its reader. An adapter registers its framework's model activities when imported.
MODEL_TURN_READERS: dict[str, ModelTurnReader] = {}
# The last model turns' conversations a workflow keeps for calls not yet made.
_TURNS_KEPT = 256


class ModelTurns:
    """Per hosting workflow: for each call id a model answer asked for, the tool results that were in
    the conversation of that request (digested). Filled by OnceflowInterceptor as answers arrive."""

    def __init__(self) -> None:
        self._by_call: dict[str, list[tuple[str, str]]] = {}
        self._kept_by_provider: list[tuple[str, str]] = []

    def started(self, reader: ModelTurnReader, args: Sequence[Any], handle: Any) -> None:
        carried = [(call_id, told_digest(content)) for call_id, content in reader.carried(args)]
        if reader.continued(args):
            carried = [*self._kept_by_provider, *carried]
        self._kept_by_provider = carried

        def answered(done: Any) -> None:
            if done.cancelled() or done.exception() is not None:
                return
            for call_id in reader.asked(done.result()):
                self._by_call.pop(call_id, None)
                self._by_call[call_id] = carried
            while len(self._by_call) > _TURNS_KEPT:
                del self._by_call[next(iter(self._by_call))]

        # Runs before the framework's own await of the handle resumes it: registered first.
        handle.add_done_callback(answered)

    def conversation_of(self, call_id: str) -> list[tuple[str, str]] | None:
        """The conversation of the turn that asked for `call_id`; None if no model turn seen here
        asked for it (then nothing counts as heard)."""
        return self._by_call.pop(call_id, None)


def _observe(activity: str, args: Sequence[Any], handle: Any) -> None:
    reader = MODEL_TURN_READERS.get(activity)
    turns = getattr(workflow.instance(), "onceflow_model_turns", None) if reader else None
    if reader is not None and isinstance(turns, ModelTurns):
        turns.started(reader, args, handle)


class _Outbound(WorkflowOutboundInterceptor):
    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        handle = super().start_activity(input)
        _observe(input.activity, input.args, handle)
        return handle

    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        handle = super().start_local_activity(input)
        _observe(input.activity, input.args, handle)
        return handle


class _Inbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_Outbound(outbound))


class OnceflowInterceptor(Interceptor):
    """A worker interceptor (OnceflowPlugin adds it): lets a hosting workflow see the model turns of
    a framework whose tool hook is not given the conversation (MODEL_TURN_READERS)."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _Inbound
