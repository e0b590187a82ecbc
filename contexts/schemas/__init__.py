"""The JSON Schemas of the files in a context directory (SPEC §3): the contract, shipped with the code.

One ``{name}.schema.json`` per file kind — ``metadata``, ``state``, ``message``, ``summary``, ``tool``,
``request``, ``lock`` — beside this module, installed as package data. Records may carry extra fields, never fewer.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

NAMES = ("lock", "message", "metadata", "request", "state", "summary", "tool")


def load_schema(name: str) -> dict[str, Any]:
    """The parsed ``{name}.schema.json``; ``KeyError`` for a name that is not one of :data:`NAMES`."""
    if name not in NAMES:
        raise KeyError(f"no schema named {name!r}; known: {', '.join(NAMES)}")
    text = resources.files(__name__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema
