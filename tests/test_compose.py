"""docker-compose.yml and the Dockerfile agree with the code. Fast: reads the files, runs no Docker.

A service built from this repository must run a command the project has, be configured only by
variables the code reads, and find in the image what it needs; published ports must not collide
and every dependency must exist. How the files are read, and whether a command would run in the image,
is in tests/support/compose_files.py.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import pytest

from onceflow.runtime.client import search_attribute_flags
from onceflow.runtime.config import ALL_ENVIRONMENT, API_ENVIRONMENT, ENVIRONMENT, WORKER_ENVIRONMENT
from onceflow.runtime.constants import SEARCH_ATTRIBUTES
from tests.support.compose_files import (
    DEPENDENCY_CONDITIONS,
    ROOT,
    _click_command,
    _is_group,
    argv,
    command_problem,
    copy_parts,
    depends_on,
    dockerfile,
    dockerignored,
    environment_names,
    final_stage,
    image_default_command,
    image_workdir_files,
    published_ports,
    repo_built_services,
    service_command,
    services,
)

# --- (a) commands --------------------------------------------------------------------------------


def test_every_repo_built_service_runs_a_command_the_project_has() -> None:
    built = repo_built_services()
    assert {"worker", "billing"} <= set(built), f"services built from the repo: {sorted(built)}"
    problems = {name: command_problem(service_command(service)) for name, service in built.items()}
    assert {name: problem for name, problem in problems.items() if problem} == {}


def test_the_worker_runs_worker_py_and_billing_runs_the_example_service() -> None:
    assert service_command(services()["worker"])[:2] == ["python", "worker.py"]
    assert service_command(services()["billing"])[:3] == ["python", "-m", "onceflow.examples.billing.service"]


def test_the_image_runs_the_worker_by_default() -> None:
    assert image_default_command() == ["python", "worker.py"]
    assert command_problem(image_default_command()) is None


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["python", "no_such_script.py"],
        ["python", "tests/test_compose.py"],  # exists, but the image does not have it
        ["python", "-m", "onceflow.examples.billing.no_such_module"],
        ["python", "-m", "onceflow.examples.billing.models"],  # exists, but runs nothing
        ["python", "-m", "json.tool"],  # not part of this project
        ["onceflow", "no-such-subcommand"],
        ["uvicorn", "onceflow.examples.billing.service:create_app"],
    ],
)
def test_the_command_check_rejects_what_the_image_cannot_run(command: list[str]) -> None:
    assert command_problem(command) is not None


def test_the_command_check_accepts_registered_onceflow_subcommands() -> None:
    from onceflow.cli import commands as cli

    group = _click_command(cli.app)
    assert _is_group(group), "onceflow.cli.commands.app has no subcommands"
    context = group.context_class(group, info_name="onceflow")
    names = group.list_commands(context)
    assert names, "onceflow.cli.commands.app has no commands"
    leaf = next(name for name in names if not _is_group(group.get_command(context, name)))
    assert command_problem(["onceflow", leaf, "--help"]) is None


# --- (b) environment -----------------------------------------------------------------------------


def read_by_the_code(name: str) -> bool:
    return name in ALL_ENVIRONMENT or name.startswith("OTEL_")


def test_repo_built_services_set_only_variables_the_code_reads() -> None:
    seen: set[str] = set()
    unread: dict[str, set[str]] = {}
    for name, service in repo_built_services().items():
        assert "env_file" not in service, f"{name}: configure it in `environment`, where it is checked"
        names = environment_names(service)
        seen |= names
        if stray := {variable for variable in names if not read_by_the_code(variable)}:
            unread[name] = stray
    assert seen, "no repo-built service sets any environment variable"
    assert unread == {}


def test_the_worker_sets_every_variable_in_config() -> None:
    assert set(ENVIRONMENT) | set(WORKER_ENVIRONMENT) <= environment_names(services()["worker"])


def test_the_operator_api_reads_the_same_environment_as_the_worker() -> None:
    api = services()["operator-api"]
    assert set(ENVIRONMENT) | set(API_ENVIRONMENT) <= environment_names(api)
    worker = services()["worker"]["environment"]
    for name in ENVIRONMENT:
        assert api["environment"][name] == worker[name], name


def test_the_worker_agents_file_is_in_the_image() -> None:
    agents = PurePosixPath(str(services()["worker"]["environment"]["ONCEFLOW_AGENTS"]))
    workdir, files = image_workdir_files()
    relative = agents.relative_to(workdir) if agents.is_absolute() else agents
    assert relative in files, f"{agents} is not copied into the image"
    assert (ROOT / relative).is_file()


# --- (c) ports -----------------------------------------------------------------------------------


def test_published_host_ports_do_not_collide() -> None:
    owners: dict[tuple[int, str], list[str]] = {}
    for name, service in services().items():
        for host, protocol, _ in published_ports(service):
            owners.setdefault((host, protocol), []).append(name)
    assert owners, "no service publishes a port"
    assert {port: names for port, names in owners.items() if len(names) > 1} == {}


def test_services_publish_the_documented_ports() -> None:
    expected = {
        "postgresql": (5432, 5432),
        "temporal": (7233, 7233),
        "temporal-ui": (8080, 8080),
        "billing": (8081, 8081),
        "operator-api": (8082, 8082),
        "prometheus": (9090, 9090),
        "grafana": (3000, 3000),
    }
    for name, (host, container) in expected.items():
        assert (host, "tcp", container) in published_ports(services()[name]), name
    assert published_ports(services()["worker"]) == [], "workers scale out; they must not publish ports"


# --- (d) dependencies ----------------------------------------------------------------------------


def test_every_dependency_exists_and_its_condition_can_be_met() -> None:
    edges = [
        (name, target, condition)
        for name, service in services().items()
        for target, condition in depends_on(service).items()
    ]
    assert edges, "no service depends on another"
    for name, target, condition in edges:
        assert target in services(), f"{name} depends on {target}, which is not a service"
        assert condition in DEPENDENCY_CONDITIONS, f"{name} -> {target}: unknown condition {condition}"
        if condition == "service_healthy":
            assert services()[target].get("healthcheck"), (
                f"{name} waits for {target} to be healthy; it has no healthcheck"
            )
        if condition == "service_completed_successfully":
            restart = str(services()[target].get("restart", "no"))
            assert restart in ("no", "on-failure") or restart.startswith("on-failure:"), (
                f"{name} waits for {target} to finish, but it restarts {restart}"
            )


# --- (e) the Dockerfile and mounted files ----------------------------------------------------------


def test_dockerfile_copy_sources_exist_in_the_build_context() -> None:
    sources = []
    for instruction in dockerfile():
        if instruction.keyword not in ("COPY", "ADD"):
            continue
        flags, paths, _ = copy_parts(instruction)
        if any(flag.startswith("--from") for flag in flags):
            continue
        sources += paths
    assert {"pyproject.toml", "worker.py", "agents.yaml"} <= set(sources)
    missing = [source for source in sources if not list(ROOT.glob(source))]
    ignored = [source for source in sources if dockerignored(source)]
    assert missing == [], "COPY sources missing from the repository"
    assert ignored == [], "COPY sources that .dockerignore leaves out of the build context"


def test_the_dockerignore_check_sees_excluded_paths() -> None:
    assert dockerignored(".venv/bin/python")
    assert dockerignored("onceflow/__pycache__/cli.cpython-311.pyc")
    assert not dockerignored("onceflow/cli/commands.py")


def test_the_image_runs_as_a_non_root_user() -> None:
    users = [instruction.rest for instruction in final_stage() if instruction.keyword == "USER"]
    assert users, "the final stage sets no USER"
    assert users[-1].split(":")[0] not in ("root", "0")


def test_files_mounted_from_the_repository_exist() -> None:
    mounts = []
    for name, service in services().items():
        for volume in service.get("volumes") or []:
            source = volume.get("source", "") if isinstance(volume, dict) else str(volume).split(":")[0]
            if source.startswith((".", "/")):
                mounts.append((name, source))
    assert mounts, "no service mounts a file from the repository"
    assert [(name, source) for name, source in mounts if not (ROOT / source).exists()] == []


# --- images and search attributes ----------------------------------------------------------------


def test_third_party_images_are_pinned() -> None:
    pulled = {name: service["image"] for name, service in services().items() if "build" not in service}
    assert pulled
    for name, image in pulled.items():
        _, _, tag = image.rpartition("/")[2].partition(":")
        assert tag and tag != "latest", f"{name}: pin {image} to a version"


def test_search_attribute_registration_matches_what_the_code_sets() -> None:
    service = services()["register-search-attributes"]
    assert "register-search-attributes.sh" in " ".join(argv(service.get("entrypoint")))
    registered = set(argv(service.get("command")))
    expected = {flag.removeprefix("--search-attribute=") for flag in search_attribute_flags()}
    assert len(expected) == len(SEARCH_ATTRIBUTES) == 7
    assert registered == expected
    assert depends_on(services()["worker"])["register-search-attributes"] == "service_completed_successfully"


# --- doors: signals, metrics, the console behind a proxy -------------------------------------------


def _default(value: object) -> str:
    """What compose puts in a variable given as `${NAME:-default}` (or as is) when NAME is unset."""
    text = str(value)
    found = re.fullmatch(r"\$\{[A-Z_]+:-(.*)\}", text)
    return found.group(1) if found else text


def test_workers_settle_from_signals_only_with_an_assertion_by_default() -> None:
    worker = services()["worker"]["environment"]
    api = services()["operator-api"]["environment"]
    assert _default(worker["ONCEFLOW_SIGNALS"]) == "verified"
    # One key, the same for the API that signs and the workers that check; none by default.
    assert worker["ONCEFLOW_SIGNAL_KEY"] == api["ONCEFLOW_SIGNAL_KEY"] == "${ONCEFLOW_SIGNAL_KEY:-}"


def test_the_apis_metrics_have_a_listener_of_their_own_that_only_prometheus_reaches() -> None:
    api = services()["operator-api"]
    port = int(api["environment"]["ONCEFLOW_API_METRICS_PORT"])
    assert port != int(api["environment"]["ONCEFLOW_API_PORT"])
    assert api["environment"]["ONCEFLOW_API_METRICS_HOST"] == "0.0.0.0"  # inside the compose network
    assert port not in [container for _, _, container in published_ports(api)]
    scrape = (ROOT / "deploy/prometheus/prometheus.yml").read_text()
    assert f'"operator-api:{port}"' in scrape and '"operator-api:8082"' not in scrape
    assert _default(api["environment"]["ONCEFLOW_METRICS_TENANT_LABEL"]) in ("name", "hash", "none")
