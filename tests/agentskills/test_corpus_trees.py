"""Scripts that take an unpacked document as a directory tree, shaped like the public
office skills' ``comment.py`` and ``office/pack.py``: the tree goes in through
``run_script``'s ``files`` (one file per part, folders in the path), and what the script
changed in it comes back."""

from __future__ import annotations

import base64
import io
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from test_mcp import _value

from skilld.agentskills._build import MAX_INPUT_FILES
from skilld.agentskills._collect import MAX_RETURNED_FILES
from skilld.sandbox import Sandbox
from support.agentskills import FIXTURES, serve_built

# An unpacked python-pptx presentation has 40 parts (one slide).
PARTS = 40
DOCUMENT = '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"/>'


def _serve(sandbox: Sandbox, tmp_path: Path) -> StdioServerParameters:
    """office-edit built natively from a copy of the fixture, served over stdio."""
    (tmp_path / "skills").mkdir()
    shutil.copytree(FIXTURES / "corpus" / "office-edit", tmp_path / "skills" / "office-edit")
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "office-edit.yaml").write_text(
        "skill: office-edit\nscripts:\n  executor: native\n"
    )
    return serve_built(tmp_path, sandbox, strict=False)


def _text(path: str, text: str) -> dict[str, Any]:
    return {"path": path, "content": base64.b64encode(text.encode()).decode()}


def test_a_script_edits_its_copy_of_a_template_of_its_own(sandbox: Sandbox, tmp_path: Path) -> None:
    """comment.py copies the skill's ``templates/comments.xml`` into the unpacked tree
    with ``shutil.copy`` (which copies the mode) and rewrites it: the copy is writable
    (the skill's files are read-only ``0444`` in the bundle), the comment comes back in
    it, the parts the script did not change do not, and the template itself is unchanged."""
    params = _serve(sandbox, tmp_path)
    tree = [
        _text("unpacked/[Content_Types].xml", "<Types/>"),
        _text("unpacked/word/document.xml", DOCUMENT),
    ]

    async def main() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            for cid in ("0", "1"):
                ran = await s.call_tool(
                    "office-edit/run_script",
                    {"script": "scripts/comment.py", "args": ["unpacked", cid, f"note {cid}"],
                     "files": tree},
                )  # fmt: skip
                value = _value(ran)
                assert value["exit_status"] == 0, value
                assert value["files"] == ["workspace://office-edit/unpacked/word/comments.xml"]
                block = next(c for c in ran.content if c.type == "resource")
                comments = block.resource.text  # type: ignore[union-attr]
                assert f'<w:comment w:id="{cid}">note {cid}</w:comment>' in comments
                assert comments.count("<w:comment ") == 1
            template = await s.read_resource("skill://office-edit/scripts/templates/comments.xml")
            assert "<w:comment " not in template.contents[0].text  # type: ignore[union-attr]

    anyio.run(main)


