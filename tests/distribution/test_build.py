"""skilld build from OCI references: resolved once, pinned in the lock, verified like a
local package, never fetched at run time; an image layout built from without a network."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distribution.conftest import Registry, Signed
from skilld.bundle import Lock, build_bundle
from skilld.cli import main
from skilld.distribution import RegistryOptions, parse_reference, push_package
from skilld.errors import BundleError, DistributionError, TrustError
from skilld.sandbox import Sandbox
from support.env import ROOT, cache_dir

OPEN = RegistryOptions()


def _tree(tmp_path: Path, signed: Signed, *refs: str) -> tuple[Path, Path]:
    """skills/ holding only sources.yaml, and policies/ for echo-wat trusting its key."""
    skills, policies = tmp_path / "skills", tmp_path / "policies"
    skills.mkdir(parents=True)
    (policies / "trust").mkdir(parents=True)
    for name in ("defaults.yaml", "echo-wat.yaml"):
        shutil.copyfile(ROOT / "policies" / name, policies / name)
    shutil.copyfile(signed.trust / "release.pub.json", policies / "trust" / "release.pub.json")
    (skills / "sources.yaml").write_text(
        "packages:\n" + "".join(f"  - {r}\n" for r in refs)
    )
    return skills, policies


def test_build_from_a_reference_pins_its_digest(
    registry: Registry, signed: Signed, sandbox: Sandbox, tmp_path: Path
) -> None:
    """The tag is resolved once and its digest recorded; the bundle loads without the
    distribution client (serving never reaches a registry)."""
    ref = f"{registry.host}/build/echo-wat:stable"
    digest = push_package(signed.v1, parse_reference(ref), OPEN)
    skills, policies = _tree(tmp_path, signed, ref)
    result = build_bundle(skills, policies, tmp_path / "bundle", sandbox=sandbox,
                          cache_dir=cache_dir())
    (source,) = result.lock.sources
    assert (source.ref, source.digest, source.id, source.version) == (
        ref, digest, "echo-wat", "0.1.0"
    )
    assert (result.out / source.package).read_bytes() == signed.v1
    assert Lock.read(result.out / "bundle.lock").sources == result.lock.sources
    loads = (
        "import sys; from pathlib import Path; from skilld.bundle import open_bundle; "
        "from skilld.sandbox import Sandbox\n"
        f"with Sandbox(Path({str(cache_dir())!r})) as sb:\n"
        f"    open_bundle(Path({str(result.out)!r}), sb)\n"
        "assert not {'skilld.distribution', 'oras', 'requests'} & set(sys.modules), sys.modules"
    )
    subprocess.run([sys.executable, "-c", loads], check=True)


def test_a_rebuild_from_the_lock_keeps_a_moved_tag_pinned(
    registry: Registry, signed: Signed, sandbox: Sandbox, tmp_path: Path
) -> None:
    """After the tag moves, --locked fetches the locked digest; a plain build takes the new
    one and says the tag moved; an entry the lock lacks is refused."""
    ref = f"{registry.host}/moving/echo-wat:stable"
    first = push_package(signed.v1, parse_reference(ref), OPEN)
    skills, policies = _tree(tmp_path, signed, ref)
    one = build_bundle(skills, policies, tmp_path / "one", sandbox=sandbox,
                       cache_dir=cache_dir())
    moved = push_package(signed.v2, parse_reference(ref), OPEN)
    assert moved != first
    lock = one.out / "bundle.lock"
    assert main(["build", "-q", "--skills", str(skills), "--policies", str(policies),
                 "-o", str(tmp_path / "pinned"), "--locked", str(lock)]) == 0
    pinned = Lock.read(tmp_path / "pinned" / "bundle.lock")
    assert [(s.digest, s.version) for s in pinned.sources] == [(first, "0.1.0")]
    assert pinned.bundle_digest == one.lock.bundle_digest
    said: list[str] = []
    fresh = build_bundle(skills, policies, tmp_path / "fresh", sandbox=sandbox,
                         cache_dir=cache_dir(), previous=lock, progress=said.append)
    assert [(s.digest, s.version) for s in fresh.lock.sources] == [(moved, "0.2.0")]
    assert any("moved" in line and first in line and moved in line for line in said)
    other = f"{registry.host}/moving/echo-wat:other"
    push_package(signed.v1, parse_reference(other), OPEN)
    (skills / "sources.yaml").write_text(f"packages:\n  - {other}\n")
    with pytest.raises(DistributionError, match="not in the lock") as caught:
        build_bundle(skills, policies, tmp_path / "x", sandbox=sandbox,
                     cache_dir=cache_dir(), locked=lock)
    assert "sources.yaml:2" in str(caught.value)


def test_a_pulled_package_is_verified_like_a_local_one(
    registry: Registry, signed: Signed, sandbox: Sandbox, tmp_path: Path
) -> None:
    """An untrusted signer is refused naming the sources.yaml line; a rollback below
    --previous is refused as for a file."""
    stranger = f"{registry.host}/verify/echo-wat:stranger"
    push_package(signed.stranger, parse_reference(stranger), OPEN)
    skills, policies = _tree(tmp_path, signed, stranger)
    with pytest.raises(TrustError) as caught:
        build_bundle(skills, policies, tmp_path / "b", sandbox=sandbox, cache_dir=cache_dir())
    assert f"sources.yaml:2 ({stranger})" in str(caught.value)
    new, old = f"{registry.host}/verify/echo-wat:new", f"{registry.host}/verify/echo-wat:old"
    push_package(signed.v2, parse_reference(new), OPEN)
    push_package(signed.v1, parse_reference(old), OPEN)
    (skills / "sources.yaml").write_text(f"packages:\n  - {new}\n")
    built = build_bundle(skills, policies, tmp_path / "new", sandbox=sandbox,
                         cache_dir=cache_dir())
    (skills / "sources.yaml").write_text(f"packages:\n  - {old}\n")
    with pytest.raises(BundleError, match=r"from 0\.2\.0 down to 0\.1\.0"):
        build_bundle(skills, policies, tmp_path / "old", sandbox=sandbox, cache_dir=cache_dir(),
                     previous=built.out / "bundle.lock")


def test_a_layout_carried_to_a_machine_without_network_builds_there(
    registry: Registry, signed: Signed, tmp_path: Path
) -> None:
    """pull -o oci:DIR:TAG on the connected side; skilld build in a network namespace with
    no route anywhere (unshare -n) from that directory; the lock pins the same digest."""
    ref = f"{registry.host}/airgap/echo-wat:0.1.0"
    digest = push_package(signed.v1, parse_reference(ref), OPEN)
    carry = tmp_path / "carry"
    env = {**os.environ, "SKILLD_CACHE": str(cache_dir())}
    skilld = [sys.executable, "-m", "skilld"]
    subprocess.run([*skilld, "pull", ref, "-o", f"oci:{carry}:echo-wat-0.1.0"], check=True,
                   env=env, capture_output=True)
    site = tmp_path / "site"
    skills, policies = _tree(site, signed, "oci:../carry:echo-wat-0.1.0")
    shutil.move(carry, site / "carry")
    if shutil.which("unshare") is None or subprocess.run(
        ["unshare", "-n", "true"], check=False
    ).returncode != 0:
        pytest.skip("unshare -n is not permitted here")
    build = subprocess.run(
        ["unshare", "-n", *skilld, "build", "--skills", str(skills), "--policies",
         str(policies), "-o", str(site / "bundle")],
        env={**env, "SKILLD_CACHE": str(tmp_path / "empty-cache")}, capture_output=True,
        text=True, check=False,
    )
    assert build.returncode == 0, build.stderr
    (source,) = Lock.read(site / "bundle" / "bundle.lock").sources
    assert (source.ref, source.digest) == ("oci:../carry:echo-wat-0.1.0", digest)
    # the namespace really had no network: the registry was unreachable from it
    probe = subprocess.run(
        ["unshare", "-n", *skilld, "pull", ref, "-o", str(tmp_path / "p")],
        env=env, capture_output=True, text=True, check=False,
    )
    assert probe.returncode == 1 and "cannot reach" in probe.stderr
