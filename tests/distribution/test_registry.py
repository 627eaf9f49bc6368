"""Push and pull against a real registry (docker-registry) and image layout directories."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from distribution.conftest import CuttingProxy, Registry, Signed, TokenServer, start_registry
from skilld.cli import main
from skilld.distribution import (
    ARTIFACT_TYPE,
    LayoutStore,
    RegistryOptions,
    fetch_layer,
    open_store,
    parse_reference,
    pull_sources,
    push_package,
    read_sources,
    resolve,
    resolve_in,
)
from skilld.errors import DigestMismatch, DistributionError, UsageError

OPEN = RegistryOptions()


def _push(tmp_path: Path, data: bytes, ref: str, capsys: pytest.CaptureFixture[str]) -> str:
    pkg = tmp_path / "in.skill"
    pkg.write_bytes(data)
    assert main(["push", str(pkg), ref]) == 0
    return capsys.readouterr().out.strip()


def test_push_then_pull_by_tag_and_by_digest(
    registry: Registry, signed: Signed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """push prints the manifest digest; pull by tag and by that digest give the same bytes."""
    ref = f"{registry.host}/skills/echo-wat:0.1.0"
    digest = _push(tmp_path, signed.v1, ref, capsys)
    artifact = resolve(parse_reference(ref), OPEN)
    assert artifact.digest == digest
    assert digest == "sha256:" + hashlib.sha256(artifact.manifest).hexdigest()
    manifest = json.loads(artifact.manifest)
    assert manifest["artifactType"] == ARTIFACT_TYPE
    assert [layer["digest"] for layer in manifest["layers"]] == [
        "sha256:" + hashlib.sha256(signed.v1).hexdigest()
    ]
    assert artifact.annotations["dev.skilld.skill.id"] == "echo-wat"
    assert artifact.annotations["dev.skilld.skill.version"] == "0.1.0"
    for by in (ref, f"{registry.host}/skills/echo-wat@{digest}"):
        out = tmp_path / by.rsplit("@" if "@" in by else ":", 1)[1].replace(":", "-")
        assert main(["pull", by, "-o", str(out)]) == 0
        assert capsys.readouterr().out.split()[0] == digest
        assert (out / "echo-wat-0.1.0.skill").read_bytes() == signed.v1


def test_the_same_package_has_the_same_digest_everywhere(
    registry: Registry, signed: Signed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The artifact manifest is canonical: another tag, or a layout, gives the same digest."""
    a = _push(tmp_path, signed.v1, f"{registry.host}/skills/echo-wat:same-a", capsys)
    b = _push(tmp_path, signed.v1, f"{registry.host}/other/echo:same-b", capsys)
    c = _push(tmp_path, signed.v1, f"oci:{tmp_path / 'layout'}:same-c", capsys)
    assert a == b == c


def test_a_tampered_layer_is_refused_naming_it(
    registry: Registry, signed: Signed, tmp_path: Path
) -> None:
    """A registry serving changed bytes: the pull fails naming the layer; nothing is kept."""
    ref = parse_reference(f"{registry.host}/tamper/echo-wat:0.1.0")
    push_package(signed.v1, ref, OPEN)
    artifact = resolve(ref, OPEN)
    blob = registry.blob_file(artifact.layer_digest)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    blobs = tmp_path / "blobs"
    try:
        with pytest.raises(DigestMismatch, match=artifact.layer_digest) as caught:
            fetch_layer(open_store(ref, OPEN), artifact, blobs)
    finally:  # blobs are shared by every repository of the registry
        blob.write_bytes(signed.v1)
    assert str(ref) in str(caught.value)
    assert not [p for p in blobs.rglob("*") if p.is_file()]


def test_a_download_resumes_from_its_partial_file(
    registry: Registry, signed: Signed, tmp_path: Path
) -> None:
    """A partial download is continued with a range request, never started over."""
    ref = parse_reference(f"{registry.host}/resume/echo-wat:0.1.0")
    push_package(signed.v1, ref, OPEN)
    artifact = resolve(ref, OPEN)
    dest = tmp_path / "blobs" / "sha256" / artifact.layer_digest[7:]
    partial = dest.with_name(dest.name + ".partial")
    partial.parent.mkdir(parents=True)
    half = len(signed.v1) // 2
    # A wrong first half proves the partial file was continued (a restart would succeed).
    partial.write_bytes(b"\0" * half)
    with pytest.raises(DigestMismatch):
        fetch_layer(open_store(ref, OPEN), artifact, tmp_path / "blobs")
    assert not partial.exists()
    partial.write_bytes(signed.v1[:half])
    assert fetch_layer(open_store(ref, OPEN), artifact, tmp_path / "blobs").read_bytes() == (
        signed.v1
    )


