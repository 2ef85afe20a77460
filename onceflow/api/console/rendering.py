"""Templates, their filters, and the headers every console page carries."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from starlette.responses import Response

from onceflow.api.headers import SECURITY_HEADERS

HERE = Path(__file__).resolve().parent
# Every value a template prints is escaped (autoescape on for all templates, whatever their name).
TEMPLATES = Jinja2Templates(
    env=jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
)

# The API's own (no script, nothing from elsewhere), and pages are never cached: they show a tenant.
PAGE_HEADERS = {**SECURITY_HEADERS, "Cache-Control": "no-store"}


def _when(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def moment(value: Any) -> str:
    when = _when(value)
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if when else ""


def age(value: Any, now: datetime | None = None) -> str:
    """How long ago, in the two largest units: `3 h 12 min`, `45 s`."""
    when = _when(value)
    if when is None:
        return ""
    seconds = max(0, int(((now or datetime.now(UTC)) - when).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")]
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0 s"


def when_words(value: Any, now: datetime | None = None) -> str:
    """When, as a person says it: `just now`, `4 minutes ago`, `2 hours ago`, `yesterday at 14:02
    UTC`, or the date and time for anything older."""
    when = _when(value)
    if when is None:
        return ""
    now = now or datetime.now(UTC)
    when = when.astimezone(UTC)
    seconds = int((now - when).total_seconds())
    if seconds < 10:
        return "just now"
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        if seconds >= size:
            count = seconds // size
            if unit == "day":
                break
            return f"{count} {unit}{'' if count == 1 else 's'} ago, at {when:%H:%M} UTC"
    if (now.date() - when.date()).days == 1:
        return f"yesterday at {when:%H:%M} UTC"
    return f"on {when:%Y-%m-%d} at {when:%H:%M} UTC"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


STATUS_LABELS = {
    "indeterminate": "unknown",
    "started": "unknown (owner gone)",
    "awaiting_approval": "awaiting approval",
    "held": "held",
    "completed": "completed",
    "failed": "failed",
    "denied": "denied",
    "compensated": "compensated",
}


def status_label(status: str) -> str:
    return STATUS_LABELS.get(status, status)


def in_path(key: str) -> str:
    """A key as one path segment (keys may hold `?` or `#`; their colon stays readable)."""
    return quote(key, safe=":")


TEMPLATES.env.filters.update(
    moment=moment, age=age, when_words=when_words, pretty=pretty, status_label=status_label, q=in_path
)


def render(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    response = TEMPLATES.TemplateResponse(request, name, context, status_code=status_code)
    response.headers.update(PAGE_HEADERS)
    return response


def redirect(url: str) -> Response:
    response = RedirectResponse(url, status_code=303)
    response.headers.update(PAGE_HEADERS)
    return response
