"""How many of a small local model's replies carry a tool call Tasuki runs (issue 37 item 4).

``python -m bench.local_model_calls`` replays the replies recorded in ``tests/data/text_tool_calls/`` (raw
``/v1/chat/completions`` responses of Qwen2.5-Coder-1.5B-Instruct Q4_K_M on llama.cpp's ``llama-server --jinja``)
and prints, of all replies, the share whose tool call Tasuki runs: before issue 37 only native ``tool_calls``
counted; now calls written in the text count too (:func:`agent.llm.textcalls.text_calls`).

``--base-url http://127.0.0.1:18777/v1`` drives a live OpenAI-compatible server instead (your own run, never CI):
each task's scratch git repository is made in a temporary directory, the conversation is Tasuki's (its system
prompt, its task message, its tool schemas; every call found is run by Tasuki's own tools in the scratch
checkout and answered as the agent answers it; a reply without one gets the agent's nudge), and ``--record DIR``
writes one JSON file per task: the messages of the conversation and each raw response with the number of
messages its request held, so every request can be rebuilt exactly.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agent.llm.base import ToolCall, parse_arguments
from agent.llm.textcalls import text_calls
from agent.prompts import NUDGE, SYSTEM_PROMPT, task_message
from agent.tools import TOOL_SCHEMAS, TOOLS, Workspace, cap_output, run_tool
from bench.common import Result

RECORDINGS = Path(__file__).resolve().parent.parent / "tests" / "data" / "text_tool_calls"
TOOL_OUTPUT_MAX_CHARS = 6000  # a small model's 16k window: less than the default 20,000, as an operator would set
MAX_TOKENS = 2048  # bounds one reply's time on a CPU (a runaway repetition would fill the whole window)


@dataclass(frozen=True)
class Task:
    """A bug-fix task: an issue and the files of the repository it is about."""

    name: str
    title: str
    body: str
    files: dict[str, str]


TASKS = (
    Task(
        "calc-add",
        "add() returns the wrong result",
        "`calc.add(2, 3)` returns -1 instead of 5. The test in test_calc.py fails. Please fix it.",
        {
            "calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
            "test_calc.py": "import unittest\n\nfrom calc import add, mul\n\n\nclass CalcTest(unittest.TestCase):\n"
            "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
            "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n\n\n"
            "if __name__ == '__main__':\n    unittest.main()\n",
            "README.md": "# calc\n\nTiny arithmetic helpers. Run the tests with `python -m unittest -v`.\n",
        },
    ),
    Task(
        "envfile-equals",
        "Values containing '=' are cut off",
        "Loading a .env file with a line like `DATABASE_URL=postgres://u:p@h/db?sslmode=require` gives "
        "`postgres://u:p@h/db?sslmode` for DATABASE_URL: everything after the second `=` is lost. Only the first "
        "`=` should separate the key from the value.\n\nTo reproduce: `python -m unittest discover -s tests -v`.",
        {
            "envfile/__init__.py": "from envfile.parser import parse, parse_line\n\n"
            "__all__ = ['parse', 'parse_line']\n",
            "envfile/parser.py": '"""Read KEY=VALUE lines of a .env file."""\n\n\n'
            "def parse_line(line):\n"
            '    """(key, value) of one line, or None for a blank line or a comment."""\n'
            "    line = line.strip()\n"
            "    if not line or line.startswith('#'):\n        return None\n"
            "    if line.startswith('export '):\n        line = line[len('export '):]\n"
            "    parts = line.split('=')\n"
            "    key, value = parts[0], parts[1] if len(parts) > 1 else ''\n"
            "    return key.strip(), value.strip().strip('\"').strip(\"'\")\n\n\n"
            "def parse(text):\n"
            '    """Every KEY=VALUE of a .env file\'s text, in order; later keys win."""\n'
            "    values = {}\n    for line in text.splitlines():\n        item = parse_line(line)\n"
            "        if item is not None:\n            values[item[0]] = item[1]\n    return values\n",
            "tests/__init__.py": "",
            "tests/test_parser.py": "import unittest\n\nfrom envfile import parse, parse_line\n\n\n"
            "class ParseTest(unittest.TestCase):\n"
            "    def test_simple(self):\n        self.assertEqual(parse_line('A=1'), ('A', '1'))\n\n"
            "    def test_comment(self):\n        self.assertIsNone(parse_line('# A=1'))\n\n"
            "    def test_value_with_equals(self):\n"
            "        self.assertEqual(parse_line('URL=a?b=c'), ('URL', 'a?b=c'))\n\n"
            "    def test_file(self):\n"
            "        self.assertEqual(parse('A=1\\nexport B=\"x=y\"\\n'), {'A': '1', 'B': 'x=y'})\n\n\n"
            "if __name__ == '__main__':\n    unittest.main()\n",
            "README.md": "# envfile\n\nRead `.env` files. Tests: `python -m unittest discover -s tests -v`.\n",
        },
    ),
    Task(
        "chunked-tail",
        "chunked() drops the last items",
        "`list(chunked([1, 2, 3, 4, 5], 2))` gives `[[1, 2], [3, 4]]`: the 5 is lost. The docstring says the last "
        "chunk may be shorter, so it should be `[[1, 2], [3, 4], [5]]`. Please fix it and add a test.",
        {
            "itertools_extra.py": '"""Small iteration helpers."""\n\n\n'
            "def chunked(items, size):\n"
            '    """Yield lists of ``size`` items from ``items``; the last one may be shorter."""\n'
            "    if size < 1:\n        raise ValueError('size must be at least 1')\n"
            "    chunk = []\n    for item in items:\n        chunk.append(item)\n"
            "        if len(chunk) == size:\n            yield chunk\n            chunk = []\n\n\n"
            "def first(items, default=None):\n"
            '    """The first item of ``items``, or ``default`` when there is none."""\n'
            "    return next(iter(items), default)\n",
            "test_itertools_extra.py": "import unittest\n\nfrom itertools_extra import chunked, first\n\n\n"
            "class ChunkedTest(unittest.TestCase):\n"
            "    def test_even(self):\n        self.assertEqual(list(chunked([1, 2, 3, 4], 2)), [[1, 2], [3, 4]])\n\n"
            "    def test_first(self):\n        self.assertEqual(first([], 7), 7)\n\n\n"
            "if __name__ == '__main__':\n    unittest.main()\n",
            "README.md": "# itertools_extra\n\nTests: `python -m unittest -v`.\n",
        },
    ),
)