def test_a_layer_over_the_cap_is_refused_before_downloading(
    registry: Registry, signed: Signed
) -> None:
    """The manifest's declared size is checked against the cap before any layer byte."""
    ref = parse_reference(f"{registry.host}/cap/echo-wat:0.1.0")
    push_package(signed.v1, ref, OPEN)
    with pytest.raises(DistributionError, match=r"over the 1000-byte package limit"):
        resolve(ref, OPEN, cap=1000)


def test_another_artifact_type_is_refused(registry: Registry) -> None:
    """A manifest that is not a skilld package is refused as the wrong artifact type."""
    ref = parse_reference(f"{registry.host}/foreign/thing:1")
    store = open_store(ref, OPEN)
    config = store.put_blob(b"{}")
    layer = store.put_blob(b"hello")
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.example.thing.v1",
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": config, "size": 2},
        "layers": [{"mediaType": "text/plain", "digest": layer, "size": 5}],
    }).encode()
    store.put_manifest(manifest, "application/vnd.oci.image.manifest.v1+json", "1")
    with pytest.raises(DistributionError, match=r"wrong artifact type: application/vnd\.example"):
        resolve(ref, OPEN)


def test_a_missing_tag_is_not_found(registry: Registry) -> None:
    """An unknown tag says not found, naming the reference."""
    with pytest.raises(DistributionError, match=r"not found: manifest nope") as caught:
        resolve(parse_reference(f"{registry.host}/skills/echo-wat:nope"), OPEN)
    assert "skills/echo-wat:nope" in str(caught.value)


