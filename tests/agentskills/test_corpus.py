"""What running the public corpus by hand found, with skills written here shaped like it:
an office script unpacking a document into dozens of parts, served from a relative
``--state-dir``; a script driving LibreOffice headless as xlsx's ``recalc.py`` does."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import socket
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from test_mcp import _value

from skilld.agentskills._collect import MAX_EMBEDDED_BYTES, MAX_RETURNED_FILES
from skilld.agentskills._executors import program_tree
from skilld.bundle import build_bundle
from skilld.sandbox import Sandbox
from support.agentskills import FIXTURES, serve_built
from support.env import cache_dir

PARTS = 20
PART = 60 << 10


def _document() -> bytes:
    """An Office-like package of ``PARTS`` XML parts of ``PART`` bytes each."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for i in range(PARTS):
            body = "<p>" + "x" * (PART - 7) + "</p>"
            z.writestr(f"word/part{i:02}.xml", body)
    return buf.getvalue()


def test_an_unpacked_document_fits_the_answer_and_a_relative_state_dir_works(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Served with ``--state-dir state`` (relative: the launcher enters the workspace from
    elsewhere), a native script unpacking 20 parts answers: embedded files stay within
    MAX_EMBEDDED_BYTES (the SDK client refuses an event over 1 MiB) and the rest are
    kept as skill:// resources: all 20 parts come back, none is omitted."""
    shutil.copytree(FIXTURES / "corpus", tmp_path / "skills")
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "office-unpack.yaml").write_text(
        "skill: office-unpack\nscripts:\n  executor: native\n"
    )
    build_bundle(
        tmp_path / "skills",
        tmp_path / "policies",
        tmp_path / "bundle",
        sandbox=sandbox,
        cache_dir=cache_dir(),
        lenient=True,
        strict=False,
    )
    (tmp_path / "state").mkdir()
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "skilld", "serve", "--bundle", "bundle", "--state-dir", "state"],
        env={**os.environ, "SKILLD_CACHE": str(cache_dir())},
        cwd=str(tmp_path),
    )
    doc = base64.b64encode(_document()).decode()

    async def main() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            ran = await s.call_tool(
                "office-unpack/run_script",
                {"script": "scripts/office/unpack.py", "args": ["d.docx", "unpacked"],
                 "files": [{"path": "d.docx", "content": doc}]},
            )  # fmt: skip
            value = _value(ran)
            assert value["exit_status"] == 0, value
            assert value["executor"] == "native"
            embedded = [c for c in ran.content if c.type == "resource"]
            sent = sum(len(c.resource.text) for c in embedded)  # type: ignore[union-attr]
            assert 0 < sent <= MAX_EMBEDDED_BYTES
            kept = value.get("resources", [])
            assert len(embedded) <= MAX_RETURNED_FILES
            assert len(embedded) + len(kept) == PARTS  # type: ignore[arg-type]
            assert "files_omitted" not in value
            first = kept[0]  # type: ignore[index]
            read = await s.read_resource(first["uri"])
            assert len(read.contents[0].text) == PART  # type: ignore[union-attr]

    anyio.run(main)


def test_a_declared_program_brings_its_interpreter_and_its_own_directory(tmp_path: Path) -> None:
    """Shaped like ``soffice``: a link on PATH to a ``#!/bin/sh`` script in a directory of
    its own that executes programs beside it. Executing it takes the script's real path,
    its interpreter and that directory; a program of a shared bin directory gets itself."""
    home = tmp_path / "lib" / "office" / "program"
    home.mkdir(parents=True)
    script = home / "office"
    script.write_text('#!/bin/sh\nexec "${0%/*}/office.bin" "$@"\n')
    script.chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "office").symlink_to(script)
    sed = shutil.which("sed")
    assert sed is not None
    tree = program_tree([str(tmp_path / "bin" / "office"), sed])
    assert str(script) in tree and str(home) in tree
    assert os.path.realpath("/bin/sh") in tree
    assert os.path.realpath(sed) in tree
    assert str(Path(os.path.realpath(sed)).parent) not in tree


FODS = """<?xml version="1.0" encoding="UTF-8"?>
<office:document xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0"
 xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0"
 xmlns:of="urn:oasis:names:tc:opendocument:xmlns:of:1.2" office:version="1.3"
 office:mimetype="application/vnd.oasis.opendocument.spreadsheet">
 <office:body><office:spreadsheet><table:table table:name="S">
  <table:table-row><table:table-cell office:value-type="float" office:value="20"/>
   <table:table-cell table:formula="of:=[.A1]+[.A2]"/></table:table-row>
  <table:table-row><table:table-cell office:value-type="float" office:value="22"/>
   <table:table-cell table:formula="of:=[.B1]*2"/></table:table-row>
 </table:table></office:spreadsheet></office:body></office:document>
"""


def _pipes() -> set[str]:
    """LibreOffice's single-instance pipes in /tmp."""
    return {p.name for p in Path("/tmp").glob("OSL_PIPE_*")}


@pytest.fixture
def outside_socket() -> Iterator[str]:
    """A listening 0666 unix socket in a world-searchable directory of /tmp: file modes
    alone would let any uid connect."""
    where = Path(tempfile.mkdtemp(prefix="skilld-outside-", dir="/tmp"))
    where.chmod(0o755)
    path = where / "engine.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)
    path.chmod(0o666)
    try:
        yield str(path)
    finally:
        server.close()
        shutil.rmtree(where)


@pytest.mark.skipif(
    shutil.which("soffice") is None and not os.environ.get("CI"),
    reason="LibreOffice is not installed (CI installs it: .ci/run)",
)
def test_a_script_driving_libreoffice_headless_runs_confined(
    sandbox: Sandbox, tmp_path: Path, outside_socket: str
) -> None:
    """Shaped like xlsx's recalc.py (a script driving ``soffice --headless`` through a local
    helper module that first checks a unix socket can be made): with ``soffice`` declared
    in the policy, it runs natively over MCP on a spreadsheet handed in ``files``, the
    formulas come back evaluated in the returned CSV, LibreOffice's profile and caches do
    not come back as outputs, its pipe in /tmp is gone after the call, and the same
    script cannot connect to a 0666 socket outside (the filter refuses connect())."""
    shutil.copytree(FIXTURES / "corpus" / "office-convert", tmp_path / "skills" / "office-convert")
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "office-convert.yaml").write_text(
        "skill: office-convert\nscripts:\n  executor: native\n  programs: [soffice]\n"
        "limits:\n  memory: 1GiB\n  wall_time: 90s\n"
    )
    params = serve_built(tmp_path, sandbox, strict=True)
    before = _pipes()

    async def main() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            ran = await s.call_tool(
                "office-convert/run_script",
                {"script": "scripts/recalc.py", "args": ["s.fods", outside_socket],
                 "files": [{"path": "s.fods", "text": FODS}]},
            )  # fmt: skip
            value = _value(ran)
            assert value["exit_status"] == 0, value
            summary = json.loads(value["stdout"])
            assert summary["csv"].split() == ["20,42", "22,84"], summary
            assert summary["outside_socket"] == "EPERM", summary
            assert value["files"] == ["workspace://office-convert/s.csv"], value["files"]

    anyio.run(main)
    assert _pipes() <= before
