"""The console's protection against cross-site requests, its sessions in the ledger, sign-in
throttling and the cookie behind a TLS proxy, over plain HTTP (no browser needed)."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.api.console.throttle import SignInThrottle, retry_after
from onceflow.api.options import ApiOptions
from onceflow.ledger import ConsoleSessions, Ledger, OperatorTokens, Status
from tests.support.agents import support_registry
from tests.support.operator_api import OperatorApi, serving_api, unknown_call


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page
    return found.group(1)


async def _signed_in(api: OperatorApi, http: httpx.AsyncClient) -> tuple[str, str]:
    token = await api.token()
    form = await http.get("/console/sign-in")
    answer = await http.post("/console/sign-in", data={"csrf": _csrf(form.text), "token": token})
    assert answer.status_code == 303 and answer.headers["location"] == "/console"
    queue = await http.get("/console")
    assert queue.status_code == 200
    return token, _csrf(queue.text)


async def test_a_post_from_another_site_or_without_the_sessions_token_changes_nothing(
    operator_api: OperatorApi,
) -> None:
    key = await unknown_call(operator_api.ledger)
    async with httpx.AsyncClient(base_url=operator_api.url, timeout=30) as http:
        token, csrf = await _signed_in(operator_api, http)
        fields = {"status": "failed", "reason": "forged", "confirmed": "yes"}
        for data, headers in (
            (fields, {}),
            ({**fields, "csrf": "0" * 64}, {}),
            ({**fields, "csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
            ({**fields, "csrf": csrf}, {"Sec-Fetch-Site": "same-site"}),
        ):
            answer = await http.post(f"/console/calls/{key}/actions/resolve", data=data, headers=headers)
            assert answer.status_code == 403, answer.text
            assert "Nothing was changed" in answer.text and token not in answer.text
        assert (await operator_api.ledger.get(key)).status is Status.INDETERMINATE

        page = await http.get(f"/console/calls/{key}")
        assert token not in page.text
        assert "script" not in page.headers["content-security-policy"]
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        done = await http.post(f"/console/calls/{key}/actions/resolve", data={**fields, "csrf": csrf})
        assert done.status_code == 200 and "settled by operator:alice" in done.text
        assert (await operator_api.ledger.get(key)).status is Status.FAILED

        # Revoking the token ends the session at its next request.
        tokens = OperatorTokens(operator_api.ledger)
        [mine] = [t for t in await tokens.list_tokens("acme") if t.revoked_at is None]
        await tokens.revoke(mine.id)
        gone = await http.get("/console")
        assert gone.status_code == 303 and gone.headers["location"] == "/console/sign-in"


async def test_sign_in_needs_its_own_form_and_a_live_token(operator_api: OperatorApi) -> None:
    token = await operator_api.token()
    async with httpx.AsyncClient(base_url=operator_api.url, timeout=30) as http:
        # A form posted from elsewhere has no sign-in cookie to match: no session is started.
        forged = await http.post("/console/sign-in", data={"csrf": "abc", "token": token})
        assert forged.status_code == 403 and "onceflow_console=" not in forged.headers.get("set-cookie", "")
        form = await http.get("/console/sign-in")
        cookie = form.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age" not in cookie
        wrong = await http.post("/console/sign-in", data={"csrf": _csrf(form.text), "token": "oft_wrong"})
        assert wrong.status_code == 401 and "oft_wrong" not in wrong.text
        assert "not an operator token" in wrong.text
        assert (await http.get("/console")).status_code == 303


# -- sessions in the ledger ---------------------------------------------------------------------------


async def _session_rows(api: OperatorApi) -> list[dict[str, Any]]:
    async with api.ledger.connection("test_sessions") as conn:
        return [dict(r) for r in await conn.fetch("SELECT * FROM console_sessions ORDER BY created_at")]


async def test_a_session_is_a_ledger_row_that_idles_out_ends_at_sign_out_and_with_its_token(
    operator_api: OperatorApi,
) -> None:
    async with httpx.AsyncClient(base_url=operator_api.url, timeout=30) as http:
        token, csrf = await _signed_in(operator_api, http)
        secret = http.cookies["onceflow_console"]
        [row] = await _session_rows(operator_api)
        # Only the id's hash is stored; the row names the token by id; no secret is in it.
        assert row["id_sha256"] == hashlib.sha256(secret.encode()).hexdigest()
        assert token not in str(row) and secret not in str(row)
        tokens = OperatorTokens(operator_api.ledger)
        [mine] = [t for t in await tokens.list_tokens("acme") if t.revoked_at is None]
        assert row["token_id"] == mine.id
        # The defaults: 30 minutes idle, 12 hours at most; each request moves the idle deadline on.
        assert row["expires_at"] - row["created_at"] == timedelta(hours=12)
        assert row["idle_expires_at"] - row["last_seen_at"] == timedelta(minutes=30)
        assert (await http.get("/console")).status_code == 200
        [touched] = await _session_rows(operator_api)
        assert (
            touched["idle_expires_at"] > row["idle_expires_at"]
            and touched["last_seen_at"] > row["last_seen_at"]
        )

        # Idle past its deadline (set back here, not waited for): sent to sign in.
        async with operator_api.ledger.connection("test_sessions") as conn:
            await conn.execute(
                "UPDATE console_sessions SET idle_expires_at = clock_timestamp() - interval '1 s'"
            )
        gone = await http.get("/console")
        assert gone.status_code == 303 and gone.headers["location"] == "/console/sign-in"

        # A new sign-in sweeps the stale row; signing out deletes its own; a second sign-out of the
        # same session is sent to sign in, like any request without one.
        token, csrf = await _signed_in(operator_api, http)
        assert len(await _session_rows(operator_api)) == 1
        out = await http.post("/console/sign-out", data={"csrf": csrf})
        assert out.status_code == 303 and out.headers["location"] == "/console/signed-out"
        assert "onceflow_console=" in out.headers["set-cookie"] and "Max-Age=0" in out.headers["set-cookie"]
        assert await _session_rows(operator_api) == []
        ended = http.cookies.get("onceflow_console")
        assert ended is None
    async with httpx.AsyncClient(base_url=operator_api.url, timeout=30) as http:
        replayed = {"Cookie": f"onceflow_console={secret}"}
        again = await http.post("/console/sign-out", data={"csrf": csrf}, headers=replayed)
        assert again.status_code == 303 and again.headers["location"] == "/console/sign-in"

        # Revoking a token deletes its sessions (the lookup also joins a live token).
        await _signed_in(operator_api, http)
        [live] = await _session_rows(operator_api)
        await tokens.revoke(live["token_id"])
        assert await _session_rows(operator_api) == []


async def test_a_session_never_outlives_its_lifetime_however_busy(ledger: Ledger) -> None:
    token, _ = await OperatorTokens(ledger).create(tenant="acme", operator="alice")
    sessions = ConsoleSessions(ledger, idle=timedelta(hours=10), lifetime=timedelta(hours=1))
    started = await sessions.start(token)
    assert started is not None
    session, secret = started
    assert session.idle_expires_at == session.expires_at == session.created_at + timedelta(hours=1)
    resumed = await sessions.resume(secret)
    assert resumed is not None and resumed.idle_expires_at == session.expires_at
    assert resumed.csrf == session.csrf and resumed.operator.operator == "alice"
    for wrong in ("", secret + "x", secret[:-1], "ocs_" + "?" * 43, "oft_" + secret[4:]):
        assert await sessions.resume(wrong) is None
    await OperatorTokens(ledger).revoke(token.id)
    assert await sessions.resume(secret) is None
    assert await sessions.start(token) is None  # a revoked token starts nothing


# -- sign-in throttling ---------------------------------------------------------------------------


class _Queries:
    """The ledger operations run while it watches (a spy on Ledger.connection)."""

    def __init__(self, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[str] = []
        real = ledger.connection

        def spy(operation: str, **attributes: Any) -> Any:
            self.seen.append(operation)
            return real(operation, **attributes)

        monkeypatch.setattr(ledger, "connection", spy)


async def _try(http: httpx.AsyncClient, token: str, **headers: str) -> httpx.Response:
    """One sign-in attempt with a fresh form (each answer draws a new form nonce)."""
    csrf = _csrf((await http.get("/console/sign-in")).text)
    return await http.post("/console/sign-in", data={"csrf": csrf, "token": token}, headers=headers)


async def test_sign_in_attempts_are_throttled_per_client_and_a_malformed_token_is_never_looked_up(
    operator_api: OperatorApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = await operator_api.token()
    queries = _Queries(operator_api.ledger, monkeypatch)
    async with httpx.AsyncClient(base_url=operator_api.url, timeout=30) as http:
        for guess in ("", "garbage", "oft_short", "Bearer " + token, token + "x", "oft_" + "é" * 43):
            answer = await _try(http, guess)
            if answer.status_code == 429:
                break
            assert answer.status_code == 401 and "not an operator token" in answer.text
        # Five attempts a client may make at once; the sixth waits, and says how long.
        assert answer.status_code == 429, answer.text
        assert "Too many sign-in attempts from your address" in answer.text
        assert int(answer.headers["retry-after"]) >= 1
        # Not one of them reached the ledger (and the throttled one did not either).
        assert not {"authenticate", "start_console_session"} & set(queries.seen)
        # Even the right token waits its turn.
        right = await _try(http, token)
        assert right.status_code == 429 and "onceflow_console=" not in right.headers.get("set-cookie", "")


async def test_guesses_at_one_token_prefix_are_throttled_whichever_client_sends_them(
    operator_api: OperatorApi,
) -> None:
    token = await operator_api.token()
    async with httpx.AsyncClient(base_url=operator_api.url, timeout=30) as http:
        answers = []
        for n in range(6):
            # Each from another address (the test's loopback is a trusted proxy by default), each a
            # well-formed token that shares the real one's first characters.
            guess = token[:20] + f"{n:02d}" + token[22:]
            answers.append(await _try(http, guess, **{"X-Forwarded-For": f"198.51.100.{n + 1}"}))
        assert [a.status_code for a in answers] == [401] * 5 + [429]
        assert "with tokens that start like this one" in answers[-1].text
        # Another prefix, another client: not held up by them.
        other = await operator_api.token(operator="bob")
        fine = await _try(http, other, **{"X-Forwarded-For": "203.0.113.9"})
        assert fine.status_code == 303


def test_the_throttle_refills_and_forgets_full_buckets_first() -> None:
    now = [0.0]
    throttle = SignInThrottle(burst=2, per_second=1.0, max_keys=3, clock=lambda: now[0])
    assert [throttle.take("a") for _ in range(3)] == [0.0, 0.0, 1.0]
    now[0] = 0.5
    assert throttle.take("a") == 0.5
    now[0] = 1.0
    assert throttle.take("a") == 0.0
    throttle.give_back("a")
    assert throttle.take("a") == 0.0
    for key in ("b", "c"):
        throttle.take(key)
    now[0] = 10.0  # everything refilled; a fourth key drops the full ones, keeping memory bounded
    throttle.take("d")
    assert len(throttle._buckets) <= 3
    assert retry_after(0.2) == "1" and retry_after(2.1) == "3"


# -- behind a TLS proxy ---------------------------------------------------------------------------


async def test_behind_a_trusted_proxy_the_cookie_is_host_prefixed_and_secure(
    operator_api: OperatorApi,
) -> None:
    """The loopback is trusted by default (ONCEFLOW_FORWARDED_ALLOW_IPS): its X-Forwarded-Proto counts."""
    token = await operator_api.token()
    https = {"X-Forwarded-Proto": "https"}
    async with httpx.AsyncClient(base_url=operator_api.url, timeout=30, headers=https) as http:
        form = await http.get("/console/sign-in")
        assert form.headers["set-cookie"].startswith("__Host-onceflow_console_sign_in=")
        nonce = form.headers["set-cookie"].split(";")[0].split("=", 1)[1]
        # The jar would not send a Secure cookie over plain HTTP; the proxy's browser would.
        cookie = {"Cookie": f"__Host-onceflow_console_sign_in={nonce}"}
        answer = await http.post(
            "/console/sign-in", data={"csrf": _csrf(form.text), "token": token}, headers=cookie
        )
        assert answer.status_code == 303
        session = next(
            c for c in answer.headers.get_list("set-cookie") if c.startswith("__Host-onceflow_console=")
        )
        attributes = {part.strip().lower() for part in session.split(";")[1:]}
        assert {"path=/", "secure", "httponly", "samesite=strict"} <= attributes
        assert not any(a.startswith("domain") for a in attributes)


async def test_a_sign_in_through_an_untrusted_proxy_that_says_https_is_refused(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    options = ApiOptions(forwarded_allow_ips="192.0.2.1")  # some other proxy, not this test
    async with serving_api(temporal_env.client, ledger, support_registry(), options=options) as api:
        token = await api.token()
        async with httpx.AsyncClient(base_url=api.url, timeout=30) as http:
            answer = await _try(http, token, **{"X-Forwarded-Proto": "https"})
            assert answer.status_code == 400
            assert "ONCEFLOW_FORWARDED_ALLOW_IPS" in answer.text and "127.0.0.1" in answer.text
            assert "onceflow_console=" not in answer.headers.get("set-cookie", "")
            # Straight to the API, no proxy in between: plain HTTP, the plain cookie.
            plain = await _try(http, token)
            assert plain.status_code == 303 and "onceflow_console=ocs_" in plain.headers["set-cookie"]
