"""A tool whose receiver uses onceflow's receiver kit (onceflow.receiver): one line on the tool, and
its unknown calls settle themselves.

    @billing.tool(external(timeout=CREDIT_TIMEOUT), receiver=kit_receiver(url_env="ONCEFLOW_BILLING_URL"))
    async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict: ...

The reconciler then asks the receiver itself, by the call's key (the reconcile protocol):

- lookup: `completed` -> the call is settled completed with the receiver's stored answer as its
  result (an error status stored: failed, the receiver refused it; a 5xx: unknown);
  `in_progress` -> unknown, asked again on the reconciler's backoff; `fenced` -> failed;
- `absent` (no record) -> fence: atomically, the receiver either hands back the answer of a request
  that completed just now, or records the key as never to be applied; then the call is failed
  (not applied: what a hook raising `ToolKeyNotFoundError` says), which is now a fact and not a
  guess.

A tool's own answer to a send (and a resend within its dedup window) speaks the same protocol:
`kit_problem_error()` turns the kit's problem documents into what the write protocol expects.
Nothing here is imported by workflows' sandbox beyond the declaration; httpx is imported on use.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from onceflow.sdk.tools.errors import ToolKeyNotFoundError, ToolNotAttemptedError, ToolRejectedError
from onceflow.sdk.tools.toolset import ReconcileOutcome, ToolContext

DEFAULT_PROTOCOL_PATH = "/idempotency-keys"
SOURCE = "onceflow.receiver"

Headers = Mapping[str, str] | Callable[[ToolContext], Mapping[str, str]]


class ReceiverKit:
    """A receiver that serves the kit's reconcile protocol. Subclasses say how to reach it."""

    describe: str = "a receiver-kit receiver"

    async def lookup(self, context: ToolContext) -> dict[str, Any]:
        """The receiver's record of the call's key (read-only): the protocol's answer."""
        raise NotImplementedError

    async def fence(self, context: ToolContext) -> dict[str, Any]:
        """Completed -> its answer; absent -> fenced for good; in progress -> said so."""
        raise NotImplementedError

    def result_of(self, answer: Mapping[str, Any]) -> Any:
        """The call's result from a completed key's stored response: its JSON body (or text)."""
        response = answer.get("response") or {}
        if "body" in response:
            return response["body"]
        return response.get("body_text", response.get("body_base64"))

    async def reconcile(self, context: ToolContext) -> ReconcileOutcome:
        """The reconcile hook every kit receiver gets: lookup, then fence when there is no record."""
        try:
            answer = await self.lookup(context)
            via = "lookup"
            if answer.get("state") == "absent":
                answer = await self.fence(context)
                via = "fence"
        except Exception as exc:  # the receiver could not be asked: nothing is known yet
            return ReconcileOutcome.unknown(
                source=SOURCE, receiver=self.describe, lookup_error=str(exc)[:500]
            )
        return self.outcome(answer, via)

    def outcome(self, answer: Mapping[str, Any], via: str) -> ReconcileOutcome:
        """What a protocol answer proves about the call."""
        state = answer.get("state")
        evidence: dict[str, Any] = {"source": SOURCE, "receiver": self.describe, "via": via, "state": state}
        for name in ("created_at", "completed_at", "expires_at", "fenced_now"):
            if name in answer:
                evidence[name] = answer[name]
        if state == "fenced":
            # What a hook raising ToolKeyNotFoundError says (no record of the key: not applied),
            # with the receiver's answer kept as the evidence.
            return ReconcileOutcome.failed(
                **evidence,
                no_record_of_key=True,
                answer=f"{self.describe} has no record of the key and has fenced it: it will never be "
                f"applied ({'fenced now' if answer.get('fenced_now') else 'fenced before'})",
            )
        if state != "completed":
            return ReconcileOutcome.unknown(**evidence)
        status = int((answer.get("response") or {}).get("status", 0))
        evidence["status"] = status
        if 200 <= status < 400:
            return ReconcileOutcome.completed(self.result_of(answer), **evidence)
        if 400 <= status < 500:
            return ReconcileOutcome.failed(**evidence, answer=self.result_of(answer))
        return ReconcileOutcome.unknown(**evidence)  # a stored server error tells nothing

    def reconcile_hook(self) -> Callable[..., Awaitable[ReconcileOutcome]]:
        """The tool's reconcile hook: called with the tool's arguments and its ToolContext."""

        async def kit_reconcile(**arguments: Any) -> ReconcileOutcome:
            context = next((v for v in arguments.values() if isinstance(v, ToolContext)), None)
            if context is None:
                raise TypeError(f"{self.describe}: the reconcile hook needs the call's ToolContext")
            return await self.reconcile(context)

        kit_reconcile.receiver = self  # type: ignore[attr-defined]
        return kit_reconcile


