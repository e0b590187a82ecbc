"""The demo's repository and the scripted trajectory the replay model answers with (SPEC §11)."""

from __future__ import annotations

from typing import Any

DEMO_FILES = {
    "README.md": "# calc\n\nA tiny calculator. Run the tests with `python -m unittest -v`.\n",
    "calc.py": (
        '"""A tiny calculator."""\n\n\n'
        "def add(a, b):\n    return a - b\n\n\n"
        "def mul(a, b):\n    return a * b\n"
    ),
    "test_calc.py": (
        "import unittest\n\nfrom calc import add, mul\n\n\n"
        "class CalcTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n\n\n"
        "if __name__ == '__main__':\n    unittest.main()\n"
    ),
}

DEMO_PROMPT = "The test suite fails: `python -m unittest` reports test_add. Fix the bug and keep all tests green."


def _bash(command: str, content: str | None = None) -> dict[str, Any]:
    return {"content": content, "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


DEMO_TRAJECTORY: list[dict[str, Any]] = [
    _bash("ls -la && cat README.md", "Let me look at the repository first."),
    _bash("python -m unittest -v 2>&1", "Now run the tests to see the failure."),
    {"content": None, "tool_calls": [{"name": "read_file", "arguments": {"path": "calc.py"}}]},
    {"content": None, "tool_calls": [{"name": "read_file", "arguments": {"path": "test_calc.py"}}]},
    _bash("git log --oneline && git status --short", "Check the history for context."),
    _bash("grep -n 'return' calc.py", "add() returns a - b; the test expects a sum."),
    {
        "content": "Fix add() so that it adds.",
        "tool_calls": [
            {
                "name": "edit_file",
                "arguments": {"path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"},
            }
        ],
    },
    _bash("python -m unittest -v 2>&1", "Run the whole suite again."),
    _bash("git diff", "Review the change."),
    {
        "content": "All tests pass.",
        "tool_calls": [
            {"name": "finish", "arguments": {"summary": "Fix add(): it subtracted instead of adding. All tests pass."}}
        ],
    },
    {  # the finish gate answered the first finish with its review: one file changed, its checks pass
        "content": "The finish gate's review shows the one-line fix and the checks pass.",
        "tool_calls": [
            {"name": "finish", "arguments": {"summary": "Fix add(): it subtracted instead of adding. All tests pass."}}
        ],
    },
]
