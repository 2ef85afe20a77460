"""assert_tool_contract: a tool that could take effect twice, or lets a model pick its key, fails."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from onceflow import Effect, ToolContext, Toolset, destructive, examples, external, read, write
from onceflow.ledger import SideEffect
from onceflow.sdk.testing import ToolContractError, assert_tool_contract, tool_contract_problems


def test_a_read_passes() -> None:
    tools = Toolset("lookups")

    @tools.tool(read())
    async def find_credit(account_id: str) -> None:
        return None

    assert_tool_contract(find_credit)


@pytest.mark.parametrize("effect", [write(), external(), destructive(), external(approval=True)])
def test_a_write_taking_the_context_passes(effect: Effect) -> None:
    tools = Toolset("writes")

    @tools.tool(effect)
    async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> None:
        return None

    assert_tool_contract(issue_credit)


def test_an_argument_named_idempotency_key_is_refused() -> None:
    tools = Toolset("leaky")

    @tools.tool(external())
    async def issue_credit(account_id: str, idempotency_key: str, context: ToolContext) -> None:
        return None

    assert "idempotency_key" in issue_credit.json_schema()["parameters"]["properties"]
    with pytest.raises(ToolContractError, match="idempotency_key look like an idempotency key"):
        assert_tool_contract(issue_credit)


@pytest.mark.parametrize(
    "name", ["idempotency_key", "idempotencyKey", "dedup_id", "request_id", "key", "idem"]
)
@pytest.mark.parametrize("effect", [read(), external()])
def test_key_like_argument_names_are_refused(name: str, effect: Effect) -> None:
    tools = Toolset("leaky")

    # Build the signature with the key-like name as an ordinary argument the model would see.
    namespace: dict[str, object] = {"ToolContext": ToolContext}
    exec(
        f"async def issue_credit(account_id: str, {name}: str, context: ToolContext) -> None: ...", namespace
    )
    tool = tools.tool(effect)(namespace["issue_credit"])  # type: ignore[arg-type]
    assert name in tool.json_schema()["parameters"]["properties"]

    with pytest.raises(ToolContractError, match="look like an idempotency key") as caught:
        assert_tool_contract(tool)
    assert name in str(caught.value)


def test_a_write_allowed_three_attempts_fails() -> None:
    tools = Toolset("retrying")

    @tools.tool(Effect(SideEffect.WRITE, max_attempts=3))
    async def issue_credit(account_id: str, context: ToolContext) -> None:
        return None

    with pytest.raises(ToolContractError, match="may be attempted 3 times") as caught:
        assert_tool_contract(issue_credit)
    assert "retrying.issue_credit" in str(caught.value)


@pytest.mark.parametrize("effect", [write(), external(), destructive()])
def test_a_write_without_a_context_parameter_fails(effect: Effect) -> None:
    tools = Toolset("keyless")

    @tools.tool(effect)
    async def issue_credit(account_id: str, amount_cents: int) -> None:
        return None

    with pytest.raises(ToolContractError, match="takes no ToolContext"):
        assert_tool_contract(issue_credit)


def test_every_problem_is_reported_at_once() -> None:
    tools = Toolset("careless")

    @tools.tool(Effect(SideEffect.DESTRUCTIVE, max_attempts=2))
    async def delete_account(account_id: str, request_id: str) -> None:
        return None

    assert len(tool_contract_problems(delete_account)) == 3


# -- every toolset the project ships ----------------------------------------------------------------------


def toolsets_in(package_name: str) -> tuple[list[str], list[Toolset]]:
    """Import every module of a package (failing on any import error) and collect its Toolsets."""

    def fail(name: str) -> None:
        raise ImportError(f"cannot import {name}")

    package = importlib.import_module(package_name)
    modules = [package]
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}.", onerror=fail):
        modules.append(importlib.import_module(info.name))
    found: dict[int, Toolset] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, Toolset):
                found.setdefault(id(value), value)
    return [m.__name__ for m in modules], list(found.values())


def test_every_toolset_in_examples_keeps_the_contract() -> None:
    modules, toolsets = toolsets_in(examples.__name__)

    checked: list[Toolset] = []
    problems: dict[str, list[str]] = {}
    for toolset in toolsets:
        for tool in toolset:
            if found := tool_contract_problems(tool):
                problems[f"{toolset.name}.{tool.name}"] = found
        checked.append(toolset)

    assert "onceflow.examples" in modules
    assert checked == toolsets
    assert problems == {}


@pytest.fixture
def scratch_package(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    name = f"scratch_tools_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    (root / "nested").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "nested" / "__init__.py").write_text("")
    (root / "nested" / "tools.py").write_text(
        "from onceflow import Toolset, read\n"
        "lookups = Toolset('lookups')\n"
        "@lookups.tool(read())\n"
        "async def find_credit(account_id: str) -> None: ...\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield name, root
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


def test_toolset_discovery_finds_nested_toolsets(scratch_package: tuple[str, Path]) -> None:
    name, _ = scratch_package
    modules, toolsets = toolsets_in(name)
    assert f"{name}.nested.tools" in modules
    assert [t.name for t in toolsets] == ["lookups"]


@pytest.mark.parametrize("broken", ["nested/broken.py", "nested/__init__.py"])
def test_toolset_discovery_fails_when_a_module_does_not_import(
    scratch_package: tuple[str, Path], broken: str
) -> None:
    name, root = scratch_package
    (root / broken).write_text("import a_module_that_does_not_exist\n")
    with pytest.raises(ImportError):
        toolsets_in(name)


def test_a_dedup_window_must_outlast_the_timeout_and_belongs_to_writes() -> None:
    tools = Toolset("windows")
    second, day = timedelta(seconds=1), timedelta(hours=24)

    @tools.tool(external(timeout=second, dedup_window=day))
    async def honest(account_id: str, context: ToolContext) -> None:
        return None

    @tools.tool(external(timeout=timedelta(seconds=5), dedup_window=timedelta(seconds=5)))
    async def too_short(account_id: str, context: ToolContext) -> None:
        return None

    @tools.tool(Effect(SideEffect.READ, max_attempts=3, dedup_window=day))
    async def a_read(account_id: str) -> None:
        return None

    assert_tool_contract(honest)
    assert tool_contract_problems(too_short) == ["its dedup window must be longer than its timeout"]
    assert tool_contract_problems(a_read) == ["a dedup window is for tools that change the world, not reads"]