def runnable_calls(message: dict[str, Any]) -> tuple[list[ToolCall], bool]:
    """The calls Tasuki runs for one reply's message, and whether they were written in its text."""
    native = [
        ToolCall(str(c.get("id")), str(c["function"]["name"]), *parse_arguments(c["function"].get("arguments")))
        for c in message.get("tool_calls") or []
    ]
    if native:
        return native, False
    return text_calls(message.get("content") or "", TOOLS), True


def replies(directory: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(conversation, assistant message) of every recorded response, in order."""
    for path in sorted(directory.glob("*.json")):
        recording = json.loads(path.read_text(encoding="utf-8"))
        for turn in recording["responses"]:
            yield path.stem, turn["response"]["choices"][0]["message"]


def measure(directory: Path) -> tuple[int, int, int]:
    """Print each recorded reply's calls and return (replies, with a native call, with a call Tasuki runs now)."""
    total = native = runnable = 0
    for conversation, message in replies(directory):
        calls, from_text = runnable_calls(message)
        total += 1
        native += bool(calls) and not from_text
        runnable += bool(calls)
        names = ", ".join(c.name for c in calls) or "-"
        print(f"{conversation:>16}  {'text' if from_text and calls else 'native' if calls else 'none':>6}  {names}")
    return total, native, runnable


def report(directory: Path) -> list[Result]:
    """The share of recorded replies whose call Tasuki runs, before text calls were read and now."""
    total, native, runnable = measure(directory)
    if total == 0:
        print(f"no recordings in {directory}")
        return []
    print(f"replies recorded: {total}")
    print(f"with a call Tasuki ran before (native tool_calls only): {native} of {total} ({native / total:.0%})")
    print(f"with a call Tasuki runs now (native or written as text): {runnable} of {total} ({runnable / total:.0%})")
    return [
        Result("local model: calls run, before", f"{native}/{total}", "-", None),
        Result("local model: calls run, now", f"{runnable}/{total}", "-", None),
    ]


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """``bench.run``'s entry: the recorded replies (quick or not: replaying them takes milliseconds)."""
    del scratch, quick  # nothing to build, nothing to scale
    return report(RECORDINGS)


def make_repository(task: Task, root: Path) -> Path:
    """The task's repository as a fresh git checkout under ``root``."""
    path = root / task.name
    for name, text in task.files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text, encoding="utf-8")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for command in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "the code as reported"]):
        subprocess.run(["git", *command], cwd=path, env=env, check=True, capture_output=True)
    return path


