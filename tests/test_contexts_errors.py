"""The contexts package's errors survive pickling (Celery carries them across processes) and share one root."""

from __future__ import annotations

import importlib
import pickle
import pkgutil

import pytest

import contexts
from contexts import TasukiError


def hierarchy(root: type[TasukiError]) -> list[type[TasukiError]]:
    """``root`` and every class below it."""
    out = [root]
    for sub in root.__subclasses__():
        out += hierarchy(sub)
    return out


for module in pkgutil.walk_packages(contexts.__path__, "contexts."):
    importlib.import_module(module.name)
CONTEXT_ERRORS = sorted(
    {cls for cls in hierarchy(TasukiError) if cls.__module__.startswith("contexts.")},
    key=lambda cls: cls.__qualname__,
)


def test_the_hierarchy_is_found() -> None:
    names = {cls.__name__ for cls in CONTEXT_ERRORS}
    assert {"TasukiError", "FencedError", "LockHeldError", "DiskFullError", "SummaryRejectedError"} <= names


@pytest.mark.parametrize("error_class", CONTEXT_ERRORS, ids=lambda cls: cls.__name__)
def test_errors_round_trip_through_pickle(error_class: type[TasukiError]) -> None:
    error = error_class("context 0b6a5c1e: something went wrong")
    try:
        raise error from ValueError("the cause")
    except TasukiError as raised:
        copy = pickle.loads(pickle.dumps(raised))  # noqa: S301 - bytes this test just made
    assert type(copy) is error_class
    assert copy.args == error.args
    assert str(copy) == str(error) == "context 0b6a5c1e: something went wrong"
    assert copy.message == error.message
    assert isinstance(copy, TasukiError)
