"""The configuration reference (docs/configuration.md), generated from the settings models (so it cannot drift).

    python -m worker.config_reference   # prints the Markdown table
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from pydantic import BaseModel

from worker.settings_models import Settings

START = "<!-- config-reference:start -->"
END = "<!-- config-reference:end -->"


def rows(model: type[BaseModel] = Settings, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, str, str, str]]:
    """``(key, default, environment variable, description)`` for every leaf key."""
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from rows(annotation, path)
            continue
        default = field.get_default(call_default_factory=True)
        shown = json.dumps(default, default=str)
        env = "TASUKI__" + "__".join(p.upper() for p in path)
        yield ".".join(path), shown, env, (field.description or "").replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """The reference as a Markdown table between its markers."""
    lines = [START, "| key | default | environment variable | meaning |", "|---|---|---|---|"]
    lines += [f"| `{key}` | `{default}` | `{env}` | {doc} |" for key, default, env, doc in rows()]
    lines.append(END)
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