def converse(client: httpx.Client, model: str, task: Task, checkout: Path, max_replies: int) -> dict[str, Any]:
    """One task's conversation with a live server, answered as Tasuki's agent answers; returns the recording."""
    issue = {"number": 1, "title": task.title, "body": task.body}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task_message("", issue)},
    ]
    recorded: list[dict[str, Any]] = []
    workspace = Workspace(checkout)
    for _ in range(max_replies):
        body = {"model": model, "messages": messages, "tools": TOOL_SCHEMAS, "max_tokens": MAX_TOKENS}
        response = client.post("/chat/completions", json=body)
        response.raise_for_status()
        raw = response.json()
        recorded.append({"messages_sent": len(messages), "response": raw})
        message = raw["choices"][0]["message"]
        calls, from_text = runnable_calls(message)
        print(f"{task.name}: {'text' if from_text and calls else 'native' if calls else 'none'} "
              f"{[c.name for c in calls]}", file=sys.stderr)
        if not calls:
            messages += [{"role": "assistant", "content": message.get("content")}, {"role": "user", "content": NUDGE}]
            continue
        messages.append({
            "role": "assistant",
            "content": message.get("content"),
            "tool_calls": [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                for c in calls
            ],
        })
        finished = False
        for call in calls:
            arguments = call.arguments if call.raw_arguments is None else call.raw_arguments
            result = run_tool(workspace, call.name, arguments, bash_timeout_s=60, max_output_chars=100_000)
            content, _ = cap_output(result.output, TOOL_OUTPUT_MAX_CHARS)
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content})
            finished = finished or result.finished
        if finished:
            break
    return {
        "task": task.name,
        "model": model,
        "request": {"tools": "agent.tools.TOOL_SCHEMAS", "max_tokens": MAX_TOKENS},
        "messages": messages,
        "responses": recorded,
    }


def record(base_url: str, model: str, out: Path, max_replies: int, names: list[str] | None = None) -> None:
    """Run the tasks (all, or those ``names``) against the live server at ``base_url``; write each recording into
    ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=base_url, timeout=1800) as client, tempfile.TemporaryDirectory() as scratch:
        for task in TASKS:
            if names and task.name not in names:
                continue
            checkout = make_repository(task, Path(scratch))
            recording = converse(client, model, task, checkout, max_replies)
            path = out / f"{task.name}.json"
            path.write_text(json.dumps(recording, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            print(f"wrote {path} ({len(recording['responses'])} replies)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Measure the recordings, or record new ones from a live server first."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="an OpenAI-compatible server to talk to (e.g. llama-server's /v1)")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m", help="the model name sent")
    parser.add_argument("--record", type=Path, help="with --base-url: write the conversations here")
    parser.add_argument("--max-replies", type=int, default=12, help="with --base-url: replies per task at most")
    parser.add_argument("--task", nargs="+", choices=[t.name for t in TASKS], help="with --base-url: only these")
    parser.add_argument("--dir", type=Path, default=RECORDINGS, help="the recordings to measure")
    args = parser.parse_args(argv)
    if args.base_url:
        out = args.record or Path(tempfile.mkdtemp(prefix="text-tool-calls-"))
        record(args.base_url, args.model, out, args.max_replies, args.task)
        return 0 if report(out) else 1
    return 0 if report(args.dir) else 1


if __name__ == "__main__":
    sys.exit(main())
