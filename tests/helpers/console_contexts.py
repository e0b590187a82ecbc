"""Contexts for the console's tests and benchmark: written through the real store, as a worker writes them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from contexts import ContextStore
from contexts.context import Context
from worker.settings_models import CompressionSettings

# A raw token in a tool's output: the store masks it before the disk, so no page may show it.
RAW_SECRET = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
# An issue whose text tries to run script in the console.
HOSTILE_TITLE = '<script>window.__pwned = 1</script>"><img src=x onerror="window.__pwned = 2">'
HOSTILE_BODY = "[click me](javascript:window.__pwned=3) <a href=\"javascript:window.__pwned=4\">there</a>"
CONFIG: dict[str, Any] = {"llm_provider": "openai", "model": "gpt-test", "context_length": 8192,
                          "compression_threshold": 0.7}


def task_key(task_id: int, repo: str = "hello") -> dict[str, str]:
    return {"task_source": "github", "owner": "octo", "repo": repo, "task_type": "issue", "task_id": str(task_id)}


def step(ctx: Context, n: int, *, prompt_tokens: int, output: str = "ok") -> None:
    """One agent step: the model's reply asking for a command, the command's record and its tool message."""
    call_id = f"call-{n}"
    arguments = {"command": f"pytest -q tests/test_{n}.py"}
    ctx.append_message("assistant", f"Step {n}: run the tests.", prompt_tokens=prompt_tokens, tool_calls=[
        {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": json.dumps(arguments)}}])
    result = f"{output}\nexit code: {n % 2}"
    ctx.append_tool("bash", arguments, "success", 40 + n, result=result, tool_call_id=call_id)
    ctx.append_message("tool", result, tool_call_id=call_id, tool_name="bash")
    ctx.update_state(add={"llm_call_count": 1, "tool_call_count": 1, "total_tokens_used": prompt_tokens},
                     current_context_tokens=prompt_tokens, status="processing")
    ctx.step_done()


def running_task(store: ContextStore, task_id: int = 1, *, steps: int = 2, user: str = "alice") -> Context:
    """A running task whose holder is the caller (no heartbeat thread): append to it, finish it."""
    issue = {"title": HOSTILE_TITLE, "body": HOSTILE_BODY}
    ctx = store.create(task_key(task_id), CONFIG, user=user, heartbeat=False,
                       extra_metadata={"request": {"task_key": task_key(task_id), "issue": issue}})
    ctx.update_state(status="processing", started_at=ctx.read_state()["updated_at"])
    ctx.append_message("system", "You are Tasuki's coding agent.")
    ctx.append_message("user", f"Fix issue #{task_id}: {HOSTILE_TITLE}\n\n{HOSTILE_BODY}")
    for n in range(1, steps + 1):
        step(ctx, n, prompt_tokens=900 * n, output=f"token {RAW_SECRET} printed by a test")
    return ctx


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def repository_with_branch(root: Path, branch: str) -> Path:
    """A local repository whose ``branch`` adds a line to ``app.py`` (the task's work)."""
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "app.py").write_text("def answer():\n    return 41\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "start")
    git(repo, "checkout", "-q", "-b", branch)
    (repo / "app.py").write_text("def answer():\n    return 42  # fixed by the agent\n")
    git(repo, "commit", "-q", "-am", "fix")
    git(repo, "checkout", "-q", "main")
    return repo


def finished_task(store: ContextStore, repo: Path, branch: str, task_id: int = 2, *, steps: int = 8) -> str:
    """A completed local task with a compression in its history and its branch in ``repo``."""
    key = {**task_key(task_id), "task_source": "local"}
    ctx = store.create(key, CONFIG, user="bob", heartbeat=False,
                       extra_metadata={"request": {"task_key": key, "repo_path": str(repo)}})
    ctx.update_state(status="processing", started_at=ctx.read_state()["updated_at"])
    ctx.append_message("system", "You are Tasuki's coding agent.")
    ctx.append_message("user", "Make answer() return 42.")
    for n in range(1, steps + 1):
        step(ctx, n, prompt_tokens=700 * n)
    policy = CompressionSettings(min_messages=6, keep_recent=4).policy()
    ctx.compress(lambda _previous, span: f"Ran the tests {len(span)} times; answer() returned 41.", policy)
    step(ctx, steps + 1, prompt_tokens=1500)
    ctx.finish("completed", result={"summary": "answer() returns 42", "branch": branch, "commit": "abc",
                                    "pull_request_url": "javascript:window.__pwned=5"})
    return ctx.uuid
