"""docker-compose.yml, the Dockerfile and .dockerignore read as the image build reads them, and whether
a command would run in the image built from this repository. The compose tests check with these
(tests/test_compose.py, tests/test_compose_production.py); nothing here runs Docker."""

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

import yaml

ROOT = Path(__file__).resolve().parents[2]
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
