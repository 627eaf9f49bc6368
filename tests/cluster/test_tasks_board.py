"""The cluster's task board (JetStream KV) against a hostile bus: a record is used only when
the node it names as owner signed it for that task; a request only when its sender signed it
for this node, once."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skilld.cluster import ClusterConfig, TaskBoard
from skilld.cluster._link import NatsLink
from skilld.cluster._tasks import BUCKET
from skilld.errors import ClusterError
from skilld.package import SigningKey, TrustStore, trusted_key
from support.cluster import NatsServer

KEY_A, KEY_C, STRANGER = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
KEY_D = SigningKey.generate()
# Per-node keys: each may speak for its own node only; the stranger for nothing.
TRUST = TrustStore(
    (
        trusted_key("node-a", KEY_A.public_raw, [], cluster=["node-a"]),
        trusted_key("node-c", KEY_C.public_raw, [], cluster=["node-c"]),
        trusted_key("node-d", KEY_D.public_raw, [], cluster=["node-d"]),
    )
)
RECORD = {"task_id": "task-1", "status": "working", "tool": "slow_compute", "expires": 4e9}


@pytest.fixture
def link(nats: NatsServer, tmp_path: Path) -> Iterator[NatsLink]:
    """A started NATS link to a JetStream server."""
    link = NatsLink(ClusterConfig(url=nats.url, node="node-t", key_file=tmp_path / "unused.pem"))
    link.start()
    try:
        yield link
    finally:
        link.close()


def board(link: NatsLink, node: str, key: SigningKey, refused: list[str]) -> TaskBoard:
    """``node``'s board, signing with ``key``, noting every refusal in ``refused``."""
    return link.run(
        TaskBoard.open(link, node, key, TRUST, 60, lambda n, why: refused.append(f"{n}: {why}")),
        timeout=10,
    )


def raw_put(link: NatsLink, key: str, value: bytes) -> None:
    """Write ``value`` under ``key`` as anyone on the bus could."""

    async def put() -> None:
        kv = await link.nc.jetstream().key_value(BUCKET)
        await kv.put(key, value)

    link.run(put(), timeout=10)


def raw_get(link: NatsLink, key: str) -> bytes:
    """The value stored under ``key``."""

    async def get() -> bytes:
        kv = await link.nc.jetstream().key_value(BUCKET)
        entry = await kv.get(key)
        assert entry.value is not None
        return bytes(entry.value)

    return link.run(get(), timeout=10)


def test_a_record_reads_back_on_another_node_with_its_owner(link: NatsLink) -> None:
    """node-a's record is read by node-c as node-a's, unchanged."""
    refused: list[str] = []
    a, c = board(link, "node-a", KEY_A, refused), board(link, "node-c", KEY_C, refused)
    a.put("task-1", RECORD)
    assert c.get("task-1") == {**RECORD, "owner": "node-a"}
    assert c.get("task-2") is None and not refused


def test_forged_moved_and_usurped_records_are_refused(link: NatsLink) -> None:
    """A record signed by a stranger, one node-c signed naming node-a its owner, and
    node-a's own record copied under another task's key are all refused (read as unknown)
    and reported."""
    refused: list[str] = []
    a, c = board(link, "node-a", KEY_A, refused), board(link, "node-c", KEY_C, refused)
    stranger = board(link, "node-a", STRANGER, refused)  # claims to be node-a
    stranger.put("task-x", RECORD)
    assert c.get("task-x") is None
    assert refused and "task-x" in refused[-1]
    # node-c writes a record in node-a's name: its key may not speak for node-a
    usurper = board(link, "node-a", KEY_C, refused)
    usurper.put("task-y", RECORD)
    assert a.get("task-y") is None and "may not speak for node 'node-a'" in refused[-1]
    # node-a's genuine record, replayed under another task's key
    a.put("task-1", RECORD)
    raw_put(link, "t.task-2", raw_get(link, "t.task-1"))
    assert c.get("task-2") is None and "task-2" in refused[-1]


