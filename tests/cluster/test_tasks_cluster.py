"""MCP tasks through a cluster: records in JetStream KV, so any entry node answers for a task
whose call runs on another; a cancel that reaches another entry node ends the call where it
runs; every value on the board is signed by the node it speaks for."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import cycle
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest

from support.cluster import Keys, NatsServer, NodeProc, entry_nodes
from support.mcp_fakes import client_tokens, token_of

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
CAPS = "io.modelcontextprotocol/clientCapabilities"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    CAPS: {"elicitation": {}, "extensions": {TASKS: {}}},
}


async def rpc(
    http: httpx.AsyncClient,
    url: str,
    method: str,
    params: dict[str, Any],
    *,
    extensions: bool = True,
    who: str | None = None,
) -> Any:
    """One stateless 2026-07-28 request declaring the tasks extension (unless told not to),
    as the caller ``who`` (its token ``token_of(who)``; none by default); its JSON-RPC message."""
    meta = META if extensions else {**META, CAPS: {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
    }
    named = params.get("name") or params.get("taskId")
    if named:
        headers["Mcp-Name"] = named
    if who is not None:
        headers["Authorization"] = f"Bearer {token_of(who)}"
    response = await http.post(url, json=body, headers=headers)
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    return json.loads(data[-1])


async def start_task(
    http: httpx.AsyncClient,
    url: str,
    seconds: float,
    label: str | None = None,
    *,
    who: str | None = None,
) -> str:
    """The id of a ``slow_compute`` task of ``seconds`` (answering with ``label``) made on
    ``url`` as the caller ``who`` (see :func:`rpc`)."""
    arguments: dict[str, Any] = {"seconds": seconds}
    if label is not None:
        arguments["label"] = label
    created = await rpc(
        http, url, "tools/call", {"name": "slow_compute", "arguments": arguments}, who=who
    )
    assert created["result"]["resultType"] == "task", created
    return str(created["result"]["taskId"])


def task_audit(node: NodeProc, task_id: str) -> list[dict[str, Any]]:
    """The ``event: task`` audit records ``node`` wrote for ``task_id`` so far."""
    found = []
    for line in list(node.lines):
        if line.startswith("{") and '"task"' in line:
            doc = json.loads(line)
            if doc.get("event") == "task" and doc.get("task") == task_id:
                found.append(doc)
    return found


@contextmanager
def _two_entries(
    bus_nats: tuple[NatsServer, Path],
    keys: Keys,
    demo_cluster_bundle: Path,
    gateway_bundle: Path,
    tmp_path: Path,
    entry_extra: Sequence[str] = (),
) -> Iterator[tuple[NodeProc, NodeProc, NodeProc]]:
    nats, bus = bus_nats
    with entry_nodes(
        nats.url,
        keys.member,
        demo_cluster_bundle,
        gateway_bundle,
        tmp_path,
        bus=bus,
        extra=["--cluster-kv", *entry_extra],
        worker_skills=7,
    ) as (worker, a, c):
        yield a, c, worker


@pytest.fixture
def two_entries(
    bus_nats: tuple[NatsServer, Path],
    keys: Keys,
    demo_cluster_bundle: Path,
    gateway_bundle: Path,
    tmp_path: Path,
) -> Iterator[tuple[NodeProc, NodeProc, NodeProc]]:
    """node-a and node-c, entry-only with --cluster-kv (tasks in JetStream KV), and node-b,
    the worker holding the conformance skill, on the documented least-privilege bus; no
    authentication (every client is the one anonymous caller)."""
    with _two_entries(bus_nats, keys, demo_cluster_bundle, gateway_bundle, tmp_path) as nodes:
        yield nodes


@pytest.fixture
def two_entries_alice_mallory(
    bus_nats: tuple[NatsServer, Path],
    keys: Keys,
    demo_cluster_bundle: Path,
    gateway_bundle: Path,
    tmp_path: Path,
) -> Iterator[tuple[NodeProc, NodeProc, NodeProc]]:
    """As ``two_entries``, the entry nodes authenticating two callers, alice and mallory
    (named tokens, ``support.mcp_fakes.token_of``), whom the gateway's rules let use all."""
    tokens = client_tokens(tmp_path, "alice", "mallory")
    extra = ["--token-file", str(tokens)]
    with _two_entries(
        bus_nats, keys, demo_cluster_bundle, gateway_bundle, tmp_path, extra
    ) as nodes:
        yield nodes


