"""The operator console at /console: the queue of calls nobody can vouch for, one call in full, and
the decisions on them, as server-rendered pages over the JSON API of the same process.

Needs the `api` extra (Jinja2 renders the pages). No page loads anything from the network: the one
style sheet is served from here, and there is no script.
"""

from __future__ import annotations

from onceflow.local.extras import require_extra

require_extra("api", "fastapi", "jinja2", "multipart")

from fastapi import FastAPI  # noqa: E402
from fastapi.staticfiles import StaticFiles  # noqa: E402

from onceflow.ledger import ConsoleSessions  # noqa: E402
from onceflow.runtime.config import env  # noqa: E402


def install_console(
    app: FastAPI, *, namespace: str, sessions: ConsoleSessions, temporal_ui: str | None = None
) -> None:
    """Serve the console on `app`, its sessions kept in the ledger by `sessions`, linking runs to
    the Temporal UI at `temporal_ui` (default: ONCEFLOW_TEMPORAL_UI, else the dev server's
    http://127.0.0.1:8233)."""
    from onceflow.api.console import actions, receiver, routes
    from onceflow.api.console.rendering import HERE
    from onceflow.api.console.throttle import SignInThrottle

    app.state.console_sessions = sessions
    app.state.sign_in_throttle = SignInThrottle()
    app.state.console_namespace = namespace
    app.state.console_temporal_ui = temporal_ui or env("ONCEFLOW_TEMPORAL_UI")
    app.include_router(routes.router)
    app.include_router(actions.router)
    app.include_router(receiver.router)  # "Ask the receiver", for tools on the receiver kit
    app.mount("/console/static", StaticFiles(directory=HERE / "static"), name="console-static")
    routes.install_handlers(app)
