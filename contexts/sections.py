"""The base of every configuration section (SPEC §9): here, below every room, so that each room declares its
own section (``sandbox.settings``, ``worker.settings_models``) and ``worker.settings`` loads them all."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

PositiveInt = Annotated[int, Field(gt=0)]
GiB = 1024**3


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are immutable, docstrings describe keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class HashableDict(dict[str, Any]):
    """A mapping section value that hashes (settings are frozen and hashed, e.g. as a cache key; a plain dict is
    not). Declare it as ``Annotated[dict[str, X], AfterValidator(HashableDict)]`` with ``default_factory``."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))
