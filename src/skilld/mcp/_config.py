"""How ``skilld serve`` serves: one frozen value of values, passed down explicitly.

The live objects serving is wired to (a cluster's round peers and task board) are not
configuration: the node builds them (``skilld.mcp._wiring``, ``skilld.node.Node.serving``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from skilld.errors import UsageError

# Host and Origin values a local client sends; always allowed, whatever the bind address.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Everything the MCP layer needs to know to serve a dispatcher.

    Attributes:
        transport: ``stdio`` (the protocol on stdin/stdout, logs on stderr) or ``http``
            (Streamable HTTP at ``/mcp`` and legacy SSE at ``/sse`` on one port).
        host: the address to bind for ``http``; binding ``0.0.0.0`` does not widen the
            Host/Origin allowlist.
        port: the TCP port for ``http`` (0 picks a free one).
        allowed_hosts: Host header values accepted besides the local ones, e.g.
            ``skilld.internal:8080`` or ``skilld.internal:*`` (any port).
        allowed_origins: Origin header values accepted besides local ones, e.g.
            ``https://agent.example.com``.
        token_file: the operator's named bearer tokens, ``NAME TOKEN [SCOPE...]`` per line
            (``#`` comments), mode 0600, each token at least 32 characters; re-read on SIGHUP.
        token_env: the name of an environment variable holding a bearer token (named
            after the variable).
        auth_issuer: the OAuth authorization server whose JWT access tokens are accepted
            (its metadata names its keys); with ``auth_audience``, skilld is an OAuth 2.1
            resource server (Protected Resource Metadata, RFC 9728).
        auth_audience: this server's resource URI (RFC 8707), e.g.
            ``https://skilld.example.com/mcp``: a token must name it in ``aud``.
        auth_jwks_file: the issuer's keys as a JWK set file (air-gapped: nothing fetched).
        auth_introspection: the issuer's RFC 7662 endpoint, for opaque access tokens.
        auth_client_file: this server's client credentials for introspection,
            ``CLIENT_ID SECRET`` (mode 0600).
        auth_scopes: scopes every MCP request needs (403 ``insufficient_scope`` without).
        auth_leeway_s: clock skew allowed on ``exp`` and ``nbf``.
        auth_keys_refresh_s: the issuer's keys are fetched again for an unknown ``kid``
            at most this often.
        allow_unauthenticated: serve without authentication on an address other than
            loopback (refused otherwise: anyone who reaches the port could call).
        max_sessions: Streamable HTTP sessions open at once, all callers together.
        max_sessions_per_caller: sessions one caller (``Caller.key``) may hold open.
        max_streams_per_caller: event streams (``GET /mcp``, ``GET /sse``) one caller may
            hold open.
        max_requests_per_caller: HTTP requests one caller may have in progress at once
            (each holds a connection).
        write_timeout_s: a connection whose client does not read a response for this
            long is closed (a client that never reads holds no connection for ever).
        max_body_bytes: the largest HTTP request body accepted (larger: 413).
        max_request_bytes_per_caller: the request bodies one caller's requests in progress
            may hold together (None: four of ``max_body_bytes``); past it, 429. A parsed
            body takes many times its size in memory while its request is served (a
            JSON object of many small values about 18 times), so requests in progress
            alone do not bound what one caller makes the server hold.
        max_reads_per_caller: how many of one caller's ``resources/read`` requests run at
            once; the rest wait their turn (holding no thread). A read may be a kept output
            of up to 64 MiB, which takes several times that while it is encoded and
            serialized, so this bounds what one caller's reads make at once.
        max_response_bytes_per_caller: the response bytes one caller's responses may have
            waiting to be written at once (a send of the response not yet taken by the
            connection: its client reads slower than the server answers, or not at all);
            a response that would pass it is dropped, its stream ended with nothing more
            (one response of any size passes when the caller has nothing else waiting).
            Requests in progress alone did not bound it: 64 requests asking for one large
            object (a kept output, a task's result) made the server hold it 64 times for
            the write timeout.
        queue_timeout_s: how long a call waits for a free slot of its skill (the skill's
            one gate, ``max_concurrency`` of its policy) before it fails as busy.
        worker_threads: threads that run blocking guest calls, shared fairly by all
            callers (one caller holds at most three quarters of them) and skills; a call
            that found no thread within ``queue_timeout_s`` fails as busy.
        worker_idle_s: an idle worker thread leaves after this long.
        inline_ms: how long a tool call may first run on the event loop itself: a
            backend that runs no guest code (delegate's ``kit_list``) answers there and
            skips the hand-off to a worker thread; guest code gives the attempt up
            before any of it runs and runs once, on a thread. 0 sends every call to a thread.
        client_request_timeout_s: how long a guest waits for a sampling or elicitation answer.
        shutdown_grace_s: how long shutdown waits for calls in flight.
        max_connections: HTTP connections open at once; lowered to what the descriptor
            limit allows. Past it the longest-idle connection is closed, or, when none
            is idle, the request is answered 503 (the probes are still answered).
        idle_timeout_s: an HTTP connection idle this long after a response is closed.
        header_timeout_s: an HTTP connection must send each request's headers within
            this long (of connecting, or of its previous response), else it is closed.
        log_file: write the log lines here instead of stderr.
        log_level: the lowest level of skilld's own log lines.
        log_format: ``json`` (one object per line, for machines) or ``text``
            (``skilld: LEVEL: EVENT key=value``, for a person at a terminal).
        server_name: the name reported in ``serverInfo``.
        server_version: the version reported in ``serverInfo``.
        node_id: names this node in the ``requestState`` of an input-required round
            (a random id per process when empty).
        request_state_keys: secrets (32 bytes or more) that seal ``requestState``; the
            first seals, all unseal (rotation). A cluster's entry nodes share them;
            empty: a random key held by this process only.
        round_ttl_s: how long a ``requestState`` stays valid (its call ends at its own
            deadline either way).
        max_rounds_per_caller: how many calls waiting for the client's answer
            (input-required rounds) one caller (``Caller.key``) may have on this node; a
            parked call keeps its skill slot. Past it, the caller's oldest waiting round
            ends as cancelled (clients may abandon rounds without a word), so one
            caller's unanswered rounds never hold more than this many slots.
        task_tools: tools that may run as tasks besides those the policy's ``mcp.tasks``
            names (``io.modelcontextprotocol/tasks``), each
            ``optional`` (a task when the client declared the extension) or ``required``
            (refused with -32021 otherwise; input is gathered in rounds first).
        task_ttl_ms: how long a task's record and result are kept after it was created.
        max_tasks_per_client: how many tasks one caller (``Caller.key``) may have
            running on this node at once; the next is refused (-32603) until one ends.
        max_tasks: how many tasks may run on this node at once, all clients together.
        max_task_results_per_client: how many tasks of one caller this node keeps,
            running or finished within their TTL; the next is refused (-32603, scope
            ``client-results``) until the oldest expires.
        max_task_result_bytes_per_client: how many bytes (JSON) of one caller's finished
            results this node keeps; a result beyond is dropped and its task ``failed``
            naming the cap (only that caller's task).
        confinement: the active confinement profile in one line (``/readyz`` shows it).
    """

    transport: Literal["stdio", "http"] = "stdio"
    host: str = "127.0.0.1"
    port: int = 8080
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    token_file: Path | None = None
    token_env: str | None = None
    auth_issuer: str | None = None
    auth_audience: str | None = None
    auth_jwks_file: Path | None = None
    auth_introspection: str | None = None
    auth_client_file: Path | None = None
    auth_scopes: tuple[str, ...] = ()
    auth_leeway_s: float = 30.0
    auth_keys_refresh_s: float = 30.0
    allow_unauthenticated: bool = False
    max_sessions: int = 10_000
    max_sessions_per_caller: int = 64
    max_streams_per_caller: int = 16
    max_requests_per_caller: int = 64
    write_timeout_s: float = 30.0
    max_body_bytes: int = 4 * 1024 * 1024
    max_request_bytes_per_caller: int | None = None
    max_response_bytes_per_caller: int = 256 * 1024 * 1024
    max_reads_per_caller: int = 2
    queue_timeout_s: float = 2.0
    worker_threads: int = 64
    worker_idle_s: float = 10.0
    inline_ms: float = 1.0
    client_request_timeout_s: float = 300.0
    shutdown_grace_s: float = 30.0
    max_connections: int = 1000
    idle_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    log_file: Path | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"
    server_name: str = "skilld"
    server_version: str = "0.1.0"
    node_id: str = ""
    request_state_keys: tuple[bytes, ...] = ()
    round_ttl_s: float = 600.0
    max_rounds_per_caller: int = 4
    task_tools: tuple[tuple[str, Literal["optional", "required"]], ...] = ()
    task_ttl_ms: int = 600_000
    max_tasks_per_client: int = 16
    max_tasks: int = 256
    max_task_results_per_client: int = 64
    max_task_result_bytes_per_client: int = 32 << 20
    confinement: str | None = None

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0:
            raise UsageError("max_body_bytes must be positive", location="serve config")
        if self.worker_threads <= 0 or self.worker_idle_s <= 0:
            raise UsageError(
                "worker_threads and worker_idle_s must be positive", location="serve config"
            )
        if not 0 <= self.inline_ms <= 100:
            raise UsageError(
                f"inline_ms must be between 0 and 100, not {self.inline_ms}",
                location="serve config",
                hint="an inline call holds up every session; 1 ms is the default",
            )
        if self.max_connections <= 0 or self.idle_timeout_s <= 0 or self.header_timeout_s <= 0:
            raise UsageError(
                "max_connections, idle_timeout_s and header_timeout_s must be positive",
                location="serve config",
            )
        if not 0 <= self.port <= 65535:
            raise UsageError(f"port {self.port} is out of range", location="serve config")
        task_caps = (
            self.max_tasks_per_client,
            self.max_tasks,
            self.max_task_results_per_client,
            self.max_task_result_bytes_per_client,
            self.max_rounds_per_caller,
        )
        if min(task_caps) <= 0:
            raise UsageError(
                "max_tasks_per_client, max_tasks, max_task_results_per_client and "
                "max_task_result_bytes_per_client and max_rounds_per_caller must be positive",
                location="serve config",
            )
        self._check_auth()

    def _check_auth(self) -> None:
        oauth = (self.auth_issuer, self.auth_audience)
        if any(oauth) and not all(oauth):
            raise UsageError(
                "--auth-issuer and --auth-audience go together",
                hint="the audience is this server's URL as clients reach it, e.g. "
                "https://skilld.example.com/mcp",
            )
        needs_issuer = (self.auth_jwks_file, self.auth_introspection, self.auth_client_file)
        if any(v is not None for v in needs_issuer) and self.auth_issuer is None:
            raise UsageError("--auth-jwks and --auth-introspection need --auth-issuer")
        if (self.auth_introspection is None) != (self.auth_client_file is None):
            raise UsageError("--auth-introspection and --auth-client-file go together")
        caps = (
            self.max_sessions,
            self.max_sessions_per_caller,
            self.max_streams_per_caller,
            self.max_requests_per_caller,
            self.max_reads_per_caller,
        )
        if self.max_request_bytes_per_caller is not None and (
            self.max_request_bytes_per_caller < self.max_body_bytes
        ):
            raise UsageError(
                "max_request_bytes_per_caller must be at least max_body_bytes (else a "
                "request of the largest body is always refused)",
                location="serve config",
            )
        if min(caps) <= 0 or self.write_timeout_s <= 0 or self.max_response_bytes_per_caller <= 0:
            raise UsageError(
                "the per-caller caps and write_timeout_s must be positive", location="serve config"
            )

    def authenticates(self) -> bool:
        """Whether HTTP clients must present a credential."""
        return any(
            v is not None
            for v in (self.token_file, self.token_env, self.auth_issuer, self.auth_introspection)
        )

    def host_allowlist(self) -> tuple[str, ...]:
        """Host header patterns accepted: the local names on any port, then the configured ones."""
        local = tuple(h for name in LOCAL_HOSTS for h in (name, f"{name}:*"))
        return local + self.allowed_hosts

    def origin_allowlist(self) -> tuple[str, ...]:
        """Origin patterns accepted: local http(s) origins on any port, then the configured ones."""
        local = tuple(
            o
            for name in LOCAL_HOSTS
            for scheme in ("http", "https")
            for o in (f"{scheme}://{name}", f"{scheme}://{name}:*")
        )
        return local + self.allowed_origins
