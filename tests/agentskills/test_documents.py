"""Document skills shaped like the public ones: loaded leniently, run natively on files a
client hands over MCP, outputs returned as resources, served through the skills extension."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import types
from mcp.client.client import Client
from mcp.server.lowlevel.server import NotificationOptions
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter
from test_mcp import _text, _value, session_for

from skilld.bundle import BuildResult, build_bundle, open_bundle
from skilld.errors import AgentSkillError
from skilld.mcp import ServeConfig
from skilld.mcp._logging import make_logger
from skilld.mcp._metrics import Metrics
from skilld.mcp._server import McpService
from skilld.mcp._skills_ext import GetSkillParams
from skilld.node import Node, NodeConfig
from skilld.sandbox import Sandbox
from support.agentskills import FIXTURES, make_docx, make_pdf, make_xlsx, wheelhouse
from support.env import cache_dir

DOCUMENTS = FIXTURES / "documents"
PACKAGES = ("defusedxml", "openpyxl", "pypdf", "pyyaml")
BIG = 3 << 20


def _tree(root: Path, policies: dict[str, str] | None = None) -> Path:
    shutil.copytree(DOCUMENTS, root / "skills")
    big = root / "skills" / "big-out"
    (big / "scripts").mkdir(parents=True)
    (big / "SKILL.md").write_text(
        "---\nname: big-out\ndescription: Writes a large file. Use in tests.\n---\n# Big\n"
    )
    (big / "scripts" / "big.py").write_text(
        f"with open('big.bin', 'wb') as fh:\n    fh.write(b'x' * {BIG})\n"
    )
    (big / "scripts" / "count.py").write_text(
        "import sys\nwith open(sys.argv[1], 'rb') as fh:\n    print(len(fh.read()))\n"
    )
    (root / "policies").mkdir()
    for name, text in (policies or {}).items():
        (root / "policies" / name).write_text(text)
    return root


def _build(root: Path, sandbox: Sandbox, **kw: Any) -> BuildResult:
    return build_bundle(
        root / "skills",
        root / "policies",
        root / "bundle",
        sandbox=sandbox,
        cache_dir=cache_dir(),
        **kw,
    )


@pytest.fixture(scope="module")
def documents(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The document skills built leniently with a wheelhouse made from PyPI."""
    root = _tree(
        tmp_path_factory.mktemp("documents"),
        {"pdf-forms.yaml": "skill: pdf-forms\nfs:\n  - path: /srv/forms/**\n    mode: ro\n"},
    )
    return _build(root, sandbox, lenient=True, strict=False, wheelhouse=wheelhouse(*PACKAGES))


def test_every_document_skill_loads_leniently_and_gets_the_native_executor(
    documents: BuildResult,
) -> None:
    """Extra fields and list metadata load; packages and shell scripts choose native."""
    agents = {a.id: a for a in documents.lock.agent_skills}
    assert set(agents) == {"big-out", "docx-text", "pdf-forms", "xlsx-recalc"}
    for sid in ("docx-text", "pdf-forms", "xlsx-recalc"):
        assert agents[sid].executor == "native", agents[sid].scripts
        assert agents[sid].scripts["unavailable"] == {}
    assert agents["big-out"].executor == "wasm"
    assert "imports" in agents["xlsx-recalc"].scripts["reason"]
    assert agents["pdf-forms"].scripts["interpreters"] == ["bash", "python"]
    assert agents["pdf-forms"].scripts["programs"] == ["wc"]  # metadata.system-programs
    rows = {r.id: r.grants for r in documents.rows}
    assert rows["docx-text"].startswith("native (")
    assert rows["big-out"].startswith("wasm (standard-library")
    warnings = " ".join(documents.warnings)
    assert "LList" not in warnings


def test_run_script_offers_only_scripts(documents: BuildResult) -> None:
    """The script enum holds scripts: no local module's package marker nor data files."""
    spec = next(a.spec for a in documents.lock.agent_skills if a.id == "docx-text")
    run = next(m for m in spec["methods"] if m["name"] == "run_script")
    assert run["params"]["properties"]["script"]["enum"] == [
        "scripts/extract.py",
        "scripts/frontmatter.py",
        "scripts/office/unpack.py",
    ]


def test_an_operator_fs_grant_is_kept_without_allowed_tools(
    documents: BuildResult, sandbox: Sandbox
) -> None:
    """allowed-tools narrows, never gates: pdf-forms declares none and keeps its fs grant."""
    loaded = open_bundle(documents.out, sandbox)
    fs = loaded.tables.skill("pdf-forms").get("fs") or ()
    assert [r["path"] for r in fs] == ["/srv/forms/**"]


