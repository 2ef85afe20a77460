"""The billing service's errors: onceflow's RFC 9457 problem details, under its own type URIs.

The receiver kit's answers (missing or bad key, key reused, in progress, fenced) use the same base.
"""

from onceflow.local.extras import needs_extra

with needs_extra("api"):
    from fastapi import FastAPI

from onceflow.api import problems

TYPE_BASE = "https://billing.example/problems/"


class Problem(problems.Problem):
    type_base = TYPE_BASE


def install_problem_handlers(app: FastAPI) -> None:
    problems.install_problem_handlers(app, Problem)