def test_requests_reach_the_owner_only_when_signed_by_their_sender(link: NatsLink) -> None:
    """node-c's cancel and update reach node-a; a request signed by a stranger, and one
    signed by node-c's key in another node's name, are refused and never delivered (the
    genuine request sent after them is the next one heard)."""
    refused: list[str] = []
    heard: queue.Queue[tuple[str, str, dict[str, Any]]] = queue.Queue()
    a, c = board(link, "node-a", KEY_A, refused), board(link, "node-c", KEY_C, refused)
    a.listen(lambda task, op, body: heard.put((task, op, body)))
    c.ask("node-a", "task-1", "cancel", {"by": "node-c"})
    assert heard.get(timeout=10) == ("task-1", "cancel", {"by": "node-c"})
    # ``by`` is the verified sender, whatever the body claims
    c.ask("node-a", "task-2", "update", {"responses": {"q": 1}, "by": "node-a"})
    assert heard.get(timeout=10) == ("task-2", "update", {"responses": {"q": 1}, "by": "node-c"})
    board(link, "node-c", STRANGER, refused).ask("node-a", "task-3", "cancel", {})
    board(link, "node-x", KEY_C, refused).ask("node-a", "task-3", "cancel", {})
    c.ask("node-a", "task-4", "cancel", {})
    assert heard.get(timeout=10)[0] == "task-4"
    assert sum("task request refused" in r for r in refused) == 2, refused


def test_a_replayed_request_is_refused(link: NatsLink) -> None:
    """A request value taken off the bus and stored again (under its own task's prefix)
    is delivered the first time only: its stamp was seen."""
    refused: list[str] = []
    heard: queue.Queue[tuple[str, str, dict[str, Any]]] = queue.Queue()
    a = board(link, "node-a", KEY_A, refused)
    a.listen(lambda task, op, body: heard.put((task, op, body)))
    c = board(link, "node-c", KEY_C, refused)
    captured: list[bytes] = []

    async def capture() -> None:
        kv = await link.nc.jetstream().key_value(BUCKET)
        watcher = await kv.watch("r.node-a.task-9.>")
        c_ask_done.put(None)
        while True:
            entry = await watcher.updates(timeout=10)
            if entry is not None and entry.value:
                captured.append(bytes(entry.value))
                await watcher.stop()
                return

    c_ask_done: queue.Queue[None] = queue.Queue()
    spying = link.spawn(capture())
    c_ask_done.get(timeout=10)
    c.ask("node-a", "task-9", "cancel", {})
    assert heard.get(timeout=10)[0] == "task-9"
    spying.result(timeout=10)
    raw_put(link, "r.node-a.task-9.replayed", captured[0])
    with pytest.raises(queue.Empty):
        heard.get(timeout=1)
    assert "task request refused" in refused[-1]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(task_id=st.text(max_size=40))
def test_hostile_task_ids_never_name_another_key(link: NatsLink, task_id: str) -> None:
    """Whatever a client sends as a task id, a lookup finds nothing or exactly that task's
    record, and no request can be sent for an id that is not one."""
    refused: list[str] = []
    c = board(link, "node-c", KEY_C, refused)
    got = c.get(task_id)
    assert got is None or got.get("task_id") == task_id
    if (
        not task_id
        or not all(ch.isalnum() or ch in "-_" for ch in task_id)
        or not task_id.isascii()
    ):
        with pytest.raises(ClusterError):
            c.ask("node-a", task_id, "cancel", {})


def test_values_are_signed_json_with_the_key_bound(link: NatsLink) -> None:
    """What the bucket holds is the signed document (headers beside it), nothing more."""
    refused: list[str] = []
    a = board(link, "node-a", KEY_A, refused)
    a.put("task-5", RECORD)
    outer = json.loads(raw_get(link, "t.task-5"))
    assert set(outer) == {"h", "d"}
    assert json.loads(outer["d"]) == {"owner": "node-a", "task": "task-5", "record": RECORD}


def following(
    link: NatsLink, node: str, key: SigningKey, refused: list[str]
) -> tuple[TaskBoard, queue.Queue[tuple[str, str]], queue.Queue[str]]:
    """``node``'s board following the records: (board, (task, status) of each record it
    heard, each task it marked failed)."""
    heard: queue.Queue[tuple[str, str]] = queue.Queue()
    failed: queue.Queue[str] = queue.Queue()
    b = board(link, node, key, refused)
    b.follow(lambda t, r: heard.put((t, r["status"])), lambda t, r: failed.put(t))
    return b, heard, failed


