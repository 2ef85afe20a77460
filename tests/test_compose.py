"""docker-compose.yml and the Dockerfile agree with the code. Fast: reads the files, runs no Docker.

A service built from this repository must run a command the project has, be configured only by
variables the code reads, and find in the image what it needs; published ports must not collide
and every dependency must exist.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from onceflow.runtime.client import search_attribute_flags
from onceflow.runtime.config import ALL_ENVIRONMENT, API_ENVIRONMENT, ENVIRONMENT, WORKER_ENVIRONMENT
from onceflow.runtime.constants import SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYTHONS = {"python", "python3", "python3.11"}
DEPENDENCY_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


# --- reading the files ---------------------------------------------------------------------------


@cache
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict) and isinstance(document.get("services"), dict), (
        "docker-compose.yml has no services"
    )
    return document


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def repo_built_services() -> dict[str, dict[str, Any]]:
    """Services whose image is built from this repository's Dockerfile."""
    built = {}
    for name, service in services().items():
        build = service.get("build")
        if build is None:
            continue
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        assert (ROOT / context).resolve() == ROOT, f"{name}: builds from {context!r}, not the repository"
        assert (ROOT / context / dockerfile).resolve() == DOCKERFILE, f"{name}: builds {dockerfile!r}"
        built[name] = service
    return built


@cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def installed_packages() -> set[str]:
    """Top-level packages `pip install .` puts into the image."""
    return set(pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"])


@dataclass(frozen=True)
class Instruction:
    stage: int
    keyword: str
    rest: str

    def arguments(self) -> list[str]:
        if self.rest.startswith("["):
            return [str(part) for part in json.loads(self.rest)]
        return shlex.split(self.rest)


@cache
def dockerfile() -> tuple[Instruction, ...]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text, pending = (pending + line).strip(), ""
        keyword, _, rest = text.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(stage, keyword, rest.strip()))
    assert instructions, "the Dockerfile has no instructions"
    return tuple(instructions)


def final_stage() -> list[Instruction]:
    last = max(instruction.stage for instruction in dockerfile())
    return [instruction for instruction in dockerfile() if instruction.stage == last]


def copy_parts(instruction: Instruction) -> tuple[list[str], list[str], str]:
    """(flags, sources, destination) of a COPY or ADD."""
    arguments = instruction.arguments()
    flags = [argument for argument in arguments if argument.startswith("--")]
    paths = [argument for argument in arguments if not argument.startswith("--")]
    assert len(paths) >= 2, f"{instruction.keyword} {instruction.rest}: needs a source and a destination"
    return flags, paths[:-1], paths[-1]


def image_workdir_files() -> tuple[PurePosixPath, set[PurePosixPath]]:
    """The final image's WORKDIR and the repository paths COPY puts there (relative to it)."""
    workdir = PurePosixPath("/")
    placed: set[PurePosixPath] = set()
    for instruction in final_stage():
        if instruction.keyword == "WORKDIR":
            workdir = workdir / instruction.rest
        elif instruction.keyword in ("COPY", "ADD"):
            flags, sources, destination = copy_parts(instruction)
            if any(flag.startswith("--from") for flag in flags):
                continue
            target = workdir / destination
            into_directory = destination.endswith("/") or destination == "." or len(sources) > 1
            for source in sources:
                path = target / PurePosixPath(source).name if into_directory else target
                placed.add(path)
    return workdir, {path.relative_to(workdir) for path in placed if path.is_relative_to(workdir)}


def dockerignore_patterns() -> list[str]:
    if not DOCKERIGNORE.exists():
        return []
    lines = (line.strip() for line in DOCKERIGNORE.read_text().splitlines())
    return [line.lstrip("/") for line in lines if line and not line.startswith(("#", "!"))]


def dockerignored(relative: str) -> bool:
    """Whether .dockerignore keeps `relative` (or a folder holding it) out of the build context."""
    parts = PurePosixPath(relative).parts
    prefixes = ["/".join(parts[: count + 1]) for count in range(len(parts))]
    for pattern in dockerignore_patterns():
        for prefix in prefixes:
            if fnmatch.fnmatchcase(prefix, pattern):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatchcase(prefix.rsplit("/", 1)[-1], pattern[3:]):
                return True
    return False


def argv(value: str | list[Any] | None) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(part) for part in value]


def image_default_command() -> list[str]:
    commands = [instruction for instruction in final_stage() if instruction.keyword == "CMD"]
    assert commands, "the Dockerfile's final stage has no CMD"
    return commands[-1].arguments()


