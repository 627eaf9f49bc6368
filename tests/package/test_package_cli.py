"""``skilld keygen|pack|sign|verify|inspect`` run in-process as a user types them."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from skilld.cli import main
from skilld.package import SkillMeta, build_package, load_private_key, load_trust, read_package

SKILL_YAML = """\
id: notes
name: Notes
version: 1.0.0
description: Keeps notes.
needs:
  kv: {}
  http:
    - https://api.example.com/*
"""


@pytest.fixture
def skill_dir(tmp_path: Path) -> Path:
    """A skill source directory with skill.yaml, SKILL.md, a resource and a component file."""
    src = tmp_path / "notes"
    (src / "resources").mkdir(parents=True)
    (src / "skill.yaml").write_text(SKILL_YAML)
    (src / "SKILL.md").write_text("# Notes\n")
    (src / "resources" / "prompt.txt").write_text("be brief")
    (tmp_path / "component.wasm").write_bytes(b"\0asm" + bytes(range(256)))
    return src


@pytest.fixture
def signer(tmp_path: Path) -> tuple[Path, Path]:
    """A key made by ``skilld keygen`` and its trust directory (scope ``notes``)."""
    key, trust = tmp_path / "release.key", tmp_path / "trust"
    rc = main(["keygen", "-o", str(key), "--trust-out", str(trust / "release.pub.json"),
               "--scope", "notes"])  # fmt: skip
    assert rc == 0
    return key, trust


def _run_pack(skill_dir: Path, out: Path, *signing: str) -> int:
    """The exit status of ``skilld pack`` of ``skill_dir`` with its built component (beside
    it) into ``out``, signed as the options ``signing`` say."""
    component = skill_dir.parent / "component.wasm"
    return main(["pack", str(skill_dir), *signing, "--component", str(component), "-o", str(out)])


def _pack(skill_dir: Path, key: Path, out: Path) -> str:
    """Pack ``skill_dir`` into ``out`` signed by ``key``; the package's sha256."""
    assert _run_pack(skill_dir, out, "--key", str(key)) == 0
    return hashlib.sha256(out.read_bytes()).hexdigest()


def test_keygen_writes_0600_key_and_prints_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """keygen writes the private key with mode 0600 and a trust file naming its key id."""
    key, trust = tmp_path / "release.key", tmp_path / "trust"
    assert main(["keygen", "-o", str(key), "--trust-out", str(trust / "release.pub.json"),
                 "--scope", "notes"]) == 0  # fmt: skip
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    kid = load_private_key(key).key_id
    assert f"key id:     {kid}" in capsys.readouterr().out
    store = load_trust(trust)
    assert [(k.name, k.key_id, k.scope) for k in store.keys] == [("release", kid, ("notes",))]


def test_keygen_refuses_to_overwrite(signer: tuple[Path, Path]) -> None:
    """keygen never replaces an existing key unless told to."""
    key, _ = signer
    before = key.read_bytes()
    assert main(["keygen", "-o", str(key)]) == 2
    assert key.read_bytes() == before


