"""A published MCP server this project did not write: `mcp-server-git` from PyPI (the reference git
server of the MCP project), run as a real process over stdio against a scratch repository."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, SideEffect, Status
from onceflow.mcp.runtime import mcp_toolsets
from onceflow.runtime.agents import build_registry
from tests.support.mcp_servers import agent
from tests.workflow_harness import running_worker

COMMIT_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "git_status", "arguments": {"repo_path": "{{ input.repo }}"}}]},
    {
        "tool_calls": [
            {"name": "git_add", "arguments": {"repo_path": "{{ input.repo }}", "files": ["notes.txt"]}}
        ]
    },
    {
        "tool_calls": [
            {
                "name": "git_commit",
                "arguments": {"repo_path": "{{ input.repo }}", "message": "Add notes (onceflow)"},
            }
        ]
    },
    {"final": "{{ results.git_commit }}"},
]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch", "main")
    git(repo, "config", "user.name", "onceflow test")
    git(repo, "config", "user.email", "test@onceflow.invalid")
    (repo / "README").write_text("scratch\n")
    git(repo, "add", "README")
    git(repo, "commit", "--quiet", "-m", "initial")
    (repo / "notes.txt").write_text("written by a test\n")
    return repo


async def test_git_server_tools_are_classified_and_an_agent_commits_exactly_once_through_the_ledger(
    temporal_env: WorkflowEnvironment, ledger: Ledger, repo: Path
) -> None:
    server = str(Path(sys.executable).parent / "mcp-server-git")
    registry = build_registry(
        {
            "mcp_servers": {"git": {"command": server, "args": ["--repository", str(repo)]}},
            "agents": {"committer": agent(COMMIT_SCRIPT, ["git"])},
        }
    )
    async with mcp_toolsets(registry):
        tools = registry.agent("committer").tools
        classes = {name: tool.side_effect for name, tool in tools.items()}
        # As the server annotates them: reads are readOnly; writes are closed-world, some destructive.
        assert classes["git_status"] is SideEffect.READ
        assert classes["git_log"] is SideEffect.READ
        assert classes["git_add"] is SideEffect.WRITE
        assert classes["git_commit"] is SideEffect.WRITE
        assert classes["git_create_branch"] is SideEffect.WRITE
        assert classes["git_reset"] is SideEffect.DESTRUCTIVE
        assert {t.effect.max_attempts for t in tools.values() if t.side_effect is not SideEffect.READ} == {1}

        async with running_worker(temporal_env.client, ledger, registry) as harness:
            handle = await harness.start("committer", f'{{"repo": "{repo}"}}')
            result = await asyncio.wait_for(handle.result(), 60)

    add = await ledger.get(f"{handle.id}:call_1_0")
    commit = await ledger.get(f"{handle.id}:call_2_0")
    assert (add.tool_name, add.status, add.attempt) == ("git_add", Status.COMPLETED, 1)
    assert (commit.tool_name, commit.status, commit.attempt) == ("git_commit", Status.COMPLETED, 1)
    assert commit.payload["arguments"]["message"] == "Add notes (onceflow)"
    # Exactly one new commit in the repository, the one the ledger recorded.
    assert git(repo, "rev-list", "--count", "HEAD") == "2"
    assert git(repo, "log", "-1", "--format=%s") == "Add notes (onceflow)"
    assert git(repo, "rev-parse", "HEAD") in str(commit.result)
    assert git(repo, "status", "--porcelain") == ""
    assert "committed" in result.final.lower()
