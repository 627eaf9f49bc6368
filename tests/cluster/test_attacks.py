"""A plain NATS client on an open bus (no node key) against the signed envelope.

Everything here is what the issue saw succeed: a forged call, a hidden method, a forged
``remote_called_by`` caller, a replayed call (also after the holder restarted), a
queue-group impostor, a forged cancel and a forged transfer chunk. Each is refused
(or its answer dropped) and the refusal is audited on the node that saw it. The bus is
deliberately open (no accounts): the signatures are the first wall; what
``skilld cluster nats-config`` adds is tested in test_secure_bus.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats as nats_client
import pytest
from mcp import types
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from skilld.cluster import _announce
from skilld.cluster._envelope import H_BOX, Sealer, digest
from skilld.package import BoxKey, load_private_key
from skilld.sandbox import Sandbox
from support.cluster import (
    HOSTILE_POLICY,
    Keys,
    NatsServer,
    NodeProc,
    SignedClient,
    make_bundle,
    mcp_client,
    start_node,
)
from support.mcp_fakes import text_of as _text

pytestmark = pytest.mark.anyio

ECHO_POLICY = (
    "skill: echo\ninvoke:\n  id: from-node-a\n  remote_called_by: [node-a/hostile]\n"
    "mcp:\n  hidden: [fail]\n"
)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module's async fixtures."""
    return "asyncio"


