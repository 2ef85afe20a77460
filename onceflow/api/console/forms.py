"""The console's browser session and its protection against cross-site requests.

Signing in puts the operator's token in a cookie the browser keeps for its session only (no
Max-Age, no Expires), HttpOnly and SameSite=Strict, scoped to /console. The token is never written
into a URL, a page or a log. The cookie also carries a random nonce drawn at sign-in; the session's
CSRF token is an HMAC of that nonce keyed by the token, so every sign-in gets a fresh one, nothing is
stored on the server, and a page that shows it reveals nothing about the token.

Every POST checks that CSRF token, and refuses a request the browser itself marks as cross-site
(`Sec-Fetch-Site`). The sign-in form, before any session exists, is protected the same way by a
one-off cookie whose value the form must echo back.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from fastapi import Request, Response

from onceflow.ledger import OperatorToken, OperatorTokens

SESSION_COOKIE = "onceflow_console"
SIGN_IN_COOKIE = "onceflow_console_sign_in"
COOKIE_PATH = "/console"


class CrossSiteRequest(Exception):
    """A POST without the session's CSRF token, or one the browser says came from another site."""


@dataclass(frozen=True)
class Session:
    operator: OperatorToken
    token: str  # kept server-side for the request only: calls to the JSON API send it
    csrf: str


def _csrf_for(token: str, nonce: str) -> str:
    return hmac.new(token.encode(), f"onceflow-console-csrf:{nonce}".encode(), hashlib.sha256).hexdigest()


def _set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    response.set_cookie(
        name,
        value,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


async def current_session(request: Request) -> Session | None:
    """The signed-in operator, or None (no cookie, a malformed one, a revoked or unknown token)."""
    nonce, _, token = request.cookies.get(SESSION_COOKIE, "").partition(".")
    if not nonce or not token:
        return None
    tokens: OperatorTokens = request.app.state.tokens
    operator = await tokens.authenticate(token)
    if operator is None:
        return None
    return Session(operator=operator, token=token, csrf=_csrf_for(token, nonce))


def start_session(request: Request, response: Response, token: str) -> None:
    _set_cookie(request, response, SESSION_COOKIE, f"{secrets.token_hex(16)}.{token}")
    response.delete_cookie(SIGN_IN_COOKIE, path=COOKIE_PATH)


def end_session(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)


def new_sign_in_nonce() -> str:
    """A fresh one-off value for the sign-in form; its cookie twin is checked when the form comes back."""
    return secrets.token_hex(16)


def remember_sign_in_nonce(request: Request, response: Response, nonce: str) -> None:
    _set_cookie(request, response, SIGN_IN_COOKIE, nonce)


def _same_site(request: Request) -> None:
    # Browsers send Sec-Fetch-Site on every request; an older client that does not still needs the
    # CSRF token, so a missing header is no pass on its own.
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise CrossSiteRequest("the browser marked this request as coming from another site")


async def form_of(request: Request) -> dict[str, str]:
    """The submitted form's fields (the last value of each; checkbox lists go through `keys_of`)."""
    form = await request.form()
    return {name: value for name, value in form.items() if isinstance(value, str)}


async def keys_of(request: Request) -> list[str]:
    form = await request.form()
    return [v for v in form.getlist("key") if isinstance(v, str)]


def check_post(request: Request, session: Session, fields: dict[str, str]) -> None:
    _same_site(request)
    if not hmac.compare_digest(fields.get("csrf", ""), session.csrf):
        raise CrossSiteRequest("the form's CSRF token does not match this session")


def check_sign_in(request: Request, fields: dict[str, str]) -> None:
    _same_site(request)
    expected = request.cookies.get(SIGN_IN_COOKIE, "")
    if not expected or not hmac.compare_digest(fields.get("csrf", ""), expected):
        raise CrossSiteRequest("the sign-in form expired or came from another site")
