"""``skilld build`` with Agent Skills: packed, locked, dependencies baked, refusals named."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skilld import agentskills, package
from skilld.bundle import BuildResult, build_bundle, open_bundle
from skilld.cli import main
from skilld.errors import AgentSkillError, BundleError, PolicyError
from skilld.node import Node, NodeConfig
from skilld.registry import Call
from skilld.sandbox import Sandbox
from support.agentskills import FIXTURES, wheelhouse
from support.env import cache_dir


def tree(tmp_path: Path, skills: dict[str, dict[str, str]], policies: dict[str, str]) -> Path:
    """A skills/ and policies/ pair written from mappings of relative paths to text."""
    for name, files in skills.items():
        for rel, text in files.items():
            (tmp_path / "skills" / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "skills" / name / rel).write_text(text)
    (tmp_path / "policies").mkdir(parents=True, exist_ok=True)
    for name, text in policies.items():
        (tmp_path / "policies" / name).write_text(text)
    return tmp_path


def skill_md(name: str, extra: str = "") -> str:
    """A valid SKILL.md for ``name``."""
    return f"---\nname: {name}\ndescription: Test skill {name}.\n{extra}---\n# {name}\n"


def build(root: Path, sandbox: Sandbox, **kw: object) -> BuildResult:
    """Build ``root``'s skills and policies into ``root/bundle``."""
    return build_bundle(
        root / "skills",
        root / "policies",
        root / "bundle",
        sandbox=sandbox,
        cache_dir=cache_dir(),
        **kw,  # type: ignore[arg-type]
    )


def test_every_file_and_the_baked_environment_are_in_the_lock(agent_bundle: BuildResult) -> None:
    """Each Agent Skill's files and its installed requirements are digest-locked."""
    lock = agent_bundle.lock
    agents = {a.id: a for a in lock.agent_skills}
    assert set(agents) == {"brand-voice", "csv-summary", "pdf-text", "release-notes"}
    assert agents["csv-summary"].executor == "wasm"
    assert agents["pdf-text"].executor == "native"
    assert agents["brand-voice"].executor == "none"
    assert f"{agents['csv-summary'].root}/scripts/summarize.py" in lock.files
    assert any(f.startswith("agentskills/pdf-text/env/pypdf/") for f in lock.files)
    assert lock.runner is not None
    assert lock.files[lock.runner.native] == lock.runner.native_sha256
    assert agents["csv-summary"].version.startswith("1.2.0+sha.")


def test_a_changed_skill_file_is_refused_at_load(
    agent_bundle: BuildResult, sandbox: Sandbox, tmp_path: Path
) -> None:
    """Changing one byte of an Agent Skill's file in a bundle makes loading refuse it."""
    copy = tmp_path / "bundle"
    shutil.copytree(agent_bundle.out, copy)
    target = copy / "agentskills" / "brand-voice" / "files" / "SKILL.md"
    target.chmod(0o644)
    target.write_text(target.read_text().replace("20 words", "99 words"))
    with pytest.raises(BundleError, match="bundle was changed") as err:
        open_bundle(copy, sandbox)
    assert "brand-voice/files/SKILL.md" in str(err.value.location)


