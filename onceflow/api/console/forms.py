"""The console's browser session and its protection against cross-site requests.

Signing in starts a session in the ledger (ledger/sessions.py) and puts only its random id in a
cookie the browser keeps for its session (no Max-Age, no Expires), HttpOnly and SameSite=Strict.
The bearer token is never in the cookie, a URL, a page or a log. Signing out deletes the session,
so the cookie, or a copy of it, opens nothing afterwards.

Over HTTPS the cookie is `__Host-onceflow_console` (`Secure`, `Path=/`, no `Domain`): a browser
takes a cookie of that name only from a secure page of this very host, so a plain-HTTP page on
another port of the host, or a sibling host of the domain, cannot plant one; and the console reads
no other name over HTTPS. Over plain HTTP (a laptop) it is `onceflow_console`, path `/console`.
"Over HTTPS" is what the server sees: its own TLS, or `X-Forwarded-Proto: https` from a proxy that
ONCEFLOW_FORWARDED_ALLOW_IPS trusts. A sign-in that an untrusted proxy says came over HTTPS is
refused rather than answered with a cookie that would silently lack `Secure`.

Every POST carries the session's CSRF token (an HMAC of the session id) and is refused when the
browser marks it as cross-site (`Sec-Fetch-Site`). The sign-in form, before any session exists, is
protected the same way by a one-off cookie whose value the form must echo back.
"""

from __future__ import annotations

import hmac
import secrets

from fastapi import Request, Response

from onceflow.ledger import ConsoleSession, ConsoleSessions

COOKIE = "onceflow_console"
SIGN_IN_COOKIE = "onceflow_console_sign_in"
PLAIN_PATH = "/console"
HOST_PREFIX = "__Host-"


class CrossSiteRequest(Exception):
    """A POST without the session's CSRF token, or one the browser says came from another site."""


class UntrustedProxy(Exception):
    """A request a proxy says came over HTTPS, from a proxy the API does not trust."""


def over_https(request: Request) -> bool:
    return request.url.scheme == "https"


def cookie_name(request: Request, name: str) -> str:
    """The name a cookie has on this request's scheme: `__Host-` prefixed over HTTPS."""
    return HOST_PREFIX + name if over_https(request) else name


def _set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    secure = over_https(request)
    response.set_cookie(
        cookie_name(request, name),
        value,
        path="/" if secure else PLAIN_PATH,
        httponly=True,
        samesite="strict",
        secure=secure,
    )


def _delete_cookie(request: Request, response: Response, name: str) -> None:
    # A browser drops a `__Host-` cookie only for a Set-Cookie that could have set it: Secure, Path=/.
    secure = over_https(request)
    response.delete_cookie(
        cookie_name(request, name),
        path="/" if secure else PLAIN_PATH,
        secure=secure,
        httponly=True,
        samesite="strict",
    )


def check_proxy(request: Request) -> None:
    """Refuse a request whose proxy says HTTPS when the server sees plain HTTP: the proxy is not
    trusted, so the cookie would go out without `Secure` and under the plain name."""
    said = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    if said == "https" and not over_https(request):
        peer = request.client.host if request.client else "unknown"
        raise UntrustedProxy(
            f"this request came through a proxy ({peer}) that says the browser used HTTPS, but "
            "the operator API does not trust it, so it cannot mark the session cookie Secure. Set "
            f"ONCEFLOW_FORWARDED_ALLOW_IPS to the proxy's address (it is {peer}) and restart the API"
        )


def _session_id(request: Request) -> str:
    return request.cookies.get(cookie_name(request, COOKIE), "")


async def current_session(request: Request) -> ConsoleSession | None:
    """The signed-in operator's live session, or None (no cookie, an ended or unknown session, a
    revoked token)."""
    secret = _session_id(request)
    if not secret:
        return None
    sessions: ConsoleSessions = request.app.state.console_sessions
    return await sessions.resume(secret)


def start_session(request: Request, response: Response, secret: str) -> None:
    _set_cookie(request, response, COOKIE, secret)
    _delete_cookie(request, response, SIGN_IN_COOKIE)


async def end_session(request: Request, response: Response) -> None:
    """Sign out: the session's row is deleted, so the cookie and any copy of it open nothing."""
    sessions: ConsoleSessions = request.app.state.console_sessions
    await sessions.end(_session_id(request))
    _delete_cookie(request, response, COOKIE)


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


def check_post(request: Request, session: ConsoleSession, fields: dict[str, str]) -> None:
    _same_site(request)
    if not hmac.compare_digest(fields.get("csrf", ""), session.csrf):
        raise CrossSiteRequest("the form's CSRF token does not match this session")


def check_sign_in(request: Request, fields: dict[str, str]) -> None:
    _same_site(request)
    expected = request.cookies.get(cookie_name(request, SIGN_IN_COOKIE), "")
    if not expected or not hmac.compare_digest(fields.get("csrf", ""), expected):
        raise CrossSiteRequest("the sign-in form expired or came from another site")
