"""The operator API: find unknown calls, settle them, approve or deny, release a call that was never
sent, close a conflict, ask for compensation.

Every route is scoped to the tenant of the caller's token. Another tenant's key answers exactly as a
key that does not exist. The ledger decides every change (compare-and-set); the API then tells the
waiting workflow to read the ledger again.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from temporalio.client import Client

from onceflow.api.auth import RequireToken
from onceflow.api.console import install_console
from onceflow.api.headers import SecurityHeaders
from onceflow.api.inputs import install_input_checks
from onceflow.api.models import ProblemDocument
from onceflow.api.options import ApiOptions
from onceflow.api.problems import PROBLEM_MEDIA_TYPE, install_problem_handlers
from onceflow.api.routes import include_routes
from onceflow.ledger import ConsoleSessions, Ledger, OperatorTokens
from onceflow.runtime.agents import AgentRegistry

MAX_BODY_BYTES = 64 * 1024

# Every error is a problem document, and malformed input is 400, not FastAPI's default 422 shape.
# Declaring 4XX also keeps FastAPI from publishing that 422 body, which this API never sends.
PROBLEMS: dict[int | str, dict[str, Any]] = {
    "4XX": {
        "description": "400 malformed input (an unknown query parameter; `unreadable-body`: a body "
        "that is not JSON the ledger can store, e.g. NaN or Infinity), 401 no valid token, 404 no such "
        "key for your tenant, 409 already decided or not allowed in its state, 413 body too large "
        "(`unreadable-body`), 415 not JSON, "
        "422 refused by a business rule.",
        "content": {PROBLEM_MEDIA_TYPE: {"schema": ProblemDocument.model_json_schema()}},
    }
}


def create_app(
    *,
    ledger: Ledger,
    client: Client,
    registry: AgentRegistry,
    task_queue: str,
    options: ApiOptions | None = None,
) -> FastAPI:
    """The operator API: its checks and middleware first, then the routes (onceflow/api/routes/).

    Not here: /metrics, which `onceflow api` serves on a listener of its own for Prometheus
    (onceflow/api/metrics.py), so nobody who reaches the console's port reads every tenant's queue;
    and FastAPI's /docs and /redoc, whose pages load a script from a CDN (/openapi.json stays).
    """
    options = options or ApiOptions()
    app = FastAPI(
        title="onceflow operator API",
        version="1",
        description=__doc__,
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
        responses=PROBLEMS,
    )
    app.state.ledger = ledger
    app.state.tokens = OperatorTokens(ledger)
    app.state.registry = registry  # the console asks a tool's kit receiver (onceflow/api/console/receiver.py)
    install_problem_handlers(app)
    # Before any route is added, so every route (and every later one) inherits the checks.
    install_input_checks(app, body_limit=MAX_BODY_BYTES)
    # Added last, so it runs first: no token, no other answer than 401.
    app.add_middleware(RequireToken, tokens=app.state.tokens)
    # Outermost: every answer, the 401s and problem documents too, carries the security headers.
    app.add_middleware(SecurityHeaders)
    sessions = ConsoleSessions(ledger, idle=options.console_idle, lifetime=options.console_lifetime)
    install_console(app, namespace=client.namespace, sessions=sessions)
    include_routes(
        app,
        ledger=ledger,
        client=client,
        registry=registry,
        task_queue=task_queue,
        signal_key=options.signal_key,
    )
    return app