async def test_round_robin_client_creates_on_a_and_reads_the_result_on_c(
    two_entries: tuple[NodeProc, NodeProc, NodeProc],
) -> None:
    """A stateless client spreading its requests round-robin over two entry nodes creates a
    task on node-a (its call runs on the worker node-b), sees it working from node-c, and
    reads its inlined result from whichever node its poll lands on; the owner audits the
    task's creation and completion."""
    a, c, _worker = two_entries
    assert a.url is not None and c.url is not None
    nodes = cycle([a.url, c.url])
    async with httpx.AsyncClient(timeout=30) as http:
        # Plain calls first (no tasks extension: the optional task tool runs at once), so
        # the task below runs on a warm worker, which tries it inline first: the guest's
        # mcp.cancelled() there must give up to a thread, not end the call.
        for label in ("warm-1", "warm-2"):
            plain = await rpc(
                http,
                next(nodes),
                "tools/call",
                {"name": "slow_compute", "arguments": {"seconds": 0.2, "label": label}},
                extensions=False,
            )
            assert plain["result"]["content"][0]["text"] == f"computed {label} after 0.2 s", plain
        task_id = await start_task(http, next(nodes), 2, "rr")
        first = (await rpc(http, next(nodes), "tasks/get", {"taskId": task_id}))["result"]
        assert first["status"] == "working" and "result" not in first, first
        seen_on: set[str] = set()
        with anyio.fail_after(30):
            while True:
                url = next(nodes)
                got = (await rpc(http, url, "tasks/get", {"taskId": task_id}))["result"]
                seen_on.add(url)
                if got["status"] != "working":
                    break
                await anyio.sleep(got["pollIntervalMs"] / 1000)
        assert got["status"] == "completed", got
        assert got["result"]["content"][0]["text"] == "computed rr after 2 s", got
        # both nodes answered, and both give the same final answer
        assert seen_on == {a.url, c.url}
        other = a.url if url == c.url else c.url
        again = (await rpc(http, other, "tasks/get", {"taskId": task_id}))["result"]
        assert again["result"] == got["result"], again
    records = a.audit_until(lambda _r: len(task_audit(a, task_id)) >= 2)
    assert records is not None
    statuses = [r["status"] for r in task_audit(a, task_id)]
    assert statuses == ["created", "completed"], statuses
    assert not task_audit(c, task_id)  # node-c only read it


async def test_a_cancel_through_the_other_entry_node_ends_the_call_on_the_worker(
    two_entries: tuple[NodeProc, NodeProc, NodeProc],
) -> None:
    """A minute-long task made on node-a is cancelled through node-c: node-a (the owner)
    cancels the call, the worker's guest stops at once (its call audited cancelled, not a
    minute later), and both entry nodes then read the task as cancelled. Each side audits
    the cancel with the node it came through."""
    a, c, worker = two_entries
    assert a.url is not None and c.url is not None
    async with httpx.AsyncClient(timeout=30) as http:
        task_id = await start_task(http, a.url, 60, "cut")
        started = time.monotonic()
        ack = await rpc(http, c.url, "tasks/cancel", {"taskId": task_id})
        assert ack["result"]["resultType"] == "complete" and "taskId" not in ack["result"], ack
        for url in (c.url, a.url):
            got = (await rpc(http, url, "tasks/get", {"taskId": task_id}))["result"]
            assert got["status"] == "cancelled", (url, got)
    worker.audit_until(
        lambda records: any(
            r.get("method") == "slow_compute" and r.get("outcome") == "cancelled" for r in records
        )
    )
    assert time.monotonic() - started < 30  # ended by the cancel, not by its own minute
    owner = a.audit_until(
        lambda _r: [r["status"] for r in task_audit(a, task_id)][-1:] == ["cancelled"]
    )
    assert owner is not None
    mine = task_audit(a, task_id)
    assert [r["status"] for r in mine] == ["created", "cancel-requested", "cancelled"], mine
    assert mine[1]["by"] == "node-c"
    via = task_audit(c, task_id)
    assert [(r["status"], r["by"], r["owner"]) for r in via] == [
        ("cancel-requested", "node-c", "node-a")
    ], via