def test_keygen_passphrase_from_env_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key encrypted with a passphrase from the environment loads only with that passphrase."""
    monkeypatch.setenv("KEY_PASS", "correct horse")
    key = tmp_path / "enc.key"
    assert main(["keygen", "-o", str(key), "--passphrase-env", "KEY_PASS"]) == 0
    assert b"ENCRYPTED" in key.read_bytes()
    pass_file = tmp_path / "pass"
    pass_file.write_text("correct horse\n")
    src = tmp_path / "s"
    src.mkdir()
    (src / "skill.yaml").write_text(SKILL_YAML)
    wasm = tmp_path / "c.wasm"
    wasm.write_bytes(b"x")
    base = ["pack", str(src), "--key", str(key), "--component", str(wasm), "-o",
            str(tmp_path / "o.skill")]  # fmt: skip
    assert main(base) == 2  # no passphrase given
    assert main([*base, "--passphrase-file", str(pass_file)]) == 0
    monkeypatch.setenv("KEY_PASS", "wrong")
    assert main([*base, "--passphrase-env", "KEY_PASS"]) == 2


def test_no_passphrase_on_argv() -> None:
    """There is no option that takes a passphrase on the command line."""
    with pytest.raises(SystemExit):
        main(["keygen", "-o", "x", "--passphrase", "secret"])


def test_pack_is_deterministic(
    tmp_path: Path, skill_dir: Path, signer: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packing twice gives the same sha256; one changed source byte gives another."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    key, _ = signer
    first = _pack(skill_dir, key, tmp_path / "a.skill")
    assert _pack(skill_dir, key, tmp_path / "b.skill") == first
    (skill_dir / "SKILL.md").write_text("# Notez\n")
    assert _pack(skill_dir, key, tmp_path / "c.skill") != first
    (skill_dir / "SKILL.md").write_text("# Notes\n")
    assert _pack(skill_dir, key, tmp_path / "d.skill") == first
    component = skill_dir.parent / "component.wasm"
    component.write_bytes(component.read_bytes()[:-1] + b"\0")
    changed = _pack(skill_dir, key, tmp_path / "e.skill")
    assert changed != first
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1800000000")
    assert _pack(skill_dir, key, tmp_path / "f.skill") != changed


def test_pack_then_verify(
    tmp_path: Path, skill_dir: Path, signer: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A packed skill verifies against the trust directory keygen wrote (exit 0)."""
    key, trust = signer
    out = tmp_path / "notes.skill"
    _pack(skill_dir, key, out)
    capsys.readouterr()
    assert main(["verify", str(out), "--trust", str(trust), "--expect-id", "notes",
                 "--expect-version", "1.0.0"]) == 0  # fmt: skip
    assert capsys.readouterr().out.startswith("OK: notes 1.0.0")
    names = set(read_package(out).files)
    assert names == {"SKILL.md", "component.wasm", "resources/prompt.txt"}


