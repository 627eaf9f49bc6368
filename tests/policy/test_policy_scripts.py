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


def test_without_a_scripts_section_the_build_chooses() -> None:
    """Without a scripts section the executor and interpreters are left to the build
    (chosen from what the scripts need); no packages, no system programs."""
    assert compile_one("skill: demo\n") == {
        "executor": None,
        "interpreters": None,
        "requirements": (),
        "programs": (),
    }


def test_system_programs_reach_the_tables() -> None:
    """scripts.programs names system programs (sorted, unique); a path is refused."""
    scripts = compile_one("scripts:\n  programs: [soffice, pdfinfo, pdfinfo]\n")
    assert scripts["programs"] == ("pdfinfo", "soffice")
    with pytest.raises(PolicyError, match="must be a program name") as err:
        compile_one("scripts:\n  programs: [/usr/bin/pdfinfo]\n")
    assert err.value.location == "policies/demo.yaml:2"


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
        ("scripts:\n  executor: wasm\n  interpreters: [bash]\n", "runs Python scripts only", 3),
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
