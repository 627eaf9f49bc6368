"""An export called with its types read once gives what wasmtime-py's own call gives."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skilld.errors import SkilldError
from skilld.registry import NullChannel
from skilld.sandbox import CallContext, Component, Sandbox
from skilld.sandbox._export import ExportCall
from skilld.types import Limits

Loader = Callable[[str], Path]


class _Plain:
    """wasmtime-py's ``Func.__call__``, as before: the reference to compare with."""

    def __call__(self, func: Any, store: Any, *params: Any) -> Any:
        return func(store, *params)


@pytest.fixture(scope="module", params=["echo", "conformance"])
def loaded(request: pytest.FixtureRequest, sandbox: Sandbox, component_path: Loader) -> Component:
    """A component with plain outputs (echo) and one with every content kind (conformance)."""
    name: str = request.param
    return sandbox.load(component_path(name).read_bytes(), name=name)


@pytest.fixture
def plain(loaded: Component) -> Iterator[Callable[[], None]]:
    """Switches ``loaded`` to wasmtime-py's own call for every export, then back."""

    def use_plain() -> None:
        loaded._export_call = lambda *_a: _Plain()  # type: ignore[method-assign,assignment,return-value]

    yield use_plain
    vars(loaded).pop("_export_call", None)


def _ctx(skill: str) -> CallContext:
    # A fresh instance for every call: both sides start from the same guest state.
    return CallContext(skill, Limits(instance_calls=1), NullChannel())


def _outcome(fn: Callable[[], Any]) -> Any:
    """What a call returned, or the error it raised (its class and text)."""
    try:
        return ("ok", repr(fn()))
    except SkilldError as exc:
        return ("error", type(exc).__name__, str(exc))


def _every_export(comp: Component) -> list[Any]:
    """Each of the component's exports, answering and failing, through the public API."""
    name = comp.name
    runs: list[Callable[[], Any]] = [lambda: comp.describe(_ctx(name))]
    if name == "echo":
        args = [
            ("echo", {"text": "héllo ✓"}),
            ("echo", {"text": ""}),
            ("structured", {"name": "sq", "points": [{"x": 1, "y": 2}]}),
            ("fail", {}),
            ("no-such-method", {}),
        ]
    else:
        methods = (
            "simple_text",
            "image_content",
            "audio_content",
            "embedded_resource",
            "multiple_content_types",
            "error_handling",
            "greet",
        )
        args = [(m, {}) for m in methods]
        runs += [
            lambda: comp.read_resource("test://static-text", _ctx(name)),
            lambda: comp.read_resource("test://static-binary", _ctx(name)),
            lambda: comp.read_resource("test://template/7/data", _ctx(name)),
            lambda: comp.read_resource("test://missing", _ctx(name)),
            lambda: comp.get_prompt("test_simple_prompt", "{}", _ctx(name)),
            lambda: comp.get_prompt("test_prompt_with_image", "{}", _ctx(name)),
            lambda: comp.get_prompt(
                "test_prompt_with_arguments", '{"arg1":"a","arg2":"b"}', _ctx(name)
            ),
        ]
    for method, arguments in args:
        text = json.dumps(arguments)
        runs.append(lambda m=method, t=text: comp.call(m, t, _ctx(name)))
    return [_outcome(run) for run in runs]


def test_same_answers_as_wasmtime(loaded: Component, plain: Callable[[], None]) -> None:
    """Values, typed errors, bytes and content blocks come back as wasmtime-py gives them."""
    fast = _every_export(loaded)
    assert any(isinstance(c, ExportCall) for c in loaded._calls.values()), "fast path unused"
    plain()
    assert _every_export(loaded) == fast


def test_types_read_once(loaded: Component) -> None:
    """The second call of an export reuses the converters the first one built."""
    _outcome(lambda: loaded.describe(_ctx(loaded.name)))
    built = dict(loaded._calls)
    _outcome(lambda: loaded.describe(_ctx(loaded.name)))
    assert loaded._calls == built
    assert all(isinstance(c, ExportCall) for c in built.values())
