"""Errors as RFC 9457 problem details (`application/problem+json`), the way payment APIs answer.

Used by the operator API, and by the example billing service with a type base of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onceflow.local.extras import needs_extra

with needs_extra("api"):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_MEDIA_TYPE = "application/problem+json"


class Problem(Exception):
    """Raise from a route to answer with a problem document; `slug` ends the problem's type URI.

    Subclass and set `type_base` to give a service's problem types a namespace of their own.
    """

    type_base = "urn:onceflow:problem:"

    def __init__(self, status: int, slug: str, title: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.extra = extra
        self.headers: Mapping[str, str] | None = None

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        """The problem as a response."""
        body = {
            "type": self.type_base + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            **self.extra,
        }
        return JSONResponse(
            body, status_code=self.status, media_type=PROBLEM_MEDIA_TYPE, headers=headers or self.headers
        )


def install_problem_handlers(app: FastAPI, problem: type[Problem] = Problem) -> None:
    """Answer every error as a problem document.

    Malformed requests get 400 rather than FastAPI's default 422, because 422 is this service's
    business rejection (a definite "no") and clients must be able to tell the two apart by status.
    """

    async def on_problem(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return exc.response()  # type_base comes from the subclass raised

    async def on_invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = [f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()]
        return problem(400, "invalid-request", "Invalid request", "; ".join(errors)).response()

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        slug = "not-found" if exc.status_code == 404 else f"http-{exc.status_code}"
        return problem(exc.status_code, slug, str(exc.detail), str(exc.detail)).response(exc.headers)

    async def on_crash(_: Request, exc: Exception) -> JSONResponse:
        # The cause goes to the log (Starlette logs it); the caller learns only that it failed.
        return problem(
            500, "internal-error", "Internal error", "the request failed; see the server log"
        ).response()

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(Exception, on_crash)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(StarletteHTTPException, on_http)
