"""The trust-store loader: accepts what keygen writes, refuses malformed files by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from skilld.errors import TrustError
from skilld.package import (
    SigningKey,
    load_trust,
    trust_file_bytes,
    trusted_key,
)


def _write(directory: Path, name: str, doc: Any) -> Path:
    path = directory / f"{name}.pub.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _doc(key: SigningKey, **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        trust_file_bytes(trusted_key("alice", key.public_raw, ["notes", "acme-*"]))
    )
    doc.update(changes)
    return doc


def test_round_trip(tmp_path: Path, key: SigningKey) -> None:
    """A trust file written by trust_file_bytes loads back with its scope and thresholds."""
    trusted = trusted_key("alice", key.public_raw, ["acme-*"], thresholds={"acme-*": 2})
    (tmp_path / "alice.pub.json").write_bytes(trust_file_bytes(trusted))
    (tmp_path / "README.md").write_text("not a key")
    store = load_trust(tmp_path)
    assert store.keys == (trusted_key("alice", key.public_raw, ["acme-*"], thresholds={"acme-*": 2},
                                      source=str(tmp_path / "alice.pub.json")),)  # fmt: skip
    assert store.get(key.key_id) is not None
    assert store.threshold("acme-notes") == 2
    assert store.threshold("notes") == 1


def test_strictest_threshold_applies(tmp_path: Path) -> None:
    """When two trust files set thresholds for the same id, the larger one wins."""
    a, b = SigningKey.generate(), SigningKey.generate()
    for name, k, n in (("a", a, 2), ("b", b, 3)):
        trusted = trusted_key(name, k.public_raw, ["*"], thresholds={"acme-*": n})
        (tmp_path / f"{name}.pub.json").write_bytes(trust_file_bytes(trusted))
    assert load_trust(tmp_path).threshold("acme-x") == 3


def test_missing_directory(tmp_path: Path) -> None:
    """A trust directory that does not exist is refused, naming it."""
    with pytest.raises(TrustError, match="does not exist") as err:
        load_trust(tmp_path / "nope")
    assert err.value.location == str(tmp_path / "nope")


@pytest.mark.parametrize(
    ("changes", "cause"),
    [
        ({"key_id": "0000000000000000"}, "is not the id of this public key"),
        ({"public_key": "not base64!"}, "not valid base64"),
        ({"public_key": "AAAA"}, "must be 32 bytes"),
        ({"scope": []}, "non-empty list"),
        ({"scope": "notes"}, "non-empty list"),
        ({"scope": ["Notes"]}, "scope pattern 'Notes'"),
        ({"scope": ["no?tes"]}, "scope pattern"),
        ({"threshold": {"notes": 0}}, "integer 1..64"),
        ({"threshold": {"notes": "2"}}, "integer 1..64"),
        ({"threshold": ["notes"]}, "'threshold' must map"),
        ({"name": "has space"}, "key name"),
        ({"name": "alice\n"}, r"key name 'alice\\n' must match"),
        ({"scope": ["notes\n"]}, r"scope pattern 'notes\\n'"),
        ({"threshold": {"notes\n": 2}}, r"scope pattern 'notes\\n'"),
        ({"owner": "me"}, "unknown field"),
    ],
)
def test_malformed_files_named(
    tmp_path: Path, key: SigningKey, changes: dict[str, Any], cause: str
) -> None:
    """Each malformed field is refused with the file's path and the cause."""
    path = _write(tmp_path, "alice", _doc(key, **changes))
    with pytest.raises(TrustError, match=cause) as err:
        load_trust(tmp_path)
    assert err.value.location == str(path)


def test_missing_field_named(tmp_path: Path, key: SigningKey) -> None:
    """A trust file without its scope is refused, naming the field and the file."""
    doc = _doc(key)
    del doc["scope"]
    path = _write(tmp_path, "alice", doc)
    with pytest.raises(TrustError, match=r"missing field.*scope") as err:
        load_trust(tmp_path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("text", ["{", "[]", '{"name": "a", "name": "b"}', "\xff"])
def test_not_json_named(tmp_path: Path, text: str) -> None:
    """Broken JSON, a non-object or duplicate keys are refused, naming the file."""
    path = _write(tmp_path, "broken", text)
    with pytest.raises(TrustError) as err:
        load_trust(tmp_path)
    assert err.value.location == str(path)


def test_same_key_twice_refused(tmp_path: Path, key: SigningKey) -> None:
    """The same public key in two trust files is refused: a key may count only once."""
    _write(tmp_path, "alice", _doc(key))
    second = _write(tmp_path, "zed", _doc(key, name="zed"))
    with pytest.raises(TrustError, match=f"key {key.key_id} is already trusted as 'alice'") as err:
        load_trust(tmp_path)
    assert err.value.location == str(second)


def test_same_name_twice_refused(tmp_path: Path, key: SigningKey) -> None:
    """Two trust files using one key name are refused."""
    _write(tmp_path, "alice", _doc(key))
    other = SigningKey.generate()
    _write(tmp_path, "alice2", _doc(other, key_id=other.key_id, public_key=other.public_b64))
    with pytest.raises(TrustError, match="key name 'alice' is already used"):
        load_trust(tmp_path)
