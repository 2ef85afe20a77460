"""What a tool (or its reconcile hook) raises to say how a call ended, and what a model's bad
arguments raise."""

from __future__ import annotations


class ToolNotAttemptedError(Exception):
    """Raise before sending anything: the call definitely did not take effect and may run again."""


class ToolRejectedError(Exception):
    """The other system answered no: definitely not applied. The model is told the reason."""


class ToolKeyNotFoundError(ToolRejectedError):
    """The other system says it has no record of the call's idempotency key: nothing under the key
    took effect there (e.g. a lookup by key that found nothing and fenced it, or a receiver that
    answers "unknown key").

    The only refusal that settles a resent call as failed: a resend refused with "key already used
    with a different body" or "request in progress" proves the key arrived before, so the first
    request may have taken effect, and the call stays unknown. Raised by a first send it means
    what `ToolRejectedError` means; raised by a reconcile hook it means the effect is proven absent.
    """


class ToolRefusedError(Exception):
    """The other system refused on policy grounds (an authorization limit, a guardrail): not applied,
    and final. The call is never sent again, and the model is told not to try it again."""


class InvalidToolArgumentsError(ValueError):
    """The model asked for a call whose arguments do not fit the tool's schema."""

    def __init__(self, tool: str, problems: list[str]) -> None:
        super().__init__(f"invalid arguments for tool {tool!r}: " + "; ".join(problems))
        self.tool = tool
        self.problems = problems
