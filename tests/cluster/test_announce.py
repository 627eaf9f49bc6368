"""Announcements and routed replies from hostile bytes: refused with ClusterError, never a crash."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from skilld.cluster import _announce
from skilld.cluster._wire import H_KEY, H_SIG, H_STAMP, error_from_json
from skilld.errors import ClusterError, SkilldError
from skilld.package import SigningKey, TrustStore, canonical_json, trusted_key

KEY = SigningKey.generate()
STAMP = _announce.Stamper()
TRUST = TrustStore((trusted_key("members", KEY.public_raw, [], cluster=["node-*"]),))

HEADERS = st.dictionaries(
    st.sampled_from([H_KEY, H_SIG, H_STAMP, "Other"]),
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
    doc=st.fixed_dictionaries(
        {},
        optional={
            "roles": st.lists(st.sampled_from(["entry", "worker", "x"]), max_size=3) | JSON,
            "bundle": st.text(max_size=8) | JSON,
        },
    ),
    skills=st.lists(st.dictionaries(st.sampled_from(SKILL_KEYS), JSON), max_size=3),
)
@example(doc={"roles": "entry", "bundle": "b"}, skills=[])  # a text read as five roles
@example(doc={"roles": ["entry"], "bundle": None}, skills=[])  # None read as a digest
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
        got = _announce.verify(data, _announce.sign(data, KEY, STAMP()), TRUST)
    except ClusterError:
        return
    # Accepted: then it was well formed, field by field (no text read as a list of roles,
    # no None read as a digest).
    assert isinstance(doc.get("roles"), list) and set(got.roles) <= _announce.ROLES
    assert isinstance(doc.get("bundle"), str) and got.bundle == doc["bundle"]
    assert len(got.skills) == len(skills)


@given(doc=st.dictionaries(st.text(max_size=10), JSON, max_size=6))
def test_any_error_document_becomes_a_skilld_error(doc: dict[str, object]) -> None:
    """Whatever a holder sends as an error, the entry raises a SkilldError from it."""
    assert isinstance(error_from_json(doc), SkilldError)


def test_the_stamp_is_signed() -> None:
    """A stamp changed after signing (a replay dressed as new) breaks the signature."""
    data = canonical_json({"v": 1, "leave": "node-x", "nonce": "0"})
    headers = _announce.sign(data, KEY, STAMP(), _announce.LEAVE_CONTEXT)
    _announce.check_signature(data, headers, TRUST, _announce.LEAVE_CONTEXT)
    boot, seq = _announce.parse_stamp(headers)
    with pytest.raises(ClusterError, match="does not verify"):
        _announce.check_signature(
            data, {**headers, H_STAMP: f"{boot}.{seq + 1}"}, TRUST, _announce.LEAVE_CONTEXT
        )
    with pytest.raises(ClusterError, match="without a valid stamp"):
        _announce.check_signature(
            data, {k: v for k, v in headers.items() if k != H_STAMP}, TRUST, _announce.LEAVE_CONTEXT
        )


@settings(max_examples=300)
@given(order=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3000)), min_size=1, max_size=200))
def test_each_stamp_is_accepted_once_and_never_an_older_boot(
    order: list[tuple[int, int]],
) -> None:
    """Whatever order stamps arrive in, each is accepted at most once; none of an older boot
    than one accepted, none more than the window behind the newest; a fresh one always."""
    fresh = _announce.Freshness()
    accepted: set[tuple[int, int]] = set()
    newest = (0, 0)
    for stamp in order:
        boot, seq = stamp
        expected = (
            stamp not in accepted
            and boot >= newest[0]
            and (boot > newest[0] or seq > newest[1] - fresh.WINDOW)
        )
        try:
            fresh.accept("node-x", stamp)
        except ClusterError:
            assert not expected, stamp
        else:
            assert expected, stamp
            accepted.add(stamp)
            newest = max(newest, stamp) if boot >= newest[0] else newest
    # The other node's stamps are its own business.
    fresh.accept("node-y", order[0])


def test_a_stamp_far_ahead_slides_the_window_at_once() -> None:
    """A counter jumping by 10**18 slides the window at once: behind it refused, inside once."""
    fresh = _announce.Freshness()
    fresh.accept("node-x", (1, 5))
    fresh.accept("node-x", (1, 10**18))
    with pytest.raises(ClusterError, match="replayed or stale"):
        fresh.accept("node-x", (1, 6))
    fresh.accept("node-x", (1, 10**18 - fresh.WINDOW + 1))
    with pytest.raises(ClusterError, match="replayed or stale"):
        fresh.accept("node-x", (1, 10**18 - fresh.WINDOW + 1))
    with pytest.raises(ClusterError, match="replayed or stale"):
        fresh.accept("node-x", (1, 10**18 - fresh.WINDOW))