@dataclass(frozen=True)
class HttpKitReceiver(ReceiverKit):
    """An HTTP service on the kit: its protocol at `<base URL><path>/{key}` and `.../{key}/fence`.

    The base URL is `url`, or read from the environment variable `url_env` when a call is reconciled
    (in the worker). `headers` authenticate the protocol's requests like the tool's own (e.g.
    `{"Authorization": "Bearer ..."}`), or are built from the call's context.
    """

    url: str | None = None
    url_env: str | None = None
    path: str = DEFAULT_PROTOCOL_PATH
    headers: Headers = field(default_factory=dict)
    timeout: float = 10.0

    def __post_init__(self) -> None:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give the receiver's base URL as exactly one of url= or url_env=")

    @property
    def describe(self) -> str:  # type: ignore[override]
        return f"receiver kit at {self.url or '$' + str(self.url_env)}{self.path}"

    def base_url(self) -> str:
        if self.url is not None:
            return self.url.rstrip("/")
        value = os.environ.get(str(self.url_env), "")
        if not value:
            raise ToolNotAttemptedError(f"{self.url_env} is not set: the receiver's base URL is unknown")
        return value.rstrip("/")

    def _headers(self, context: ToolContext) -> Mapping[str, str]:
        return self.headers(context) if callable(self.headers) else self.headers

    async def _ask(self, method: str, context: ToolContext, suffix: str = "") -> dict[str, Any]:
        import httpx

        url = f"{self.base_url()}{self.path}/{quote(context.idempotency_key, safe='')}{suffix}"
        async with httpx.AsyncClient(timeout=self.timeout, headers=dict(self._headers(context))) as http:
            response = await http.request(method, url)
        if response.status_code != 200:
            raise RuntimeError(f"{method} {url}: HTTP {response.status_code}: {response.text[:300]}")
        answer = response.json()
        if not isinstance(answer, dict) or "state" not in answer:
            raise RuntimeError(f"{method} {url}: not a reconcile protocol answer: {str(answer)[:300]}")
        return answer

    async def lookup(self, context: ToolContext) -> dict[str, Any]:
        return await self._ask("GET", context)

    async def fence(self, context: ToolContext) -> dict[str, Any]:
        return await self._ask("POST", context, "/fence")


def kit_receiver(
    url: str | None = None,
    *,
    url_env: str | None = None,
    path: str = DEFAULT_PROTOCOL_PATH,
    headers: Headers | None = None,
    timeout: float = 10.0,
) -> HttpKitReceiver:
    """Declare that a tool's receiver is an HTTP service on onceflow's receiver kit (see module doc)."""
    return HttpKitReceiver(url=url, url_env=url_env, path=path, headers=headers or {}, timeout=timeout)


def kit_problem_error(problem: Mapping[str, Any], detail: str | None = None) -> Exception | None:
    """The write protocol's reading of a kit refusal (a problem document), None if it is not one:

    - `key-fenced`: the receiver has no record of the key and never will (ToolKeyNotFoundError;
      settles a resent call failed);
    - `key-reused`: the key is known, for another request: a definite no to *this* request, which
      proves nothing about the first (ToolRejectedError);
    - `missing-key`, `bad-key`: refused at the door, nothing stored (ToolNotAttemptedError);
    - `key-in-progress`: a request with the key is being handled: nothing is known (a plain error,
      which the write protocol records as unknown).
    """
    kind = str(problem.get("type", "")).rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    text = detail or str(problem.get("detail") or kind)
    if kind == "key-fenced":
        return ToolKeyNotFoundError(text)
    if kind == "key-reused":
        return ToolRejectedError(text)
    if kind in ("missing-key", "bad-key"):
        return ToolNotAttemptedError(text)
    if kind == "key-in-progress":
        return RuntimeError(f"the receiver is still handling this key: {text}")
    return None