def test_auth_is_required_and_read_from_auth_json(
    private_registry: Registry,
    signed: Signed,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without credentials: unauthorized, saying where they go; with an auth.json: push and
    pull work; a wrong password: unauthorized, naming the file that held it."""
    ref = f"{private_registry.host}/private/echo-wat:0.1.0"
    pkg = tmp_path / "echo.skill"
    pkg.write_bytes(signed.v1)
    assert main(["push", str(pkg), ref]) == 1
    err = capsys.readouterr().err
    assert "unauthorized" in err and "auth.json" in err
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(private_registry.auth_file(tmp_path / "a.json")))
    assert main(["push", str(pkg), ref]) == 0
    digest = capsys.readouterr().out.strip()
    assert main(["pull", ref, "-o", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.split()[0] == digest
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"auths": {private_registry.host: {"username": "ci",
                                                                   "password": "nope"}}}))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(wrong))
    with pytest.raises(DistributionError, match="unauthorized") as caught:
        resolve(parse_reference(ref), OPEN)
    assert str(wrong) in str(caught.value)


def test_a_registry_that_goes_away_fails_at_once(tmp_path: Path) -> None:
    """A registry that stops answering, before or after the store reached it, is an error
    naming it within seconds (oras-py's own retry would sleep for minutes)."""
    import time

    registry, proc = start_registry(tmp_path / "gone")
    ref = parse_reference(f"{registry.host}/x/y:1")
    store = open_store(ref, OPEN)
    proc.terminate()
    proc.wait(10)
    start = time.monotonic()
    with pytest.raises(DistributionError, match=f"cannot reach {registry.host}"):
        resolve_in(store, ref)
    with pytest.raises(DistributionError, match=f"cannot reach {registry.host}"):
        resolve(ref, OPEN)
    assert time.monotonic() - start < 5


def test_pull_into_a_layout_keeps_the_digest(
    registry: Registry, signed: Signed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pull -o oci:DIR:TAG copies the artifact unchanged; the layout serves it offline."""
    ref = f"{registry.host}/skills/echo-wat:layout"
    digest = _push(tmp_path, signed.v1, ref, capsys)
    layout = tmp_path / "carry"
    assert main(["pull", ref, "-o", f"oci:{layout}:echo-wat-0.1.0"]) == 0
    capsys.readouterr()
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    local = parse_reference(f"oci:{layout}:echo-wat-0.1.0")
    assert resolve(local, OPEN).digest == digest
    assert main(["pull", f"oci:{layout}@{digest}", "-o", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "echo-wat-0.1.0.skill").read_bytes() == signed.v1


def test_tls_with_a_custom_ca(
    tls_registry: tuple[Registry, Path], signed: Signed, tmp_path: Path
) -> None:
    """An HTTPS registry whose CA is unknown is refused (never downgraded to plain HTTP,
    even on loopback); given its CA, in sources.yaml's registries, it serves."""
    registry, ca = tls_registry
    ref = parse_reference(f"{registry.host}/tls/echo-wat:0.1.0")
    with pytest.raises(DistributionError, match=r"TLS with .* failed") as caught:
        push_package(signed.v1, ref, OPEN)
    assert "ca_file" in str(caught.value)
    (tmp_path / "ca.pem").write_bytes(ca.read_bytes())
    listing = tmp_path / "sources.yaml"
    listing.write_text(
        f"packages:\n  - {ref}\nregistries:\n  {registry.host}:\n    ca_file: ca.pem\n"
    )
    sources = read_sources(listing)
    options = sources.options(ref)
    digest = push_package(signed.v1, ref, options)
    (pulled,) = pull_sources(sources, tmp_path / "blobs")
    assert pulled.artifact.digest == digest
    assert pulled.path.read_bytes() == signed.v1


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("packages: [1]", ":1: each package is a reference"),
        ("packages:\n  - nohost/repo:1\n", ":2: nohost/repo:1: name the registry"),
        ("packages:\n  - a.io/r:1\n  - a.io/r:1\n", ":3: a.io/r:1 is listed twice"),
        ("pakages: []\n", ":1: unknown key 'pakages'"),
        ("registries:\n  a.io:\n    plain: true\n", ":3: unknown key 'plain'"),
        ("registries:\n  a.io:\n    ca_file: nope.pem\n", ":3: ca_file"),
    ],
)
def test_sources_yaml_mistakes_name_their_line(text: str, error: str, tmp_path: Path) -> None:
    """Each mistake in sources.yaml is refused with its file and line."""
    listing = tmp_path / "sources.yaml"
    listing.write_text(text)
    with pytest.raises(UsageError) as caught:
        read_sources(listing)
    assert f"{listing}{error}" in str(caught.value)


def test_each_source_is_pulled_from_its_own_repository(
    registry: Registry, signed: Signed, tmp_path: Path
) -> None:
    """Two repositories of one registry in one sources.yaml: each entry gets its own."""
    first, second = f"{registry.host}/two/first:1", f"{registry.host}/two/second:1"
    one = push_package(signed.v1, parse_reference(first), OPEN)
    two = push_package(signed.v2, parse_reference(second), OPEN)
    listing = tmp_path / "sources.yaml"
    listing.write_text(f"packages:\n  - {first}\n  - {second}\n")
    pulled = pull_sources(read_sources(listing), tmp_path / "blobs")
    assert [(p.artifact.digest, p.path.read_bytes()) for p in pulled] == [
        (one, signed.v1), (two, signed.v2)
    ]


def test_bearer_tokens_from_the_registrys_realm(
    token_registry: tuple[Registry, TokenServer],
    signed: Signed,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registry that challenges with Bearer: the auth file's credentials buy a token from
    its realm for the repository's scope; without them the token server's refusal is
    reported as unauthorized."""
    registry, tokens = token_registry
    ref = parse_reference(f"{registry.host}/bearer/echo-wat:0.1.0")
    with pytest.raises(DistributionError, match="unauthorized"):
        push_package(signed.v1, ref, OPEN)
    assert not tokens.issued
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(registry.auth_file(tmp_path / "auth.json")))
    digest = push_package(signed.v1, ref, OPEN)
    assert resolve(ref, OPEN).digest == digest
    assert any(scope.startswith("repository:bearer/echo-wat:") for scope in tokens.issued)


def test_referrers_travel_with_the_package_into_a_layout(
    registry: Registry, signed: Signed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An SBOM attached to a package (this registry has no referrers API: the tag-schema
    fallback) is listed, and copied with the package into a layout, bytes unchanged."""
    ref = parse_reference(f"{registry.host}/refs/echo-wat:0.1.0")
    subject = push_package(signed.v1, ref, OPEN)
    store = open_store(ref, OPEN)
    sbom = b'{"spdxVersion":"SPDX-2.3"}'
    layer, empty = store.put_blob(sbom), store.put_blob(b"{}")
    image = "application/vnd.oci.image.manifest.v1+json"
    subject_size = len(resolve(ref, OPEN).manifest)
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": image,
        "artifactType": "application/spdx+json",
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": empty, "size": 2},
        "layers": [{"mediaType": "application/spdx+json", "digest": layer, "size": len(sbom)}],
        "subject": {"mediaType": image, "digest": subject, "size": subject_size},
    }).encode()
    referrer = store.put_referrer(manifest, image, subject)
    listed = store.referrers(subject)
    assert [(d["digest"], d["artifactType"]) for d in listed] == [
        (referrer, "application/spdx+json")
    ]
    layout = tmp_path / "carry"
    assert main(["pull", str(ref), "-o", f"oci:{layout}:echo-wat-0.1.0"]) == 0
    capsys.readouterr()
    carried = open_store(parse_reference(f"oci:{layout}:echo-wat-0.1.0"), OPEN)
    assert [d["digest"] for d in carried.referrers(subject)] == [referrer]
    assert (layout / "blobs" / "sha256" / layer[7:]).read_bytes() == sbom
    assert (layout / "blobs" / "sha256" / referrer[7:]).read_bytes() == manifest
    assert resolve(parse_reference(f"oci:{layout}:echo-wat-0.1.0"), OPEN).digest == subject


