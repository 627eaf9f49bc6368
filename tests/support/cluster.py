"""A real nats-server (JetStream, temp dir, ephemeral port) and skilld nodes as processes."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from skilld.bundle import build_bundle
from skilld.package import SigningKey, trust_file_bytes, trusted_key, write_private_key
from skilld.sandbox import Sandbox
from support.env import ROOT, SKILLS, cache_dir, cache_env
from support.mcp_fakes import token_of

NATS_SERVER = Path(sys.executable).parent / "nats-server"
START_TIMEOUT_S = 60.0
AUDIT_EVENTS = ("call", "cluster-refused", "transfer")

# The hostile skill's policy in the cluster tests' bundles ({data}: its read-only directory).
HOSTILE_POLICY = (
    "skill: hostile\nkv: {}\nfs:\n  - id: data-ro\n    path: {data}\n    mode: ro\n"
    "invoke:\n  calls: [echo]\nlimits:\n  wall_time: 2s\n  memory: 128MiB\n"
)


def _reader(stream: Any, lines: list[str], inbox: queue.Queue[str]) -> None:
    for line in stream:
        lines.append(line)
        inbox.put(line)
    inbox.put("")  # end of stream


def _wait_line(inbox: queue.Queue[str], pattern: str, timeout: float, what: str) -> re.Match[str]:
    regex = re.compile(pattern)
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what}: no line matching {pattern!r} within {timeout}s")
        try:
            line = inbox.get(timeout=left)
        except queue.Empty:
            continue
        if line == "":
            raise RuntimeError(f"{what} ended before printing {pattern!r}")
        found = regex.search(line)
        if found:
            return found


class NatsServer:
    """nats-server with JetStream in ``store``, on 127.0.0.1; restartable on the same port."""

    def __init__(
        self,
        store: Path,
        max_payload: int | None = None,
        config: Path | None = None,
    ):
        self.store = store
        self.max_payload = max_payload
        self.config = config  # a `skilld cluster nats-config` configuration (TLS, NKeys)
        self.port = -1
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []

    @property
    def url(self) -> str:
        """The client URL."""
        return f"{'tls' if self.config else 'nats'}://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it (on the port it had, once it had one) and wait until it is ready."""
        argv = [str(NATS_SERVER), "-a", "127.0.0.1", "-p", str(self.port)]
        if self.config is not None:
            argv += ["-c", str(self.config)]  # JetStream's store is in the configuration
        else:
            argv += ["-js", "-sd", str(self.store)]
        if self.max_payload is not None:
            config = self.store.parent / "nats.conf"
            config.write_text(f"max_payload: {self.max_payload}\n")
            argv += ["-c", str(config)]
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        inbox: queue.Queue[str] = queue.Queue()
        threading.Thread(
            target=_reader, args=(self.proc.stderr, self.lines, inbox), daemon=True
        ).start()
        found = _wait_line(
            inbox, r"Listening for client connections on [\d.]+:(\d+)", 30, "nats-server"
        )
        self.port = int(found.group(1))
        _wait_line(inbox, r"Server is ready", 30, "nats-server")

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Stop it (SIGTERM) and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@dataclass
class NodeProc:
    """A ``skilld serve --cluster`` process."""

    name: str
    proc: subprocess.Popen[str]
    lines: list[str]
    inbox: queue.Queue[str]
    url: str | None = None
    state: Path = field(default_factory=Path)
    reader: threading.Thread | None = None

    def wait_line(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        """The next line of its log matching ``pattern``."""
        return _wait_line(self.inbox, pattern, timeout, f"node {self.name}")

    def seen(self, pattern: str, timeout: float = 30) -> None:
        """Wait until its log (so far, or from now on) has a line matching ``pattern``."""
        if not any(re.search(pattern, line) for line in list(self.lines)):
            self.wait_line(pattern, timeout)

    def log(self) -> str:
        """Everything it logged so far."""
        return "".join(self.lines)

    def kill(self) -> None:
        """kill -9."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._drained()

    def _drained(self) -> None:
        # Everything it wrote is in ``lines`` once the reader saw the end of its stderr.
        if self.reader is not None:
            self.reader.join(timeout=30)

    def stop(self) -> None:
        """SIGTERM, and wait for it to leave."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._drained()

    def audit(self) -> list[dict[str, Any]]:
        """Its audit records so far (nodes write them to stderr: ``--audit-log -``)."""
        records = []
        for line in list(self.lines):
            if line.startswith("{"):
                doc = json.loads(line)
                if doc.get("event") in AUDIT_EVENTS:
                    records.append(doc)
        return records

    def audit_until(
        self, ok: Callable[[list[dict[str, Any]]], bool], timeout: float = 30
    ) -> list[dict[str, Any]]:
        """Its audit records, once ``ok`` holds for them (waiting for more lines meanwhile)."""
        end = time.monotonic() + timeout
        while not ok(records := self.audit()):
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"node {self.name}: audit never matched: {records[-5:]}")
            try:
                self.inbox.get(timeout=left)  # any new line: look again
            except queue.Empty:
                continue
        return records

    def wait_audit(self, **match: Any) -> dict[str, Any]:
        """The next audit record whose fields equal ``match`` (skipping others)."""
        while True:
            found = self.wait_line(r"^\{.*\}$")
            doc = json.loads(found.group(0))
            if doc.get("event") in AUDIT_EVENTS and all(doc.get(k) == v for k, v in match.items()):
                return dict(doc)


