"""Every refusal of verify_package, each with a message that names its cause."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skilld.errors import (
    DigestMismatch,
    PackageError,
    PackageFormatError,
    SignatureError,
    TrustError,
)
from skilld.package import (
    PackageLimits,
    SigningKey,
    SkillMeta,
    TrustedKey,
    TrustStore,
    build_package,
    canonical_json,
    read_package,
    sign_package,
    verify_package,
)
from skilld.package._pack import signature_entry
from skilld.package._verify import _parse_signature
from skilld.package._zip import ZipEntry, dos_datetime, write_zip
from support.packages import COMPONENT, META, RawEntry, raw_zip, signed_archive

MakeTrust = Callable[..., TrustStore]


def _manifest(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": "skilld-skill/1",
        "id": "notes",
        "name": "Notes",
        "version": "1.2.3",
        "description": "",
        "abi": "0.1.0",
        "needs": {},
        "files": {
            "component.wasm": {
                "sha256": hashlib.sha256(COMPONENT).hexdigest(),
                "size": len(COMPONENT),
            }
        },
    }
    doc.update(changes)
    return doc


def _rezip(package: bytes, **replace: bytes) -> bytes:
    """The package's entries rewritten canonically, with some entries' bytes replaced."""
    entries: list[tuple[str, bytes | memoryview]] = [
        (e.name, replace.get(e.name.replace(".", "_").replace("/", "__"), bytes(e.data)))
        for e in read_package(package).archive.entries
    ]
    return write_zip(entries, dos=dos_datetime(0))


# -- size limits and the archive itself ---------------------------------------------------


def test_oversize_package_refused_before_parsing(package: bytes, trust: TrustStore) -> None:
    """A package over max_package_bytes is refused by its size alone."""
    with pytest.raises(PackageFormatError, match="over the limit"):
        verify_package(package, trust, limits=PackageLimits(max_package_bytes=len(package) - 1))


def test_oversize_file_refused_by_stat(tmp_path: Path, trust: TrustStore) -> None:
    """A package path over the limit is refused from its size, even if it is not a ZIP."""
    path = tmp_path / "big.skill"
    path.write_bytes(b"\0" * 2048)
    with pytest.raises(PackageFormatError, match="over the limit") as err:
        verify_package(path, trust, limits=PackageLimits(max_package_bytes=1024))
    assert err.value.location == str(path)


def test_not_a_regular_file_refused(tmp_path: Path, trust: TrustStore) -> None:
    """A directory (or any non-regular file) given as a package is refused."""
    with pytest.raises(PackageFormatError, match="not a regular file"):
        verify_package(tmp_path, trust)


@pytest.mark.parametrize("reader", ["verify_package", "read_package", "sign_package"])
def test_fifo_refused_without_blocking(
    reader: str, tmp_path: Path, key: SigningKey, trust: TrustStore
) -> None:
    """A FIFO given as a package is refused at once, not waited on for a writer."""
    fifo = tmp_path / "pipe.skill"
    os.mkfifo(fifo)
    calls: dict[str, Callable[[], object]] = {
        "verify_package": lambda: verify_package(fifo, trust),
        "read_package": lambda: read_package(fifo),
        "sign_package": lambda: sign_package(fifo, key),
    }
    errors: list[Exception] = []

    def run() -> None:
        try:
            calls[reader]()
        except Exception as exc:  # handed to the test thread below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=30)  # a bound on a hang, not a wait for an event
    if thread.is_alive():  # release the blocked open() so the thread can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join()
        pytest.fail(f"{reader} blocked opening a FIFO")
    assert len(errors) == 1 and isinstance(errors[0], PackageFormatError), errors
    assert "not a regular file" in str(errors[0])
    assert errors[0].location == str(fifo)


def test_sign_refuses_oversize_file_unread(tmp_path: Path, package: bytes, key: SigningKey) -> None:
    """sign_package refuses a file over the limit from its size, naming the file."""
    path = tmp_path / "notes.skill"
    path.write_bytes(package)
    with pytest.raises(PackageFormatError, match="over the limit") as err:
        sign_package(path, key, PackageLimits(max_package_bytes=len(package) - 1))
    assert err.value.location == str(path)
    assert path.read_bytes() == package


def test_garbage_refused(trust: TrustStore) -> None:
    """Bytes that are not a ZIP archive are refused as such."""
    with pytest.raises(PackageFormatError, match="end-of-archive"):
        verify_package(b"hello, world, this is not a zip file at all", trust)


def test_trailing_bytes_refused(package: bytes, trust: TrustStore) -> None:
    """Bytes after the end record (an appended payload) are refused."""
    with pytest.raises(PackageFormatError, match="end-of-archive"):
        verify_package(package + b"\0", trust)


def test_prepended_bytes_refused(package: bytes, trust: TrustStore) -> None:
    """Bytes before the first entry (a polyglot prefix) are refused."""
    with pytest.raises(PackageFormatError):
        verify_package(b"#!/bin/sh\n" + package, trust)


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("/etc/passwd", "absolute path"),
        ("C:/windows", "absolute path"),
        ("../escape", "contains '..'"),
        ("resources/../../escape", "contains '..'"),
        ("resources\\x", "backslash"),
        ("resources//x", "segment"),
        (".hidden", "segment"),
        ("resources/", "directory"),
        ("SKILL.md\n", "segment"),
        ("resources/help.txt\n", "segment"),
    ],
)
def test_unsafe_names_refused(name: str, cause: str, trust: TrustStore) -> None:
    """Entry names that are absolute, climb out, or are not plain paths are refused."""
    data = raw_zip([RawEntry("component.wasm"), RawEntry(name), RawEntry("skill.json")])
    with pytest.raises(PackageFormatError, match=cause) as err:
        verify_package(data, trust)
    assert repr(name) in str(err.value)


def test_duplicate_entries_refused(trust: TrustStore) -> None:
    """The same name twice (two manifests, or the same key's signature twice) is refused."""
    data = raw_zip([RawEntry("component.wasm"), RawEntry("skill.json"), RawEntry("skill.json")])
    with pytest.raises(PackageFormatError, match="appears twice"):
        verify_package(data, trust)
    sig = "signatures/0123456789abcdef.sig"
    data = raw_zip([RawEntry("component.wasm"), RawEntry(sig), RawEntry(sig)])
    with pytest.raises(PackageFormatError, match="appears twice"):
        verify_package(data, trust)


def test_names_differing_in_case_refused(trust: TrustStore) -> None:
    """Two names equal but for case (one file on macOS or Windows) are refused."""
    data = raw_zip([RawEntry("SKILL.md"), RawEntry("component.wasm"), RawEntry("skill.md")])
    with pytest.raises(PackageFormatError, match=r"'SKILL\.md' and 'skill\.md' differ only"):
        verify_package(data, trust)


def test_duplicate_from_zipfile_refused(trust: TrustStore) -> None:
    """A duplicate written by Python's own zipfile module is refused too."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("skill.json", "{}")
        with pytest.warns(UserWarning, match="Duplicate name"):
            zf.writestr("skill.json", "{}")
    with pytest.raises(PackageFormatError, match="appears twice"):
        verify_package(buf.getvalue(), trust)


@pytest.mark.parametrize(
    ("mode", "cause"),
    [
        (stat.S_IFLNK | 0o777, "symbolic link"),
        (stat.S_IFDIR | 0o755, "directory"),
        (stat.S_IFCHR | 0o666, "not a regular file"),
        (stat.S_IFBLK | 0o666, "not a regular file"),
        (stat.S_IFIFO | 0o644, "not a regular file"),
        (stat.S_IFSOCK | 0o644, "not a regular file"),
    ],
)
def test_links_and_devices_refused(mode: int, cause: str, trust: TrustStore) -> None:
    """Links, directories, devices, FIFOs and sockets are refused, saying which."""
    data = raw_zip([RawEntry("component.wasm", b"/etc/shadow", mode=mode)])
    with pytest.raises(PackageFormatError, match=cause):
        verify_package(data, trust)


def test_non_canonical_mode_refused(package: bytes, trust: TrustStore) -> None:
    """A regular file with any mode but 0644 (an executable bit, say) is refused."""
    data = raw_zip([RawEntry("component.wasm", mode=stat.S_IFREG | 0o755)])
    with pytest.raises(PackageFormatError, match="not canonical"):
        verify_package(data, trust)


def test_compressed_entry_refused(trust: TrustStore) -> None:
    """A deflated entry is refused: packages store entries, so nothing expands."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("component.wasm", b"a" * 1000)
    with pytest.raises(PackageFormatError, match="compressed"):
        verify_package(buf.getvalue(), trust)


def test_zip_bomb_refused_by_declared_size(trust: TrustStore) -> None:
    """A deflate bomb is refused by its declared size before a byte is inflated."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("component.wasm", b"\0" * (4 * 1024 * 1024))
    assert len(buf.getvalue()) < 64 * 1024
    with pytest.raises(PackageFormatError, match="over the per-file limit"):
        verify_package(buf.getvalue(), trust, limits=PackageLimits(max_file_bytes=1024 * 1024))


def test_lying_sizes_refused(trust: TrustStore) -> None:
    """A stored entry whose declared expanded size differs from its stored size is refused."""
    data = raw_zip([RawEntry("component.wasm", b"abc", usize=1000)])
    with pytest.raises(PackageFormatError, match="declares 3 stored bytes but 1000"):
        verify_package(data, trust)
    huge = raw_zip([RawEntry("component.wasm", b"abc", usize=2**32 - 1)])
    with pytest.raises(PackageFormatError, match="over the per-file limit"):
        verify_package(huge, trust)


def test_total_expansion_limit(package: bytes, trust: TrustStore) -> None:
    """Files that each fit but together exceed max_total_bytes are refused."""
    with pytest.raises(PackageFormatError, match="total limit"):
        verify_package(package, trust, limits=PackageLimits(max_total_bytes=len(COMPONENT)))


def test_too_many_entries_refused(package: bytes, trust: TrustStore) -> None:
    """An archive with more entries than max_entries is refused from its end record."""
    with pytest.raises(PackageFormatError, match="entries, over the limit"):
        verify_package(package, trust, limits=PackageLimits(max_entries=2))


def test_extra_field_refused(trust: TrustStore) -> None:
    """Extra fields (where tools hide timestamps and owners) make an archive non-canonical."""
    data = raw_zip([RawEntry("component.wasm", extra=b"UT\x05\x00\x01\x00\x00\x00\x00")])
    with pytest.raises(PackageFormatError, match="not canonical"):
        verify_package(data, trust)


# -- manifest and file set ----------------------------------------------------------------


def test_missing_manifest_refused(trust: TrustStore) -> None:
    """A package without skill.json is refused, naming it."""
    data = write_zip([("component.wasm", COMPONENT)], dos=dos_datetime(0))
    with pytest.raises(PackageFormatError, match=r"no skill\.json"):
        verify_package(data, trust)


def test_file_not_in_manifest_refused(key: SigningKey, trust: TrustStore) -> None:
    """A file present in the archive but not listed in the manifest is refused, named."""
    data = signed_archive(_manifest(), {"component.wasm": COMPONENT, "smuggled.bin": b"x"}, [key])
    with pytest.raises(PackageFormatError, match=r"not in the manifest: smuggled\.bin"):
        verify_package(data, trust)


def test_file_missing_from_archive_refused(key: SigningKey, trust: TrustStore) -> None:
    """A file listed in the manifest but absent from the archive is refused, named."""
    files = _manifest()["files"] | {"SKILL.md": {"sha256": "0" * 64, "size": 1}}
    data = signed_archive(_manifest(files=files), {"component.wasm": COMPONENT}, [key])
    with pytest.raises(PackageFormatError, match=r"missing from the archive: SKILL\.md"):
        verify_package(data, trust)


def test_changed_component_is_a_digest_mismatch(package: bytes, trust: TrustStore) -> None:
    """Swapping the component for other bytes of the same size fails its sha256."""
    data = _rezip(package, component_wasm=COMPONENT[::-1])
    with pytest.raises(DigestMismatch, match=r"sha256 of component\.wasm"):
        verify_package(data, trust)


def test_changed_size_is_a_digest_mismatch(package: bytes, trust: TrustStore) -> None:
    """A resource with a different size than the manifest records is refused, named."""
    data = _rezip(package, resources__help_txt=b"help me")
    with pytest.raises(
        DigestMismatch, match=r"resources/help\.txt is 7 bytes; the manifest says 4"
    ):
        verify_package(data, trust)


@pytest.mark.parametrize(
    ("changes", "cause"),
    [
        ({"id": "Notes"}, "manifest id 'Notes' must match"),
        ({"id": "notes\n"}, r"manifest id 'notes\\n' must match"),
        ({"version": "1.2"}, "not a semantic version"),
        ({"version": "1.2.3\n"}, r"manifest version '1\.2\.3\\n' is not a semantic version"),
        ({"abi": "0.1.0\n"}, r"manifest abi '0\.1\.0\\n' is not a semantic version"),
        ({"name": "Notes\x1b[2J"}, r"'name' holds the control character '\\x1b' at index 5"),
        ({"name": "Notes\n"}, r"'name' holds the control character '\\n'"),
        ({"description": "ok\r\x1b]0;x\x07"}, r"'description' holds the control character '\\r'"),
        ({"description": "ok\x9b2J"}, r"'description' holds the control character '\\x9b'"),
        ({"abi": "9.0.0"}, "built for skill ABI 9.0.0"),
        ({"format": "other/1"}, "manifest format"),
        ({"needs": []}, "'needs' must be a JSON object"),
        ({"extra": 1}, "unknown manifest field"),
        ({"name": 5}, "'name' must be a string"),
    ],
)
def test_bad_manifest_fields_refused(
    changes: dict[str, Any], cause: str, key: SigningKey, trust: TrustStore
) -> None:
    """A signed manifest with a malformed field is still refused, naming the field."""
    data = signed_archive(_manifest(**changes), {"component.wasm": COMPONENT}, [key])
    with pytest.raises(PackageFormatError, match=cause):
        verify_package(data, trust)


def test_digest_with_trailing_newline_refused(key: SigningKey, trust: TrustStore) -> None:
    """A manifest sha256 followed by a newline is not 64 hex digits and is refused."""
    entry = {"sha256": hashlib.sha256(COMPONENT).hexdigest() + "\n", "size": len(COMPONENT)}
    data = signed_archive(
        _manifest(files={"component.wasm": entry}), {"component.wasm": COMPONENT}, [key]
    )
    with pytest.raises(PackageFormatError, match=r"sha256 of 'component\.wasm' is not 64"):
        verify_package(data, trust)


def test_missing_manifest_field_refused(key: SigningKey, trust: TrustStore) -> None:
    """A manifest without a required field is refused, naming it."""
    doc = _manifest()
    del doc["version"]
    data = signed_archive(doc, {"component.wasm": COMPONENT}, [key])
    with pytest.raises(PackageFormatError, match="missing: version"):
        verify_package(data, trust)


def test_non_canonical_manifest_refused(key: SigningKey, trust: TrustStore) -> None:
    """A manifest with whitespace (even correctly signed) is refused as non-canonical."""
    raw = canonical_json(_manifest()).replace(b",", b", ", 1)
    data = signed_archive(raw, {"component.wasm": COMPONENT}, [key])
    with pytest.raises(PackageFormatError, match="canonical JSON"):
        verify_package(data, trust)


def test_duplicate_manifest_keys_refused(key: SigningKey, trust: TrustStore) -> None:
    """A manifest repeating a key (parsers disagree on which wins) is refused."""
    raw = canonical_json(_manifest())[:-1] + b',"id":"evil"}'
    data = signed_archive(raw, {"component.wasm": COMPONENT}, [key])
    with pytest.raises(PackageFormatError, match="duplicate JSON key 'id'"):
        verify_package(data, trust)


# -- signatures and trust -----------------------------------------------------------------


def test_unsigned_refused(trust: TrustStore) -> None:
    """A package with no signature is refused as unsigned."""
    data = build_package(META, COMPONENT)
    with pytest.raises(SignatureError, match="is not signed"):
        verify_package(data, trust)


def test_unknown_key_refused(package: bytes, key: SigningKey, make_trust: MakeTrust) -> None:
    """A package signed only by a key the store does not hold is refused, naming the key."""
    trust = make_trust(("bob", SigningKey.generate(), ["*"]))
    with pytest.raises(TrustError, match=f"unknown key.*{key.key_id}"):
        verify_package(package, trust)


def test_key_outside_scope_refused(package: bytes, key: SigningKey, make_trust: MakeTrust) -> None:
    """A trusted key whose scope does not cover the skill id does not count, and says so."""
    trust = make_trust(("alice", key, ["acme-*", "todo"]))
    with pytest.raises(TrustError, match=r"'alice'.*may not sign skill 'notes'.*acme-\*"):
        verify_package(package, trust)


def test_scope_wildcards(key: SigningKey, make_trust: MakeTrust) -> None:
    """'*' matches any run of id characters, and only at its place in the pattern."""
    data = build_package(SkillMeta("acme-notes", "n", "1.0.0", ""), COMPONENT, keys=[key])
    assert verify_package(data, make_trust(("a", key, ["acme-*"]))).signers == (key.key_id,)
    assert verify_package(data, make_trust(("a", key, ["*"]))).signers == (key.key_id,)
    with pytest.raises(TrustError, match="may not sign"):
        verify_package(data, make_trust(("a", key, ["acme"])))
    with pytest.raises(TrustError, match="may not sign"):
        verify_package(data, make_trust(("a", key, ["*-todo"])))


def test_bad_signature_refused(package: bytes, key: SigningKey, trust: TrustStore) -> None:
    """A well-formed signature that does not verify is refused, naming the key."""
    other = SigningKey.generate()
    forged = {f"signatures__{key.key_id}_sig": canonical_json({
        "algorithm": "ed25519", "key_id": key.key_id,
        "signature": __import__("base64").b64encode(other.sign(b"x")).decode(),
    })}  # fmt: skip
    data = _rezip(package, **forged)
    with pytest.raises(SignatureError, match=f"'alice' \\({key.key_id}\\) does not verify"):
        verify_package(data, trust)


def test_signature_under_another_keys_name_refused(
    package: bytes, key: SigningKey, trust: TrustStore
) -> None:
    """A signature file whose name and key id disagree is refused."""
    sig = next(e for e in read_package(package).archive.entries if e.name.startswith("sig"))
    entries = [(e.name, bytes(e.data)) for e in read_package(package).archive.entries]
    entries.append(("signatures/0000000000000000.sig", bytes(sig.data)))
    data = write_zip(entries, dos=dos_datetime(0))
    with pytest.raises(SignatureError, match=f"by key '{key.key_id}', not by '0000000000000000'"):
        verify_package(data, trust)


def test_signature_name_with_trailing_newline_refused(package: bytes, key: SigningKey) -> None:
    """A second copy of a signature filed as 'signatures/<id>.sig\\n' is refused, naming it."""
    sig_name = f"signatures/{key.key_id}.sig"
    entries = read_package(package).archive.entries
    copy = [RawEntry(e.name, bytes(e.data)) for e in entries]
    sig = next(e for e in entries if e.name == sig_name)
    copy.append(RawEntry(sig_name + "\n", bytes(sig.data)))
    with pytest.raises(PackageFormatError, match=rf"'{sig_name}\\n' has a segment"):
        read_package(raw_zip(copy))
    # The signature-name check stands on its own too, not only behind the archive's.
    entry = ZipEntry(sig_name + "\n", sig.data, sig.crc)
    with pytest.raises(SignatureError, match=r"must be named signatures/<16-hex key id>\.sig"):
        _parse_signature(entry, PackageLimits())


def test_threshold_needs_distinct_keys(key: SigningKey, make_trust: MakeTrust) -> None:
    """With threshold 2, one signature is refused and two distinct trusted keys pass."""
    second = SigningKey.generate()
    trust = make_trust(("alice", key, ["notes"], {"notes": 2}), ("bob", second, ["*"]))
    one = build_package(META, COMPONENT, keys=[key])
    with pytest.raises(TrustError, match="needs 2 distinct trusted keys, has 1"):
        verify_package(one, trust)
    both = build_package(META, COMPONENT, keys=[key, second])
    assert set(verify_package(both, trust).signers) == {key.key_id, second.key_id}


def test_one_key_signing_under_two_key_ids_counts_once(key: SigningKey) -> None:
    """Two valid signatures by one public key, filed under two key ids, do not meet threshold 2."""
    alias = "f" * 16  # sorts after the real key id, so the real one is counted first
    # A store built by hand may hold one public key under a second, made-up key id
    # (load_trust refuses that); each signature entry then finds "its" trusted key.
    trust = TrustStore(
        (
            TrustedKey("alice", key.key_id, key.public_raw, ("notes",), (("notes", 2),)),
            TrustedKey("alias", alias, key.public_raw, ("notes",)),
        )
    )
    raw = canonical_json(_manifest())
    name, sig = signature_entry(key, raw)
    aliased = canonical_json(json.loads(sig) | {"key_id": alias})
    data = write_zip(
        [("skill.json", raw), ("component.wasm", COMPONENT), (name, sig),
         (f"signatures/{alias}.sig", aliased)],
        dos=dos_datetime(0),
    )  # fmt: skip
    assert len(read_package(data).signatures) == 2
    with pytest.raises(
        TrustError,
        match=rf"'alias' \({alias}\) is the same public key as {key.key_id} and counts once; "
        rf"threshold not met: skill 'notes' needs 2 distinct trusted keys, has 1 \({key.key_id}\)",
    ):
        verify_package(data, trust)


def test_out_of_scope_signature_does_not_count(key: SigningKey, make_trust: MakeTrust) -> None:
    """For a threshold, only keys whose scope covers the id count; the message says why."""
    second = SigningKey.generate()
    trust = make_trust(("alice", key, ["notes"], {"notes": 2}), ("bob", second, ["todo"]))
    data = build_package(META, COMPONENT, keys=[key, second])
    with pytest.raises(TrustError, match=r"'bob'.*may not sign.*needs 2 distinct trusted keys"):
        verify_package(data, trust)


def test_unknown_extra_signature_is_ignored(key: SigningKey, trust: TrustStore) -> None:
    """A signature by a key the store does not know does not block a trusted one."""
    data = build_package(META, COMPONENT, keys=[key, SigningKey.generate()])
    assert verify_package(data, trust).signers == (key.key_id,)


def test_expected_id_and_version(package: bytes, trust: TrustStore) -> None:
    """A valid package of another skill or version than expected is refused, saying which."""
    with pytest.raises(TrustError, match="package is skill 'notes', expected 'todo'"):
        verify_package(package, trust, expect_id="todo")
    with pytest.raises(TrustError, match=r"version 1\.2\.3 of 'notes', expected 1\.2\.4"):
        verify_package(package, trust, expect_version="1.2.4")


def test_path_errors_name_the_file(tmp_path: Path, trust: TrustStore) -> None:
    """Refusals of a package given by path carry the path as their location."""
    path = tmp_path / "x.skill"
    path.write_bytes(build_package(META, COMPONENT))
    with pytest.raises(PackageError) as err:
        verify_package(path, trust)
    assert err.value.location == str(path)
    assert str(path) in str(err.value)