def _files(**named: bytes) -> list[dict[str, str]]:
    return [{"path": p, "content": base64.b64encode(d).decode()} for p, d in named.items()]


def test_document_scripts_run_natively_on_files_handed_over_mcp(
    documents: BuildResult, tmp_path: Path
) -> None:
    """A PDF's text and form fields, a spreadsheet recalculated, a document's text, YAML,
    a shell script and a helper process, each on files the client sent, outputs returned."""
    pdf = make_pdf("Quarterly report", field=("customer", "Ada"))

    async def main() -> None:
        async with session_for(documents.out, tmp_path / "state") as s:
            ran = await s.call_tool(
                "pdf-forms/run_script",
                {"script": "scripts/extract_text.py", "args": ["in/a.pdf"],
                 "files": _files(**{"in/a.pdf": pdf})},
            )  # fmt: skip
            value = _value(ran)
            assert value["exit_status"] == 0, value["stderr"]
            assert "Quarterly report" in json.loads(str(value["stdout"]))["text"]

            ran = await s.call_tool(
                "pdf-forms/run_script",
                {"script": "scripts/form_fields.py", "args": ["a.pdf"],
                 "files": _files(**{"a.pdf": pdf})},
            )  # fmt: skip
            value = _value(ran)
            assert value["exit_status"] == 0, value["stderr"]
            blocks = {c.resource.uri: c.resource for c in ran.content if c.type == "resource"}
            fields = json.loads(blocks["workspace://pdf-forms/fields.json"].text)  # type: ignore[union-attr]
            assert fields == [{"name": "customer", "type": "/Tx", "value": "Ada"}]

            book = make_xlsx([[1, 10], [2, 20], [3, 30], ["=SUM(A1:A3)", "=SUM(B1:B3)"]])
            ran = await s.call_tool(
                "xlsx-recalc/run_script",
                {"script": "scripts/recalc.py", "args": ["book.xlsx"],
                 "files": _files(**{"book.xlsx": book})},
            )  # fmt: skip
            value = _value(ran)
            assert value["exit_status"] == 0, value["stderr"]
            assert json.loads(str(value["stdout"])) == {"A4": 6.0, "B4": 60.0}
            out = next(c.resource for c in ran.content if c.type == "resource")
            assert str(out.uri) == "workspace://xlsx-recalc/recalculated.xlsx"
            with zipfile.ZipFile(io.BytesIO(base64.b64decode(out.blob))) as z:  # type: ignore[union-attr]
                sheet = z.read("xl/worksheets/sheet1.xml").decode()
            assert "<v>6</v>" in sheet or "<v>6.0</v>" in sheet

            docx = make_docx(["First paragraph", "Second one"])
            ran = await s.call_tool(
                "docx-text/run_script",
                {"script": "scripts/extract.py", "args": ["d.docx"],
                 "files": _files(**{"d.docx": docx})},
            )  # fmt: skip
            value = _value(ran)
            assert value["exit_status"] == 0, value["stderr"]
            assert str(value["stdout"]).split("\n")[:2] == ["First paragraph", "Second one"]

            ran = await s.call_tool(
                "docx-text/run_script",
                {"script": "scripts/frontmatter.py", "args": ["n.md"],
                 "files": [{"path": "n.md", "text": "---\ntitle: Note\ntags: [a]\n---\nBody\n"}]},
            )  # fmt: skip
            value = _value(ran)
            assert json.loads(str(value["stdout"])) == {"tags": ["a"], "title": "Note"}

            ran = await s.call_tool(
                "pdf-forms/run_script",
                {"script": "scripts/size.sh", "args": ["a.pdf"],
                 "files": _files(**{"a.pdf": pdf})},
            )  # fmt: skip
            value = _value(ran)
            assert value["exit_status"] == 0, value["stderr"]
            assert value["stdout"] == f"size: {len(pdf)}\n"

            ran = await s.call_tool("pdf-forms/run_script", {"script": "scripts/child.py"})
            value = _value(ran)
            assert (value["exit_status"], value["stdout"]) == (0, "helper ran\n"), value

    anyio.run(main)