async def test_a_question_asked_on_a_is_answered_through_c(
    two_entries: tuple[NodeProc, NodeProc, NodeProc],
) -> None:
    """A task whose guest elicits (made on node-a, run on the worker) reads input_required
    with the question on node-c too; tasks/update through node-c answers it, the record
    leaves input_required, and the task completes with the answer, read on either node."""
    a, c, _worker = two_entries
    assert a.url is not None and c.url is not None
    async with httpx.AsyncClient(timeout=30) as http:
        created = (
            await rpc(http, a.url, "tools/call", {"name": "confirm_delete", "arguments": {}})
        )["result"]
        task_id = created["taskId"]
        with anyio.fail_after(30):
            while True:
                got = (await rpc(http, c.url, "tasks/get", {"taskId": task_id}))["result"]
                if got["status"] == "input_required":
                    break
                await anyio.sleep(got["pollIntervalMs"] / 1000)
        (key, question), *more = got["inputRequests"].items()
        assert not more and question["method"] == "elicitation/create", got
        answer = {key: {"action": "accept", "content": {"confirm": True}}}
        updated = await rpc(
            http, c.url, "tasks/update", {"taskId": task_id, "inputResponses": answer}
        )
        assert updated["result"]["resultType"] == "complete", updated
        with anyio.fail_after(30):
            while True:
                got = (await rpc(http, c.url, "tasks/get", {"taskId": task_id}))["result"]
                if got["status"] == "completed":
                    break
                assert got["status"] in ("working", "input_required"), got
                await anyio.sleep(got["pollIntervalMs"] / 1000)
        assert got["result"]["content"][0]["text"] == "confirmed=True", got
        on_a = (await rpc(http, a.url, "tasks/get", {"taskId": task_id}))["result"]
        assert on_a["result"] == got["result"]
    statuses = [r["status"] for r in task_audit(a, task_id)]
    assert statuses[:2] == ["created", "input_required"] and statuses[-1] == "completed"


async def test_another_client_cannot_read_or_cancel_a_task_on_any_entry(
    two_entries_alice_mallory: tuple[NodeProc, NodeProc, NodeProc],
) -> None:
    """A task alice made on node-a is unknown to mallory on node-c and on node-a: her
    tasks/get, tasks/update and tasks/cancel are -32602, and the task runs on for alice."""
    a, c, _worker = two_entries_alice_mallory
    assert a.url is not None and c.url is not None
    async with httpx.AsyncClient(timeout=30) as http:
        task_id = await start_task(http, a.url, 60, who="alice")
        for url in (c.url, a.url):
            for method, extra in (
                ("tasks/get", {}),
                ("tasks/update", {"inputResponses": {}}),
                ("tasks/cancel", {}),
            ):
                got = await rpc(http, url, method, {"taskId": task_id, **extra}, who="mallory")
                assert got["error"]["code"] == -32602, (url, method, got)
        still = await rpc(http, c.url, "tasks/get", {"taskId": task_id}, who="alice")
        assert still["result"]["status"] == "working", still
        await rpc(http, c.url, "tasks/cancel", {"taskId": task_id}, who="alice")


async def test_unknown_and_malformed_task_ids_read_as_unknown_on_every_entry(
    two_entries: tuple[NodeProc, NodeProc, NodeProc],
) -> None:
    """A task id that names no record, or that would be a NATS wildcard or another key,
    is -32602 on either entry node, never a lookup of something else."""
    a, c, _worker = two_entries
    assert a.url is not None and c.url is not None
    async with httpx.AsyncClient(timeout=30) as http:
        for url in (a.url, c.url):
            for task_id in ("task-nope", "*", ">", "t.x", "r.node-a.>", "a" * 300, "../t"):
                got = await rpc(http, url, "tasks/get", {"taskId": task_id})
                assert got["error"]["code"] == -32602, (task_id, got)


async def listen(
    http: httpx.AsyncClient,
    url: str,
    out: anyio.abc.ObjectSendStream[dict[str, Any]],
    ready: anyio.Event,
    who: str | None = None,
) -> None:
    """Hold a subscriptions/listen stream (declaring the tasks extension) on ``url`` as
    ``who``; send each message it carries to ``out``, and set ``ready`` once acknowledged."""
    body = {
        "jsonrpc": "2.0",
        "id": 99,
        "method": "subscriptions/listen",
        "params": {"notifications": {"toolsListChanged": True}, "_meta": META},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "subscriptions/listen",
    }
    if who is not None:
        headers["Authorization"] = f"Bearer {token_of(who)}"
    async with http.stream("POST", url, json=body, headers=headers) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("method") == "notifications/subscriptions/acknowledged":
                    ready.set()
                else:
                    await out.send(message)


