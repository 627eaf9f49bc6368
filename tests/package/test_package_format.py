"""The .skill format: deterministic, readable by any unzip tool, round-trips through verify."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import stat
import zipfile
from pathlib import Path
from typing import Any

import pytest

from skilld import ABI_VERSION
from skilld.errors import PackageFormatError
from skilld.package import (
    SigningKey,
    SkillMeta,
    TrustStore,
    add_signature,
    build_package,
    read_package,
    verify_package,
)
from support.packages import COMPONENT, META


def test_verify_returns_every_file(package: bytes, trust: TrustStore, key: SigningKey) -> None:
    """A valid package verifies and hands back its manifest, component, files and signer."""
    v = verify_package(package, trust, expect_id="notes", expect_version="1.2.3")
    assert v.manifest.id == "notes" and v.manifest.version == "1.2.3"
    assert v.manifest.abi == ABI_VERSION
    assert dict(v.manifest.needs) == {"kv": {}, "fs": {"read": ["/data"]}}
    assert v.component == COMPONENT
    assert dict(v.files) == {"SKILL.md": b"# Notes\n", "resources/help.txt": b"help"}
    assert v.signers == (key.key_id,) and v.signer_names == ("alice",)
    assert v.sha256 == hashlib.sha256(package).hexdigest()


def test_verify_reads_a_path(tmp_path: Path, package: bytes, trust: TrustStore) -> None:
    """verify_package accepts a path as well as bytes."""
    path = tmp_path / "notes.skill"
    path.write_bytes(package)
    assert verify_package(path, trust).manifest.id == "notes"


def test_same_inputs_same_bytes(key: SigningKey) -> None:
    """Building twice from the same inputs and epoch gives byte-identical packages."""
    a = build_package(META, COMPONENT, keys=[key], epoch=1_700_000_000)
    b = build_package(META, COMPONENT, keys=[key], epoch=1_700_000_000)
    assert a == b


def test_epoch_and_content_change_the_bytes(key: SigningKey) -> None:
    """A different SOURCE_DATE_EPOCH or one different component byte changes the package."""
    base = build_package(META, COMPONENT, keys=[key], epoch=1_700_000_000)
    assert build_package(META, COMPONENT, keys=[key], epoch=1_800_000_000) != base
    assert build_package(META, COMPONENT[:-1] + b"?", keys=[key], epoch=1_700_000_000) != base


def test_source_date_epoch_is_read(monkeypatch: pytest.MonkeyPatch, key: SigningKey) -> None:
    """Without an explicit epoch, SOURCE_DATE_EPOCH sets every entry's timestamp."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    data = build_package(META, COMPONENT, keys=[key])
    assert data == build_package(META, COMPONENT, keys=[key], epoch=1_700_000_000)
    times = {i.date_time for i in zipfile.ZipFile(io.BytesIO(data)).infolist()}
    assert times == {(2023, 11, 14, 22, 13, 20)}


def test_any_unzip_reads_it(package: bytes) -> None:
    """The package is a plain ZIP: sorted, stored, regular 0644 files, CRCs valid."""
    zf = zipfile.ZipFile(io.BytesIO(package))
    assert zf.testzip() is None
    infos = zf.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names)
    assert {i.compress_type for i in infos} == {zipfile.ZIP_STORED}
    assert {i.external_attr >> 16 for i in infos} == {stat.S_IFREG | 0o644}
    assert zf.read("component.wasm") == COMPONENT
    manifest = json.loads(zf.read("skill.json"))
    assert set(manifest["files"]) == {"SKILL.md", "component.wasm", "resources/help.txt"}
    assert manifest["files"]["component.wasm"] == {
        "sha256": hashlib.sha256(COMPONENT).hexdigest(),
        "size": len(COMPONENT),
    }


def test_manifest_is_canonical_json(package: bytes) -> None:
    """skill.json is sorted-key, whitespace-free UTF-8 JSON."""
    raw = zipfile.ZipFile(io.BytesIO(package)).read("skill.json")
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()


def test_second_signature_keeps_the_first(package: bytes, key: SigningKey) -> None:
    """Adding a signature keeps the original one and the files; re-adding is a no-op."""
    other = SigningKey.generate()
    signed = add_signature(package, other)
    assert {s.key_id for s in read_package(signed).signatures} == {key.key_id, other.key_id}
    assert add_signature(signed, other) is signed
    assert read_package(signed).manifest == read_package(package).manifest


@pytest.mark.parametrize(
    ("field", "value", "cause"),
    [
        ("id", "Notes", "must match"),
        ("id", "9lives", "must match"),
        ("id", "a" * 65, "must match"),
        ("version", "1.2", "not a semantic version"),
        ("version", "v1.2.3", "not a semantic version"),
        ("version", "01.2.3", "not a semantic version"),
        ("id", "notes\n", "must match"),
        ("version", "1.2.3\n", "not a semantic version"),
        ("name", "Notes\x1b[31m", "'name' holds the control character"),
        ("name", "Notes\nsigned by alice", "'name' holds the control character"),
        ("description", "Keeps\x00notes.", "'description' holds the control character"),
    ],
)
def test_bad_metadata_is_refused_when_packing(field: str, value: str, cause: str) -> None:
    """Packing refuses a bad id, a non-semver version or control characters, saying which."""
    changes: dict[str, Any] = {field: value}
    meta = dataclasses.replace(META, **changes)
    with pytest.raises(PackageFormatError, match=cause):
        build_package(meta, COMPONENT)


def test_semver_prerelease_and_build_are_accepted(key: SigningKey, trust: TrustStore) -> None:
    """Versions like 1.0.0-rc.1+build.5 are valid semver and verify."""
    meta = SkillMeta("notes", "Notes", "1.0.0-rc.1+build.5", "")
    data = build_package(meta, COMPONENT, keys=[key])
    assert verify_package(data, trust).manifest.version == "1.0.0-rc.1+build.5"


def test_multiline_description_is_accepted(key: SigningKey, trust: TrustStore) -> None:
    """A description may span lines and hold tabs (YAML block scalars make such text)."""
    meta = SkillMeta("notes", "Notes", "1.0.0", "Keeps notes.\n\tOne per key.\n")
    data = build_package(meta, COMPONENT, keys=[key])
    assert verify_package(data, trust).manifest.description == meta.description


def test_same_key_twice_signs_once(key: SigningKey) -> None:
    """Passing one key twice to build_package writes one signature entry."""
    data = build_package(META, COMPONENT, keys=[key, key])
    assert [s.key_id for s in read_package(data).signatures] == [key.key_id]


@pytest.mark.parametrize("name", ["skill.json", "component.wasm", "signatures/x.sig", "../x"])
def test_reserved_or_unsafe_extra_files_are_refused(name: str) -> None:
    """Extra files may not shadow the manifest, component or signatures, nor escape."""
    with pytest.raises(PackageFormatError):
        build_package(META, COMPONENT, files={name: b"x"})
