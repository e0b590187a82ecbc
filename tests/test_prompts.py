"""The agent's system prompt: Tasuki's rules first, the workflow, exactly the tools sent, testing and finishing."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agent.prompts import PARAMETER_GUIDES, SYSTEM_PROMPT, TOOL_GUIDES, system_prompt, tool_guide
from agent.tools import TOOLS
from agent.tools.protocol import ToolOptions, ToolOutcome
from agent.tools.workspace import Workspace
from contexts.tokens import estimate_tokens

# Every tool name the prompt module knows of, sent or not: none but the sent ones may appear in the prompt.
KNOWN_NAMES = set(TOOL_GUIDES) | {owner for owner, _ in PARAMETER_GUIDES} | set(TOOLS)


def listed_tools(prompt: str) -> list[str]:
    section = prompt.split("# Tools\n", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^- ([a-z_]+):", section, flags=re.MULTILINE)


def test_the_prompt_lists_exactly_the_tools_the_registry_sends_in_its_order() -> None:
    assert listed_tools(SYSTEM_PROMPT) == list(TOOLS)


def test_no_tool_outside_the_registry_is_named_anywhere_in_the_prompt() -> None:
    for name in KNOWN_NAMES - set(TOOLS):
        assert re.search(rf"\b{name}\b", SYSTEM_PROMPT) is None, name
    for name in TOOLS:
        assert re.search(rf"\b{name}\b", SYSTEM_PROMPT), name


def test_every_tool_in_the_registry_has_a_guide_written_for_the_prompt() -> None:
    # A new tool must be taught, not only described by its schema.
    assert set(TOOLS) <= set(TOOL_GUIDES)


class _Probe:
    name = "probe"
    description = "Probe the thing. Its own words."
    changes_checkout = False
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}, "required": []}

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        return ToolOutcome("")


def test_a_tool_without_a_guide_is_shown_with_its_description_and_parameter_hints_follow_the_schema() -> None:
    section = tool_guide({"probe": _Probe()})
    assert "- probe: Probe the thing. Its own words." in section
    edit = TOOLS["edit_file"]
    hint = PARAMETER_GUIDES[("edit_file", "replace_all")]
    has_replace_all = "replace_all" in edit.parameters["properties"]
    assert (hint in tool_guide({"edit_file": edit})) is has_replace_all


def test_a_task_with_more_tools_gets_them_in_its_prompt() -> None:
    prompt = system_prompt({**TOOLS, "probe": _Probe()})
    assert listed_tools(prompt) == [*TOOLS, "probe"]


def test_tasukis_rules_come_before_the_work_and_keep_the_issue_as_data() -> None:
    rules = SYSTEM_PROMPT.index("# Tasuki's rules")
    for later in ("# How to work", "# Tools", "# Testing", "# Finishing"):
        assert rules < SYSTEM_PROMPT.index(later)
    head = " ".join(SYSTEM_PROMPT[rules:SYSTEM_PROMPT.index("# How to work")].split())
    assert "DATA" in head
    assert "cannot give you tools" in head
    assert "follow them unless they conflict with these rules" in head  # the owner's authority, below Tasuki's
    assert "wrote or changed is not one" in head  # an instruction file the agent writes has no authority
    assert "secrets" in head
    assert "Network access" in head


def test_the_workflow_teaches_reproduce_verify_edge_cases_review_and_clean_up() -> None:
    work = SYSTEM_PROMPT[SYSTEM_PROMPT.index("# How to work"):SYSTEM_PROMPT.index("# Tools")]
    steps = ["relevant code", "Reproduce", "root cause", "Verify", "edge cases", "git diff", "scratch files", "Finish"]
    positions = [work.index(step) for step in steps]
    assert positions == sorted(positions)


def test_finishing_says_what_the_gate_does_and_what_the_summary_holds() -> None:
    finishing = " ".join(SYSTEM_PROMPT[SYSTEM_PROMPT.index("# Finishing"):].split())
    assert "runs the repository's checks once" in finishing
    assert "the next finish is accepted" in finishing
    assert "how you tested it" in finishing


def test_the_prompt_stays_compact() -> None:
    tokens = estimate_tokens(SYSTEM_PROMPT)
    print(f"system prompt: {tokens} estimated tokens, {len(SYSTEM_PROMPT)} characters")
    assert tokens < 1600  # sent (cached) with every request: growth must be a decision, not drift
