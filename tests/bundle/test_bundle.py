"""Bundles: built reproducibly, loaded strictly, refused when anything differs from the lock."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import threading
from pathlib import Path

import pytest

from skilld.bundle import (
    LOCK,
    BuildResult,
    LoadedBundle,
    Lock,
    open_bundle,
    prehash_bundle,
    verify_lock_signature,
)
from skilld.cli import main
from skilld.errors import BundleError
from skilld.package import SigningKey, trust_file_bytes, trusted_key, write_private_key
from skilld.sandbox import Sandbox
from support.bundle import build


@pytest.fixture(scope="module")
def copy(demo_bundle: BuildResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A writable copy of the demo bundle that tests damage and repair."""
    target = tmp_path_factory.mktemp("copy") / "bundle"
    shutil.copytree(demo_bundle.out, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


# pyrunner: delegate's runner component, bundled because policies/kits/ declares kits.
DEMO_SKILLS = {"echo", "echo-wat", "notes", "pyrunner"}


def test_lock_names_everything(demo_bundle: BuildResult) -> None:
    """The lock lists every file with its digest, each skill, the engine and the policy."""
    lock = demo_bundle.lock
    files = {
        p.relative_to(demo_bundle.out).as_posix() for p in demo_bundle.out.rglob("*") if p.is_file()
    } - {LOCK}
    assert set(lock.files) == files
    assert {s.id for s in lock.skills} == DEMO_SKILLS
    assert len(lock.bundle_digest) == 64 and lock.policy_digest and lock.engine


def test_demo_build_warns_about_nothing(demo_bundle: BuildResult) -> None:
    """The demo policies grant exactly what the demo skills need: a demo build has no warning."""
    assert demo_bundle.warnings == ()


def test_loads_clean(demo_bundle: BuildResult, sandbox: Sandbox) -> None:
    """An untouched bundle loads: every component ready, tables returned."""
    loaded = open_bundle(demo_bundle.out, sandbox)
    assert set(loaded.components) == DEMO_SKILLS
    # a runner entry per kit of policies/kits/ (delegate)
    assert set(loaded.tables.skills) == DEMO_SKILLS | {"kit.notes", "kit.text"}
    assert loaded.tables.digest == loaded.lock.policy_digest


def _files(bundle_root: Path) -> list[str]:
    return sorted(
        p.relative_to(bundle_root).as_posix() for p in bundle_root.rglob("*") if p.is_file()
    )


@pytest.mark.parametrize("ahead", [False, True], ids=["hashed-on-load", "hashed-ahead"])
def test_flipped_byte_is_refused_naming_the_file(copy: Path, sandbox: Sandbox, ahead: bool) -> None:
    """Flipping one byte of any file in the bundle makes loading refuse, naming that file,
    also when the files were hashed ahead (as serve does); no descriptor is left open."""

    def load() -> LoadedBundle:
        if not ahead:
            return open_bundle(copy, sandbox)
        with prehash_bundle(copy) as prehash:
            return open_bundle(copy, sandbox, prehash=prehash)

    files = _files(copy)
    assert len(files) >= 9
    for rel in files:
        path = copy / rel
        original = path.read_bytes()
        damaged = bytearray(original)
        damaged[len(damaged) // 2] ^= 0x01
        path.write_bytes(bytes(damaged))
        try:
            with pytest.raises(BundleError) as info:
                load()
            assert rel in str(info.value), (rel, str(info.value))
        finally:
            path.write_bytes(original)
    loaded = load()  # repaired: loads again
    assert set(loaded.components) == DEMO_SKILLS
    del loaded, info
    gc.collect()  # loaded components keep their native code's file open until freed
    assert not _open_under(copy)


def _open_under(root: Path) -> list[str]:
    """The files below ``root`` this process holds open."""
    held = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue  # closed while listing
        if target.startswith(str(root) + "/"):
            held.append(target)
    return held


def test_fifo_in_place_of_a_file_is_refused_without_hanging(copy: Path, sandbox: Sandbox) -> None:
    """A FIFO where the lock names a file is refused by name at once, hashed ahead or not."""
    victim = next((copy / "trust").iterdir())
    data = victim.read_bytes()
    victim.unlink()
    os.mkfifo(victim)
    outcome: list[BaseException] = []

    def load(ahead: bool) -> None:
        try:
            if ahead:
                with prehash_bundle(copy) as prehash:
                    open_bundle(copy, sandbox, prehash=prehash)
            else:
                open_bundle(copy, sandbox)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    try:
        for ahead in (False, True):
            worker = threading.Thread(target=load, args=(ahead,), daemon=True)
            worker.start()
            worker.join(timeout=30)
            assert not worker.is_alive(), "loading blocked on the FIFO"
            err = outcome.pop()
            assert isinstance(err, BundleError) and "not a regular file" in str(err), err
            assert victim.name in str(err)
    finally:
        victim.unlink()
        victim.write_bytes(data)


def test_prehash_stays_inside_the_bundle(tmp_path: Path) -> None:
    """Hashing ahead opens only plain relative names the (unverified) lock lists."""
    root = tmp_path / "b"
    root.mkdir()
    (root / "ok.txt").write_bytes(b"x")
    (tmp_path / "outside.txt").write_bytes(b"secret")
    files = {"ok.txt": "", "../outside.txt": "", str(tmp_path / "outside.txt"): "", "./ok.txt": ""}
    (root / LOCK).write_text(json.dumps({"files": files}))
    with prehash_bundle(root) as prehash:
        opened = prehash.take("ok.txt")
        assert opened is not None
        os.close(opened[0])
        for rel in list(files)[1:]:
            assert prehash.take(rel) is None, rel


def test_unknown_file_is_refused(copy: Path, sandbox: Sandbox) -> None:
    """A file the lock does not name makes loading refuse, naming it."""
    extra = copy / "native" / "evil.cwasm"
    extra.write_bytes(b"x")
    try:
        with pytest.raises(BundleError, match=r"evil\.cwasm"):
            open_bundle(copy, sandbox)
    finally:
        extra.unlink()


def test_missing_file_is_refused(copy: Path, sandbox: Sandbox) -> None:
    """A file the lock names but that is gone makes loading refuse, naming it."""
    victim = next((copy / "trust").iterdir())
    data = victim.read_bytes()
    victim.unlink()
    try:
        with pytest.raises(BundleError, match=victim.name):
            open_bundle(copy, sandbox)
    finally:
        victim.write_bytes(data)


def test_other_engine_is_refused(copy: Path, sandbox: Sandbox) -> None:
    """Native code for another engine fingerprint is refused unless recompiling is asked for."""
    lock_path = copy / LOCK
    original = lock_path.read_bytes()
    raw = json.loads(original)
    raw["engine"] = "0" * 16
    lock = Lock.read(lock_path)
    forged = Lock(
        **{**{f: getattr(lock, f) for f in lock.__dataclass_fields__}, "engine": "0" * 16}
    )
    lock_path.write_bytes(forged.to_json())
    try:
        with pytest.raises(BundleError, match="compiled for engine") as info:
            open_bundle(copy, sandbox)
        assert "bundle.lock" in str(info.value)
        loaded = open_bundle(copy, sandbox, recompile=True)
        assert set(loaded.components) == DEMO_SKILLS
    finally:
        lock_path.write_bytes(original)


def test_same_inputs_same_digest(
    demo_bundle: BuildResult, sandbox: Sandbox, tmp_path: Path
) -> None:
    """Two builds from the same inputs give the same bundle digest."""
    again = build(sandbox, tmp_path / "again")
    assert again.lock.bundle_digest == demo_bundle.lock.bundle_digest
    assert again.lock.policy_digest == demo_bundle.lock.policy_digest


@pytest.mark.slow
def test_same_digest_with_native_code_compiled_anew(
    demo_bundle: BuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Native code compiled again from the same components gives the same bundle digest.

    The components come from the shared cache: componentize-py 0.25 does not build
    byte-identical components twice (upstream componentize-py#247), so "the same
    inputs" of a bundle are its components (or packages), its policy and the engine.
    """
    from skilld.bundle import build_bundle
    from support.env import ROOT, cache_dir

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "315532800")
    cold = tmp_path / "cold-native"
    cold.mkdir(mode=0o700)
    with Sandbox(cold) as fresh:
        again = build_bundle(
            ROOT / "skills", ROOT / "policies", tmp_path / "b", sandbox=fresh, cache_dir=cache_dir()
        )
    assert list(cold.rglob("*.cwasm")), "native code was not compiled anew"
    assert again.lock.bundle_digest == demo_bundle.lock.bundle_digest


def _signed_bundle(sandbox: Sandbox, tmp_path: Path) -> tuple[Path, Path]:
    key = SigningKey.generate()
    write_private_key(key, tmp_path / "bundle.key")
    trust = tmp_path / "bundle.pub.json"
    trust.write_bytes(trust_file_bytes(trusted_key("bundle", key.public_raw, ["*"])))
    out = build(sandbox, tmp_path / "signed", bundle_key=tmp_path / "bundle.key").out
    for path in [out, *out.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out, trust


def test_signed_lock(sandbox: Sandbox, tmp_path: Path) -> None:
    """A lock signed with a bundle key verifies with its trust file; a changed lock does not."""
    out, trust = _signed_bundle(sandbox, tmp_path)
    verify = verify_lock_signature(trust)
    open_bundle(out, sandbox, verify_lock=verify)
    sig = out / "bundle.lock.sig"
    sig.write_bytes(sig.read_bytes().replace(b'"signature":"', b'"signature":"AAAA'))
    with pytest.raises(BundleError, match="lock signature"):
        open_bundle(out, sandbox, verify_lock=verify)
    other = SigningKey.generate()
    other_trust = tmp_path / "other.pub.json"
    other_trust.write_bytes(trust_file_bytes(trusted_key("other", other.public_raw, ["*"])))
    with pytest.raises(BundleError, match="signed by key"):
        open_bundle(out, sandbox, verify_lock=verify_lock_signature(other_trust))


def test_signed_bundle_every_flipped_byte(sandbox: Sandbox, tmp_path: Path) -> None:
    """With a lock key, flipping a byte of any file, the signature included, is refused."""
    out, trust = _signed_bundle(sandbox, tmp_path)
    verify = verify_lock_signature(trust)
    files = _files(out)
    assert "bundle.lock.sig" in files
    for rel in files:
        path = out / rel
        original = path.read_bytes()
        # the middle byte, and for the small JSON signature one inside its base64 text
        at = original.index(b'"signature":"') + 20 if rel.endswith(".sig") else len(original) // 2
        damaged = bytearray(original)
        damaged[at] ^= 0x01
        path.write_bytes(bytes(damaged))
        try:
            with pytest.raises(BundleError) as info:
                open_bundle(out, sandbox, verify_lock=verify)
            named = rel if rel != "bundle.lock" else "bundle.lock"
            assert named in str(info.value) or "bundle.lock.sig" in str(info.value), (rel, info)
        finally:
            path.write_bytes(original)
    open_bundle(out, sandbox, verify_lock=verify)


def test_unchecked_signature_is_reported(
    sandbox: Sandbox, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A signed bundle served without a lock key loads, and says its signature went unchecked."""
    out, _ = _signed_bundle(sandbox, tmp_path)
    with caplog.at_level("WARNING", logger="skilld.bundle"):
        open_bundle(out, sandbox)
    assert any(
        "bundle.lock.sig is present but not checked" in r.getMessage() for r in caplog.records
    )


def test_lock_naming_unlisted_native_is_refused(copy: Path) -> None:
    """A lock whose skill points at a file its file list lacks is refused, naming the lock."""
    lock = Lock.read(copy / LOCK)
    files = dict(lock.files)
    del files[lock.skills[0].native]
    forged = Lock(**{**{f: getattr(lock, f) for f in lock.__dataclass_fields__}, "files": files})
    with pytest.raises(BundleError, match=r"bundle\.lock: malformed lock: native/"):
        Lock.parse(forged.to_json(), str(copy / LOCK))


def test_downgrade_refused(demo_bundle: BuildResult, sandbox: Sandbox, tmp_path: Path) -> None:
    """A skill version below the previous lock's is refused unless --allow-downgrade."""
    lock = json.loads((demo_bundle.out / LOCK).read_bytes())
    for skill in lock["skills"]:
        if skill["id"] == "echo":
            skill["version"] = "9.0.0"
    lock_obj = Lock.read(demo_bundle.out / LOCK)
    raised = Lock(
        **{
            **{f: getattr(lock_obj, f) for f in lock_obj.__dataclass_fields__},
            "skills": tuple(
                s
                if s.id != "echo"
                else type(s)(
                    **{**{f: getattr(s, f) for f in s.__dataclass_fields__}, "version": "9.0.0"}
                )
                for s in lock_obj.skills
            ),
        }
    )
    previous = tmp_path / "previous.lock"
    previous.write_bytes(raised.to_json())
    with pytest.raises(BundleError, match=r"'echo' would go from 9\.0\.0 down to 0\.1\.0"):
        build(sandbox, tmp_path / "down", previous=previous)
    build(sandbox, tmp_path / "down", previous=previous, allow_downgrade=True)


@pytest.mark.parametrize(
    ("before", "after", "down"),
    [
        ("1.9.0", "1.10.0", False),  # numeric, not textual: 10 > 9
        ("1.10.0", "1.9.0", True),
        ("2.0.0", "2.0.0-rc.1", True),  # a pre-release sorts below its release
        ("2.0.0-rc.1", "2.0.0", False),
        ("1.0.0-beta.11", "1.0.0-beta.2", True),  # numeric identifiers compare as numbers
        ("1.0.0-alpha.1", "1.0.0-alpha.beta", False),  # numbers sort below text
        ("1.0.0+build.2", "1.0.0+build.1", False),  # build metadata has no precedence
    ],
)
def test_downgrade_uses_semver_precedence(before: str, after: str, down: bool) -> None:
    """Downgrades are judged by Semantic Versioning precedence, not by string order."""
    from skilld.bundle._build import _check_downgrades

    previous = type("L", (), {"skills": (type("S", (), {"id": "x", "version": before}),)})()
    if down:
        with pytest.raises(BundleError, match=f"from {re.escape(before)} down to"):
            _check_downgrades(previous, [("x", after)], allow_downgrade=False)  # type: ignore[arg-type]
    else:
        _check_downgrades(previous, [("x", after)], allow_downgrade=False)  # type: ignore[arg-type]
    _check_downgrades(previous, [("x", after)], allow_downgrade=True)  # type: ignore[arg-type]


def test_build_cli_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """skilld build prints a summary table with skills, methods, sizes and the digest."""
    from support.env import ROOT

    code = main(
        [
            "build",
            "--skills",
            str(ROOT / "skills"),
            "--policies",
            str(ROOT / "policies"),
            "-o",
            str(tmp_path / "b"),
            "-q",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "echo" in out and "notes" in out and "digest" in out


def test_build_cli_quiet_still_shows_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-q drops the progress lines, not the warnings (named by the policies path as given)."""
    from support.env import ROOT

    policies = ROOT / "docs" / "examples" / "policies"
    args = ["build", "--skills", str(ROOT / "skills"), "--policies", str(policies)]
    assert main([*args, "-o", str(tmp_path / "b"), "-q"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {policies}/notes.yaml:6: notes.notes-dir is granted but" in err
    assert all(line.startswith("warning: ") for line in err.splitlines())  # no progress