# Every node name the cluster tests use: each has a key of its own, trusted for that name
# only (a node holding one member key trusted for node-* could sign as any node).
NODE_NAMES = tuple(
    f"node-{n}" for n in (*"abcdefghijklmnopqrstuvwxyz", "check", "w1", "w2", "w3", "r1", "r2")
)


@dataclass
class Keys:
    """Each node's own signing key, trusted for its own name only, and a stranger's key
    (trusted for nothing).

    ``member`` is the directory of the nodes' keys (``NODE.pem``): :func:`start_node` and
    :class:`SignedClient` take the key of the node they start or speak as from it.
    """

    member: Path
    stranger: Path
    trust: Path  # a directory: one trust file per node key, scoped to that node's name

    def of(self, node: str) -> Path:
        """``node``'s own key file."""
        return self.member / f"{node}.pem"


def node_key(key: Path, node: str) -> Path:
    """The key file ``node`` signs with: ``key`` itself, or ``node``'s in a directory of keys."""
    return key / f"{node}.pem" if key.is_dir() else key


def make_keys(root: Path) -> Keys:
    """A key per node of NODE_NAMES, each trusted for that node only, and a stranger's."""
    (root / "nodes").mkdir(parents=True, exist_ok=True)
    (root / "trust").mkdir(exist_ok=True)
    for node in NODE_NAMES:
        key = SigningKey.generate()
        write_private_key(key, root / "nodes" / f"{node}.pem")
        trusted = trusted_key(node, key.public_raw, [], cluster=[node])
        (root / "trust" / f"{node}.pub.json").write_bytes(trust_file_bytes(trusted))
    stranger = SigningKey.generate()
    write_private_key(stranger, root / "stranger.pem")
    return Keys(root / "nodes", root / "stranger.pem", root / "trust")


CLUSTER_SKILLS = ROOT / "tests" / "cluster" / "skills"


def make_bundle(
    sandbox: Sandbox, root: Path, skills: Sequence[str], keys: Keys, policies: dict[str, str]
) -> Path:
    """A bundle of ``skills`` (repo, test or cluster-test skills) trusting the member key."""
    src = root / "src"
    (src / "skills").mkdir(parents=True)
    (src / "policies" / "trust").mkdir(parents=True)
    for name in skills:
        origin = SKILLS.get(name) or (
            CLUSTER_SKILLS / name if (CLUSTER_SKILLS / name).is_dir() else ROOT / "skills" / name
        )
        shutil.copytree(origin, src / "skills" / name)
    for name, text in policies.items():  # a name may be a path: kits/notes.yaml
        (src / "policies" / name).parent.mkdir(parents=True, exist_ok=True)
        (src / "policies" / name).write_text(text)
    for trust_file in sorted(keys.trust.glob("*.pub.json")):
        shutil.copy(trust_file, src / "policies" / "trust" / trust_file.name)
    out = root / "bundle"
    build_bundle(
        src / "skills", src / "policies", out, sandbox=sandbox, cache_dir=cache_dir(), strict=False
    )
    return out