def test_a_digest_in_sources_yaml_must_agree_with_the_lock(
    registry: Registry, signed: Signed, tmp_path: Path
) -> None:
    """Pinned to a lock, an entry that names another digest is refused, not overridden."""
    one = push_package(signed.v1, parse_reference(f"{registry.host}/agree/e:1"), OPEN)
    two = push_package(signed.v2, parse_reference(f"{registry.host}/agree/e:2"), OPEN)
    entry = f"{registry.host}/agree/e@{two}"
    listing = tmp_path / "sources.yaml"
    listing.write_text(f"packages:\n  - {entry}\n")
    with pytest.raises(DistributionError, match=f"names {two}, but the lock pins {one}"):
        pull_sources(read_sources(listing), tmp_path / "blobs", pinned={entry: one})
    (same,) = pull_sources(read_sources(listing), tmp_path / "blobs", pinned={entry: two})
    assert same.artifact.digest == two


def test_a_layer_longer_than_declared_is_cut_off(
    registry: Registry, signed: Signed, tmp_path: Path
) -> None:
    """A registry serving more bytes than the manifest declares: reading stops at the
    declared size plus one chunk, the pull fails, nothing is kept."""
    ref = parse_reference(f"{registry.host}/long/echo-wat:0.1.0")
    push_package(signed.v1, ref, OPEN)
    artifact = resolve(ref, OPEN)
    blob = registry.blob_file(artifact.layer_digest)
    blob.write_bytes(signed.v1 + b"\0" * (1 << 20))
    blobs = tmp_path / "blobs"
    try:
        with pytest.raises(DistributionError, match=r"larger than the .* bytes its manifest"):
            fetch_layer(open_store(ref, OPEN), artifact, blobs)
    finally:
        blob.write_bytes(signed.v1)
    assert not [p for p in blobs.rglob("*") if p.is_file()]


def test_a_cut_download_resumes_where_it_stopped(
    registry: Registry, signed: Signed, tmp_path: Path
) -> None:
    """The network drops mid-layer: the pull fails saying how far it got and that a rerun
    resumes; the rerun asks only for the rest (a range) and gets the package."""
    ref = parse_reference(f"{registry.host}/cut/echo-wat:0.1.0")
    push_package(signed.v1, ref, OPEN)
    proxy = CuttingProxy(registry.host, after=3000)
    try:
        via = parse_reference(f"{proxy.host}/cut/echo-wat:0.1.0")
        artifact = resolve(via, OPEN)
        blobs = tmp_path / "blobs"
        with pytest.raises(DistributionError, match="stopped at") as caught:
            fetch_layer(open_store(via, OPEN), artifact, blobs)
        assert "resumes" in str(caught.value)
        assert proxy.cut.is_set()
        (partial,) = blobs.rglob("*.partial")
        assert 0 < partial.stat().st_size < len(signed.v1)
        assert signed.v1.startswith(partial.read_bytes())
        assert fetch_layer(open_store(via, OPEN), artifact, blobs).read_bytes() == signed.v1
    finally:
        proxy.close()


def test_processes_writing_one_layout_lose_no_tag(tmp_path: Path) -> None:
    """Six processes tagging into one layout at once: every tag is in index.json after."""
    import subprocess
    import sys

    layout = tmp_path / "shared"
    script = (
        "import sys; from pathlib import Path; from skilld.distribution import LayoutStore\n"
        "store = LayoutStore(Path(sys.argv[1]), create=True)\n"
        "for i in range(15):\n"
        "    store.put_manifest(f'{{\"n\":\"{sys.argv[2]}-{i}\"}}'.encode(), 'x/y', "
        "f'{sys.argv[2]}-{i}')\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(layout), f"p{n}"]) for n in range(6)
    ]
    assert [p.wait(60) for p in procs] == [0] * 6
    tags = LayoutStore(layout).tags()
    assert set(tags) == {f"p{n}-{i}" for n in range(6) for i in range(15)}
