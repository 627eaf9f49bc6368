"""``telemetry:``: the per-skill opt-in to record call arguments and results on spans."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.policies import assert_refused_at, compiled, explained, write_policies


def test_only_the_skill_that_opts_in_records_its_arguments(tmp_path: Path) -> None:
    """``record_arguments: true`` is the skill's alone; a skill without it never records,
    and its tables have no telemetry entry (bundle digests of such policies unchanged)."""
    tables = compiled(
        tmp_path,
        {"notes.yaml": "telemetry:\n  record_arguments: true\n", "echo.yaml": "kv: {}\n"},
    )
    assert tables.records_arguments("notes")
    assert not tables.records_arguments("echo")
    assert "telemetry" not in tables.skill("echo")


def test_a_skill_may_opt_out_of_the_defaults(tmp_path: Path) -> None:
    """``defaults.yaml`` may opt every skill in; a skill's own ``false`` wins for it."""
    tables = compiled(
        tmp_path,
        {
            "defaults.yaml": "telemetry: {record_arguments: true}\n",
            "notes.yaml": "telemetry: {record_arguments: false}\n",
            "echo.yaml": "{}\n",
        },
    )
    assert not tables.records_arguments("notes")
    assert tables.records_arguments("echo")


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("telemetry:\n  record_arguments: yes please\n", 2, "must be true or false"),
        ("telemetry:\n  record_argument: true\n", 2, "did you mean 'record_arguments'"),
        ("telemetry: on\n", 1, "telemetry"),
    ],
)
def test_a_bad_telemetry_section_is_refused_at_its_line(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    """A typo or a non-boolean names the file, its line and what to write."""
    assert_refused_at(tmp_path, text, line, words)


def test_explain_says_whether_a_skill_records_its_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``skilld policy explain`` says, per skill, whether spans carry its arguments."""
    root = write_policies(
        tmp_path, {"notes.yaml": "telemetry:\n  record_arguments: true\n", "echo.yaml": "{}\n"}
    )
    opted = "arguments and results: recorded on its spans (telemetry.record_arguments)"
    assert opted in explained(root, "notes", capsys)
    never = "arguments and results: never recorded (telemetry.record_arguments)"
    assert never in explained(root, "echo", capsys)