def test_an_unpacked_tree_of_many_parts_goes_in_and_is_packed(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """40 parts in nested folders (more than the 32 files a run took before) are placed
    as given, and pack.py zips exactly them; more than MAX_INPUT_FILES is refused by the
    schema with a short message, not an echo of the files."""
    params = _serve(sandbox, tmp_path)
    parts = {f"ppt/slideLayouts/_rels/slideLayout{i}.xml.rels": f"<r n='{i}'/>" for i in range(20)}
    parts |= {f"ppt/slideLayouts/slideLayout{i}.xml": f"<l n='{i}'/>" * 50 for i in range(19)}
    parts["[Content_Types].xml"] = "<Types/>"
    assert len(parts) == PARTS
    files = [_text(f"unpacked/{name}", body) for name, body in parts.items()]

    async def main() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            ran = await s.call_tool(
                "office-edit/run_script",
                {"script": "scripts/office/pack.py", "args": ["unpacked", "out.pptx"],
                 "files": files},
            )  # fmt: skip
            value = _value(ran)
            assert value["exit_status"] == 0, value
            assert value["files"] == ["workspace://office-edit/out.pptx"]
            blob = next(c for c in ran.content if c.type == "resource").resource.blob  # type: ignore[union-attr]
            with zipfile.ZipFile(io.BytesIO(base64.b64decode(blob))) as z:
                assert {n: z.read(n).decode() for n in z.namelist()} == parts
            many = [_text(f"p/{i}.xml", "x") for i in range(MAX_INPUT_FILES + 1)]
            refused = await s.call_tool(
                "office-edit/run_script",
                {"script": "scripts/office/pack.py", "args": ["p", "o"], "files": many},
            )
            assert refused.is_error
            message = refused.content[0].text  # type: ignore[union-attr]
            assert "files" in message and len(message) < 1000, message[:300]

    anyio.run(main)


def test_parts_a_script_removes_are_listed(sandbox: Sandbox, tmp_path: Path) -> None:
    """clean.py deletes two of the parts handed in: ``files_removed`` names exactly those
    two, nothing comes back as written, and a run deleting nothing has no such key."""
    params = _serve(sandbox, tmp_path)
    tree = [
        _text("unpacked/ppt/slides/slide1.xml", "<s/>"),
        _text("unpacked/ppt/slides/orphan9.xml", "<s/>"),
        _text("unpacked/ppt/orphan.xml", "<o/>"),
    ]

    async def main() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            value = _value(
                await s.call_tool(
                    "office-edit/run_script",
                    {"script": "scripts/clean.py", "args": ["unpacked"], "files": tree},
                )
            )
            assert value["exit_status"] == 0, value
            assert value["files"] == []
            assert value["files_removed"] == [
                "unpacked/ppt/orphan.xml",
                "unpacked/ppt/slides/orphan9.xml",
            ]
            again = _value(
                await s.call_tool(
                    "office-edit/run_script",
                    {"script": "scripts/clean.py", "args": ["unpacked"], "files": tree[:1]},
                )
            )
            assert again["exit_status"] == 0 and "files_removed" not in again, again

    anyio.run(main)


def test_an_unpacked_tree_comes_back_whole_and_goes_back_by_uri(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """unpack.py writes 40 parts: 16 at most are embedded, every other one is kept as a
    skill:// resource of the run (none omitted); handing the embedded ones back as
    content and the kept ones by ``uri`` lets pack.py rebuild the same document."""
    params = _serve(sandbox, tmp_path)
    parts = {f"ppt/slides/slide{i}.xml": f"<p:sld n='{i}'/>" for i in range(PARTS)}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, body in parts.items():
            z.writestr(name, body)
    document = base64.b64encode(buf.getvalue()).decode()

    async def main() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            ran = await s.call_tool(
                "office-edit/run_script",
                {"script": "scripts/office/unpack.py", "args": ["d.pptx", "unpacked"],
                 "files": [{"path": "d.pptx", "content": document}]},
            )  # fmt: skip
            value = _value(ran)
            assert value["exit_status"] == 0, value
            assert "files_omitted" not in value
            embedded = [c.resource for c in ran.content if c.type == "resource"]
            kept: list[dict[str, Any]] = value["resources"]  # type: ignore[assignment]
            assert len(embedded) <= MAX_RETURNED_FILES
            assert len(embedded) + len(kept) == PARTS
            prefix = "workspace://office-edit/"
            back = [_text(str(e.uri)[len(prefix) :], e.text) for e in embedded]  # type: ignore[union-attr]
            back += [{"path": k["path"], "uri": k["uri"]} for k in kept]
            packed = await s.call_tool(
                "office-edit/run_script",
                {"script": "scripts/office/pack.py", "args": ["unpacked", "again.pptx"],
                 "files": back},
            )  # fmt: skip
            assert _value(packed)["exit_status"] == 0
            blob = next(c for c in packed.content if c.type == "resource").resource.blob  # type: ignore[union-attr]
            with zipfile.ZipFile(io.BytesIO(base64.b64decode(blob))) as z:
                assert {n: z.read(n).decode() for n in z.namelist()} == parts

    anyio.run(main)


_TAMPER = """import json, os, sys
me = os.path.abspath(__file__)
seen = {"uid": os.getuid(), "owner": os.stat(me).st_uid}
for name, act in (
    ("write", lambda: open(me, "a").write("#")),
    ("chmod", lambda: os.chmod(me, 0o4777)),
    ("utime", lambda: os.utime(me, (0, 0))),
    ("unlink", lambda: os.unlink(me)),
    ("rename", lambda: os.rename(me, me + ".x")),
):
    try:
        act()
        seen[name] = "DONE"
    except OSError as exc:
        seen[name] = exc.errno
print(json.dumps(seen))
"""


def test_a_script_cannot_change_its_own_skill_files(sandbox: Sandbox, tmp_path: Path) -> None:
    """A native script that tries to rewrite, chmod (setuid), utime, unlink or rename its
    own file in the skill's run copy is refused each time; the copy is owned neither by
    the script's uid nor by ``nobody`` (another process of the host), and the next run
    finds the file unchanged."""
    skill = tmp_path / "skills" / "tamper"
    (skill / "scripts").mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: tamper\ndescription: Tries to change its own files. Use in tests.\n---\n"
        "# Tamper\n\n`scripts/tamper.py` reports what it could change.\n"
    )
    (skill / "scripts" / "tamper.py").write_text(_TAMPER)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "tamper.yaml").write_text(
        "skill: tamper\nscripts:\n  executor: native\n"
    )
    params = serve_built(tmp_path, sandbox, strict=False)

    async def main() -> list[dict[str, Any]]:
        runs = []
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            for _ in range(2):
                ran = await s.call_tool("tamper/run_script", {"script": "scripts/tamper.py"})
                value = _value(ran)
                assert value["exit_status"] == 0, value
                runs.append(json.loads(value["stdout"]))
        return runs

    first, second = anyio.run(main)
    for seen in (first, second):
        assert all(seen[k] != "DONE" for k in ("write", "chmod", "utime", "unlink", "rename")), seen
        assert seen["owner"] not in (seen["uid"], 65534), seen
    assert first == second
