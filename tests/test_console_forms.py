"""The console's protection against cross-site requests, over plain HTTP (no browser needed)."""

from __future__ import annotations

import re

import httpx

from onceflow.ledger import OperatorTokens, Status
from tests.support.operator_api import OperatorApi, unknown_call


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
        assert (await http.get("/console")).status_code == 303
