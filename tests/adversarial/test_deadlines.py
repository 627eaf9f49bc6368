"""One deadline for every host call: slow peers, combinatorial globs, nested calls, the client.

The prober runs under a 300 ms wall time and asks for far longer itself (10 minutes of
HTTP or TCP timeout). Local servers on 127.0.0.1 trickle bytes or hold the connection;
a glob with many ``**`` walks a deep tree. Every call ends by its deadline + 100 ms,
whatever the guest asked for, and a cancelled call lets go of its host call at once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from skilld.errors import CallCancelled, DeadlineExceeded
from skilld.permissions import SkillPermissions
from skilld.policy import Tables
from skilld.registry import Call, NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Component
from skilld.state import SqliteState
from support.adversarial import Probe, compile_dir

WALL_S = 0.3
# Far below what each probe's blocking call asked for (minutes): the deadline, not the
# call, ended it. Generous, so a loaded CI machine does not make it flaky.
SLACK_S = 1.0
REPEAT = 3
BIG_TIMEOUT_MS = 600_000

POLICY = """\
limits:
  wall_time: 300ms
http:
  - id: slow
    url: http://127.0.0.1:{H}/
  - id: tls
    url: https://127.0.0.1:{T}/
tcp:
  - id: peers
    host: 127.0.0.1
    ports: [{T}, {B}]
fs:
  - id: tree
    path: {R}
  - id: chain
    path: {C}
invoke:
  calls: [callee]
mcp:
  client: [sample, elicit]
kv: {}
"""

CALLEE = """\
limits:
  wall_time: 60s
tcp:
  - id: peer
    host: 127.0.0.1
    ports: [{T}]
invoke:
  called_by: [prober]
"""


class SlowPeer:
    """A TCP server on 127.0.0.1 whose connections each run ``handler`` on a thread."""

    def __init__(self, handler: Callable[[socket.socket, threading.Event], None]):
        self.handler = handler
        self.stop = threading.Event()
        self.accepted = threading.Event()
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            self.accepted.set()
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.handler(conn, self.stop)
            except OSError:
                return  # the host hung up: what a deadline is for

    def close(self) -> None:
        """Stop serving and let every handler end."""
        self.stop.set()
        self.srv.close()


def _request_path(conn: socket.socket) -> str:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return ""
        data += chunk
    return data.split(b" ", 2)[1].decode()


def _trickle(conn: socket.socket, stop: threading.Event, data: bytes) -> None:
    for i in range(len(data)):
        if stop.wait(0.02):
            return
        conn.sendall(data[i : i + 1])


def _web(conn: socket.socket, stop: threading.Event) -> None:
    path = _request_path(conn)
    if path.startswith("/hold"):
        stop.wait()
    elif path.startswith("/trickle-body"):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        _trickle(conn, stop, b"x" * 100_000)
    elif path.startswith("/trickle-headers"):
        _trickle(conn, stop, b"HTTP/1.1 200 OK\r\n" + b"X-Slow: yes\r\n" * 10_000)
    elif path.startswith("/chunked"):
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        _trickle(conn, stop, b"1\r\nx\r\n" * 100_000)
    elif path.startswith("/redirect"):
        # Each hop answers well within the guest's own timeout; together they do not.
        stop.wait(0.12)
        n = int(path.rsplit("/", 1)[1]) + 1
        conn.sendall(
            f"HTTP/1.1 302 Found\r\nLocation: /redirect/{n}\r\nContent-Length: 0\r\n\r\n".encode()
        )


def _tcp(conn: socket.socket, stop: threading.Event) -> None:
    first = conn.recv(16)
    if first.startswith(b"trickle"):
        _trickle(conn, stop, b"y" * 100_000)
    else:
        stop.wait()


@pytest.fixture(scope="module")
def web() -> Iterator[SlowPeer]:
    """An HTTP peer that holds, trickles headers, body or chunks, or redirects slowly."""
    peer = SlowPeer(_web)
    yield peer
    peer.close()


@pytest.fixture(scope="module")
def holder() -> Iterator[SlowPeer]:
    """A TCP peer that holds the connection open, or trickles one byte at a time."""
    peer = SlowPeer(_tcp)
    yield peer
    peer.close()


@pytest.fixture(scope="module")
def blackhole() -> Iterator[int]:
    """A port whose accept queue is full: a connect to it waits for ever."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(8):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    yield port
    for s in fillers:
        s.close()
    srv.close()


