"""The signed envelope and the skill-id mapping against hostile input."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skilld.cluster import _announce
from skilld.cluster._envelope import H_BOX, H_META, Opener, Sealer, digest
from skilld.cluster._wire import H_KEY, H_SIG, H_STAMP, skill_from_token, skill_token
from skilld.errors import ClusterError
from skilld.package import BoxKey, SigningKey, TrustStore, trusted_key

KEY = SigningKey.generate()
STRANGER = SigningKey.generate()
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
    st.sampled_from([H_KEY, H_SIG, H_STAMP, H_META, H_BOX, "Other"]),
    st.one_of(
        st.text(max_size=200),
        st.just(KEY.key_id),
        st.just(json.dumps({**META, "from": "node-a"})),
        st.just(json.dumps({**META, "from": "node-a", "pair": 1})),
        st.just(Sealer("node-a", KEY, _announce.Stamper(), BoxKey()).seal(META, b"")[H_BOX]),
        st.just(f"{_announce.Stamper()()}"),
    ),
    max_size=5,
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=500), headers=HEADERS)
def test_hostile_headers_are_refused_with_cluster_error(
    data: bytes, headers: dict[str, str]
) -> None:
    """Random envelopes never open and never raise anything but ClusterError."""
    opener = Opener("node-b", TRUST, _announce.Freshness(), BoxKey())
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
    assert b"secret" not in sent and H_SIG not in headers  # paired: no signature per message
    opened = at_b.open(headers, sent)
    assert opened.data == b'{"secret":"x"}'
    assert opened.box == a_box.public_raw  # answers go back sealed to node-a
    # node-b's next life (another payload key) cannot read it: refused, not run.
    reborn = Opener("node-b", TRUST, _announce.Freshness(), c_box)
    with pytest.raises(ClusterError, match="does not decrypt"):
        reborn.open(headers, sent)
    # ... unless it is told its boot: then the call is only stale, its payload unread,
    # and what it names in its answer is that exact message.
    again = Opener("node-b", TRUST, _announce.Freshness(), c_box)
    stale = again.open(headers, sent, boot=sealer.boot + 1)
    assert stale.stale and stale.data == b"" and stale.digest == digest(headers, sent)
    changed = {**headers, H_META: headers[H_META].replace('"boot":1', '"boot":2')}
    assert again.open(changed, sent, boot=7).digest != stale.digest
    # The payload and the routing facts are authenticated: changed, nothing opens.
    headers2, sent2 = sealer.seal_to(b_box.public_raw, META, b"{}")
    flipped = bytearray(sent2)
    flipped[-1] ^= 1
    with pytest.raises(ClusterError, match="does not decrypt"):
        Opener("node-b", TRUST, _announce.Freshness(), b_box).open(headers2, bytes(flipped))


def _paired() -> tuple[Sealer, Opener, BoxKey, BoxKey]:
    a_box, b_box = BoxKey(), BoxKey()
    return (
        Sealer("node-a", KEY, _announce.Stamper(), a_box),
        Opener("node-b", TRUST, _announce.Freshness(), b_box),
        a_box,
        b_box,
    )


def test_a_paired_message_opens_once_for_its_target_only() -> None:
    """Paired (no signature): once at its target; replayed, elsewhere, or with any routing
    fact or its stamp changed, it is refused."""
    sealer, at_b, _, b_box = _paired()
    headers, sent = sealer.seal_to(b_box.public_raw, META, b"{}")
    assert at_b.open(headers, sent, "node-a", call="c" * 24).sender == "node-a"
    with pytest.raises(ClusterError, match="replayed"):
        at_b.open(headers, sent)
    with pytest.raises(ClusterError, match="not to this node"):
        Opener("node-c", TRUST, _announce.Freshness(), b_box).open(
            *sealer.seal_to(b_box.public_raw, META, b"{}")
        )
    for name, value in (("chain", ["hostile"]), ("depth", 3), ("name", "fail"), ("ev", "cancel")):
        headers, sent = sealer.seal_to(b_box.public_raw, META, b"{}")
        meta = {**json.loads(headers[H_META]), name: value}
        forged = {**headers, H_META: json.dumps(meta, separators=(",", ":"), sort_keys=True)}
        with pytest.raises(ClusterError, match="does not decrypt"):
            at_b.open(forged, sent)
    headers, sent = sealer.seal_to(b_box.public_raw, META, b"{}")
    boot, seq = headers[H_STAMP].split(".")
    with pytest.raises(ClusterError, match="does not decrypt"):
        at_b.open({**headers, H_STAMP: f"{boot}.{int(seq) + 5}"}, sent)
    assert at_b.open(headers, sent).data == b"{}"  # the genuine one still opens, once


def test_a_captured_payload_key_does_not_let_another_node_speak() -> None:
    """An impostor with node-a's (public) key certificate but its own payload key, or with
    no certificate, or stripping the signature of a signed message, is refused."""
    sealer, at_b, _, b_box = _paired()
    genuine, _ = sealer.seal_to(b_box.public_raw, META, b"{}")
    impostor = Sealer("node-a", STRANGER, _announce.Stamper(), BoxKey())
    headers, sent = impostor.seal_to(b_box.public_raw, META, b'{"text":"forged"}')
    with pytest.raises(ClusterError, match="trust set does not hold"):
        at_b.open(headers, sent)  # its own certificate: signed by an untrusted key
    with pytest.raises(ClusterError, match="does not decrypt"):
        at_b.open({**headers, H_BOX: genuine[H_BOX]}, sent)  # node-a's: not its key
    without = {k: v for k, v in headers.items() if k != H_BOX}
    with pytest.raises(ClusterError, match="unsigned"):
        at_b.open(without, sent)
    signed = sealer.seal(META, b"{}")
    stripped = {k: v for k, v in signed.items() if k not in (H_SIG, H_KEY)}
    with pytest.raises(ClusterError, match="unsigned"):
        at_b.open(stripped, b"{}")


def test_a_nodes_own_key_cannot_speak_for_another_node() -> None:
    """node-b's own key (trusted for node-b only) cannot sign, nor certify a payload key,
    as node-a: the whole trust set is per node, not one key for node-*."""
    key_a, key_b = SigningKey.generate(), SigningKey.generate()
    trust = TrustStore(
        (
            trusted_key("node-a", key_a.public_raw, [], cluster=["node-a"]),
            trusted_key("node-b", key_b.public_raw, [], cluster=["node-b"]),
        )
    )
    c_box = BoxKey()
    at_c = Opener("node-c", trust, _announce.Freshness(), c_box)
    meta = {**META, "to": "node-c"}
    as_a = Sealer("node-a", key_b, _announce.Stamper(), BoxKey())
    with pytest.raises(ClusterError, match="may not speak for node 'node-a'"):
        at_c.open(as_a.seal(meta, b"{}"), b"{}")
    with pytest.raises(ClusterError, match="may not speak for node 'node-a'"):
        at_c.open(*as_a.seal_to(c_box.public_raw, meta, b"{}"))
    # node-b's genuine certificate, claimed for node-a, does not verify either.
    b_cert = Sealer("node-b", key_b, _announce.Stamper(), BoxKey()).seal(meta, b"")[H_BOX]
    honest_a = Sealer("node-a", key_a, _announce.Stamper(), BoxKey())
    headers, sent = honest_a.seal_to(c_box.public_raw, meta, b"{}")
    with pytest.raises(ClusterError, match="certificate"):
        at_c.open({**headers, H_BOX: b_cert}, sent)
    assert at_c.open(headers, sent).sender == "node-a"
