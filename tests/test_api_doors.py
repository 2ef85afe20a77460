"""The doors beside the operator API's routes: no third-party script on its origin (/docs and /redoc
are not served; every answer carries the console's Content-Security-Policy), the console's query
checked like the API's (`?tool=%00` is 400, not 500), and run links built from encoded parts.
Over plain HTTP against the real API; signal assertions are in tests/test_signal_door.py."""

from __future__ import annotations

import re
import uuid
from html import unescape as html_unescape

import httpx

from onceflow.api.console.routes import temporal_ui_url
from onceflow.api.headers import CONTENT_SECURITY_POLICY
from onceflow.ledger import CallIdentity, SideEffect
from tests.support.operator_api import ARGUMENTS, OperatorApi, unknown_call
from tests.test_executions_cli import put_call


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page
    return found.group(1)


async def _signed_in(api: OperatorApi, http: httpx.AsyncClient) -> None:
    token = await api.token()
    form = await http.get("/console/sign-in")
    answer = await http.post("/console/sign-in", data={"csrf": _csrf(form.text), "token": token})
    assert answer.status_code == 303


async def test_docs_and_redoc_are_not_served_and_the_openapi_document_is(operator_api: OperatorApi) -> None:
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        answer = await operator_api.http.get(path)
        assert answer.status_code == 404, path
        assert "cdn" not in answer.text.lower() and "<script" not in answer.text.lower()
    schema = await operator_api.http.get("/openapi.json")
    assert schema.status_code == 200 and schema.json()["info"]["title"] == "onceflow operator API"
    assert schema.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


async def test_every_page_and_answer_the_api_serves_carries_the_consoles_csp(
    operator_api: OperatorApi,
) -> None:
    """Signed in, from the console's pages and the API's own, every page a link leads to: HTML
    pages (and everything else: JSON, errors, redirects, the style sheet) carry the policy that
    allows no script at all."""
    key = await unknown_call(operator_api.ledger)
    waiting = await put_call(operator_api.ledger, approval=True)
    start = ["/console", "/console/sign-in", "/console/signed-out", f"/console/calls/{waiting}"]
    start += ["/openapi.json", "/healthz", "/docs", "/redoc", "/no-such-page", "/console/calls/no-colon"]
    start += [f"/v1/tool-executions/{key}", "/console?show=unknown&tool=%00"]
    seen: set[str] = set()
    html = 0
    async with httpx.AsyncClient(base_url=operator_api.url, timeout=30) as http:
        await _signed_in(operator_api, http)
        queue = list(start)
        while queue and len(seen) < 80:
            path = queue.pop(0)
            if path in seen:
                continue
            seen.add(path)
            answer = await http.get(path)
            policy = answer.headers.get("content-security-policy")
            assert policy == CONTENT_SECURITY_POLICY, (path, answer.status_code, policy)
            assert answer.headers["x-content-type-options"] == "nosniff"
            if answer.headers.get("content-type", "").startswith("text/html"):
                html += 1
                assert "<script" not in answer.text.lower(), path
                links = re.findall(r'(?:href|src)="(/[^"]*)"', answer.text)
                queue += [html_unescape(link) for link in links if "sign-out" not in link]
    assert "script" not in CONTENT_SECURITY_POLICY and "default-src 'none'" in CONTENT_SECURITY_POLICY
    assert {f"/console/calls/{key}", "/console/static/console.css"} <= seen
    assert html >= 6


REFUSED_QUERIES = [
    "tool=%00",
    "agent=a%00b",
    "cursor=%00",
    "tool=" + "t" * 201,
    "show=everything",
    "limit=7",
    "limit=ten",
    "tool=a&tool=b",
    "stauts=held",
]


async def test_a_console_query_the_api_would_refuse_is_400_and_reads_nothing(
    operator_api: OperatorApi,
) -> None:
    token = await operator_api.token()
    async with httpx.AsyncClient(base_url=operator_api.url, timeout=30) as http:
        await _signed_in(operator_api, http)
        for query in REFUSED_QUERIES:
            page = await http.get(f"/console?{query}")
            assert page.status_code == 400, (query, page.text)
            assert "Nothing was read" in page.text and page.headers["content-type"].startswith("text/html")
            # The JSON API says no to the same input (in its own words).
            if query.split("=")[0] in ("tool", "agent", "cursor", "stauts"):
                listed = await http.get(
                    f"/v1/tool-executions?{query}", headers={"Authorization": f"Bearer {token}"}
                )
                assert listed.status_code == 400, (query, listed.text)
        assert (await http.get("/console?tool=issue_credit&show=unknown&limit=25")).status_code == 200


async def test_the_temporal_ui_link_encodes_the_run_id_and_the_namespace(operator_api: OperatorApi) -> None:
    assert (
        temporal_ui_url("http://ui:8080/", "ops team/eu", "run?x=1#frag")
        == "http://ui:8080/namespaces/ops%20team%2Feu/workflows/run%3Fx%3D1%23frag"
    )
    run_id = f"run-{uuid.uuid4().hex[:6]}?other=1#x"
    call = CallIdentity(tenant="acme", run_id=run_id, tool_call_id="call_1_0")
    await operator_api.ledger.reserve(
        call, tool_name="issue_credit", side_effect=SideEffect.EXTERNAL, arguments=ARGUMENTS, owner="w"
    )
    await operator_api.ledger.mark_indeterminate(call.key, actor="inspector", reason="timed out")
    async with httpx.AsyncClient(base_url=operator_api.url, timeout=30) as http:
        await _signed_in(operator_api, http)
        page = await http.get(f"/console/calls/{call.key.replace('?', '%3F').replace('#', '%23')}")
        assert page.status_code == 200, page.text
        link = re.search(r'<a href="([^"]+)" rel="noreferrer">Open the run', page.text)
        assert link is not None
        encoded = run_id.replace("?", "%3F").replace("=", "%3D").replace("#", "%23")
        assert link.group(1) == f"http://127.0.0.1:8233/namespaces/default/workflows/{encoded}"


async def test_a_call_page_for_a_key_the_api_would_refuse_is_400(operator_api: OperatorApi) -> None:
    async with httpx.AsyncClient(base_url=operator_api.url, timeout=30) as http:
        await _signed_in(operator_api, http)
        for path in ("/console/calls/run%00:c", "/console/calls/no-colon", "/console/calls/a%20b:c"):
            page = await http.get(path)
            assert page.status_code == 400, (path, page.status_code)
            assert page.headers["content-type"].startswith("text/html")