TREE_DEPTH = 6
TREE_FANOUT = 4


@pytest.fixture(scope="module")
def tree(prober: Component, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree 6 directories deep, 4 wide (5,460 directories), built by the guest itself
    through fs.mkdir under a read-write grant of its own."""
    root = Path(os.path.realpath(tmp_path_factory.mktemp("tree")))
    builder = compile_dir(
        tmp_path_factory.mktemp("builder"),
        {"prober": f"limits:\n  wall_time: 120s\nfs:\n  - path: {root}\n    mode: rw\n"},
    )
    leaves = [
        str(root) + "".join(f"/d{(n // TREE_FANOUT**k) % TREE_FANOUT}" for k in range(TREE_DEPTH))
        for n in range(TREE_FANOUT**TREE_DEPTH)
    ]
    build = Probe(prober, builder)
    made = build("fs_batch", op="mkdir", paths=leaves).report["ok"]
    assert all(r == {"ok": None} for r in made), made[:3]
    wrote = build("fs_batch", op="write", paths=[f"{leaf}/x" for leaf in leaves[:50]])
    assert all(r == {"ok": None} for r in wrote.report["ok"])
    return root


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chain of 140 directories, deeper than a glob may descend."""
    root = tmp_path_factory.mktemp("chain")
    path = root
    for _ in range(140):
        path = path / "c"
    path.mkdir(parents=True)
    return root


@pytest.fixture(scope="module")
def tables(
    tmp_path_factory: pytest.TempPathFactory,
    web: SlowPeer,
    holder: SlowPeer,
    blackhole: int,
    tree: Path,
    chain: Path,
) -> Tables:
    """The prober's 300 ms policy and a callee with a minute of its own."""
    values = {
        "{H}": web.port,
        "{T}": holder.port,
        "{B}": blackhole,
        "{R}": tree,
        "{C}": chain,
    }

    def fill(text: str) -> str:
        for key, value in values.items():
            text = text.replace(key, str(value))
        return text

    return compile_dir(
        tmp_path_factory.mktemp("policies"), {"prober": fill(POLICY), "callee": fill(CALLEE)}
    )


class Channel(NullChannel):
    """A client that never answers requests; cancellable from another thread."""

    def __init__(self) -> None:
        self.flag = threading.Event()
        self.asked = threading.Event()
        self.abandoned = threading.Event()

    def sample(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        self.asked.set()
        threading.Event().wait(30)
        return {}

    elicit = sample

    def cancelled(self) -> bool:
        return self.flag.is_set()

    def abandon_requests(self) -> None:
        self.abandoned.set()


def timed_call(
    component: Component, tables: Tables, method: str, args: dict[str, Any], channel: Any = None
) -> tuple[float, dict[str, Any] | str]:
    """Call the prober; return the seconds it took and its report (or how the sandbox ended it)."""
    checker = SkillPermissions.from_tables(tables, "prober")
    ctx = CallContext("prober", checker.limits, channel or NullChannel(), checker=checker)
    started = time.monotonic()
    try:
        value = component.call(method, json.dumps(args), ctx).value
    except DeadlineExceeded:
        value = "deadline"
    except CallCancelled:
        value = "cancelled"
    elapsed = time.monotonic() - started
    assert not ctx.host_faults, ctx.host_faults
    return elapsed, value


def within_deadline(elapsed: float, outcome: dict[str, Any] | str) -> None:
    """The call ended by its deadline + SLACK_S, stopped or refused for lack of time."""
    assert elapsed <= WALL_S + SLACK_S, (elapsed, outcome)
    if isinstance(outcome, dict):
        assert outcome.get("error") in ("timeout", "limit-exceeded", None), outcome


# (id, prober method, args with {H}/{T}/{B}/{R} for the peers' ports and the tree)
SLOW: list[tuple[str, str, dict[str, Any]]] = [
    ("http-hold", "http_timed", {"url": "http://127.0.0.1:{H}/hold"}),
    ("http-trickle-body", "http_timed", {"url": "http://127.0.0.1:{H}/trickle-body"}),
    ("http-trickle-headers", "http_timed", {"url": "http://127.0.0.1:{H}/trickle-headers"}),
    ("http-chunked-trickle", "http_timed", {"url": "http://127.0.0.1:{H}/chunked"}),
    ("http-slow-redirects", "http_timed", {"url": "http://127.0.0.1:{H}/redirect/0"}),
    ("https-handshake-hold", "http_timed", {"url": "https://127.0.0.1:{T}/"}),
    ("tcp-hold", "tcp_hold", {"host": "127.0.0.1", "port": "{T}"}),
    ("tcp-connect-blackhole", "tcp_hold", {"host": "127.0.0.1", "port": "{B}"}),
]


def _fill(args: dict[str, Any], ports: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in args.items():
        if isinstance(value, str):
            for mark, port in ports.items():
                value = value.replace(mark, str(port))
            out[key] = int(value) if value.isdigit() else value
        else:
            out[key] = value
    return out


@pytest.mark.parametrize(("name", "method", "args"), SLOW, ids=[s[0] for s in SLOW])
def test_slow_peers_end_by_the_deadline(
    prober: Component,
    tables: Tables,
    web: SlowPeer,
    holder: SlowPeer,
    blackhole: int,
    name: str,
    method: str,
    args: dict[str, Any],
) -> None:
    """A peer that holds or trickles costs the call its wall time, not the guest's 10 minutes."""
    ports = {"{H}": web.port, "{T}": holder.port, "{B}": blackhole}
    for _ in range(REPEAT):
        elapsed, outcome = timed_call(
            prober, tables, method, _fill(args, ports) | {"timeout_ms": BIG_TIMEOUT_MS}
        )
        within_deadline(elapsed, outcome)
        assert outcome != {"ok": 0}, outcome


def test_tcp_trickle_ends_by_the_deadline(
    prober: Component, tables: Tables, holder: SlowPeer
) -> None:
    """A peer feeding one byte every 20 ms keeps each receive short, but not the call long."""
    for _ in range(REPEAT):
        elapsed, outcome = timed_call(
            prober,
            tables,
            "tcp_exchange",
            {"host": "127.0.0.1", "port": holder.port, "send": "trickle"},
        )
        within_deadline(elapsed, outcome)


def test_kv_waiting_for_a_lock_ends_by_the_deadline(
    prober: Component, tables: Tables, tmp_path: Path
) -> None:
    """A state database whose write lock another writer holds keeps kv.set no longer than
    the call's deadline (SQLite would wait 30 s), and the guest hears ``timeout``."""
    state = SqliteState(tmp_path / "state.sqlite3")
    blocker = sqlite3.connect(tmp_path / "state.sqlite3", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    checker = SkillPermissions.from_tables(tables, "prober")
    try:
        for _ in range(REPEAT):
            ctx = CallContext(
                "prober", checker.limits, NullChannel(), kv=state.store("prober"), checker=checker
            )
            started = time.monotonic()
            try:
                outcome: Any = prober.call("kv_set", json.dumps({"key": "k", "value": "v"}), ctx)
                outcome = outcome.value
            except DeadlineExceeded:
                outcome = "deadline"
            within_deadline(time.monotonic() - started, outcome)
            assert outcome == "deadline" or outcome.get("error") == "timeout", outcome
    finally:
        blocker.rollback()
        blocker.close()
    # the lock released, the store works as before
    ctx = CallContext(
        "prober", checker.limits, NullChannel(), kv=state.store("prober"), checker=checker
    )
    assert prober.call("kv_set", json.dumps({"key": "k", "value": "v"}), ctx).value == {"ok": None}
    state.close()


@pytest.mark.parametrize("stars", range(1, 9))
def test_combinatorial_globs_end_by_the_deadline(
    prober: Component, tables: Tables, tree: Path, stars: int
) -> None:
    """``**/**/...`` over a deep tree visits each directory once: done, or stopped, in time."""
    pattern = str(tree) + "/**" * stars + "/x"
    for _ in range(REPEAT):
        elapsed, outcome = timed_call(prober, tables, "fs_glob", {"pattern": pattern})
        within_deadline(elapsed, outcome)
        if isinstance(outcome, dict) and "ok" in outcome:
            assert len(outcome["ok"]) == 50


def test_deep_chain_glob_is_capped(prober: Component, tables: Tables, chain: Path) -> None:
    """A directory chain deeper than the walk's cap is refused, not walked."""
    elapsed, outcome = timed_call(prober, tables, "fs_glob", {"pattern": f"{chain}/**/zzz"})
    within_deadline(elapsed, outcome)
    assert isinstance(outcome, dict) and outcome.get("error") in ("limit-exceeded", "timeout")


@pytest.mark.parametrize("kind", ["sample", "elicit"])
def test_client_requests_end_by_the_deadline(
    prober_mcp: Component, tables: Tables, kind: str
) -> None:
    """A client that never answers sampling or elicitation costs the wall time, and the request
    is abandoned."""
    for _ in range(REPEAT):
        channel = Channel()
        elapsed, outcome = timed_call(
            prober_mcp, tables, "mcp_ask", {"kind": kind, "params": {}}, channel
        )
        within_deadline(elapsed, outcome)
        assert channel.abandoned.is_set()


# (id, prober method, args): host calls parked until the client cancels
PARKED: list[tuple[str, str, dict[str, Any]]] = [
    ("tcp-receive", "tcp_hold", {"host": "127.0.0.1", "port": "{T}"}),
    ("http-hold", "http_timed", {"url": "http://127.0.0.1:{H}/hold"}),
    ("http-trickle", "http_timed", {"url": "http://127.0.0.1:{H}/trickle-body"}),
    ("https-handshake", "http_timed", {"url": "https://127.0.0.1:{T}/"}),
    ("sample", "mcp_ask", {"kind": "sample", "params": {}}),
]


@pytest.mark.parametrize(("name", "method", "args"), PARKED, ids=[p[0] for p in PARKED])
def test_cancel_interrupts_the_host_call(
    prober_mcp: Component,
    tables: Tables,
    web: SlowPeer,
    holder: SlowPeer,
    name: str,
    method: str,
    args: dict[str, Any],
) -> None:
    """A cancel from the client ends a call parked in a host call within a wait slice."""
    checker = SkillPermissions.from_tables(tables, "prober")
    # A minute of wall time: only the cancel can end these calls soon.
    limits = dataclasses.replace(checker.limits, timeout_ms=60_000)
    ports = {"{H}": web.port, "{T}": holder.port}
    for _ in range(REPEAT):
        channel = Channel()
        ctx = CallContext("prober", limits, channel, checker=checker)
        # Cancel once the guest is parked: the peer took the connection, or the client
        # got the request.
        peer = holder if "{T}" in json.dumps(args) else web
        parked = channel.asked if name == "sample" else peer.accepted
        parked.clear()
        cancelled_at: list[float] = []

        def cancel(
            parked: threading.Event = parked,
            channel: Channel = channel,
            cancelled_at: list[float] = cancelled_at,
        ) -> None:
            parked.wait(10)
            cancelled_at.append(time.monotonic())
            channel.flag.set()

        threading.Thread(target=cancel, daemon=True).start()
        full = _fill(args, ports) | ({"timeout_ms": BIG_TIMEOUT_MS} if "kind" not in args else {})
        try:
            outcome: Any = prober_mcp.call(method, json.dumps(full), ctx).value
        except CallCancelled:
            outcome = "cancelled"
        ended = time.monotonic()
        assert outcome == "cancelled" or outcome.get("error") == "cancelled", outcome
        assert ended - cancelled_at[0] <= SLACK_S, ended - cancelled_at[0]


def test_nested_call_ends_by_its_callers_deadline(
    prober: Component, tables: Tables, holder: SlowPeer
) -> None:
    """A callee with a minute of its own stops when its 300 ms caller's time is up."""
    registry = Registry()
    for skill_id in ("prober", "callee"):
        checker = SkillPermissions.from_tables(tables, skill_id)
        spec = prober.describe(CallContext(skill_id, checker.limits, NullChannel()))
        registry.add(
            SkillEntry(
                spec=dataclasses.replace(spec, id=skill_id),
                component=prober,
                limits=checker.limits,
                checker=checker,
            )
        )
    registry.mark_ready()
    inner = {"host": "127.0.0.1", "port": holder.port, "timeout_ms": BIG_TIMEOUT_MS}
    for _ in range(REPEAT):
        started = time.monotonic()
        try:
            out: Any = registry.call_method(
                Call(
                    "prober",
                    "invoke_call",
                    {"skill_id": "callee", "method": "tcp_hold", "args": inner},
                )
            ).value
        except DeadlineExceeded:
            out = "deadline"
        elapsed = time.monotonic() - started
        assert elapsed <= WALL_S + SLACK_S, (elapsed, out)
        assert out == "deadline" or "timeout" in json.dumps(out), out
