"""A model provider for tests, served over real HTTP: the OpenAI Chat Completions and the Anthropic
Messages wire formats, talked to by the real `openai` and `anthropic` SDKs.

Each request is checked the way the real API checks it (tests/support/wire_checks.py). A request the
real API would refuse is answered 400, as the API would, and recorded in `problems`; the `model_server`
fixture fails the test if any were. Answers are scripted per test, in order, provider-neutral:
`Answer` (text and tool calls), `Fault` (an HTTP error with headers, e.g. 429 with Retry-After) or
`Hang` (no answer until the client gives up or the test ends).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.support.processes import free_port
from tests.support.wire_checks import anthropic_problems, openai_problems

Provider = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class Call:
    """One tool call in an answer. `id=None` sends none; `raw` sends these exact argument bytes
    (OpenAI sends arguments as a JSON string, which a small model may garble)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = "auto"
    raw: str | None = None


@dataclass(frozen=True)
class Answer:
    text: str = ""
    calls: tuple[Call, ...] = ()
    input_tokens: int = 21
    output_tokens: int = 8


@dataclass(frozen=True)
class Fault:
    status: int
    message: str = "scripted fault"
    headers: dict[str, str] = field(default_factory=dict)
    code: str | None = None


@dataclass(frozen=True)
class Hang:
    """Answer nothing for `seconds` (the client's timeout or a killed worker ends the wait first)."""

    seconds: float = 600


Scripted = Answer | Fault | Hang

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class ModelServer:
    """Serves one provider's wire format on a loopback port; `url` is its base URL for the SDK."""

    def __init__(self, provider: Provider, key: str) -> None:
        self.provider = provider
        self.key = key
        self.port = free_port()
        self.script: list[Scripted] = []
        self.requests: list[dict[str, Any]] = []  # every request body received, in order
        self.problems: list[str] = []  # requests the real API would have refused
        self.keys_seen: list[str] = []
        self.times: list[float] = []  # when each request arrived (time.monotonic)
        self._ids = itertools.count(1)
        self._release = asyncio.Event()

    @property
    def url(self) -> str:
        suffix = "/v1" if self.provider == "openai" else ""  # the SDKs' own base URL conventions
        return f"http://127.0.0.1:{self.port}{suffix}"

    def answer(self, *items: Scripted) -> None:
        self.script.extend(items)

    def release_hangs(self) -> None:
        self._release.set()

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._openai, methods=["POST"]),
                Route("/v1/messages", self._anthropic, methods=["POST"]),
            ]
        )

    async def _openai(self, request: Request) -> JSONResponse:
        authorization = request.headers.get("authorization", "")
        return await self._handle(request, "openai", authorization.removeprefix("Bearer "), openai_problems)

    async def _anthropic(self, request: Request) -> JSONResponse:
        problems = [] if request.headers.get("anthropic-version") else ["anthropic-version header missing"]
        # Anthropic takes the key as x-api-key, or (newer SDKs send this) as a bearer token.
        key = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix(
            "Bearer "
        )
        return await self._handle(request, "anthropic", key, anthropic_problems, problems)

    async def _handle(
        self, request: Request, route: Provider, key: str, check: Any, problems: list[str] | None = None
    ) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        self.keys_seen.append(key)
        self.times.append(time.monotonic())
        if route != self.provider:
            return self._refuse(f"this server speaks {self.provider}, not {route}")
        if key != self.key:
            # Like the real APIs, the message quotes the key it was given: onceflow must scrub it.
            return self._error(401, f"Incorrect API key provided: {key}")
        problems = (problems or []) + check(body)
        if problems:
            return self._refuse("; ".join(problems))
        if not self.script:
            return self._refuse("the test scripted no answer for this request")
        item = self.script.pop(0)
        if isinstance(item, Hang):
            try:
                await asyncio.wait_for(self._release.wait(), item.seconds)
            except TimeoutError:
                pass
            return self._error(500, "hung and gave up")
        if isinstance(item, Fault):
            return self._error(item.status, item.message, item.headers, item.code)
        return JSONResponse(self._render(body, item))

    def _refuse(self, problem: str) -> JSONResponse:
        self.problems.append(problem)
        return self._error(400, problem)

    def _error(
        self, status: int, message: str, headers: dict[str, str] | None = None, code: str | None = None
    ) -> JSONResponse:
        kind = _ERROR_TYPES.get(status, "api_error")
        if self.provider == "openai":
            body: dict[str, Any] = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        else:
            body = {"type": "error", "error": {"type": kind, "message": message}}
        return JSONResponse(body, status_code=status, headers=headers)

    def _call_id(self, call: Call) -> str | None:
        if call.id != "auto":
            return call.id
        prefix = "call_" if self.provider == "openai" else "toolu_"
        return f"{prefix}{next(self._ids):04d}"

    def _render(self, body: dict[str, Any], answer: Answer) -> dict[str, Any]:
        if self.provider == "openai":
            return self._render_openai(body, answer)
        return self._render_anthropic(body, answer)

    def _render_openai(self, body: dict[str, Any], answer: Answer) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": answer.text or None, "refusal": None}
        if answer.calls:
            message["tool_calls"] = []
            for call in answer.calls:
                wire: dict[str, Any] = {
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.raw or json.dumps(call.arguments)},
                }
                call_id = self._call_id(call)
                if call_id is not None:
                    wire["id"] = call_id
                message["tool_calls"].append(wire)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if answer.calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": answer.input_tokens,
                "completion_tokens": answer.output_tokens,
                "total_tokens": answer.input_tokens + answer.output_tokens,
            },
        }

    def _render_anthropic(self, body: dict[str, Any], answer: Answer) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if answer.text:
            content.append({"type": "text", "text": answer.text})
        for call in answer.calls:
            content.append(
                {
                    "type": "tool_use",
                    "id": self._call_id(call) or "",
                    "name": call.name,
                    "input": call.arguments,
                }
            )
        return {
            "id": f"msg_{uuid.uuid4().hex[:20]}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": "tool_use" if answer.calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens},
        }


@asynccontextmanager
async def serving(provider: Provider, key: str) -> AsyncIterator[ModelServer]:
    server = ModelServer(provider, key)
    uv = uvicorn.Server(
        uvicorn.Config(server.app(), host="127.0.0.1", port=server.port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(uv.serve(), name=f"model-server-{provider}")
    while not uv.started:
        if task.done():
            await task
        await asyncio.sleep(0.01)
    try:
        yield server
    finally:
        server.release_hangs()
        uv.should_exit = True
        await task
