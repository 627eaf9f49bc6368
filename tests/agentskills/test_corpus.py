"""What running the public corpus by hand found, with a skill written here shaped like it:
an office script unpacking a document into dozens of parts, served from a relative
``--state-dir``."""

from __future__ import annotations

import base64
import io
import os
import shutil
import sys
import zipfile
from pathlib import Path

import anyio
from agentskills_util import FIXTURES
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from test_mcp import _value

from skilld.agentskills._backend import MAX_EMBEDDED_BYTES, MAX_RETURNED_FILES
from skilld.agentskills._executors import program_tree
from skilld.bundle import build_bundle
from skilld.sandbox import Sandbox
from tests_env import cache_dir

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
    MAX_EMBEDDED_BYTES (the SDK client refuses an event over 1 MiB), the rest are kept as
    skill:// resources up to MAX_RETURNED_FILES, and the others are counted as omitted."""
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
            assert len(embedded) + len(kept) == MAX_RETURNED_FILES  # type: ignore[arg-type]
            assert value["files_omitted"] == PARTS - MAX_RETURNED_FILES
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