def test_verify_fails_and_says_why(
    tmp_path: Path, skill_dir: Path, signer: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """verify exits 1 and prints the cause for a wrong id, an unknown key and a damaged file."""
    key, trust = signer
    out = tmp_path / "notes.skill"
    _pack(skill_dir, key, out)
    capsys.readouterr()
    assert main(["verify", str(out), "--trust", str(trust), "--expect-id", "todo"]) == 1
    assert "expected 'todo'" in capsys.readouterr().err
    empty = tmp_path / "empty-trust"
    empty.mkdir()
    assert main(["verify", str(out), "--trust", str(empty)]) == 1
    assert "unknown key" in capsys.readouterr().err
    data = bytearray(out.read_bytes())
    data[100] ^= 0xFF
    out.write_bytes(bytes(data))
    assert main(["verify", str(out), "--trust", str(trust)]) == 1
    assert str(out) in capsys.readouterr().err


def test_inspect_shows_needs_and_signer(
    tmp_path: Path, skill_dir: Path, signer: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """inspect prints the declared needs, every file's digest and the signer's key id."""
    key, _ = signer
    out = tmp_path / "notes.skill"
    _pack(skill_dir, key, out)
    kid = load_private_key(key).key_id
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "https://api.example.com/*" in text and '"kv": {}' in text
    assert kid in text
    assert hashlib.sha256(b"# Notes\n").hexdigest() in text
    assert main(["inspect", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["manifest"]["needs"] == {"kv": {}, "http": ["https://api.example.com/*"]}
    assert doc["signatures"] == [kid]
    assert doc["signatures_verified"] is False


def test_inspect_escapes_what_it_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """inspect escapes invisible characters in the unverified name and indents every line."""
    meta = SkillMeta("notes", "Notes\u202egnp.exe", "1.0.0", "One.\nsigned by: x\u200b")
    out = tmp_path / "notes.skill"
    out.write_bytes(build_package(meta, b"\0asm"))
    assert main(["inspect", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["notes 1.0.0: Notes\\u202egnp.exe", "  One.", "  signed by: x\\u200b"]


def test_pack_refuses_control_characters_in_skill_yaml(
    tmp_path: Path, skill_dir: Path, signer: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A control character in skill.yaml's name is refused before building, naming the file."""
    (skill_dir / "skill.yaml").write_text(SKILL_YAML.replace("name: Notes", 'name: "No\\ttes"'))
    assert _run_pack(skill_dir, tmp_path / "x.skill", "--key", str(signer[0])) != 0
    err = capsys.readouterr().err
    assert "skill.yaml" in err and "'name' holds the control character '\\t'" in err


def test_sign_meets_a_threshold(
    tmp_path: Path, skill_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second key added with 'skilld sign' meets a threshold of two; signing again is a no-op."""
    trust = tmp_path / "trust"
    for name in ("a", "b"):
        assert main(["keygen", "-o", str(tmp_path / f"{name}.key"), "--trust-out",
                     str(trust / f"{name}.pub.json"), "--scope", "notes", "--threshold",
                     "notes=2"]) == 0  # fmt: skip
    out = tmp_path / "notes.skill"
    _pack(skill_dir, tmp_path / "a.key", out)
    assert main(["verify", str(out), "--trust", str(trust)]) == 1
    assert "needs 2 distinct trusted keys, has 1" in capsys.readouterr().err
    assert main(["sign", str(out), "--key", str(tmp_path / "b.key")]) == 0
    assert main(["verify", str(out), "--trust", str(trust)]) == 0
    before = out.read_bytes()
    assert main(["sign", str(out), "--key", str(tmp_path / "b.key")]) == 0
    assert "already signed" in capsys.readouterr().out
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_sign_refuses_a_damaged_package(
    tmp_path: Path, skill_dir: Path, signer: tuple[Path, Path]
) -> None:
    """sign checks the package first and leaves a damaged one untouched."""
    key, _ = signer
    out = tmp_path / "notes.skill"
    _pack(skill_dir, key, out)
    data = bytearray(out.read_bytes())
    data[60] ^= 1
    out.write_bytes(bytes(data))
    assert main(["sign", str(out), "--key", str(key)]) == 1
    assert out.read_bytes() == bytes(data)


def test_pack_with_ephemeral_key(tmp_path: Path, skill_dir: Path) -> None:
    """--ephemeral-key-out signs with a fresh key (reused on re-runs) and a trust file for it."""
    keys = tmp_path / "ephemeral"
    out = tmp_path / "notes.skill"
    assert _run_pack(skill_dir, out, "--ephemeral-key-out", str(keys)) == 0
    assert stat.S_IMODE((keys / "notes.key").stat().st_mode) == 0o600
    assert [k.scope for k in load_trust(keys).keys] == [("notes",)]
    assert main(["verify", str(out), "--trust", str(keys)]) == 0
    again = tmp_path / "again.skill"
    assert _run_pack(skill_dir, again, "--ephemeral-key-out", str(keys)) == 0
    assert again.read_bytes() == out.read_bytes()  # the key in DIR is reused


def test_pack_needs_a_key(tmp_path: Path, skill_dir: Path) -> None:
    """pack without --key or --ephemeral-key-out is a usage error (exit 2)."""
    assert _run_pack(skill_dir, tmp_path / "x.skill") == 2


def test_pack_refuses_bad_skill_yaml(
    tmp_path: Path, skill_dir: Path, signer: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A skill.yaml with a non-semver or unquoted numeric version is refused, naming the file."""
    (skill_dir / "skill.yaml").write_text(SKILL_YAML.replace("1.0.0", "v1.0.0"))
    assert _run_pack(skill_dir, tmp_path / "x.skill", "--key", str(signer[0])) != 0
    err = capsys.readouterr().err
    assert "skill.yaml" in err and "not a semantic version" in err
    (skill_dir / "skill.yaml").write_text(SKILL_YAML.replace("1.0.0", "1.0"))
    assert _run_pack(skill_dir, tmp_path / "x.skill", "--key", str(signer[0])) != 0
    assert "quote it" in capsys.readouterr().err


def test_pack_refuses_symlinked_resource(
    tmp_path: Path, skill_dir: Path, signer: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A symbolic link under resources/ is refused rather than followed."""
    (skill_dir / "resources" / "passwd").symlink_to("/etc/passwd")
    assert _run_pack(skill_dir, tmp_path / "x.skill", "--key", str(signer[0])) != 0
    assert "symbolic link" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["keygen", "pack", "sign", "verify", "inspect"])
def test_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every command has a --help that describes it."""
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert len(capsys.readouterr().out) > 300


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: p.write_text("# not a package\n"), "not a zip archive; it begins '# not a"),
        (lambda p: p.write_bytes(b""), "it is empty"),
        (lambda p: p.mkdir(), "a directory"),
    ],
)
def test_inspect_says_when_it_is_not_a_package(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, why: str
) -> None:
    """inspect (and verify) on something that is no package says so, with what it is instead."""
    target = tmp_path / "README.md"
    make(target)  # type: ignore[operator]
    assert main(["inspect", str(target)]) == 1
    err = capsys.readouterr().err
    assert f"{target}: not a .skill package ({why}" in err
    assert "'skilld pack'" in err
