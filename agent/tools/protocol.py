"""The seam every agent tool fits: a name, a JSON schema for its arguments, and ``run``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.tools.workspace import Workspace
from sandbox.jail import NoSandbox, Sandbox
from sandbox.settings import SandboxLimits


@dataclass(frozen=True)
class ToolOptions:
    """What the operator decides for every tool run (the model cannot change these)."""

    bash_timeout_s: int
    max_output_chars: int
    env: Mapping[str, str] | None = None
    sandbox: Sandbox = field(default_factory=NoSandbox)
    limits: SandboxLimits | None = None
    on_start: Callable[[int], None] | None = None  # told the process group of a command once it runs
    recall: Callable[[str], str] | None = None  # the task's memory search, for the recall tool
    home: Path | None = None  # the task's home (lasts for the task); None: an empty one per bash call
    view_chars: int | None = None  # what of an output the model sees: paged tools (read_file) fit their page to it


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool returns to the dispatcher; ``error`` set means the run failed."""

    output: str
    error: str | None = None
    finished: bool = False
    summary: str | None = None


class Tool(Protocol):
    """One agent tool; ``parameters`` is the JSON schema of its arguments (``run_tool`` checks them).

    ``changes_checkout``: whether a run can change the checkout — the loop checkpoints after such a step and
    never runs such a call twice on resume."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    changes_checkout: bool

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Do the work; raise ToolError with a message for the model when it cannot be done."""
        ...
