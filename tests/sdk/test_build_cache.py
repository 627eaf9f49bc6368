"""The build cache key covers everything a Python skill's component is built from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from skilld.package import build
from support.env import SKILLS


def test_builder_source_is_in_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Editing the builder (its entry-module or world template) changes the cache key."""
    before = build.source_digest(SKILLS["echo"])
    edited = tmp_path / "build.py"
    edited.write_text(
        Path(build.__file__).read_text().replace("export guest;", "export guest; ", 1)
    )
    monkeypatch.setattr(build, "__file__", str(edited))
    assert build.source_digest(SKILLS["echo"]) != before


def test_tool_and_python_versions_are_in_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another componentize-py or another Python gives another cache key."""
    before = build.source_digest(SKILLS["echo"])
    with monkeypatch.context() as m:
        m.setattr(build, "_tool_version", lambda: "0.0.0-other")
        assert build.source_digest(SKILLS["echo"]) != before
    with monkeypatch.context() as m:
        m.setattr(sys, "version", sys.version + " (another build)")
        assert build.source_digest(SKILLS["echo"]) != before
    assert build.source_digest(SKILLS["echo"]) == before
