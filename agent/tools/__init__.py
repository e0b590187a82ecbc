"""The agent's tools (SPEC §5, §13): bash, read_file, search, glob, write_file, edit_file, recall, finish, in the
checkout."""

from agent.tools.dispatch import TOOL_SCHEMAS, TOOLS, FinishTool, ToolResult, check_arguments, run_tool
from agent.tools.files import EditFileTool, ReadFileTool, WriteFileTool
from agent.tools.output import OutputCapture, cap_output
from agent.tools.protocol import Tool, ToolOptions, ToolOutcome
from agent.tools.search import GlobTool, SearchTool
from agent.tools.shell import BashTool, run_command
from agent.tools.workspace import ToolError, Workspace
from sandbox.jail import scrubbed_env

__all__ = [
    "TOOLS",
    "TOOL_SCHEMAS",
    "BashTool",
    "EditFileTool",
    "FinishTool",
    "GlobTool",
    "OutputCapture",
    "ReadFileTool",
    "SearchTool",
    "Tool",
    "ToolError",
    "ToolOptions",
    "ToolOutcome",
    "ToolResult",
    "Workspace",
    "WriteFileTool",
    "cap_output",
    "check_arguments",
    "run_command",
    "run_tool",
    "scrubbed_env",
]