@pytest.fixture(scope="module")
def open_bus(
    sandbox: Sandbox, keys: Keys, gateway_bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """An open nats-server; node-b holds echo (fail hidden) and hostile; node-a is the entry."""
    root = tmp_path_factory.mktemp("attacks")
    (root / "data").mkdir()
    bundle = make_bundle(
        sandbox,
        root / "holder",
        ["hostile", "echo"],
        keys,
        {
            "hostile.yaml": HOSTILE_POLICY.replace("{data}", str(root / "data")),
            "echo.yaml": ECHO_POLICY,
        },
    )
    server = NatsServer(root / "jetstream")
    server.start()
    nodes: dict[str, NodeProc] = {}
    try:
        nodes["b"] = start_node("node-b", bundle, server.url, keys.member, root / "b", http=False)
        nodes["a"] = start_node(
            "node-a", gateway_bundle, server.url, keys.member, root / "a", extra=["--entry-only"]
        )
        nodes["a"].seen(r"node node-b joined")
        yield {"server": server, "nodes": nodes, "bundle": bundle, "root": root, "keys": keys}
    finally:
        for node in nodes.values():
            node.stop()
        server.stop()


@pytest.fixture
async def plain(open_bus: dict[str, Any]) -> AsyncIterator[NatsClient]:
    """A NATS client with no credentials and no node key."""
    nc = await nats_client.connect(open_bus["server"].url)
    try:
        yield nc
    finally:
        await nc.close()


async def _call(node: NodeProc, tool: str, args: dict[str, Any]) -> types.CallToolResult:
    assert node.url is not None
    async with mcp_client(node.url) as client:
        await client.wait_tools(lambda n: tool in n)
        return await client.session.call_tool(tool, args)



def _refused(node: NodeProc, *needles: str) -> dict[str, Any]:
    """``node``'s audit record of a refused cluster message mentioning every needle."""

    def match(r: dict[str, Any]) -> bool:
        return r["event"] == "cluster-refused" and all(n in r["reason"] for n in needles)

    records = node.audit_until(lambda rs: any(match(r) for r in rs))
    return next(r for r in records if match(r))


async def _capture(plain: NatsClient, node: NodeProc) -> Msg:
    """A genuine routed call of echo/echo, as anyone on an open bus can record it."""
    seen: asyncio.Queue[Msg] = asyncio.Queue()

    async def keep(msg: Msg) -> None:
        await seen.put(msg)

    sub = await plain.subscribe("skilld.call.>", cb=keep)
    await plain.flush()
    result = await _call(node, "echo/echo", {"text": "recorded"})
    assert _text(result) == "recorded"
    msg = await asyncio.wait_for(seen.get(), timeout=10)
    await sub.unsubscribe()
    return msg


def _calls(node: NodeProc) -> int:
    return len([r for r in node.audit() if r["event"] == "call"])


async def _capture_settled(plain: NatsClient, entry: NodeProc, holder: NodeProc) -> tuple[Msg, int]:
    """A recorded genuine call, once the holder's audit shows it ran; and its call count."""
    before = _calls(holder)
    msg = await _capture(plain, entry)
    holder.audit_until(lambda rs: len([r for r in rs if r["event"] == "call"]) > before)
    return msg, _calls(holder)


async def _no_answer(plain: NatsClient, subject: str, data: bytes, headers: dict[str, str]) -> None:
    """Publish a request; no answer may come back (the holder stays silent)."""
    with pytest.raises(Exception, match=r"(?i)timeout"):
        await plain.request(subject, data, headers=headers, timeout=1.5)


async def _boot(plain: NatsClient, node: str) -> int:
    """``node``'s boot, from the stamp of its next announcement."""
    return (await _announced(plain, node))[0]


async def _announced(plain: NatsClient, node: str) -> tuple[int, bytes]:
    """``node``'s boot and payload key, from its next announcement."""
    got: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()

    async def keep(msg: Msg) -> None:
        doc = json.loads(msg.data)
        if doc.get("node") == node:
            boot = _announce.parse_stamp(msg.headers or {})[0]
            await got.put((boot, base64.b64decode(doc["box"])))

    sub = await plain.subscribe("skilld.announce", cb=keep)
    found = await asyncio.wait_for(got.get(), timeout=10)
    await sub.unsubscribe()
    return found


async def test_a_listener_on_an_open_bus_sees_only_ciphertext_and_the_node_says_so(
    open_bus: dict[str, Any], plain: NatsClient
) -> None:
    """On a bus without accounts anyone can subscribe: arguments and results travel
    encrypted to their node, and the nodes warn at start-up all the same."""
    seen: list[Msg] = []

    async def keep(msg: Msg) -> None:
        seen.append(msg)

    sub = await plain.subscribe(">", cb=keep)
    await plain.flush()
    msg = await _capture(plain, open_bus["nodes"]["a"])
    await sub.unsubscribe()
    assert json.loads((msg.headers or {})["Skilld-Meta"])["pair"] == 1
    assert all(b"recorded" not in m.data for m in seen), [m.subject for m in seen]
    assert any(m.subject.startswith("_INBOX.node-a.") for m in seen)  # the result went by
    assert "INSECURE BUS" in open_bus["nodes"]["b"].log()


async def test_a_forged_call_is_refused_and_audited(
    open_bus: dict[str, Any], plain: NatsClient
) -> None:
    """An unsigned call, and one signed by an untrusted key, run nothing on node-b."""
    node_b = open_bus["nodes"]["b"]
    genuine, calls = await _capture_settled(plain, open_bus["nodes"]["a"], node_b)
    meta = json.loads((genuine.headers or {})["Skilld-Meta"])
    forged_meta = {**meta, "call": "f" * 24}
    await _no_answer(
        plain, genuine.subject, b'{"text":"forged"}', {"Skilld-Meta": json.dumps(forged_meta)}
    )
    _refused(node_b, "routed call refused", "unsigned")
    stranger = SignedClient("node-a", open_bus["keys"].stranger)
    headers = stranger.seal({**forged_meta, "call": "g" * 24}, b'{"text":"forged"}')
    await _no_answer(plain, genuine.subject, b'{"text":"forged"}', headers)
    _refused(node_b, "routed call refused", "trust set does not hold")
    assert _calls(node_b) == calls


async def test_a_captured_payload_key_certificate_speaks_for_nobody(
    open_bus: dict[str, Any], plain: NatsClient
) -> None:
    """Calls are paired (no signature per message): an impostor that copies node-a's
    certified payload key from the bus, but holds another private key, is refused."""
    node_b = open_bus["nodes"]["b"]
    genuine, calls = await _capture_settled(plain, open_bus["nodes"]["a"], node_b)
    boot, box = await _announced(plain, "node-b")
    meta = {**json.loads((genuine.headers or {})["Skilld-Meta"]), "call": "p" * 24, "boot": boot}
    for name in ("from", "pair"):
        meta.pop(name)
    impostor = Sealer(
        "node-a", load_private_key(open_bus["keys"].stranger), _announce.Stamper(), BoxKey()
    )
    headers, sent = impostor.seal_to(box, meta, b'{"text":"forged"}')
    headers[H_BOX] = (genuine.headers or {})[H_BOX]
    await _no_answer(plain, genuine.subject, sent, headers)
    _refused(node_b, "routed call refused", "does not decrypt")
    assert _calls(node_b) == calls


async def test_a_changed_copy_cannot_make_the_entry_send_a_call_twice(
    open_bus: dict[str, Any], plain: NatsClient
) -> None:
    """A copy of a call with another boot draws node-b's 'restarted'; it names the copy,
    not the entry's call, so the entry does not send its call again: it runs once."""
    node_a, node_b = open_bus["nodes"]["a"], open_bus["nodes"]["b"]
    seen: asyncio.Queue[Msg] = asyncio.Queue()

    async def copy(msg: Msg) -> None:
        meta = json.loads((msg.headers or {})["Skilld-Meta"])
        changed = {**(msg.headers or {}), "Skilld-Meta": json.dumps({**meta, "boot": 1})}
        await plain.publish(msg.subject, msg.data, reply=msg.reply, headers=changed)
        await seen.put(msg)

    sub = await plain.subscribe("skilld.call.node-b.hostile.>", cb=copy)
    await plain.flush()
    before = _calls(node_b)
    try:
        result = await _call(node_a, "hostile/write_keys", {"count": 60, "prefix": "once"})
    finally:
        await sub.unsubscribe()
    assert _text(result) == "60", result.content
    await asyncio.wait_for(seen.get(), timeout=10)
    _refused(node_b, "routed call", "made for boot 1")
    _refused(node_a, "'restarted' answer", "names another message")
    node_b.audit_until(lambda rs: len([r for r in rs if r["event"] == "call"]) > before)
    assert _calls(node_b) == before + 1


async def test_a_nodes_own_key_cannot_speak_as_another_node(
    open_bus: dict[str, Any], plain: NatsClient
) -> None:
    """node-b's own key signing a call, or certifying a payload key, as node-a: refused."""
    node_b = open_bus["nodes"]["b"]
    genuine, calls = await _capture_settled(plain, open_bus["nodes"]["a"], node_b)
    boot, box = await _announced(plain, "node-b")
    meta = {**json.loads((genuine.headers or {})["Skilld-Meta"]), "boot": boot}
    for name in ("from", "pair"):
        meta.pop(name)
    as_a = Sealer(
        "node-a", load_private_key(open_bus["keys"].of("node-b")), _announce.Stamper(), BoxKey()
    )
    signed = as_a.seal({**meta, "call": "k" * 24}, b'{"text":"as node-a"}')
    await _no_answer(plain, genuine.subject, b'{"text":"as node-a"}', signed)
    headers, sent = as_a.seal_to(box, {**meta, "call": "l" * 24}, b'{"text":"as node-a"}')
    await _no_answer(plain, genuine.subject, sent, headers)

    def refused(records: list[dict[str, Any]]) -> int:
        needle = "key node-b"
        return len(
            [
                r
                for r in records
                if r["event"] == "cluster-refused"
                and needle in r["reason"]
                and "may not speak for node 'node-a'" in r["reason"]
            ]
        )

    node_b.audit_until(lambda rs: refused(rs) >= 2)
    assert _calls(node_b) == calls


async def test_a_hidden_method_is_never_routed(open_bus: dict[str, Any], plain: NatsClient) -> None:
    """echo's hidden 'fail': no tool on the entry; even a member's signed call is refused."""
    node_a, node_b = open_bus["nodes"]["a"], open_bus["nodes"]["b"]
    assert node_a.url is not None
    async with mcp_client(node_a.url) as client:
        names = await client.wait_tools(lambda n: "echo/echo" in n)
    assert "echo/fail" not in names
    genuine = await _capture(plain, node_a)
    member = SignedClient("node-t", open_bus["keys"].member)
    meta = {
        **json.loads((genuine.headers or {})["Skilld-Meta"]),
        "call": "h" * 24,
        "to": "node-b",
        "name": "fail",
        "boot": await _boot(plain, "node-b"),
    }
    for name in ("from", "pair"):  # node-t's own; signed, not paired
        meta.pop(name, None)
    body = b'{"code":"internal","message":"x"}'
    answer = await plain.request(genuine.subject, body, headers=member.seal(meta, body), timeout=10)
    assert json.loads(answer.data)["error"]["code"] == "not-found", answer.data
    _refused(node_b, "'fail'", "hidden")
    assert not any(r["event"] == "call" and r.get("method") == "fail" for r in node_b.audit())


async def test_a_forged_remote_called_by_caller_is_refused(
    open_bus: dict[str, Any], plain: NatsClient
) -> None:
    """A call claiming to come from node-a/hostile is refused unless node-a signed it."""
    node_b = open_bus["nodes"]["b"]
    genuine = await _capture(plain, open_bus["nodes"]["a"])
    meta = {
        **json.loads((genuine.headers or {})["Skilld-Meta"]),
        "call": "c" * 24,
        "chain": ["hostile"],
        "depth": 1,
    }
    # Unsigned, claiming node-a: refused before anything else.
    await _no_answer(plain, genuine.subject, b'{"text":"x"}', {"Skilld-Meta": json.dumps(meta)})
    _refused(node_b, "routed call refused", "unsigned")
    # Signed, but by node-t with its own key: the chain is node-t's, and node-b consents to
    # node-a/hostile only.
    member = SignedClient("node-t", open_bus["keys"].member)
    meta = {**meta, "call": "d" * 24, "boot": await _boot(plain, "node-b")}
    for name in ("from", "pair"):  # node-t's own; signed, not paired
        meta.pop(name, None)
    answer = await plain.request(
        genuine.subject, b'{"text":"x"}', headers=member.seal(meta, b'{"text":"x"}'), timeout=10
    )
    assert json.loads(answer.data)["error"]["code"] == "not-permitted", answer.data
    # The sender is node-t, whatever caller the copied message carries.
    record = node_b.audit_until(
        lambda rs: any(str(r.get("caller")).startswith("node:node-t<") for r in rs)
    )
    refused = next(r for r in record if str(r.get("caller")).startswith("node:node-t<"))
    assert refused["outcome"] == "error:not-permitted"


async def test_a_replayed_call_is_refused(open_bus: dict[str, Any], plain: NatsClient) -> None:
    """A recorded genuine call sent again does not run again."""
    node_b = open_bus["nodes"]["b"]
    genuine, calls = await _capture_settled(plain, open_bus["nodes"]["a"], node_b)
    await _no_answer(plain, genuine.subject, genuine.data, dict(genuine.headers or {}))
    _refused(node_b, "routed call refused", "replayed")
    assert _calls(node_b) == calls


async def test_a_queue_group_impostor_is_dropped_and_the_real_answer_arrives(
    open_bus: dict[str, Any], plain: NatsClient
) -> None:
    """An impostor in node-b's queue group answers with forged results; none is used."""
    node_a = open_bus["nodes"]["a"]
    genuine = await _capture(plain, node_a)
    forged = 0

    async def impostor(msg: Msg) -> None:
        nonlocal forged
        forged += 1
        done = {"ok": {"value": "forged", "content": [{"kind": "text", "text": "forged"}]}}
        await plain.publish(msg.reply, json.dumps(done).encode(), headers={"Skilld-Event": "done"})

    sub = await plain.subscribe(genuine.subject, queue=genuine.subject, cb=impostor)
    await plain.flush()
    try:
        assert node_a.url is not None
        async with mcp_client(node_a.url) as client:
            await client.wait_tools(lambda n: "echo/echo" in n)
            for i in range(40):
                result = await client.session.call_tool("echo/echo", {"text": f"real {i}"})
                assert _text(result) == f"real {i}", result.content
                if forged and i >= 5:
                    break
    finally:
        await sub.unsubscribe()
    assert forged, "the impostor was never picked by the queue group"
    _refused(node_a, "answer to routed call dropped", "unsealed")


async def test_a_forged_cancel_is_ignored(open_bus: dict[str, Any], plain: NatsClient) -> None:
    """A cancel from anyone but the node that started the call does not stop it."""
    node_a, node_b = open_bus["nodes"]["a"], open_bus["nodes"]["b"]
    seen: asyncio.Queue[Msg] = asyncio.Queue()

    async def keep(msg: Msg) -> None:
        await seen.put(msg)

    sub = await plain.subscribe("skilld.call.node-b.hostile.>", cb=keep)
    await plain.flush()
    member = SignedClient("node-t", open_bus["keys"].member)

    async def forge() -> None:
        msg = await asyncio.wait_for(seen.get(), timeout=20)
        call_id = json.loads((msg.headers or {})["Skilld-Meta"])["call"]
        subject = f"skilld.cancel.{call_id}"
        await plain.publish(subject, b"", headers={"Skilld-Meta": json.dumps({"call": call_id})})
        cancel = {"ev": "cancel", "call": call_id, "to": "node-b"}
        await plain.publish(subject, b"", headers=member.seal(cancel, b""))
        await plain.flush()

    forging = asyncio.get_running_loop().create_task(forge())
    try:
        result = await _call(node_a, "hostile/loop", {})
    finally:
        await sub.unsubscribe()
    await forging
    # It ran to its wall time: stopped by its deadline, not by either cancel.
    assert result.is_error
    assert "cancel" not in _text(result).lower(), _text(result)
    _refused(node_b, "cancellation refused", "unsigned")
    _refused(node_b, "cancellation refused", "only node 'node-a' may speak")


async def test_a_forged_transfer_chunk_is_refused(
    open_bus: dict[str, Any], plain: NatsClient
) -> None:
    """A transfer step without a node's signature is refused and audited."""
    node_b = open_bus["nodes"]["b"]
    meta = {"ev": "transfer", "op": "chunk", "id": "t" * 24, "seq": 0, "to": "node-b"}
    answer = await plain.request(
        "skilld.transfer.node-b",
        b"payload",
        headers={"Skilld-Meta": json.dumps({**meta, "from": "node-a"})},
        timeout=10,
    )
    assert json.loads(answer.data)["error"]["code"] == "not-permitted"
    _refused(node_b, "transfer step refused", "unsigned")


async def test_a_call_replayed_after_the_holder_restarted_is_refused(
    open_bus: dict[str, Any], plain: NatsClient
) -> None:
    """node-b forgets its replay window when it restarts; the call names its old boot."""
    nodes, root, keys = open_bus["nodes"], open_bus["root"], open_bus["keys"]
    genuine = await _capture(plain, nodes["a"])
    nodes["b"].stop()
    nodes["b"] = start_node(
        "node-b", open_bus["bundle"], open_bus["server"].url, keys.member, root / "b", http=False
    )
    # The only answer is node-b's sealed "restarted" naming the message it got (for the
    # entry to send it again, had it been the entry's own call): no result, nothing ran.
    answer = await plain.request(
        genuine.subject, genuine.data, headers=dict(genuine.headers or {}), timeout=10
    )
    restarted = json.loads((answer.headers or {})["Skilld-Meta"])
    assert restarted["ev"] == "restarted"
    assert restarted["of"] == digest(genuine.headers or {}, genuine.data)
    _refused(nodes["b"], "routed call", "made for boot")
    assert not any(r["event"] == "call" for r in nodes["b"].audit())
    # The entry learns the new boot and its calls go on.
    nodes["a"].wait_line(r"node node-b joined")
    result = await _call(nodes["a"], "echo/echo", {"text": "after"})
    assert _text(result) == "after"
