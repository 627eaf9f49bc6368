"""The signed envelope and the skill-id mapping against hostile input."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skilld.cluster import _announce
from skilld.cluster._envelope import H_META, Opener, Sealer
from skilld.cluster._wire import H_KEY, H_SIG, H_STAMP, skill_from_token, skill_token
from skilld.errors import ClusterError
from skilld.package import BoxKey, SigningKey, TrustStore, trusted_key

KEY = SigningKey.generate()
TRUST = TrustStore((trusted_key("members", KEY.public_raw, [], cluster=["node-*"]),))
META = {"ev": "call", "call": "c" * 24, "to": "node-b", "boot": 1, "chain": []}


def _pair() -> tuple[Sealer, Opener]:
    return Sealer("node-a", KEY, _announce.Stamper()), Opener(
        "node-b", TRUST, _announce.Freshness()
    )


def test_a_sealed_message_opens_once_for_its_target_only() -> None:
    """It opens once at its target; again (replay), elsewhere, or changed, it is refused."""
    sealer, opener = _pair()
    headers = sealer.seal(META, b"{}")
    opened = opener.open(headers, b"{}", "node-a", call="c" * 24)
    assert (opened.sender, opened.meta["chain"], opened.boot) == ("node-a", [], sealer.boot)
    with pytest.raises(ClusterError, match="replayed"):
        opener.open(headers, b"{}")
    elsewhere = Opener("node-c", TRUST, _announce.Freshness())
    with pytest.raises(ClusterError, match="not to this node"):
        elsewhere.open(sealer.seal(META, b"{}"), b"{}")
    fresh = Opener("node-b", TRUST, _announce.Freshness())
    with pytest.raises(ClusterError, match="does not verify"):
        fresh.open(sealer.seal(META, b"{}"), b'{"x":1}')  # the payload changed
    forged = json.dumps({**META, "chain": ["hostile"], "from": "node-a"})
    with pytest.raises(ClusterError, match="does not verify"):
        fresh.open({**sealer.seal(META, b"{}"), H_META: forged}, b"{}")  # the chain changed
    with pytest.raises(ClusterError, match="only node 'node-x' may speak"):
        fresh.open(sealer.seal(META, b"{}"), b"{}", "node-x")
    with pytest.raises(ClusterError, match="for call"):
        fresh.open(sealer.seal(META, b"{}"), b"{}", call="d" * 24)


def test_a_key_speaks_only_for_its_nodes() -> None:
    """A trusted key signing as a node outside its cluster patterns is refused."""
    sealer = Sealer("rogue", KEY, _announce.Stamper())
    _, opener = _pair()
    with pytest.raises(ClusterError, match="may not speak for node 'rogue'"):
        opener.open(sealer.seal(META, b""), b"")


HEADERS = st.dictionaries(
    st.sampled_from([H_KEY, H_SIG, H_STAMP, H_META, "Other"]),
    st.one_of(st.text(max_size=200), st.just(KEY.key_id), st.just(json.dumps(META))),
    max_size=5,
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=500), headers=HEADERS)
def test_hostile_headers_are_refused_with_cluster_error(
    data: bytes, headers: dict[str, str]
) -> None:
    """Random envelopes never open and never raise anything but ClusterError."""
    _, opener = _pair()
    with pytest.raises(ClusterError):
        opener.open(headers, data)


@given(st.text(min_size=1, max_size=80))
def test_skill_tokens_are_reversible_and_valid_names(skill_id: str) -> None:
    """Any id maps to a subject token and endpoint name (^[A-Za-z0-9_-]+$) and back."""
    token = skill_token(skill_id)
    assert token and all(c.isascii() and (c.isalnum() or c in "_-") for c in token)
    assert skill_from_token(token) == skill_id


@given(st.text(max_size=40))
def test_foreign_tokens_are_refused_or_exact(token: str) -> None:
    """A string that is not a token is refused; one that is maps back to itself."""
    try:
        skill_id = skill_from_token(token)
    except ValueError:
        return
    assert skill_token(skill_id) == token


def test_payloads_are_sealed_to_their_node_only() -> None:
    """With payload keys the bytes on the bus are ciphertext that only the target opens."""
    a_box, b_box, c_box = BoxKey(), BoxKey(), BoxKey()
    sealer = Sealer("node-a", KEY, _announce.Stamper(), a_box)
    at_b = Opener("node-b", TRUST, _announce.Freshness(), b_box)
    headers, sent = sealer.seal_to(b_box.public_raw, META, b'{"secret":"x"}')
    assert b"secret" not in sent
    opened = at_b.open(headers, sent)
    assert opened.data == b'{"secret":"x"}'
    assert opened.box == a_box.public_raw  # answers go back sealed to node-a
    # node-b's next life (another payload key) cannot read it: refused, not run.
    reborn = Opener("node-b", TRUST, _announce.Freshness(), c_box)
    with pytest.raises(ClusterError, match="does not decrypt"):
        reborn.open(headers, sent)
    # ... unless it is told its boot: then the call is only stale, its payload unread.
    again = Opener("node-b", TRUST, _announce.Freshness(), c_box)
    stale = again.open(headers, sent, boot=sealer.boot + 1)
    assert stale.stale and stale.data == b""
    # The routing facts are the associated data: changed, the payload does not open.
    headers2, sent2 = sealer.seal_to(b_box.public_raw, META, b"{}")
    flipped = bytearray(sent2)
    flipped[-1] ^= 1
    with pytest.raises(ClusterError, match="does not verify"):
        Opener("node-b", TRUST, _announce.Freshness(), b_box).open(headers2, bytes(flipped))
