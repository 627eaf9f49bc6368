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
        "temp_paths": (),
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


def test_temp_paths_reach_the_tables() -> None:
    """scripts.temp_paths names fixed directories under /tmp (sorted, unique)."""
    scripts = compile_one(
        "scripts:\n  executor: native\n  temp_paths:\n"
        "    - /tmp/libreoffice_docx_profile\n    - /tmp/a.b\n    - /tmp/a.b\n"
    )
    assert scripts["temp_paths"] == ("/tmp/a.b", "/tmp/libreoffice_docx_profile")


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("tmp/x", "must be absolute"),
        ("/tmp/../etc", "must not contain '.' or '..'"),
        ("/tmp/..", "must not contain '.' or '..'"),
        ("/tmp/./x", "must not contain '.' or '..'"),
        ("/var/tmp/x", "must be under /tmp"),
        ("/tmpx", "must be under /tmp"),
        ("/tmp", "is /tmp itself"),
        ("/tmp/", "is /tmp itself"),
        ("/tmp/a/b", "one name directly under /tmp"),
        ("/tmp/a b", "one name directly under /tmp"),
        ("/tmp/x/", "one name directly under /tmp"),
    ],
)
def test_bad_temp_paths_are_refused_at_their_line(path: str, words: str) -> None:
    """A relative path, '..', a path outside /tmp, /tmp itself or a nested path is
    refused at the line of the entry."""
    with pytest.raises(PolicyError, match=words) as err:
        compile_one(f"scripts:\n  executor: native\n  temp_paths:\n    - /tmp/ok\n    - '{path}'\n")
    assert err.value.location == "policies/demo.yaml:5"


def test_temp_paths_are_refused_for_the_wasm_executor() -> None:
    """The wasm executor has no /tmp: temp_paths with executor: wasm is refused."""
    with pytest.raises(PolicyError, match="for native programs"):
        compile_one("scripts:\n  executor: wasm\n  temp_paths: [/tmp/x]\n")
