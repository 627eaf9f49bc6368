"""How scripts will run, read from the scripts at build: executor, packages, programs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skilld.agentskills import plan, runnable_scripts
from skilld.agentskills._plan import local_modules, script_needs


def _plan(files: dict[str, str], **kw: object) -> object:
    args: dict[str, object] = {
        "policy_executor": None,
        "requirements": (),
        "programs": (),
        "wheelhouse": None,
        "which": lambda p: f"/usr/bin/{p}" if p in ("bash", "wc") else None,
    }
    args.update(kw)
    return plan("demo", {k: v.encode() for k, v in files.items()}, **args)  # type: ignore[arg-type]


def test_stdlib_python_gets_wasm_and_says_why() -> None:
    """Standard-library Python that starts no process runs in wasm."""
    p = _plan({"scripts/a.py": "import json, csv\nfrom pathlib import Path\n"})
    assert (p.executor, p.reason) == ("wasm", "standard-library Python only, no processes")
    assert p.unavailable == {}


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("import subprocess\n", "starts processes"),
        ("import os\nos.system('ls')\n", "starts processes"),
        ("from concurrent.futures import ProcessPoolExecutor\n", "starts processes"),
        ("import pypdf\n", "imports pypdf"),
    ],
)
def test_processes_or_packages_choose_native(source: str, why: str) -> None:
    """A process start or a package import chooses the native executor, naming why."""
    p = _plan({"scripts/a.py": source})
    assert p.executor == "native"
    assert why in p.reason


def test_a_shell_script_chooses_native_with_bash() -> None:
    """A shell script needs bash: native, with bash among the interpreters."""
    p = _plan({"scripts/run.sh": "echo hi\n", "scripts/a.py": "import json\n"})
    assert (p.executor, p.interpreters) == ("native", ("bash", "python"))


def test_a_local_folder_without_init_is_the_skills_own() -> None:
    """scripts/office/ without __init__.py is the skill's own module, not a package."""
    files = {
        "scripts/fix.py": "from office.soffice import run\nimport helpers.merge\n",
        "scripts/office/soffice.py": "X = 1\n",
        "scripts/office/helpers/merge.py": "Y = 2\n",
    }
    assert {"office", "helpers", "soffice", "merge"} <= local_modules(files)
    assert _plan(files).executor == "wasm"


def test_an_optional_import_does_not_make_a_script_unavailable() -> None:
    """An import inside try/except ImportError is optional: its absence is no finding."""
    source = "try:\n    import ujson as json\nexcept ImportError:\n    import json\n"
    needs = script_needs("scripts/a.py", source.encode(), set())
    assert needs.optional == frozenset({"ujson"})
    p = _plan({"scripts/a.py": source})
    assert p.unavailable == {} and p.findings == ()


def test_a_missing_package_is_unavailable_at_its_line() -> None:
    """A package with no wheel: the script is unavailable; the finding is at file:line."""
    p = _plan({"scripts/a.py": "import json\n\nimport yaml\n"})
    assert p.findings == (
        "demo/scripts/a.py:3: imports 'yaml' (package 'PyYAML'), which has no wheel in "
        "no wheelhouse",
    )
    assert "PyYAML" in p.unavailable["scripts/a.py"]


def test_a_package_in_the_wheelhouse_is_installed(tmp_path: Path) -> None:
    """An imported package whose wheel is in the wheelhouse is installed, not a finding."""
    (tmp_path / "PyYAML-6.0-py3-none-any.whl").write_bytes(b"")
    p = _plan({"scripts/a.py": "import yaml\n"}, wheelhouse=tmp_path)
    assert p.distributions == ("PyYAML",)
    assert p.findings == ()


def test_wasm_forced_by_the_policy_names_every_gap() -> None:
    """Under a policy's wasm: a shell script, a package and a process, each named."""
    p = _plan(
        {"scripts/a.sh": "ls\n", "scripts/b.py": "import pypdf\nimport subprocess\n"},
        policy_executor="wasm",
    )
    assert p.reason == "the policy says scripts.executor: wasm"
    assert "wasm executor runs Python only" in p.unavailable["scripts/a.sh"]
    text = "\n".join(p.findings)
    assert "demo/scripts/b.py:1: imports 'pypdf'" in text
    assert "demo/scripts/b.py:2: starts a process" in text


def test_an_interpreter_the_policy_does_not_name_is_unavailable() -> None:
    """The policy's interpreters are the ceiling: a bash script without bash is unavailable."""
    p = _plan({"scripts/a.sh": "ls\n"}, policy_interpreters=("python",))
    assert "not in the policy's scripts.interpreters" in p.unavailable["scripts/a.sh"]


def test_a_missing_declared_program_names_its_debian_package() -> None:
    """A declared program the host lacks makes every script unavailable, naming the package."""
    p = _plan({"scripts/a.py": "import json\n"}, programs=("pdfinfo",))
    assert "'pdfinfo' (Debian package: poppler-utils)" in p.unavailable["scripts/a.py"]


def test_only_scripts_are_offered() -> None:
    """Package markers, requirements, data and templates under scripts/ are not scripts."""
    files = [
        "scripts/__init__.py",
        "scripts/a.py",
        "scripts/run.sh",
        "scripts/example.xml",
        "scripts/requirements.txt",
        "scripts/templates/t.docx",
        "references/x.py",
    ]
    assert runnable_scripts(files) == ["scripts/a.py", "scripts/run.sh"]


@given(st.text(max_size=300))
def test_hostile_script_text_never_crashes_the_plan(source: str) -> None:
    """Any script text yields a plan: a syntax error is a finding, never an exception."""
    p = _plan({"scripts/a.py": source})
    assert p.executor in ("wasm", "native")