def service_command(service: dict[str, Any]) -> list[str]:
    """What a repo-built service's container runs: entrypoint + command, else the image's CMD."""
    command = argv(service.get("command")) or image_default_command()
    return argv(service.get("entrypoint")) + command


def environment_names(service: dict[str, Any]) -> set[str]:
    environment = service.get("environment") or {}
    if isinstance(environment, dict):
        return {str(name) for name in environment}
    return {str(entry).split("=", 1)[0] for entry in environment}


def published_ports(service: dict[str, Any]) -> list[tuple[int, str, int]]:
    """(host port, protocol, container port) for each port the service publishes on the host."""
    published = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            if entry.get("published") is None:
                continue
            host, target = str(entry["published"]), str(entry["target"])
            protocol = entry.get("protocol", "tcp")
        else:
            text, _, protocol = str(entry).partition("/")
            protocol = protocol or "tcp"
            fields = text.rsplit(":", 2)
            if len(fields) == 1:
                continue  # container port only: the host picks a free port
            host, target = fields[-2], fields[-1]
        host_ports = _port_range(host)
        target_ports = _port_range(target)
        if len(target_ports) != len(host_ports):
            target_ports = target_ports[:1] * len(host_ports)
        published += [(h, protocol, t) for h, t in zip(host_ports, target_ports, strict=True)]
    return published


def _port_range(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """Dependency name -> condition."""
    dependencies = service.get("depends_on") or {}
    if isinstance(dependencies, list):
        return dict.fromkeys(dependencies, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in dependencies.items()}


# --- does a command exist in the project ---------------------------------------------------------


def command_problem(command: list[str]) -> str | None:
    """Why `command` would not run in the image built from this repository, or None if it would."""
    if not command:
        return "no command"
    executable, *arguments = command
    if executable in PYTHONS:
        if arguments[:1] == ["-m"]:
            return module_problem(arguments[1]) if len(arguments) > 1 else "`python -m` names no module"
        if not arguments or arguments[0].startswith("-"):
            return f"`{shlex.join(command)}` runs no script of the project"
        return script_problem(arguments[0])
    scripts = pyproject()["project"].get("scripts", {})
    if executable in scripts:
        return console_script_problem(executable, scripts[executable], arguments)
    return f"{executable!r} is neither python nor a console script of this project"


def module_problem(name: str) -> str | None:
    if name.split(".")[0] not in installed_packages():
        return f"module {name} is not in a package the image installs ({sorted(installed_packages())})"
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        return f"module {name} does not exist"
    if spec.submodule_search_locations is not None:
        return None if _find_spec(f"{name}.__main__") else f"package {name} has no __main__"
    source = Path(spec.origin or "").read_text()
    if not re.search(r"""if __name__ == ["']__main__["']""", source):
        return f"module {name} does nothing when run with -m"
    return None


def _find_spec(name: str) -> Any:
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None


def script_problem(script: str) -> str | None:
    if not (ROOT / script).is_file():
        return f"{script} does not exist in the repository"
    workdir, files = image_workdir_files()
    wanted = PurePosixPath(script)
    if not any(wanted == path or path in wanted.parents for path in files):
        return f"the Dockerfile does not copy {script} into the image's WORKDIR {workdir}"
    return None


def console_script_problem(executable: str, target: str, arguments: list[str]) -> str | None:
    """For `onceflow X Y`: X (and Y, while they are groups) must be commands of onceflow.cli.commands.app."""
    module_name = target.partition(":")[0]
    if _find_spec(module_name) is None:
        return f"`{executable}` needs {module_name}, which does not exist"
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        return f"`{executable}`: importing {module_name} fails: {exc!r}"
    app = getattr(module, "app", None)
    if app is None:
        return f"`{executable}`: {module_name} has no `app` to look its subcommands up in"
    command = _click_command(app)
    path = [executable]
    for argument in arguments:
        if argument.startswith("-") or not _is_group(command):
            break
        context = command.context_class(command, info_name=" ".join(path))
        subcommand = command.get_command(context, argument)
        if subcommand is None:
            known = ", ".join(command.list_commands(context))
            return f"`{' '.join([*path, argument])}` is not a command (there are: {known})"
        command, path = subcommand, [*path, argument]
    if _is_group(command) and not getattr(command, "invoke_without_command", False):
        return f"`{' '.join(path)}` names no subcommand"
    return None


def _click_command(app: Any) -> Any:
    """The click command behind a Typer app (typer may bring its own copy of click), or the app itself."""
    if callable(getattr(app, "context_class", None)):
        return app
    import typer

    return typer.main.get_command(app)


def _is_group(command: Any) -> bool:
    return callable(getattr(command, "get_command", None)) and callable(
        getattr(command, "list_commands", None)
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
