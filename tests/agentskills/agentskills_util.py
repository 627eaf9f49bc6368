"""Helpers for the Agent Skills tests: the fixtures' place, a wheelhouse, a PDF."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests_env import cache_dir

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def wheelhouse() -> Path:
    """A wheelhouse holding pypdf, downloaded once into the cache (PyPI is reachable in CI)."""
    house = cache_dir() / "wheelhouse"
    if not any(house.glob("pypdf-*.whl")):
        house.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary", ":all:", "--dest", str(house), "pypdf"],
            check=True,
        )  # fmt: skip
    return house


def make_pdf(text: str) -> bytes:
    """A one-page PDF whose text layer is ``text`` (ASCII), written by hand."""
    stream = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
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
