"""The operator API (`onceflow api`). Needs the `api` extra: pip install 'onceflow[api]'."""

from onceflow.local.extras import require_extra

require_extra("api", "fastapi", "starlette", "uvicorn")
