"""Helpers for the Agent Skills tests: the fixtures' place, a wheelhouse, a PDF."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from support.env import ROOT, cache_dir

FIXTURES = ROOT / "tests" / "agentskills" / "fixtures"


def wheelhouse(*requirements: str) -> Path:
    """A wheelhouse made from PyPI for ``requirements`` (pypdf by default), downloaded
    once into the cache, keyed by the requirement list (PyPI is reachable in CI)."""
    wanted = sorted(requirements or ("pypdf",))
    key = hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:12]
    house = cache_dir() / f"wheelhouse-{key}"
    done = house / ".complete"
    if not done.is_file():
        house.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
             "--dest", str(house), *wanted],
            check=True,
        )  # fmt: skip
        done.write_text("\n".join(wanted))
    return house


def _zip(parts: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in parts.items():
            z.writestr(name, text)
    return buf.getvalue()


def make_xlsx(rows: list[list[object]]) -> bytes:
    """A one-sheet workbook (numbers, and strings starting with '=' as formulas)."""
    cells = []
    for r, row in enumerate(rows, 1):
        out = []
        for c, value in enumerate(row):
            ref = f"{chr(ord('A') + c)}{r}"
            if isinstance(value, str) and value.startswith("="):
                out.append(f'<c r="{ref}"><f>{value[1:]}</f></c>')
            elif isinstance(value, str):
                out.append(f'<c r="{ref}" t="inlineStr"><is><t>{value}</t></is></c>')
            else:
                out.append(f'<c r="{ref}"><v>{value}</v></c>')
        cells.append(f'<row r="{r}">{"".join(out)}</row>')
    main = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
    rel = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
    ct = "http://schemas.openxmlformats.org/package/2006/content-types"
    return _zip({
        "[Content_Types].xml": f'<?xml version="1.0"?><Types xmlns="{ct}">'
        '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'  # noqa: E501 - OOXML names
        '<Default Extension="xml" ContentType="application/xml"/>'
        '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'  # noqa: E501 - OOXML names
        '<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'  # noqa: E501 - OOXML names
        "</Types>",
        "_rels/.rels": '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        f'<Relationship Id="rId1" Type="{rel}/officeDocument" Target="xl/workbook.xml"/></Relationships>',  # noqa: E501 - OOXML names
        "xl/workbook.xml": f'<?xml version="1.0"?><workbook xmlns="{main}" xmlns:r="{rel}">'
        '<sheets><sheet name="Sheet1" sheetId="1" r:id="rId1"/></sheets></workbook>',
        "xl/_rels/workbook.xml.rels": '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        f'<Relationship Id="rId1" Type="{rel}/worksheet" Target="worksheets/sheet1.xml"/></Relationships>',  # noqa: E501 - OOXML names
        "xl/worksheets/sheet1.xml": f'<?xml version="1.0"?><worksheet xmlns="{main}">'
        f"<sheetData>{''.join(cells)}</sheetData></worksheet>",
    })  # fmt: skip


def make_docx(paragraphs: list[str]) -> bytes:
    """A minimal Word document holding ``paragraphs``."""
    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    body = "".join(f"<w:p><w:r><w:t>{p}</w:t></w:r></w:p>" for p in paragraphs)
    return _zip({
        "[Content_Types].xml": '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="xml" ContentType="application/xml"/></Types>',
        "word/document.xml": f'<?xml version="1.0"?><w:document xmlns:w="{w}"><w:body>{body}</w:body></w:document>',  # noqa: E501 - OOXML names
    })  # fmt: skip


def make_pdf(text: str, field: tuple[str, str] | None = None) -> bytes:
    """A one-page PDF whose text layer is ``text`` (ASCII), written by hand; with
    ``field`` (name, value), a fillable text field holding that value."""
    stream = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
    form = b" /AcroForm << /Fields [6 0 R] >>" if field else b""
    annots = b" /Annots [6 0 R]" if field else b""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R" + form + b" >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R" + annots + b" >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    if field:
        objects.append(
            f"<< /Type /Annot /Subtype /Widget /FT /Tx /T ({field[0]}) /V ({field[1]}) "
            "/Rect [72 600 300 620] /P 3 0 R >>".encode()
        )
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def serve_built(root: Path, sandbox: Any, *, strict: bool) -> Any:
    """Build ``root``/skills with ``root``/policies into ``root``/bundle (strict, or
    lenient) and the parameters that serve it over stdio from ``root``: a real
    ``skilld serve`` process, the build cache shared."""
    from mcp.client.stdio import StdioServerParameters

    from skilld.bundle import build_bundle

    build_bundle(
        root / "skills",
        root / "policies",
        root / "bundle",
        sandbox=sandbox,
        cache_dir=cache_dir(),
        lenient=not strict,
        strict=strict,
    )
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "skilld", "serve", "--bundle", "bundle", "--state-dir", "state"],
        env={**os.environ, "SKILLD_CACHE": str(cache_dir())},
        cwd=str(root),
    )
