"""References and auth files are hostile input: parsing fails only with a UsageError or a
DistributionError naming the problem, and what parses means what it says."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skilld.distribution import find_credential, parse_reference
from skilld.errors import DistributionError, UsageError

_component = st.from_regex(r"[a-z0-9]{1,8}([._-][a-z0-9]{1,8}){0,2}", fullmatch=True)
_host = st.one_of(
    st.just("localhost:5000"),
    st.from_regex(r"[a-z][a-z0-9]{0,10}(\.[a-z][a-z0-9]{0,10}){1,3}(:[0-9]{1,5})?", fullmatch=True),
)
_tag = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,20}", fullmatch=True)
_digest = st.from_regex(r"sha256:[a-f0-9]{64}", fullmatch=True)


@given(st.text(max_size=300))
@settings(max_examples=400, deadline=None)
def test_any_text_parses_or_is_refused_plainly(text: str) -> None:
    """No input makes the parser fail with anything but a UsageError."""
    try:
        ref = parse_reference(text)
    except UsageError:
        return
    assert ref.tag is not None or ref.digest is not None
    assert (ref.layout is None) != (ref.registry == "")


@given(_host, st.lists(_component, min_size=1, max_size=3), st.none() | _tag, st.none() | _digest)
@settings(deadline=None)
def test_a_valid_reference_round_trips(
    host: str, path: list[str], tag: str | None, digest: str | None
) -> None:
    """A reference built from the grammar parses to its parts and prints as written."""
    if tag is None and digest is None:
        tag = "latest"
    repo = "/".join(path)
    text = f"{host}/{repo}" + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
    ref = parse_reference(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (host, repo, tag, digest)
    assert str(ref) == text
    assert ref.target == (digest or tag)


def test_a_layout_reference_is_relative_to_its_base(tmp_path: Path) -> None:
    """oci:DIR:TAG names a directory beside the file that lists it; a path keeps its colons
    only before the tag."""
    ref = parse_reference("oci:../carry:notes-1.0.0", base=tmp_path / "skills")
    assert ref.layout == tmp_path / "skills" / ".." / "carry" and ref.tag == "notes-1.0.0"
    assert parse_reference("oci:/a:b/c:t").layout == Path("/a:b/c")


@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@settings(deadline=None)
def test_a_hostile_auth_file_is_refused_naming_it(data: bytes) -> None:
    """An auth file's content never fails with anything but a DistributionError naming it."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "auth.json"
        path.write_bytes(data)
        try:
            find_credential("r.io", "a/b", [path])
        except DistributionError as exc:
            failure: DistributionError | None = exc
        else:
            failure = None
        assert failure is None or str(path) in str(failure)


@given(st.dictionaries(st.text(max_size=20), st.none() | st.text(max_size=30) | st.integers(),
                       max_size=4))
@settings(deadline=None)
def test_hostile_entries_are_refused_naming_the_file(entry: dict[str, object]) -> None:
    """Malformed entries for the registry fail with the file's name, never a crash."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "auth.json"
        path.write_text(json.dumps({"auths": {"r.io": entry}}))
        try:
            find_credential("r.io", "a/b", [path])
        except DistributionError as exc:
            failure: DistributionError | None = exc
        else:
            failure = None
        assert failure is None or str(path) in str(failure)


def test_the_most_specific_entry_of_the_first_file_wins(tmp_path: Path) -> None:
    """Files in order; within one, host/repo before host; URL spellings mean the host."""

    def auth(user: str) -> dict[str, str]:
        return {"auth": base64.b64encode(f"{user}:pw".encode()).decode()}

    first, second = tmp_path / "1.json", tmp_path / "2.json"
    first.write_text(json.dumps({"auths": {"https://r.io/v1/": auth("host"),
                                           "r.io/team": auth("team")}}))
    second.write_text(json.dumps({"auths": {"r.io/team/app": auth("later")}}))
    files = [first, second]
    assert find_credential("r.io", "team/app", files).username == "team"  # type: ignore[union-attr]
    assert find_credential("r.io", "other/app", files).username == "host"  # type: ignore[union-attr]
    assert find_credential("s.io", "team/app", files) is None
    cred = find_credential("r.io", "team/app", [second])
    assert cred is not None and cred.source == second and "pw" not in repr(cred)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
_IMAGE = "application/vnd.oci.image.manifest.v1+json"


def _near_manifest() -> st.SearchStrategy[object]:
    """Manifests close to a skilld artifact, with any field replaced by anything."""
    layer = st.fixed_dictionaries({
        "mediaType": st.sampled_from(["application/vnd.skilld.skill.v1+zip", "x/y"]) | _json,
        "digest": st.sampled_from(["sha256:" + "a" * 64, "sha256:xyz", "md5:1"]) | _json,
        "size": st.integers(-5, 1 << 40) | _json,
    })
    return st.fixed_dictionaries({
        "mediaType": st.just(_IMAGE) | _json,
        "artifactType": st.just("application/vnd.skilld.skill.v1") | _json,
        "layers": st.lists(layer, max_size=2) | _json,
        "annotations": st.dictionaries(st.text(max_size=8), _json, max_size=3) | _json,
    }) | _json


@given(_near_manifest())
@settings(max_examples=300, deadline=None)  # a loaded machine: timing is not the claim
def test_a_hostile_manifest_is_refused_plainly(body: object) -> None:
    """Whatever a registry or layout serves as a manifest, resolving it either yields a
    well-formed skilld artifact or fails with a DistributionError, never a crash."""
    import tempfile

    from skilld.distribution import LayoutStore, RegistryOptions, resolve

    with tempfile.TemporaryDirectory() as d:
        store = LayoutStore(Path(d), create=True)
        store.put_manifest(json.dumps(body).encode(), _IMAGE, "t")
        try:
            artifact = resolve(parse_reference(f"oci:{d}:t"), RegistryOptions())
        except DistributionError:
            return
        assert artifact.layer_digest.startswith("sha256:") and len(artifact.layer_digest) == 71
        assert 0 <= artifact.layer_size <= 256 << 20


def test_a_layout_index_cannot_point_outside_its_blobs(tmp_path: Path) -> None:
    """A tag whose digest is a path (``sha256:../../…``) is refused, never opened."""
    from skilld.distribution import LayoutStore, RegistryOptions, resolve

    LayoutStore(tmp_path / "l", create=True)
    secret = tmp_path / "secret"
    secret.write_text("{}")
    index = json.loads((tmp_path / "l" / "index.json").read_text())
    index["manifests"] = [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": "sha256:../../../secret", "size": 2,
                           "annotations": {"org.opencontainers.image.ref.name": "t"}}]
    (tmp_path / "l" / "index.json").write_text(json.dumps(index))
    with pytest.raises(DistributionError, match="not a sha256 digest"):
        resolve(parse_reference(f"oci:{tmp_path / 'l'}:t"), RegistryOptions())