def start_node(
    name: str,
    bundle: Path,
    nats_url: str,
    key: Path,
    state: Path,
    *,
    http: bool = True,
    extra: Sequence[str] = (),
    heartbeat: float = 0.5,
    bus: Path | None = None,
) -> NodeProc:
    """Start ``skilld serve --cluster`` and wait until it serves (HTTP) or has joined.

    ``key``: the node's key file, or a directory of keys (``Keys.member``) holding it.
    ``bus``: the directory ``skilld cluster nats-config`` wrote; the node connects with
    its NKey seed there and trusts its CA.
    """
    key = node_key(key, name)
    if bus is not None:
        extra = [
            *extra,
            "--nats-nkey",
            str(bus / f"{name}.nk"),
            "--nats-tls-ca",
            str(bus / "ca.pem"),
        ]
    argv = [
        sys.executable,
        "-m",
        "skilld",
        "serve",
        "--bundle",
        str(bundle),
        "--state-dir",
        str(state),
        "--cluster",
        nats_url,
        "--node",
        name,
        "--cluster-key",
        str(key),
        "--heartbeat",
        str(heartbeat),
        "--audit-log",
        "-",
        *extra,
    ]
    argv += ["--transport", "http", "--port", "0"] if http else ["--no-mcp"]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **cache_env()},
    )
    lines: list[str] = []
    inbox: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_reader, args=(proc.stderr, lines, inbox), daemon=True)
    reader.start()
    node = NodeProc(name, proc, lines, inbox, state=state, reader=reader)
    try:
        if http:
            found = node.wait_line(r'^(\{.*"serving".*\})$', START_TIMEOUT_S)
            node.url = json.loads(found.group(1))["url"]
        else:
            node.wait_line(r"serving the cluster only", START_TIMEOUT_S)
    except (TimeoutError, RuntimeError):
        node.stop()
        raise RuntimeError(f"node {name} did not start:\n{node.log()[-4000:]}") from None
    return node


@contextmanager
def entry_nodes(
    nats_url: str,
    key: Path,
    worker_bundle: Path,
    gateway_bundle: Path,
    root: Path,
    state_key: Path | None = None,
    *,
    bus: Path | None = None,
    extra: Sequence[str] = (),
    worker: str = "node-b",
    worker_skills: int | None = None,
) -> Iterator[tuple[NodeProc, NodeProc, NodeProc]]:
    """(worker, a, c): ``worker``, serving ``worker_bundle`` without HTTP, and node-a and
    node-c, entry-only nodes serving ``gateway_bundle`` with ``extra`` options (sharing the
    round-sealing key file ``state_key`` when given); yielded once each entry node has
    seen the worker (announcing ``worker_skills`` skills, when given) and the other join.
    All are stopped on exit, the entry nodes first. ``key``, ``bus``: as for
    :func:`start_node`; ``root``: where each keeps its state (the worker's name without
    ``node-``, ``node-a``, ``node-c``)."""
    sealed = [] if state_key is None else ["--request-state-key", str(state_key)]
    state = root / worker.removeprefix("node-")
    started = [start_node(worker, worker_bundle, nats_url, key, state, http=False, bus=bus)]
    try:
        for name in ("node-a", "node-c"):
            started.append(
                start_node(
                    name,
                    gateway_bundle,
                    nats_url,
                    key,
                    root / name,
                    extra=["--entry-only", *sealed, *extra],
                    bus=bus,
                )
            )
        work, a, c = started
        joined = rf"node {worker} joined" + (
            rf" \({worker_skills} skills\)" if worker_skills is not None else ""
        )
        for entry, other in ((a, "node-c"), (c, "node-a")):
            entry.seen(joined)
            entry.seen(rf"node {other} joined")
        yield work, a, c
    finally:
        for node in reversed(started):
            node.stop()


EntryNodes = Callable[..., AbstractContextManager[tuple[NodeProc, NodeProc, NodeProc]]]
""":func:`entry_nodes` with its first arguments bound (the cluster tests' ``bus_entry_nodes``)."""


