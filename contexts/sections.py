"""The base of every configuration section (SPEC §9): here, below every room, so that each room declares its
own section (``sandbox.settings``, ``worker.settings_models``) and ``worker.settings`` loads them all."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Name = Annotated[str, Field(min_length=1)]


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise PydanticCustomError("http_url", "expected an http:// or https:// URL")
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url)]


def cross_field_error(field: str, value: object, expected: str) -> PydanticCustomError:
    """An error about one key of a section that depends on another key; the loader names `field`."""
    return PydanticCustomError("cross_field", "{expected}", {"field": field, "value": value, "expected": expected})

GiB = 1024**3


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are immutable, docstrings describe keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class HashableDict(dict[str, Any]):
    """A mapping section value that hashes (settings are frozen and hashed, e.g. as a cache key; a plain dict is
    not). Declare it as ``Annotated[dict[str, X], AfterValidator(HashableDict)]`` with ``default_factory``."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))