def test_a_large_output_is_kept_as_a_resource_of_the_run(
    documents: BuildResult, tmp_path: Path
) -> None:
    """An output too large to embed comes back as a skill:// resource the client reads,
    and can be handed to the next run by its URI (native and wasm alike)."""

    async def main() -> None:
        async with session_for(documents.out, tmp_path / "state") as s:
            ran = await s.call_tool("big-out/run_script", {"script": "scripts/big.py"})
            value = _value(ran)
            assert value["exit_status"] == 0, value["stderr"]
            [kept] = value["resources"]  # type: ignore[misc]
            assert kept["uri"].startswith("skill://big-out/runs/")
            assert kept["size"] == BIG
            read = await s.read_resource(kept["uri"])
            assert len(base64.b64decode(read.contents[0].blob)) == BIG  # type: ignore[union-attr]
            again = await s.call_tool(
                "pdf-forms/run_script",
                {"script": "scripts/size.sh", "args": ["x"],
                 "files": [{"path": "x", "uri": "skill://pdf-forms/SKILL.md"}]},
            )  # fmt: skip
            size = (DOCUMENTS / "pdf-forms" / "SKILL.md").stat().st_size
            assert _value(again)["stdout"] == f"size: {size}\n"
            wasm = await s.call_tool(
                "big-out/run_script",
                {"script": "scripts/count.py", "args": ["in/big.bin"],
                 "files": [{"path": "in/big.bin", "uri": kept["uri"]}]},
            )  # fmt: skip
            value = _value(wasm)
            assert (value["executor"], value["stdout"]) == ("wasm", f"{BIG}\n"), value

    anyio.run(main)


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ([{"path": "../escape", "text": "x"}], "must be relative"),
        ([{"path": "/etc/passwd", "text": "x"}], "must be relative"),
        ([{"path": "a", "content": "%%%"}], "not base64"),
        ([{"path": "a", "uri": "file:///etc/passwd"}], "not a resource of skill"),
        ([{"path": "a", "uri": "skill://docx-text/SKILL.md"}], "not a resource of skill"),
        ([{"path": "a", "text": "x", "content": "eA=="}], "one of content, text or uri"),
        ([{"path": "a", "text": "x"}, {"path": "a", "text": "y"}], "collides"),
        ([{"path": "a", "text": "x"}, {"path": "a/b", "text": "y"}], "collides"),
        ([{"path": "a/./b", "text": "x"}], "must be relative"),
    ],
)
def test_hostile_input_files_are_refused(
    documents: BuildResult, tmp_path: Path, files: list[dict[str, str]], words: str
) -> None:
    """Paths outside the workspace, bad base64 and other skills' or hosts' files are refused."""

    async def main() -> None:
        async with session_for(documents.out, tmp_path / "state") as s:
            ran = await s.call_tool(
                "pdf-forms/run_script", {"script": "scripts/size.sh", "files": files}
            )
            assert ran.is_error
            assert words in _text(ran)

    anyio.run(main)


def _get(uri: str) -> types.Request[GetSkillParams, str]:
    """A ``skills/get`` request (typed: the SDK's Request drops unknown params)."""
    return types.Request[GetSkillParams, str](method="skills/get", params=GetSkillParams(uri=uri))


