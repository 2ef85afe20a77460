"""Bearer tokens: every request names its tenant and operator only through its token.

The console is the one other way in: it calls these routes in-process, over ASGI, for an operator
whose session it has just checked, and says so under `SIGNED_IN` in the request's ASGI scope. A
scope is built by the server, never from what a client sends, so no request from outside can carry
that key; and the console never holds the operator's token at all (ledger/sessions.py).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from onceflow.api.problems import Problem
from onceflow.ledger import OperatorToken, OperatorTokens

SIGNED_IN = "onceflow.signed_in_operator"

_bearer = HTTPBearer(auto_error=False, description="An operator token from `onceflow tokens create`.")


def _unauthorized(detail: str) -> Problem:
    problem = Problem(401, "unauthorized", "Unauthorized", detail)
    problem.headers = {"WWW-Authenticate": "Bearer"}
    return problem


async def _authenticate(tokens: OperatorTokens, authorization: str | None) -> OperatorToken:
    scheme, _, secret = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise _unauthorized("send `Authorization: Bearer <token>`")
    operator = await tokens.authenticate(secret.strip())
    if operator is None:
        raise _unauthorized("unknown or revoked token")
    return operator


class RequireToken:
    """Check the token of every request under `prefix` before anything else reads it.

    A dependency alone is not enough: FastAPI parses a JSON body before it runs any dependency, so
    a caller without a token who sends a malformed body would get 400 instead of 401.
    """

    def __init__(self, app: ASGIApp, tokens: OperatorTokens, prefix: str = "/v1/") -> None:
        self.app = app
        self.tokens = tokens
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        operator = scope.get(SIGNED_IN)
        if not isinstance(operator, OperatorToken):
            try:
                operator = await _authenticate(self.tokens, Headers(scope=scope).get("authorization"))
            except Problem as problem:
                await problem.response()(scope, receive, send)
                return
        scope.setdefault("state", {})["operator"] = operator
        await self.app(scope, receive, send)


async def current_operator(
    request: Request,
    # Declared for the OpenAPI security scheme; RequireToken has already checked it.
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> OperatorToken:
    operator: OperatorToken | None = getattr(request.state, "operator", None)
    if operator is None:  # a route outside RequireToken's prefix
        operator = await _authenticate(request.app.state.tokens, request.headers.get("authorization"))
    return operator


Operator = Annotated[OperatorToken, Depends(current_operator)]