def heard_until(heard: queue.Queue[tuple[str, str]], want: tuple[str, str]) -> None:
    """Wait until ``want`` is heard."""
    while heard.get(timeout=10) != want:
        pass


def test_of_two_nodes_that_saw_the_owner_go_one_marks_its_task_failed(link: NatsLink) -> None:
    """node-c and node-d both hear node-a go at once: its unfinished task is marked failed by
    exactly one of them (compare-and-set on the revision), naming node-a; its finished task
    is left alone; both read the failed record as node-a's."""
    refused: list[str] = []
    a = board(link, "node-a", KEY_A, refused)
    c, heard_c, failed_c = following(link, "node-c", KEY_C, refused)
    d, heard_d, failed_d = following(link, "node-d", KEY_D, refused)
    a.put("task-run", {**RECORD, "task_id": "task-run"})
    a.put("task-done", {**RECORD, "task_id": "task-done", "status": "completed"})
    for heard in (heard_c, heard_d):
        heard_until(heard, ("task-done", "completed"))

    async def both_hear_it() -> list[Any]:
        return [c.owner_gone("node-a", None, "expired"), d.owner_gone("node-a", None, "expired")]

    marking = link.run(both_hear_it(), timeout=10)
    assert all(m is not None for m in marking)
    for m in marking:
        m.result(timeout=10)
    marked = [*(["node-c"] * failed_c.qsize()), *(["node-d"] * failed_d.qsize())]
    assert len(marked) == 1, marked
    for reader in (c, d):
        got = reader.get("task-run")
        assert got is not None and got["status"] == "failed" and got["owner"] == "node-a"
        assert "node node-a running this task expired" in got["error"]["message"]
        assert reader.get("task-done") == {
            **RECORD,
            "task_id": "task-done",
            "status": "completed",
            "owner": "node-a",
        }
    assert not refused, refused


def test_a_restarted_owner_loses_only_the_tasks_of_its_earlier_life(link: NatsLink) -> None:
    """When node-a's boot changes, node-c marks failed the tasks node-a signed before that
    boot, not those its new life wrote after it."""
    refused: list[str] = []
    old = board(link, "node-a", KEY_A, refused)
    old.put("task-old", {**RECORD, "task_id": "task-old"})
    new = board(link, "node-a", KEY_A, refused)  # a new stamper: a later boot
    new.put("task-new", {**RECORD, "task_id": "task-new"})
    c, heard, failed = following(link, "node-c", KEY_C, refused)
    heard_until(heard, ("task-new", "working"))

    async def restarted() -> Any:
        return c.owner_gone("node-a", new._stamper.boot, "restarted")

    link.run(restarted(), timeout=10).result(timeout=10)
    assert failed.get(timeout=10) == "task-old" and failed.empty()
    assert (c.get("task-old") or {}).get("status") == "failed"
    assert (c.get("task-new") or {}).get("status") == "working"


def test_only_a_failed_record_without_a_result_may_be_written_for_another_node(
    link: NatsLink,
) -> None:
    """A record node-c signs in node-a's task saying completed, or failed with a result, or
    signed by a stranger claiming to be the marking node, is refused; node-c's plain failed
    mark is read."""
    refused: list[str] = []
    c = board(link, "node-c", KEY_C, refused)
    stranger = board(link, "node-c", STRANGER, refused)
    base = {**RECORD, "status": "failed", "error": {"code": -32603, "message": "gone"}}
    for n, (signer, record) in enumerate(
        [
            (c, {**RECORD, "status": "completed", "result": {"content": []}}),
            (c, {**base, "result": {"content": [{"type": "text", "text": "forged"}]}}),
            (stranger, base),
        ]
    ):
        key = f"t.task-{n}"
        doc = {"owner": "node-a", "by": "node-c", "task": f"task-{n}", "record": record}
        raw_put(link, key, signer._sign(key, doc))
        assert c.get(f"task-{n}") is None, record
    assert len(refused) == 3, refused
    doc = {"owner": "node-a", "by": "node-c", "task": "task-ok", "record": base}
    raw_put(link, "t.task-ok", c._sign("t.task-ok", doc))
    assert c.get("task-ok") == {**base, "owner": "node-a"}