async def heard_until(
    inbox: anyio.abc.ObjectReceiveStream[dict[str, Any]], task_id: str, last: str
) -> list[tuple[str, str]]:
    """The (task id, status) of every task status a listen stream hears, until ``task_id``
    reads ``last``."""
    heard: list[tuple[str, str]] = []
    with anyio.fail_after(30):
        while not heard or heard[-1] != (task_id, last):
            message = await inbox.receive()
            if message.get("method") != "notifications/tasks/status":
                continue
            assert message["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == 99
            heard.append((message["params"]["taskId"], message["params"]["status"]))
    return heard


async def test_a_listener_on_c_hears_the_status_of_a_task_run_through_a(
    two_entries_alice_mallory: tuple[NodeProc, NodeProc, NodeProc],
) -> None:
    """alice's listen stream on node-c hears working, then completed, of a task she made and
    ran through node-a (seen changing in the bucket), each once; her stream on node-a hears
    the same once, not twice; mallory's stream on node-c hears nothing of it."""
    a, c, _worker = two_entries_alice_mallory
    assert a.url is not None and c.url is not None
    send_c, on_c = anyio.create_memory_object_stream[dict[str, Any]](64)
    send_a, on_a = anyio.create_memory_object_stream[dict[str, Any]](64)
    send_m, on_m = anyio.create_memory_object_stream[dict[str, Any]](64)
    async with httpx.AsyncClient(timeout=60) as http, anyio.create_task_group() as tg:
        ready = [anyio.Event() for _ in range(3)]
        tg.start_soon(listen, http, c.url, send_c, ready[0], "alice")
        tg.start_soon(listen, http, a.url, send_a, ready[1], "alice")
        tg.start_soon(listen, http, c.url, send_m, ready[2], "mallory")
        with anyio.fail_after(15):
            for event in ready:
                await event.wait()
        # then a marker task: once alice's streams hear it, nothing more of the first is coming
        for seconds, label in ((1, "heard"), (0, "marker")):
            task_id = await start_task(http, a.url, seconds, label, who="alice")
            for inbox in (on_c, on_a):
                heard = await heard_until(inbox, task_id, "completed")
                assert heard == [(task_id, "working"), (task_id, "completed")], heard
        with pytest.raises(anyio.WouldBlock):
            on_m.receive_nowait()
        tg.cancel_scope.cancel()


async def test_a_task_whose_owner_is_killed_reads_failed_on_the_other_entry(
    two_entries: tuple[NodeProc, NodeProc, NodeProc],
) -> None:
    """kill -9 of node-a while its minute-long task runs: once membership expires node-a,
    node-c marks the task failed, naming node-a (its tasks/get answers failed with the
    error, well before the minute), alice's listen stream on node-c hears failed, and
    node-c audits it as the node that marked it."""
    a, c, _worker = two_entries
    assert a.url is not None and c.url is not None
    send_c, on_c = anyio.create_memory_object_stream[dict[str, Any]](64)
    async with httpx.AsyncClient(timeout=60) as http, anyio.create_task_group() as tg:
        ready = anyio.Event()
        tg.start_soon(listen, http, c.url, send_c, ready, "alice")
        with anyio.fail_after(15):
            await ready.wait()
        task_id = await start_task(http, a.url, 60, "orphan", who="alice")
        assert (await heard_until(on_c, task_id, "working"))[-1] == (task_id, "working")
        started = time.monotonic()
        a.kill()
        heard = await heard_until(on_c, task_id, "failed")
        assert heard == [(task_id, "failed")], heard
        got = (await rpc(http, c.url, "tasks/get", {"taskId": task_id}, who="alice"))["result"]
        assert got["status"] == "failed" and "result" not in got, got
        assert "node-a" in got["error"]["message"] and "node-a" in got["statusMessage"], got
        # heartbeat 0.5 s: expired within a few seconds, not at the task's end or TTL
        assert time.monotonic() - started < 20
        tg.cancel_scope.cancel()
    marked = c.audit_until(lambda _r: bool(task_audit(c, task_id)))
    assert marked is not None
    mine = task_audit(c, task_id)
    assert [(r["status"], r["by"], r["owner"]) for r in mine] == [("failed", "node-c", "node-a")], (
        mine
    )
