"""``instances:``: fresh or warm instances per skill, compiled into its limits and explained."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skilld.errors import PolicyError
from skilld.policy import compile_policies
from skilld.types import Limits
from support.policies import assert_refused_at, compiled, explained, write_policies


def _limits(tmp_path: Path, files: dict[str, str], skill: str = "notes") -> Limits:
    return compiled(tmp_path, files).limits(skill)


@pytest.mark.parametrize(
    ("text", "calls", "idle_ms"),
    [
        ("kv: {}\n", Limits().instance_calls, Limits().instance_idle_ms),
        ("instances: fresh\n", 1, Limits().instance_idle_ms),
        ("instances: warm\n", Limits().instance_calls, Limits().instance_idle_ms),
        ("instances:\n  max_calls: 50\n  idle: 5s\n", 50, 5000),
        ("instances:\n  reuse: warm\n  idle: 2m\n", Limits().instance_calls, 120_000),
    ],
)
def test_instances_compile_into_the_limits(
    tmp_path: Path, text: str, calls: int, idle_ms: int
) -> None:
    """Warm by default; ``fresh`` is one call per instance; max_calls and idle as given."""
    limits = _limits(tmp_path, {"notes.yaml": text})
    assert (limits.instance_calls, limits.instance_idle_ms) == (calls, idle_ms)
    assert limits.fresh_instances == (calls == 1)


def test_a_skill_overrides_the_defaults(tmp_path: Path) -> None:
    """``defaults.yaml`` may say fresh for all; a skill's own ``warm`` wins for it."""
    files = {
        "defaults.yaml": "instances: fresh\n",
        "notes.yaml": "instances: warm\n",
        "echo.yaml": "{}\n",
    }
    assert not _limits(tmp_path, files).fresh_instances
    assert compile_policies(tmp_path / "policies").tables.limits("echo").fresh_instances


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("instances: cold\n", 1, "'cold' is not one of warm, fresh"),
        ("instances:\n  reuse: fresh\n  max_calls: 3\n", 3, "means nothing with a fresh"),
        ("instances:\n  max_calls: 1\n", 2, "instances.max_calls: bad count 1"),
        ("instances:\n  idle: soon\n", 2, "instances.idle: bad duration"),
        ("instances:\n  reuse: warm\n  calls: 3\n", 3, "unknown key 'calls'"),
    ],
)
def test_bad_instances_are_refused_at_their_line(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    """A wrong word, count or duration names the file, its line and what to write."""
    assert_refused_at(tmp_path, text, line, words)


def test_explain_says_which_instances_a_skill_gets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``skilld policy explain`` ends with the skill's instance policy."""
    root = write_policies(
        tmp_path,
        {
            "notes.yaml": "kv: {}\ninstances: fresh\n",
            "echo.yaml": "instances:\n  max_calls: 20\n  idle: 30s\n",
        },
    )
    assert "instances: fresh (a new instance for every call)" in explained(root, "notes", capsys)
    warm = (
        "instances: warm (one caller's calls share an instance: "
        "at most 20 calls, idle at most 30 s)"
    )
    assert warm in explained(root, "echo", capsys)


_YAML_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 200_000)
    | st.sampled_from(["warm", "fresh", "cold", "5s", "0s", "1m", "", "soon", "-1"]),
    lambda inner: (
        st.dictionaries(
            st.sampled_from(["reuse", "max_calls", "idle", "calls", ""]), inner, max_size=4
        )
        | st.lists(inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=_YAML_VALUES)
def test_any_instances_value_compiles_or_is_refused_with_its_line(
    tmp_path_factory: pytest.TempPathFactory, value: object
) -> None:
    """Whatever ``instances:`` holds, it compiles to sane limits or fails as a PolicyError."""
    root = tmp_path_factory.mktemp("p") / "policies"
    root.mkdir()
    (root / "notes.yaml").write_text(yaml.safe_dump({"instances": value}))
    refused: PolicyError | None = None
    try:
        limits = compile_policies(root).tables.limits("notes")
    except PolicyError as exc:
        refused = exc
    if refused is not None:
        assert refused.location is not None and "notes.yaml:" in refused.location
        return
    assert 1 <= limits.instance_calls <= 100_000
    assert limits.instance_idle_ms > 0
