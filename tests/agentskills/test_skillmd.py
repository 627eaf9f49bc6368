"""SKILL.md validation: every rule of the specification, strict and lenient, with file:line."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skilld.agentskills import parse_skill_md, parse_skill_text, read_source
from skilld.agentskills._skillmd import split_allowed_tools
from skilld.errors import AgentSkillError
from support.agentskills import FIXTURES

SRC = "demo/SKILL.md"


def md(*lines: str, body: str = "# Demo\n\nDo the thing.\n") -> str:
    """A SKILL.md with these frontmatter lines (line 2 onwards) and a body."""
    return "---\n" + "".join(f"{line}\n" for line in lines) + "---\n" + body


def refused(text: str, *, lenient: bool = False, dir_name: str = "demo") -> str:
    """The error message of a refused SKILL.md."""
    with pytest.raises(AgentSkillError) as err:
        parse_skill_text(text, dir_name, source=SRC, lenient=lenient)
    return str(err.value)


OK = ("name: demo", "description: Does the thing. Use when a thing needs doing.")

# (frontmatter lines, expected words, the line they are reported at)
STRICT_REFUSALS = [
    (("description: d",), "Missing required field in frontmatter: name", 2),
    (("name: demo",), "Missing required field in frontmatter: description", 2),
    (("name: ''", "description: d"), "name: Field 'name' must be a non-empty string", 2),
    (("name: 42", "description: d"), "Field 'name' must be a non-empty string", 2),
    (("name: Demo", "description: d"), "Skill name 'Demo' must be lowercase", 2),
    (("name: -demo", "description: d"), "cannot start or end with a hyphen", 2),
    (("name: demo-", "description: d"), "cannot start or end with a hyphen", 2),
    (("name: de--mo", "description: d"), "cannot contain consecutive hyphens", 2),
    (("name: de_mo", "description: d"), "contains invalid characters", 2),
    (("name: dé-mo", "description: d"), "ASCII a-z and 0-9 only", 2),
    (("name: 1demo", "description: d"), "must start with a letter", 2),
    (("name: other", "description: d"), "Directory name 'demo' must match skill name 'other'", 2),
    (("name: " + "a" * 65, "description: d"), "exceeds 64 character limit (65 chars)", 2),
    (("name: demo", "description: ''"), "Field 'description' must be a non-empty string", 3),
    (("name: demo", "description: " + "x" * 1025), "exceeds 1024 character limit", 3),
    ((*OK, "license: [MIT]"), "license: Field 'license' must be a string", 4),
    ((*OK, "compatibility: " + "c" * 501), "Compatibility exceeds 500 character limit", 4),
    ((*OK, "compatibility: 3"), "Field 'compatibility' must be a string", 4),
    ((*OK, "metadata: [a, b]"), "Field 'metadata' must be a mapping", 4),
    ((*OK, "metadata:", "  version: 1.0"), "metadata.version: Field 'metadata' values must", 5),
    ((*OK, "allowed-tools: 7"), "Field 'allowed-tools' must be either a string or a list", 4),
    ((*OK, "allowed-tools: [Read, 3]"), "must be either a string or a list of strings", 4),
    ((*OK, "version: 1.0.0"), "version: Unexpected field in frontmatter", 4),
    ((*OK, "tags: [x]"), "tags: Unexpected field in frontmatter", 4),
]


@pytest.mark.parametrize(("lines", "words", "line"), STRICT_REFUSALS)
def test_strict_refuses_each_rule_at_its_line(
    lines: tuple[str, ...], words: str, line: int
) -> None:
    """Each rule refuses in strict mode, worded like skills-ref, at SKILL.md:LINE."""
    message = refused(md(*lines))
    assert words in message
    assert f"{SRC}:{line}:" in message


@pytest.mark.parametrize(
    ("text", "words", "line"),
    [
        ("name: demo\n", "must start with YAML frontmatter (---)", 1),
        ("---\nname: demo\ndescription: d\n", "not properly closed with ---", 3),
        (md("name: [demo", "description: d"), "Invalid YAML in frontmatter", 3),
        (md("name: demo", "name: again", "description: d"), "duplicate key 'name'", 3),
        (md("- a list"), "frontmatter must be a YAML mapping", 2),
    ],
)
def test_structure_errors_name_the_line(text: str, words: str, line: int) -> None:
    """A missing fence, unparseable YAML or a non-mapping frontmatter is refused with its line."""
    with pytest.raises(AgentSkillError) as err:
        parse_skill_text(text, "demo", source=SRC)
    assert words in str(err.value)
    assert f"{SRC}:{line}" in str(err.value)


@pytest.mark.parametrize(
    ("lines", "dir_name", "warning", "served_as"),
    [
        (("name: other", "description: d"), "demo", "must match skill name 'other'", "other"),
        (("name: demo", "description: " + "x" * 1100), "demo", "exceeds 1024 character", "demo"),
        (("name: " + "a" * 70, "description: d"), "demo", "exceeds 64 character limit", "demo"),
    ],
)
def test_lenient_loads_what_the_client_guide_allows_with_a_warning(
    lines: tuple[str, ...], dir_name: str, warning: str, served_as: str
) -> None:
    """Lenient mode loads a mismatched name, an over-long name or description, warning."""
    skill = parse_skill_text(md(*lines), dir_name, source=SRC, lenient=True)
    assert any(warning in w for w in skill.warnings)
    assert skill.id == served_as
    with pytest.raises(AgentSkillError):
        parse_skill_text(md(*lines), dir_name, source=SRC)


DESCRIPTION_REFUSALS = {
    "Missing required field in frontmatter: description",
    "Field 'description' must be a non-empty string",
}


@pytest.mark.parametrize(
    ("lines", "words", "line"),
    [r for r in STRICT_REFUSALS if r[1] not in DESCRIPTION_REFUSALS],
)
def test_lenient_loads_every_strict_finding_but_the_description_with_a_warning(
    lines: tuple[str, ...], words: str, line: int
) -> None:
    """The client guide skips a skill only for its description or YAML: all else warns."""
    skill = parse_skill_text(md(*lines), "demo", source=SRC, lenient=True)
    assert any(words in w and f"{SRC}:{line}:" in w for w in skill.warnings), skill.warnings
    # Served under its name when that can be a skilld id, else under its directory's.
    assert skill.id == (skill.name if re.fullmatch(r"[a-z][a-z0-9-]{0,63}", skill.name) else "demo")


@pytest.mark.parametrize("lines", [("name: demo",), ("name: demo", "description: ''")])
def test_lenient_still_refuses_a_missing_description(lines: tuple[str, ...]) -> None:
    """Lenient mode refuses a missing or empty description, as the client guide says."""
    assert "description" in refused(md(*lines), lenient=True)


def test_lenient_refuses_a_skill_neither_name_nor_directory_can_serve() -> None:
    """A name and a directory that cannot be skilld ids are refused even leniently."""
    message = refused(md("name: Bad_Name", "description: d"), lenient=True, dir_name="Bad_Dir")
    assert "neither the name nor the directory 'Bad_Dir'" in message


def test_lenient_still_refuses_unparseable_yaml() -> None:
    """Lenient mode refuses a frontmatter that is not YAML, even after quoting values."""
    refused(md("name: demo", "description: [unclosed"), lenient=True)


def test_lenient_quotes_an_unquoted_colon_as_the_guide_suggests() -> None:
    """A description holding ': ' unquoted loads leniently (quoted), strict refuses it."""
    lines = ("name: demo", "description: Use when: the user asks for a demo")
    skill = parse_skill_text(md(*lines), "demo", source=SRC, lenient=True)
    assert skill.description == "Use when: the user asks for a demo"
    assert any("not valid YAML" in w for w in skill.warnings)
    assert "Invalid YAML" in refused(md(*lines))


def test_frontmatter_is_kept_verbatim_and_list_metadata_as_json_text() -> None:
    """Extra fields and list metadata pass through verbatim; metadata values become text."""
    lines = (*OK, "version: 1.2.0", "metadata:", "  tags: [pdf, forms]", "  count: 3")
    skill = parse_skill_text(md(*lines), "demo", source=SRC, lenient=True)
    assert skill.frontmatter["version"] == "1.2.0"
    assert skill.frontmatter["metadata"] == {"tags": ["pdf", "forms"], "count": 3}
    assert dict(skill.metadata) == {"tags": '["pdf", "forms"]', "count": "3"}
    assert any("metadata.tags" in w and "a list" in w for w in skill.warnings)
    assert all("LList" not in w for w in skill.warnings)


def test_all_findings_are_reported_at_once() -> None:
    """Every finding of one SKILL.md is in one message, each at its own line."""
    message = refused(md("name: Bad_Name", "description: ''", "extra: 1"))
    assert f"{SRC}:2: name:" in message
    assert f"{SRC}:3: description:" in message
    assert f"{SRC}:4: extra:" in message


def test_accepted_fields_are_parsed() -> None:
    """Every optional field is kept; allowed-tools splits on spaces outside parentheses."""
    skill = parse_skill_text(
        md(
            *OK,
            "license: Apache-2.0",
            "compatibility: Python 3.10+",
            "metadata:",
            "  author: someone",
            "  version: '2.1'",
            "allowed-tools: Bash(git status:*) Read  Write",
        ),
        "demo",
        source=SRC,
    )
    assert skill.license == "Apache-2.0"
    assert skill.compatibility == "Python 3.10+"
    assert dict(skill.metadata) == {"author": "someone", "version": "2.1"}
    assert skill.allowed_tools == ("Bash(git status:*)", "Read", "Write")
    assert skill.allowed_tools_line == 9
    assert skill.body.startswith("# Demo")
    assert skill.body_line == 11


def test_the_longest_name_and_description_pass() -> None:
    """Exactly 64 name characters (the specification's limit) and 1024 description ones pass."""
    name = "a" * 64
    skill = parse_skill_text(md(f"name: {name}", "description: " + "d" * 1024), name, source=SRC)
    assert skill.id == name


def test_missing_skill_md_is_refused(tmp_path: Path) -> None:
    """A directory without SKILL.md is refused like skills-ref does."""
    with pytest.raises(AgentSkillError, match=r"Missing required file: SKILL\.md"):
        parse_skill_md(tmp_path)


@pytest.mark.parametrize("name", ["brand-voice", "csv-summary", "pdf-text", "release-notes"])
def test_fixtures_shaped_like_public_skills_are_accepted(name: str) -> None:
    """The sample skills (shaped like anthropics/skills) pass strict validation."""
    source = read_source(FIXTURES / "skills" / name)
    assert source.md.id == name
    assert source.md.warnings == ()
    assert "SKILL.md" in source.files


def test_a_symlink_in_a_skill_is_refused(tmp_path: Path) -> None:
    """A skill directory holding a symbolic link is refused, naming the file."""
    skill = tmp_path / "demo"
    skill.mkdir()
    (skill / "SKILL.md").write_text(md(*OK))
    (skill / "secret").symlink_to("/etc/passwd")
    with pytest.raises(AgentSkillError, match="symbolic link") as err:
        read_source(skill)
    assert err.value.location == "demo/secret"


@given(st.text(alphabet="ab (:*)\t", max_size=40))
def test_allowed_tools_split_never_loses_characters(text: str) -> None:
    """Splitting allowed-tools keeps every non-space character, in order."""
    parts = split_allowed_tools(text)
    assert "".join(parts).replace(" ", "").replace("\t", "") == "".join(text.split())


@given(st.text(max_size=300))
def test_hostile_frontmatter_is_refused_or_parsed_never_crashes(text: str) -> None:
    """Arbitrary text is either a valid SKILL.md or an AgentSkillError, nothing else."""
    with contextlib.suppress(AgentSkillError):
        parse_skill_text(f"---\n{text}\n---\nbody", "demo", source=SRC)