@contextmanager
def replicas_behind_entry(
    nats_url: str, key: Path, bundle: Path, gateway_bundle: Path, root: Path
) -> Iterator[tuple[list[NodeProc], NodeProc]]:
    """(replicas, entry): node-r1 and node-r2, both serving ``bundle`` without HTTP and
    keeping kv state in JetStream KV (one bucket, so neither withdraws a stateful skill),
    and node-a, an entry-only node serving ``gateway_bundle``; all stopped on exit, the
    entry node first. ``key``: as for :func:`start_node`; ``root``: where each keeps its
    state (``r1``, ``r2``, ``a``)."""
    started: list[NodeProc] = []
    try:
        for i in (1, 2):
            started.append(
                start_node(
                    f"node-r{i}",
                    bundle,
                    nats_url,
                    key,
                    root / f"r{i}",
                    http=False,
                    extra=["--cluster-kv"],
                )
            )
        entry = start_node(
            "node-a", gateway_bundle, nats_url, key, root / "a", extra=["--entry-only"]
        )
        started.insert(0, entry)
        yield started[1:], entry
    finally:
        for node in started:
            node.stop()


@dataclass
class Client:
    """An MCP SDK client session to an entry node, with what it was sent."""

    session: ClientSession
    changed: list[anyio.Event] = field(default_factory=lambda: [anyio.Event()])
    logs: list[types.LoggingMessageNotificationParams] = field(default_factory=list)

    async def tool_names(self) -> set[str]:
        """The tools listed now."""
        return {t.name for t in (await self.session.list_tools()).tools}

    async def wait_tools(self, ok: Callable[[set[str]], bool], timeout: float = 30) -> set[str]:
        """List tools until ``ok`` holds, waiting for list_changed notifications in between."""
        with anyio.fail_after(timeout):
            while True:
                event = self.changed[-1]
                names = await self.tool_names()
                if ok(names):
                    return names
                await event.wait()


async def _sampling(
    context: Any, params: types.CreateMessageRequestParams
) -> types.CreateMessageResult:
    first = params.messages[0].content
    text = first.text if isinstance(first, types.TextContent) else "?"
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=f"echo: {text}"), model="fake"
    )


async def _elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": "Ada"})


@asynccontextmanager
async def mcp_client(url: str) -> AsyncIterator[Client]:
    """An initialized client session to ``url`` that notes list_changed notifications."""
    holder: list[Client] = []

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", message)
        if isinstance(root, types.ToolListChangedNotification) and holder:
            done = holder[0].changed[-1]
            holder[0].changed.append(anyio.Event())
            done.set()

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        holder[0].logs.append(params)

    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(
            read,
            write,
            message_handler=on_message,
            logging_callback=on_log,
            sampling_callback=_sampling,
            elicitation_callback=_elicitation,
        ) as session,
    ):
        holder.append(Client(session))
        await session.initialize()
        yield holder[0]


class SignedClient:
    """A plain NATS client holding a key: it signs as node ``name`` would (``key_file``:
    a key, or a directory of node keys where it takes ``name``'s).

    What a compromised or misbehaving member could send; the attack tests use it to
    reach the checks that come after the signature (hidden methods, misaddressing).
    """

    def __init__(self, name: str, key_file: Path):
        from skilld.cluster._announce import Stamper
        from skilld.cluster._envelope import Sealer
        from skilld.package import load_private_key

        self.name = name
        self.key = load_private_key(node_key(key_file, name))
        self.stamper = Stamper()
        self.sealer = Sealer(name, self.key, self.stamper)

    def announcement(self) -> tuple[bytes, dict[str, str]]:
        """A signed announcement of this node (an entry node with no skills)."""
        from skilld.cluster import _announce

        data = _announce.payload(self.name, ("entry",), "0" * 64, [])
        return data, _announce.sign(data, self.key, self.stamper())

    def seal(self, meta: dict[str, Any], body: bytes) -> dict[str, str]:
        """The envelope headers for ``body``."""
        return self.sealer.seal(meta, body)


async def entry_in_flight(http: httpx2.AsyncClient, url: str) -> int:
    """The ``skilld_tool_calls_in_flight`` of the node serving MCP at ``url``, read from its
    /metrics as ``ops`` (a token file naming ``ops`` with the metrics scope)."""
    metrics = url.removesuffix("/mcp") + "/metrics"
    response = await http.get(metrics, headers={"Authorization": f"Bearer {token_of('ops')}"})
    found = re.search(r"^skilld_tool_calls_in_flight (\S+)$", response.text, re.MULTILINE)
    assert found is not None, response.text[-800:]
    return int(float(found.group(1)))