def test_wasm_refuses_a_script_importing_beyond_the_stdlib(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    """The wasm executor is refused at build for a script that imports a package."""
    root = tree(
        tmp_path,
        {
            "fetch": {
                "SKILL.md": skill_md("fetch"),
                "scripts/get.py": "import json\nimport requests\n",
            }
        },
        {"fetch.yaml": "scripts:\n  executor: wasm\n"},
    )
    with pytest.raises(AgentSkillError, match="imports 'requests'") as err:
        build(root, sandbox)
    assert err.value.location == "fetch/scripts/get.py:2"


def test_a_missing_wheel_names_the_skill_and_package(tmp_path: Path, sandbox: Sandbox) -> None:
    """A requirement with no wheel in the wheelhouse fails the build, naming both."""
    root = tree(
        tmp_path,
        {
            "needy": {
                "SKILL.md": skill_md("needy"),
                "scripts/run.py": "import nosuchpkg\n",
                "scripts/requirements.txt": "nosuchpkg-skilld-test\n",
            }
        },
        {"needy.yaml": "scripts:\n  executor: native\n"},
    )
    with pytest.raises(AgentSkillError, match="needs package 'nosuchpkg-skilld-test'") as err:
        build(root, sandbox, wheelhouse=wheelhouse())
    assert "'needy'" in str(err.value)


def test_requirement_lines_that_fetch_are_refused(tmp_path: Path, sandbox: Sandbox) -> None:
    """A requirements line that is a URL or an option is refused at its line."""
    root = tree(
        tmp_path,
        {
            "needy": {
                "SKILL.md": skill_md("needy"),
                "scripts/run.py": "",
                "requirements.txt": "pypdf\n--index-url https://example.com/simple\n",
            }
        },
        {"needy.yaml": "scripts:\n  executor: native\n"},
    )
    with pytest.raises(AgentSkillError, match="is an option, a path or a URL") as err:
        build(root, sandbox, wheelhouse=wheelhouse())
    assert err.value.location == "needy/requirements.txt:2"


def test_wasm_with_requirements_is_refused(tmp_path: Path, sandbox: Sandbox) -> None:
    """Requirements need the native executor: wasm has the standard library only."""
    root = tree(
        tmp_path,
        {"w": {"SKILL.md": skill_md("w"), "scripts/a.py": "", "requirements.txt": "pypdf\n"}},
        {},
    )
    with pytest.raises(AgentSkillError, match="has the standard library only"):
        build(root, sandbox)


def test_ungranted_allowed_tools_fail_strict_and_warn_lenient(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    """A declared Bash(cmd:*) no grant covers is a build error at SKILL.md:LINE (strict),
    a warning otherwise; an unknown tool grants nothing and is reported."""
    extra = "allowed-tools: Bash(git:*) Frobnicate\n"
    root = tree(tmp_path, {"gitty": {"SKILL.md": skill_md("gitty", extra)}}, {})
    with pytest.raises(PolicyError, match="needs shell git") as err:
        build(root, sandbox)
    assert err.value.location == "gitty/SKILL.md:4"
    seen: list[str] = []
    result = build(root, sandbox, strict=False, progress=seen.append)
    assert any("Frobnicate: not a tool skilld maps" in m for m in seen)
    assert result.lock.agent_skills[0].id == "gitty"


def test_lenient_build_loads_a_mismatched_name(tmp_path: Path, sandbox: Sandbox) -> None:
    """--lenient builds a skill whose name differs from its directory, with a warning."""
    root = tree(tmp_path, {"folder": {"SKILL.md": skill_md("named")}}, {})
    with pytest.raises(AgentSkillError, match="must match skill name 'named'"):
        build(root, sandbox)
    seen: list[str] = []
    result = build(root, sandbox, lenient=True, progress=seen.append)
    assert [a.id for a in result.lock.agent_skills] == ["named"]
    assert any("must match skill name" in m for m in seen)


def test_a_prepacked_agent_skill_is_accepted(tmp_path: Path, sandbox: Sandbox) -> None:
    """A signed .skill of kind agent-skill, from a trusted key, builds like a directory."""
    key = package.SigningKey.generate()
    source = agentskills.read_source(FIXTURES / "skills" / "brand-voice")
    data, version = agentskills.pack(source, keys=[key])
    root = tree(tmp_path, {}, {})
    (root / "skills").mkdir()
    (root / "skills" / f"brand-voice-{version}.skill").write_bytes(data)
    trust = root / "policies" / "trust"
    trust.mkdir()
    (trust / "vendor.pub.json").write_bytes(
        package.trust_file_bytes(package.trusted_key("vendor", key.public_raw, ["brand-*"]))
    )
    result = build(root, sandbox)
    assert [a.id for a in result.lock.agent_skills] == ["brand-voice"]
    assert result.lock.agent_skills[0].signers == (key.key_id,)


def test_skills_list_plain_and_xml(
    agent_bundle: BuildResult, capsys: pytest.CaptureFixture[str]
) -> None:
    """skilld skills list prints each skill, and the <available_skills> block with --xml."""
    assert main(["skills", "list", "--bundle", str(agent_bundle.out)]) == 0
    plain = capsys.readouterr().out
    assert "csv-summary" in plain
    assert "agent-skill (wasm)" in plain
    assert main(["skills", "list", "--bundle", str(agent_bundle.out), "--xml"]) == 0
    xml = capsys.readouterr().out
    assert xml.startswith("<available_skills>\n<skill>\n<name>brand-voice</name>")
    assert "<location>skill://pdf-text/SKILL.md</location>" in xml
    assert main(["skills", "list", "--skills", str(FIXTURES / "skills"), "--xml"]) == 0
    assert "<name>release-notes</name>" in capsys.readouterr().out


def test_allowed_tools_map_onto_the_policy_vocabulary() -> None:
    """Read asks for the granted paths read-only, Write the rw ones, Bash(cmd:*) a
    program, WebFetch the granted URLs with GET; the rest grants nothing; without a file
    tool the operator's fs grants stay as written."""
    grants = {
        "fs": [{"path": "/data/in", "mode": "ro"}, {"path": "/data/out", "mode": "rw"}],
        "http": [{"url": "https://api.example.com/"}],
    }
    mapped = agentskills.tools_to_needs(
        ["Read", "Write", "Bash(git log:*)", "WebFetch", "Bash", "Task"], grants, 7
    )
    assert mapped.needs["fs"] == [
        {"path": "/data/in", "mode": "ro"},
        {"path": "/data/out", "mode": "ro"},
        {"path": "/data/out", "mode": "rw"},
    ]
    assert mapped.needs["shell"] == [{"program": "git", "args": ["log", "**"]}]
    assert mapped.needs["http"] == [{"url": "https://api.example.com/", "methods": ["GET"]}]
    assert len(mapped.findings) == 2
    # No file tool declared: allowed-tools narrows, never gates the operator's fs grants.
    assert agentskills.tools_to_needs([], grants).needs == {"fs": grants["fs"]}
    assert agentskills.tools_to_needs(["Bash(git:*)"], grants).needs["fs"] == grants["fs"]


def test_skilld_pack_packs_an_agent_skill(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """skilld pack signs an Agent Skills directory into a .skill of kind agent-skill."""
    out = tmp_path / "brand-voice.skill"
    argv = ["pack", str(FIXTURES / "skills" / "brand-voice"), "-o", str(out)]
    assert main([*argv, "--ephemeral-key-out", str(tmp_path / "keys")]) == 0
    assert "Agent Skill brand-voice" in capsys.readouterr().out
    assert package.read_package(out.read_bytes()).manifest.kind == package.KIND_AGENT_SKILL


def test_the_same_inputs_build_the_same_bundle_digest(
    agent_bundle: BuildResult, sandbox: Sandbox, tmp_path: Path
) -> None:
    """Building the fixtures again (a new ephemeral key, pip run again) gives the same digest."""
    shutil.copytree(FIXTURES / "skills", tmp_path / "skills")
    shutil.copytree(FIXTURES / "policies", tmp_path / "policies")
    again = build(tmp_path, sandbox, wheelhouse=wheelhouse())
    assert again.lock.bundle_digest == agent_bundle.lock.bundle_digest


def test_scripts_get_directory_trees_never_widened_globs() -> None:
    """Literal and /** grants reach scripts as directories; a glob grant does not at all."""
    kept, left = agentskills.tree_grants(
        [
            {"id": "a", "path": "/data/in", "mode": "ro"},
            {"id": "b", "path": "/data/out/**", "mode": "rw"},
            {"id": "c", "path": "/data/docs/**/*.md", "mode": "ro"},
        ]
    )
    assert kept == [{"path": "/data/in", "mode": "ro"}, {"path": "/data/out", "mode": "rw"}]
    assert left == ["c"]


def test_skilld_build_cli_takes_lenient_and_wheelhouse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """skilld build --lenient --wheelhouse builds Agent Skills and lists them in its summary."""
    monkeypatch.setenv("SKILLD_CACHE", str(cache_dir()))
    shutil.copytree(FIXTURES / "skills" / "pdf-text", tmp_path / "skills" / "pdf-txt")
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "pdf-text.yaml").write_text("scripts:\n  executor: native\n")
    argv = ["build", "--skills", str(tmp_path / "skills"), "--policies", str(tmp_path / "policies")]
    argv += ["-o", str(tmp_path / "bundle"), "-q", "--wheelhouse", str(wheelhouse())]
    assert main(argv) == 1  # strict: the directory is not named pdf-text
    assert "must match skill name 'pdf-text'" in capsys.readouterr().err
    assert main([*argv, "--lenient"]) == 0
    assert "pdf-text" in capsys.readouterr().out


@given(st.lists(st.text(alphabet="BashRdWeF():*. /-gitx", max_size=24), max_size=6))
def test_any_allowed_tools_give_needs_the_policy_reads_or_refuses(tools: list[str]) -> None:
    """Whatever allowed-tools hold, their needs parse as policy needs or are refused as a
    PolicyError (with its location), never anything else."""
    from skilld.policy import parse_grants
    from skilld.policy._schema import NEEDS_KEYS

    grants = {"fs": [{"path": "/data", "mode": "rw"}], "http": [{"url": "https://x.test/"}]}
    mapped = agentskills.tools_to_needs(tools, grants, 3)
    with contextlib.suppress(PolicyError):
        parse_grants(mapped.needs, "demo", "demo/SKILL.md", allowed=NEEDS_KEYS)


def test_one_runner_serves_kits_and_wasm_scripts(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a bundle with delegate's kits, the wasm executor uses the runner the kits
    compiled (no second copy), and a script runs on it through a node."""
    from skilld.node import Node, NodeConfig
    from skilld.policy import RUNNER
    from support.env import ROOT

    shutil.copytree(ROOT / "skills", tmp_path / "skills")
    shutil.copytree(ROOT / "policies", tmp_path / "policies")
    shutil.copytree(FIXTURES / "skills" / "csv-summary", tmp_path / "skills" / "csv-summary")
    shutil.copy(FIXTURES / "policies" / "csv-summary.yaml", tmp_path / "policies")
    result = build(tmp_path, sandbox)
    runner_skill = next(s for s in result.lock.skills if s.id == RUNNER)
    assert result.lock.runner is not None
    assert result.lock.runner.native == runner_skill.native
    assert not any(f.startswith("native/_pyrunner") for f in result.lock.files)
    monkeypatch.setenv("SKILLD_CACHE", str(cache_dir()))
    with Node.open(NodeConfig(bundle=result.out, state_dir=tmp_path / "state")) as node:
        out = node.registry.call_method(
            Call("csv-summary", "run_script", {"script": "scripts/summarize.py", "stdin": "a\n1\n"})
        )
    assert out.value["exit_status"] == 0, out.value["stderr"]
    assert '"rows": 1' in out.value["stdout"]


def test_a_64_character_name_builds_strictly_and_is_served(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    """The specification's longest name is a skill id: strict builds accept it, with a script."""
    name = "a" + "-b" * 31 + "c"
    assert len(name) == 64
    root = tree(
        tmp_path,
        {name: {"SKILL.md": skill_md(name), "scripts/hi.py": "print('hi')\n"}},
        {},
    )
    result = build(root, sandbox)
    [locked] = result.lock.agent_skills
    assert (locked.id, locked.executor) == (name, "wasm")
    with Node.open(NodeConfig(bundle=result.out, state_dir=tmp_path / "state")) as node:
        tools = {t.name for t in node.registry.tools()}
        assert {name, f"{name}/run_script"} <= tools


def test_a_program_the_policy_names_and_the_host_lacks_fails_even_leniently(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    """scripts.programs is the operator's word: a missing one fails, naming its package."""
    root = tree(
        tmp_path,
        {"pdfy": {"SKILL.md": skill_md("pdfy"), "scripts/a.py": "import json\n"}},
        {"pdfy.yaml": "scripts:\n  programs: [skilld-no-such-program, pdfinfo-x]\n"},
    )
    with pytest.raises(AgentSkillError, match="skilld-no-such-program") as err:
        build(root, sandbox, lenient=True, strict=False)
    assert err.value.location == "policies/pdfy.yaml"


def test_a_program_only_the_skill_names_makes_its_scripts_unavailable_leniently(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    """metadata.system-programs the host lacks: lenient serves it unavailable, strict refuses."""
    md = skill_md("pdfy", "metadata:\n  system-programs: pdfinfo-skilld-test\n")
    root = tree(tmp_path, {"pdfy": {"SKILL.md": md, "scripts/a.sh": "pdfinfo-skilld-test\n"}}, {})
    seen: list[str] = []
    result = build(root, sandbox, lenient=True, strict=False, progress=seen.append)
    [locked] = result.lock.agent_skills
    assert "'pdfinfo-skilld-test'" in locked.scripts["unavailable"]["scripts/a.sh"]
    assert not any("from None" in line or "None" in line.split() for line in seen)
    with pytest.raises(AgentSkillError, match="pdfinfo-skilld-test"):
        build(root, sandbox)
