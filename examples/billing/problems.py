"""The billing service's errors: onceflow's RFC 9457 problem details, under its own type URIs."""

from onceflow.local.extras import needs_extra

with needs_extra("api"):
    from fastapi import FastAPI

from onceflow.api import problems


class Problem(problems.Problem):
    type_base = "https://billing.example/problems/"


def install_problem_handlers(app: FastAPI) -> None:
    problems.install_problem_handlers(app, Problem)
