"""The repository stands alone: nothing it uses lives outside it, and it names no downloads."""

from __future__ import annotations

import re
import subprocess

from support.env import ROOT


def _tracked() -> dict[str, bytes]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    files = (ROOT / n.decode() for n in names if n)
    return {p.relative_to(ROOT).as_posix(): p.read_bytes() for p in files if p.is_file()}


def test_repository_carries_no_package_download_urls() -> None:
    """No tracked file names a package-index download (PyPI files, npm tarballs)."""
    download = re.compile(
        rb"https?://(files\.pythonhosted\.org/packages/|pypi\.org/packages/"
        rb"|registry\.npmjs\.org/\S+\.tgz)"
    )
    assert not [name for name, data in _tracked().items() if download.search(data)]


def test_nothing_reaches_outside_the_repository() -> None:
    """No tracked file points at a sibling directory (the helpers and docs live in-tree)."""
    outside = re.compile(rb"\.\./(shared|tools)/|\bparent(s\[\d\])? / \"shared\"")
    assert not [name for name, data in _tracked().items() if outside.search(data)]
    for helper in ("oci-base", "oci-run", "mcp-conformance"):
        assert (ROOT / "tools" / helper).stat().st_mode & 0o111, helper
    assert (ROOT / "docs" / "architecture.md").is_file()


def test_test_modules_have_unique_names() -> None:
    """Test modules are imported by their basename (no packages under tests/): two of one
    name make the whole run stop at collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