def test_skills_list_and_get_carry_the_frontmatter_verbatim_and_lock_digests(
    documents: BuildResult, tmp_path: Path
) -> None:
    """skills/list and skills/get (SEP-2640): every field as written, sha256 from the lock,
    the extension declared; a client of the MCP SDK over the served node, in memory."""
    dump: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])

    async def main(node: Node) -> None:
        service = McpService(
            node.registry, ServeConfig(), make_logger(ServeConfig(log_level="error")), Metrics()
        )
        async with Client(service.server) as client:
            s = client.session
            caps = service.server.get_capabilities(NotificationOptions(), {})
            assert "io.modelcontextprotocol/skills" in (caps.extensions or {})
            listed = await s.send_request(types.Request(method="skills/list", params={}), dump)
            assert listed["resultType"] == "complete" and listed["ttlMs"] > 0
            uris = [e["uri"] for e in listed["skills"]]
            assert uris == sorted(f"skill://{a.id}/SKILL.md" for a in documents.lock.agent_skills)
            got = await s.send_request(
                _get("skill://pdf-forms/SKILL.md"),
                dump,
            )
            entry = got["skill"]
            assert entry["frontmatter"]["version"] == "1.0.0"
            assert entry["frontmatter"]["metadata"] == {
                "tags": ["pdf", "forms"],
                "revision": 3,
                "system-programs": "wc",
            }
            files = {r["uri"]: r for r in entry["resources"]}
            assert "skill://pdf-forms/SKILL.md" in files
            data = (DOCUMENTS / "pdf-forms" / "scripts" / "size.sh").read_bytes()
            size_sh = files["skill://pdf-forms/scripts/size.sh"]
            assert size_sh["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
            assert size_sh["size"] == len(data)
            lock_sha = documents.lock.files["agentskills/pdf-forms/files/scripts/size.sh"]
            assert size_sh["digest"] == f"sha256:{lock_sha}"
            with pytest.raises(MCPError, match="no skill at") as err:
                await s.send_request(
                    _get("skill://nope/SKILL.md"),
                    dump,
                )
            assert err.value.error.code == types.INVALID_PARAMS

    with Node.open(NodeConfig(bundle=documents.out, state_dir=tmp_path / "state")) as node:
        anyio.run(main, node)


def test_strict_refuses_every_script_finding_at_once(sandbox: Sandbox, tmp_path: Path) -> None:
    """Without a wheelhouse, a strict build names each missing package at file:line, together."""
    root = _tree(tmp_path)
    for name in ("docx-text", "pdf-forms"):  # frontmatter strict mode accepts
        (root / "skills" / name / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: Test {name}.\n---\n# {name}\n"
        )
    with pytest.raises(AgentSkillError) as err:
        _build(root, sandbox)
    message = str(err.value)
    for where in (
        "docx-text/scripts/frontmatter.py:6: imports 'yaml' (package 'PyYAML')",
        "docx-text/scripts/office/unpack.py:5: imports 'defusedxml'",
        "pdf-forms/scripts/extract_text.py:6: imports 'pypdf'",
        "pdf-forms/scripts/form_fields.py:6: imports 'pypdf'",
        "xlsx-recalc/scripts/recalc.py:7: imports 'openpyxl'",
    ):
        assert where in message, message
    assert "office" not in message.replace("scripts/office/unpack.py", "")


def test_lenient_serves_what_cannot_run_and_run_script_says_why(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Without a wheelhouse, a lenient build serves every tier; run_script answers
    unavailable naming the package; a shell script forced under wasm names the executor."""
    root = _tree(tmp_path, {"pdf-forms.yaml": "skill: pdf-forms\nscripts:\n  executor: wasm\n"})
    result = _build(root, sandbox, lenient=True, strict=False)
    agents = {a.id: a for a in result.lock.agent_skills}
    assert (
        "package 'PyYAML'" in agents["docx-text"].scripts["unavailable"]["scripts/frontmatter.py"]
    )
    assert (
        "wasm executor runs Python only"
        in agents["pdf-forms"].scripts["unavailable"]["scripts/size.sh"]
    )

    async def main() -> None:
        async with session_for(result.out, tmp_path / "state") as s:
            tier2 = await s.call_tool("docx-text", {})
            assert "<skill_content" in _text(tier2)
            ran = await s.call_tool(
                "docx-text/run_script", {"script": "scripts/frontmatter.py", "args": ["x"]}
            )
            assert ran.is_error
            assert "cannot run on this server" in _text(ran)
            assert "PyYAML" in _text(ran)
            ran = await s.call_tool("pdf-forms/run_script", {"script": "scripts/child.py"})
            assert "WASI" in _text(ran) or "process" in _text(ran)

    anyio.run(main)


def test_a_handshake_client_over_stdio_sees_the_extension_and_lists_skills(
    documents: BuildResult, tmp_path: Path
) -> None:
    """Over stdio at 2025-11-25 (no capabilities.extensions field), the extension is
    declared under experimental and skills/list and skills/get answer: raw JSON-RPC."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "skilld", "serve", "--bundle", str(documents.out),
         "--state-dir", str(tmp_path / "state")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "SKILLD_CACHE": str(cache_dir())},
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None

    def ask(message: dict[str, Any]) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()
        if "id" not in message:
            return {}
        answer: dict[str, Any] = json.loads(proc.stdout.readline())
        return answer

    try:
        hello = ask({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}})  # fmt: skip
        experimental = hello["result"]["capabilities"]["experimental"]
        assert experimental["io.modelcontextprotocol/skills"] == {}
        ask({"jsonrpc": "2.0", "method": "notifications/initialized"})
        listed = ask({"jsonrpc": "2.0", "id": 2, "method": "skills/list", "params": {}})
        assert len(listed["result"]["skills"]) == len(documents.lock.agent_skills)
        got = ask({"jsonrpc": "2.0", "id": 3, "method": "skills/get",
                   "params": {"uri": "skill://docx-text/SKILL.md"}})  # fmt: skip
        assert got["result"]["skill"]["frontmatter"]["metadata"]["formats"] == ["docx"]
        bad = ask({"jsonrpc": "2.0", "id": 4, "method": "skills/get",
                   "params": {"uri": "skill://docx-text/../pdf-forms/SKILL.md"}})  # fmt: skip
        assert bad["error"]["code"] == -32602
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
