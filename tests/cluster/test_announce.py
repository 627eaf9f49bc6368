"""Announcements and routed replies from hostile bytes: refused with ClusterError, never a crash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skilld.cluster import _announce
from skilld.cluster._wire import H_KEY, H_SIG, error_from_json
from skilld.errors import ClusterError, SkilldError
from skilld.package import SigningKey, TrustStore, canonical_json, trusted_key

KEY = SigningKey.generate()
TRUST = TrustStore((trusted_key("members", KEY.public_raw, [], cluster=["node-*"]),))

HEADERS = st.dictionaries(
    st.sampled_from([H_KEY, H_SIG, "Other"]),
    st.one_of(st.text(max_size=100), st.just(KEY.key_id)),
    max_size=3,
)


@settings(max_examples=300)
@given(data=st.binary(max_size=2000), headers=HEADERS)
def test_arbitrary_bytes_and_headers_are_refused(data: bytes, headers: dict[str, str]) -> None:
    """Random payloads and headers never verify and never raise anything but ClusterError."""
    with pytest.raises(ClusterError):
        _announce.verify(data, headers, TRUST)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


SKILL_KEYS = ["spec", "digest", "exposure", "annotations", "description", "limits"]


@settings(max_examples=500)
@given(
    doc=st.dictionaries(st.sampled_from(["roles", "bundle", "skills"]), JSON),
    skills=st.lists(st.dictionaries(st.sampled_from(SKILL_KEYS), JSON), max_size=3),
)
def test_signed_but_malformed_announcements_are_refused(
    doc: dict[str, object], skills: list[dict[str, object]]
) -> None:
    """A validly signed announcement of any shape is refused cleanly unless it is well formed."""
    doc = {**doc, "v": 1, "node": "node-x", "skills": skills}
    try:
        data = canonical_json(doc)
    except SkilldError:
        return
    try:
        _announce.verify(data, _announce.sign(data, KEY), TRUST)
    except ClusterError:
        return


@given(doc=st.dictionaries(st.text(max_size=10), JSON, max_size=6))
def test_any_error_document_becomes_a_skilld_error(doc: dict[str, object]) -> None:
    """Whatever a holder sends as an error, the entry raises a SkilldError from it."""
    assert isinstance(error_from_json(doc), SkilldError)
