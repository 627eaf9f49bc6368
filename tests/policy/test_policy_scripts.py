"""The policy's ``scripts`` section: how an Agent Skill's scripts run."""

from __future__ import annotations

import pytest

from skilld.errors import PolicyError
from skilld.policy import compile_documents, load_yaml


def compile_one(text: str) -> dict[str, object]:
    """Compile ``demo.yaml`` holding ``text``; the skill's scripts table."""
    doc = load_yaml(text, "policies/demo.yaml")
    tables = compile_documents({"demo.yaml": ("policies/demo.yaml", doc)}).tables
    return dict(tables.scripts("demo"))


def test_defaults_are_wasm_and_python() -> None:
    """Without a scripts section a skill's scripts run under wasm, in Python, no packages."""
    assert compile_one("skill: demo\n") == {
        "executor": "wasm",
        "interpreters": ("python",),
        "requirements": (),
    }


def test_native_with_interpreters_and_requirements() -> None:
    """executor, interpreters and requirements reach the tables."""
    scripts = compile_one(
        "scripts:\n  executor: native\n  interpreters: [python, bash]\n"
        "  requirements: [pypdf, 'markdown==3.7']\n"
    )
    assert scripts["executor"] == "native"
    assert scripts["interpreters"] == ("bash", "python")
    assert scripts["requirements"] == ("pypdf", "markdown==3.7")


@pytest.mark.parametrize(
    ("text", "words", "line"),
    [
        ("skill: demo\nscripts:\n  executor: docker\n", "must be one of wasm, native", 3),
        ("scripts:\n  executor: native\n  interpreters: [/bin/sh]\n", "not a path", 3),
        ("scripts:\n  interpreters: [python, bash]\n", "runs Python scripts only", 2),
        ("scripts:\n  requirements: ['https://x/pkg']\n", "must be NAME", 2),
        ("scripts:\n  runner: x\n", "unknown key 'runner' in scripts", 2),
    ],
)
def test_malformed_scripts_are_refused_at_their_line(text: str, words: str, line: int) -> None:
    """A bad executor, interpreter path, non-Python wasm, URL requirement or unknown key
    is refused with policies/demo.yaml:LINE."""
    with pytest.raises(PolicyError, match=words) as err:
        compile_one(text)
    assert err.value.location == f"policies/demo.yaml:{line}"
