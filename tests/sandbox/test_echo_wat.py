"""skills/echo-wat: a component written in WebAssembly text, built and served like any other."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skilld.call import CallContext
from skilld.errors import BuildError, GuestError
from skilld.package import read_skill_meta
from skilld.package.build import build_component
from skilld.registry import NullChannel
from skilld.sandbox import Component, Sandbox
from skilld.types import Limits
from support.env import SKILLS


@pytest.fixture(scope="module")
def wat(sandbox: Sandbox, component_path: Callable[[str], Path]) -> Component:
    return sandbox.load(component_path("echo-wat").read_bytes(), name="echo-wat")


def _ctx() -> CallContext:
    return CallContext("echo-wat", Limits(memory_bytes=16 << 20), NullChannel())


def test_it_describes_itself_as_its_manifest_says(wat: Component) -> None:
    meta = read_skill_meta(SKILLS["echo-wat"])
    spec = wat.describe(_ctx())
    assert (spec.id, spec.version, spec.description) == (meta.id, meta.version, meta.description)
    assert [m.name for m in spec.methods] == ["echo"]
    assert spec.methods[0].params_schema["required"] == ["text"]
    assert wat.imports == frozenset()


@settings(max_examples=200, deadline=None)
@given(text=st.text(), compact=st.booleans())
def test_any_text_comes_back_unchanged(wat: Component, text: str, compact: bool) -> None:
    args = json.dumps({"text": text}, separators=(",", ":") if compact else None)
    assert wat.call("echo", args, _ctx()).value == text


@settings(max_examples=300, deadline=None)
@given(args=st.one_of(st.text(), st.text(alphabet='{}":\\ text\n"', max_size=30)))
def test_any_arguments_end_in_a_value_or_a_typed_error(wat: Component, args: str) -> None:
    """Hostile argument text never traps the guest: an echo, or invalid-argument."""
    code, value = None, None
    try:
        value = wat.call("echo", args, _ctx()).value
    except GuestError as exc:
        code = exc.code
    if code is None:
        assert json.loads(args) == {"text": value}
    else:
        # invalid-argument from the guest; internal when the string inside is no JSON
        assert code in ("invalid-argument", "internal")


@settings(max_examples=100, deadline=None)
@given(method=st.text().filter(lambda m: m != "echo"))
def test_other_methods_are_not_found(wat: Component, method: str) -> None:
    with pytest.raises(GuestError) as info:
        wat.call(method, '{"text":"x"}', _ctx())
    assert info.value.code == "not-found"


def test_it_serves_no_resources_or_prompts(wat: Component) -> None:
    with pytest.raises(GuestError, match="serves no resources or prompts"):
        wat.read_resource("test://x", _ctx())
    with pytest.raises(GuestError, match="serves no resources or prompts"):
        wat.get_prompt("p", "{}", _ctx())


def _skill_dir(tmp_path: Path, **files: str) -> Path:
    (tmp_path / "skill.yaml").write_text("id: broken\nversion: 0.1.0\n")
    for name, text in files.items():
        (tmp_path / name.replace("_", ".")).write_text(text)
    return tmp_path


def test_a_wat_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    src = _skill_dir(
        tmp_path, skill_wat="(component\n  (core module (func (result i32) i32.bogus)))\n"
    )
    with pytest.raises(BuildError, match=r"skill\.wat") as info:
        build_component(src, cache_dir=tmp_path / "cache")
    assert "2:" in str(info.value) or "line 2" in str(info.value)


def test_a_core_module_is_refused(tmp_path: Path) -> None:
    src = _skill_dir(tmp_path, skill_wat='(module (func (export "f")))\n')
    with pytest.raises(BuildError, match="core module, not a component"):
        build_component(src, cache_dir=tmp_path / "cache")


def test_python_and_wat_together_are_refused(tmp_path: Path) -> None:
    src = _skill_dir(tmp_path, skill_wat="(component)\n", skill_py="")
    with pytest.raises(BuildError, match=r"both skill\.py and skill\.wat"):
        build_component(src, cache_dir=tmp_path / "cache")


def test_neither_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"neither skill\.py nor skill\.wat"):
        build_component(_skill_dir(tmp_path), cache_dir=tmp_path / "cache")


def test_the_build_writes_nothing_into_the_sources(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for f in SKILLS["echo-wat"].iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    out = build_component(src, cache_dir=tmp_path / "cache")
    assert out.parent == tmp_path / "cache" / "components"
    assert sorted(p.name for p in src.iterdir()) == ["skill.wat", "skill.yaml"]
