"""``skilld serve``: load a bundle strictly and serve it over MCP."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from pathlib import Path
from typing import Any

from skilld import __version__, paths, telemetry
from skilld.cli._cluster import add_nats_options, nats_options
from skilld.errors import ConfinementUnavailable, SkilldError, UsageError


def register(sub: Any) -> None:
    """Add ``skilld serve``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="serve a bundle's skills as MCP tools",
        description="Verify the bundle (lock, signature, every digest) and serve its skills "
        "over MCP. Without --bundle, serves the demo bundle, building it first when missing. "
        "Only the state directory is written; nothing is fetched.",
    )
    p.add_argument(
        "--bundle",
        type=Path,
        metavar="DIR",
        help="a bundle from 'skilld build' (default: the demo bundle, built on first use)",
    )
    # The image's entry point is `skilld serve ...`: `docker run IMAGE --version` lands here.
    p.add_argument("--version", action="version", version=f"skilld {__version__}")
    p.add_argument(
        "--with-conformance",
        type=Path,
        metavar="DIR",
        help="add the MCP conformance suite's test_* tools, resources and prompts to the "
        "demo bundle, from DIR/skills/conformance and DIR/policies/conformance.yaml (a "
        "source checkout's tests/; for running the suite, never served otherwise)",
    )
    p.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (default) or http: Streamable HTTP at /mcp and SSE at /sse",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind for http (127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port for http (8080; 0 = any free)")
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST[:PORT|:*]",
        help="accept this Host header besides localhost (repeatable)",
    )
    p.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="accept this Origin besides local ones (repeatable)",
    )
    _auth_options(p)
    p.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="key-value state and the audit log (default: $SKILLD_STATE_DIR, else one "
        f"directory per bundle under {paths.state_dir('')}, e.g. .../demo)",
    )
    p.add_argument(
        "--audit-log",
        metavar="FILE|-",
        help="audit records as JSON lines (default: STATE_DIR/audit.jsonl; - = stderr)",
    )
    p.add_argument(
        "--kept-mib-per-caller",
        type=_positive_mib,
        metavar="MIB",
        help="what one caller's Agent Skill runs may keep as skill://NAME/runs/... outputs "
        "at once, in MiB (default 256; past it, its own oldest go first)",
    )
    p.add_argument(
        "--kept-mib",
        type=_positive_mib,
        metavar="MIB",
        help="what the node keeps for all callers together, in MiB (default 1024; when "
        "full, a new output is not kept and no other caller's is evicted)",
    )
    p.add_argument(
        "--log-file",
        type=Path,
        metavar="FILE",
        help="skilld's own log as JSON lines (default: stderr: JSON lines, or a banner and "
        "plain warnings when stderr is a terminal)",
    )
    p.add_argument(
        "--inline-ms",
        type=_inline_ms,
        default=1.0,
        metavar="MS",
        help="how long a tool call may first run on the event loop before it moves to a "
        "worker thread (default 1; 0 = every call on a thread; at most 100)",
    )
    p.add_argument(
        "--shutdown-grace",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="on SIGTERM or SIGINT, how long calls in flight may still run while new ones "
        "are refused (default 30; keep it below the stop timeout of docker or systemd)",
    )
    p.add_argument(
        "--worker-threads",
        type=int,
        default=64,
        metavar="N",
        help="threads that run guest calls, shared fairly by callers and skills (default 64); "
        "a call that finds none free within 2 s fails as busy",
    )
    p.add_argument(
        "--worker-idle",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="an idle worker thread leaves after this long (default 10)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=1000,
        metavar="N",
        help="HTTP connections open at once (default 1000, lowered to what ulimit -n allows); "
        "past it the longest-idle one is closed, or new requests get 503",
    )
    p.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=5.0,
        metavar="S",
        help="close an HTTP connection idle this long after a response (default 5)",
    )
    p.add_argument(
        "--header-timeout",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="close an HTTP connection that has not sent a request's headers within this "
        "long (default 10)",
    )
    p.add_argument(
        "--lock-key",
        type=Path,
        metavar="TRUST.pub.json",
        help="require bundle.lock to be signed by this key",
    )
    p.add_argument(
        "--recompile",
        action="store_true",
        help="compile native code into the cache when the engine changed",
    )
    c = p.add_argument_group(
        "cluster",
        "join a cluster over NATS: serve this bundle's skills to it and, as an entry node, "
        "the tools of every node (docs/cluster.md). Secrets are read from files only.",
    )
    add_nats_options(c)
    c.add_argument("--node", metavar="NAME", help="this node's name in the cluster ([a-z0-9-])")
    c.add_argument(
        "--cluster-key",
        type=Path,
        metavar="KEY.pem",
        help="the private key signing this node's announcements; peers must trust its "
        "public half for this node's name ('cluster' in a trust file)",
    )
    c.add_argument(
        "--heartbeat",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="announcement interval H (default 1); a node silent for 2.5 H is removed",
    )
    c.add_argument(
        "--cluster-kv",
        action="store_true",
        help="keep skills' key-value state in JetStream KV, shared by the nodes holding a "
        "skill (default: this node's SQLite file)",
    )
    c.add_argument(
        "--entry-only",
        action="store_true",
        help="serve only the cluster's skills, none of this bundle's own (its trust set "
        "still decides which nodes are accepted)",
    )
    c.add_argument(
        "--request-state-key",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a secret (32 bytes or more) the cluster's entry nodes share to seal the "
        "requestState of MCP input-required rounds, so a retry reaching any entry node "
        "reaches its call ('request-state.key' of `skilld cluster nats-config`); repeat "
        "to rotate: the first seals, all open",
    )
    c.add_argument(
        "--no-mcp",
        action="store_true",
        help="a worker-only node: serve skills to the cluster, no MCP transport",
    )
    p.set_defaults(handler=run)


def _auth_options(p: argparse.ArgumentParser) -> None:
    """Who may connect over HTTP, and each caller's share of the transport (docs/mcp.md)."""
    a = p.add_argument_group(
        "authentication (http)",
        "Without any of these, http serves only a loopback address (127.0.0.1, ::1) unless "
        "--allow-unauthenticated says otherwise.",
    )
    a.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="named bearer tokens: 'NAME TOKEN [SCOPE...]' per line, mode 0600, tokens of 32+ "
        "characters; re-read on SIGHUP (a removed token stops working)",
    )
    a.add_argument(
        "--token-file-init",
        action="store_true",
        help="if the --token-file does not exist, write one with a fresh token named 'admin' "
        "(scope skilld:metrics) and show it once in the log",
    )
    a.add_argument(
        "--token-env", metavar="VAR", help="environment variable holding a token (named VAR)"
    )
    a.add_argument(
        "--auth-issuer",
        metavar="URL",
        help="OAuth 2.1: accept JWT access tokens of this authorization server (its keys "
        "come from its metadata)",
    )
    a.add_argument(
        "--auth-audience",
        metavar="URI",
        help="this server's resource URI as clients reach it (e.g. https://skilld.example.com/mcp);"
        " tokens must be issued for it",
    )
    a.add_argument(
        "--auth-jwks", type=Path, metavar="FILE", help="the issuer's keys (a JWK set), air-gapped"
    )
    a.add_argument(
        "--auth-introspection",
        metavar="URL",
        help="RFC 7662 endpoint for opaque access tokens (with --auth-client-file)",
    )
    a.add_argument(
        "--auth-client-file",
        type=Path,
        metavar="FILE",
        help="this server's client credentials for introspection: 'CLIENT_ID SECRET', mode 0600",
    )
    a.add_argument(
        "--auth-scope",
        action="append",
        default=[],
        metavar="SCOPE",
        help="a scope every MCP request needs (repeatable; 403 insufficient_scope without)",
    )
    a.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a non-loopback address without authentication (anyone reaching it may call)",
    )
    c = p.add_argument_group("each caller's share (http)")
    c.add_argument("--max-sessions-per-caller", type=int, default=64, metavar="N")
    c.add_argument("--max-streams-per-caller", type=int, default=16, metavar="N")
    c.add_argument("--max-requests-per-caller", type=int, default=64, metavar="N")
    c.add_argument(
        "--write-timeout",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="drop a connection whose client has not read a response for this long (default 30)",
    )


def _auth_config(args: argparse.Namespace, logger: _Logger) -> dict[str, Any]:
    """The ServeConfig fields of the authentication options; makes the token file first
    when asked (its token is logged once, when made).

    Raises:
        UsageError: --token-file-init without --token-file, or the file cannot be made.
    """
    if args.token_file_init:
        if args.token_file is None:
            raise UsageError("--token-file-init needs --token-file FILE")
        from skilld.mcp import create_token_file

        token = create_token_file(args.token_file)
        if token is not None:
            logger.get().warning(
                "token_created",
                name="admin",
                token=token,
                file=str(args.token_file),
                hint="shown once: send it as 'Authorization: Bearer TOKEN'; "
                "edit the file to add named tokens (SIGHUP re-reads it)",
            )
    return {
        "token_file": args.token_file,
        "token_env": args.token_env,
        "auth_issuer": args.auth_issuer,
        "auth_audience": args.auth_audience,
        "auth_jwks_file": args.auth_jwks,
        "auth_introspection": args.auth_introspection,
        "auth_client_file": args.auth_client_file,
        "auth_scopes": tuple(args.auth_scope),
        "allow_unauthenticated": args.allow_unauthenticated,
        "max_sessions_per_caller": args.max_sessions_per_caller,
        "max_streams_per_caller": args.max_streams_per_caller,
        "max_requests_per_caller": args.max_requests_per_caller,
        "write_timeout_s": args.write_timeout,
    }


def _inline_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be between 0 and 100, not {text}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text}")
    return value


def run(args: argparse.Namespace) -> int:
    """Handle ``skilld serve``.

    Raises:
        SkilldError: at a terminal, for the CLI to print (elsewhere it is logged as JSON).
    """
    # One format per stream: a person at a terminal reads plain lines and a banner; a
    # pipe, a file or a supervisor gets JSON lines only (also when audit records share
    # stderr, which are JSON), the error that ends the server included.
    text = args.log_file is None and args.audit_log != "-" and sys.stderr.isatty()
    # Before any thread: the launcher forks from a single-threaded process, and a
    # SKILLD_RUN_AS drop of this process's privileges must cover every thread.
    confinement = _start_confinement()
    logger = _Logger(args, text)
    _setup_logging(logger)
    try:
        return _serve(args, text, logger, confinement)
    except SkilldError as exc:
        if text:
            raise
        logger.get().error(
            "failed",
            error=exc.message,
            kind=type(exc).__name__,
            location=exc.location,
            hint=exc.hint,
        )
        return 2 if isinstance(exc, UsageError) else 1


def _start_confinement() -> str:
    """Start the confinement launcher (see :func:`skilld.confine.start_from_env`); the
    active profile in one line.

    Raises:
        ConfinementUnavailable: ``SKILLD_RUN_AS`` is set and skilld could not take it
            (it never goes on serving as root).
    """
    from skilld import confine

    confine.start_from_env()
    try:
        return confine.profile().describe()
    except ConfinementUnavailable as exc:
        return f"native commands refused: {exc.message}"


def _serve(args: argparse.Namespace, text: bool, logger: _Logger, confinement: str) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from skilld.node import Node, NodeConfig, demo_bundle
    from skilld.permissions import CallerPolicy

    if args.bundle is None:
        progress = None if text else logging.getLogger("skilld.build").info
        bundle_dir = demo_bundle(with_conformance=args.with_conformance, progress=progress)
        state_name = "demo-conformance" if args.with_conformance is not None else "demo"
    elif args.with_conformance is not None:
        raise UsageError("--with-conformance adds to the demo bundle; it goes without --bundle")
    else:
        bundle_dir = args.bundle
        state_name = paths.bundle_state_name(bundle_dir)
    node_config = NodeConfig(
        bundle=bundle_dir,
        state_dir=args.state_dir or paths.state_dir(state_name),
        audit_log=args.audit_log,
        recompile=args.recompile,
        lock_key=args.lock_key,
        cluster=_cluster_config(args),
        serve_skills=not args.entry_only,
        kept_bytes_per_caller=args.kept_mib_per_caller,
        kept_bytes=args.kept_mib,
    )
    started = time.perf_counter()
    # Start-up is mostly imports (which hold the GIL) and hashing the bundle (which does
    # not): the bundle's files are opened and hashed on other cores from here on, while
    # this thread imports the runtime and then the MCP SDK. Nothing is trusted yet:
    # open_bundle compares each digest with the verified lock before using a file.
    from skilld.bundle import prehash_bundle

    with prehash_bundle(bundle_dir) as prehash:
        # The runtime's own modules are imported here, before the loader thread starts:
        # two threads importing at once only slow each other down.
        import skilld.audit
        import skilld.permissions
        import skilld.registry
        import skilld.state  # noqa: F401
        from skilld.bundle import open_bundle  # noqa: F401 - the loader, imported here

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="skilld-load") as pool:
            loading = pool.submit(Node.open, node_config, prehash=prehash)
            from skilld.mcp import ServeConfig, bind, serve

            # Bound before anything says ready: a busy port is the error a user sees.
            try:
                http = args.transport == "http" and not args.no_mcp
                sock = bind(args.host, args.port) if http else None
            except BaseException:
                with contextlib.suppress(Exception):
                    loading.result().close()
                raise
            try:
                node = loading.result()
            except BaseException:
                if sock is not None:
                    sock.close()
                raise
    with node, telemetry.configured(args.node):
        # Each skill's uid, in sorted order: a collision resolves the same way every start.
        from skilld import confine

        with contextlib.suppress(ConfinementUnavailable):
            confine.assign([entry.spec.id for entry in node.registry.skills()])
        config = ServeConfig(
            transport=args.transport,
            host=args.host,
            port=sock.getsockname()[1] if sock is not None else args.port,
            allowed_hosts=tuple(args.allowed_host),
            allowed_origins=tuple(args.allowed_origin),
            **_auth_config(args, logger),
            log_file=args.log_file,
            log_format="text" if text else "json",
            # the banner says what the info lines would; warnings and errors still show
            log_level="warning" if text else "info",
            inline_ms=args.inline_ms,
            shutdown_grace_s=args.shutdown_grace,
            worker_threads=args.worker_threads,
            worker_idle_s=args.worker_idle,
            max_connections=args.max_connections,
            idle_timeout_s=args.idle_timeout,
            header_timeout_s=args.header_timeout,
            confinement=confinement,
            **_round_options(args, node, logger),
        )
        logger.get().info(
            "ready",
            bundle=str(bundle_dir),
            skills=len(node.registry.skills()),
            tools=len(node.registry.tools()),
            state_dir=str(node_config.state_dir),
            stages_ms=node.timings,
            cluster=node_config.cluster.node if node_config.cluster else None,
            confinement=confinement,
            total_ms=round((time.perf_counter() - started) * 1000, 2),
        )
        if (args.token_file or args.token_env) and not CallerPolicy.from_tables(
            node.bundle.tables
        ).names_authenticated():
            # Deny by default: say so, or an upgraded token setup just lists nothing.
            logger.get().warning(
                "callers_unnamed",
                detail="no caller rule names a token or OAuth caller: they list and call "
                "nothing; write policies/callers/ (docs/policy.md, Callers) and rebuild",
            )
        if args.no_mcp:
            _wait_for_signal(logger)
            return 0
        if text:
            _banner(args, config, node, node_config)
        # The cluster's round relay and task board: the same wiring the tests and
        # benchmarks serve a node with.
        wiring = node.serving(config.task_ttl_ms / 1000)
        serve(node.registry, config, sock=sock, wiring=wiring)
    return 0


def _positive_mib(text: str) -> int:
    """Bytes from a positive whole number of MiB (argparse type).

    Raises:
        argparse.ArgumentTypeError: not a positive whole number.
    """
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of MiB")
    return int(text) << 20


def _round_options(args: argparse.Namespace, node: Any, logger: _Logger) -> dict[str, Any]:
    """The ServeConfig fields of input-required rounds in a cluster: this node's name in
    ``requestState`` and the entry nodes' shared sealing keys (the relay between them is
    wiring: ``Node.serving``).

    Raises:
        UsageError: a key file cannot be read, is readable by other users, or holds
            fewer than 32 bytes.
    """
    keys = []
    for path in args.request_state_key:
        secret = paths.read_private(path, "request-state key").strip()
        if len(secret) < 32:
            raise UsageError(
                "a request-state key must hold 32 bytes or more of secret randomness",
                location=str(path),
                hint="`skilld cluster nats-config` writes one: request-state.key",
            )
        keys.append(secret)
    if node.cluster is None:
        if keys:
            raise UsageError("--request-state-key needs --cluster")
        return {}
    if not keys:
        logger.get().warning(
            "request_state_key_missing",
            detail="no --request-state-key: this entry node seals input-required rounds with "
            "a key of its own, so a retry that a balancer sends to another entry node is "
            "refused there",
        )
    return {
        "node_id": node.cluster.config.node,
        "request_state_keys": tuple(keys),
    }


def _cluster_config(args: argparse.Namespace) -> Any:
    """The cluster options as a ClusterConfig, or None without --cluster.

    Raises:
        UsageError: --cluster without --node or --cluster-key, or cluster options without
            --cluster.
    """
    if args.cluster is None:
        if args.node or args.cluster_key or args.no_mcp or args.entry_only:
            raise UsageError("--node, --cluster-key, --entry-only and --no-mcp need --cluster")
        return None
    if not args.node or not args.cluster_key:
        raise UsageError(
            "--cluster needs --node NAME and --cluster-key KEY.pem",
            hint="create a key with 'skilld keygen' and trust its public half for the node "
            "names ('cluster' in policies/trust/NAME.pub.json)",
        )
    from skilld.cluster import ClusterConfig

    return ClusterConfig(
        node=args.node,
        key_file=args.cluster_key,
        heartbeat_s=args.heartbeat,
        **nats_options(args),
        entry=not args.no_mcp,
        kv=args.cluster_kv,
    )


def _wait_for_signal(logger: _Logger) -> None:
    """Block until SIGTERM or SIGINT (a worker-only node has no transport to wait on)."""
    import signal
    import threading

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _n, _f: stop.set())
    logger.get().info("serving the cluster only (--no-mcp) until SIGTERM")
    stop.wait()


def _auth_line(config: Any) -> str:
    """Which authentication the banner says is on."""
    named = config.token_file or (f"${config.token_env}" if config.token_env else None)
    if config.auth_issuer is not None:
        line = f"OAuth 2.1, tokens of {config.auth_issuer} for {config.auth_audience}"
        return line + (f"; named tokens ({named})" if named else "")
    if named:
        return f"named tokens ({named})"
    return "none (anyone who reaches the address may call)"


def _banner(args: argparse.Namespace, config: Any, node: Any, node_config: Any) -> None:
    """What a person starting the server needs: where to connect and how to stop."""
    from skilld.mcp import advertised_url

    what = "the demo bundle" if args.bundle is None else str(node_config.bundle)
    skills, tools = len(node.registry.skills()), len(node.registry.tools())
    lines = [f"skilld {__version__}: serving {what} ({skills} skills, {tools} tools)"]
    if config.transport == "http":
        url = advertised_url(config.host, config.port)
        if config.host in ("0.0.0.0", "", "::"):  # noqa: S104 - says where it listens
            # The URL above is for a client on this machine; say the server answers more.
            lines.append(f"  listening on:          every interface, port {config.port}")
        lines += [
            f"  MCP (Streamable HTTP): {url}",
            f"  MCP (SSE):             {url.removesuffix('/mcp')}/sse",
            f"  authentication:        {_auth_line(config)}",
        ]
    else:
        lines.append("  MCP over stdio: an MCP client starts this command and talks on stdin")
    audit = node_config.audit_target()
    lines += [
        f"  confinement:           {config.confinement}",
        f"  state and audit log:   {node_config.state_dir}"
        if audit == node_config.state_dir / "audit.jsonl"
        else f"  state:                 {node_config.state_dir}\n  audit log:             {audit}",
        "Press Ctrl-C to stop." if config.transport == "http" else "Ctrl-D or Ctrl-C stops it.",
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


class _Logger:
    """skilld's own log for this command, made when first needed (the MCP layer's logger).

    It is made lazily because importing the MCP layer is most of the start-up time, and
    it runs beside loading the bundle; a record logged before then waits for it.
    """

    def __init__(self, args: argparse.Namespace, text: bool):
        self._args = args
        self._text = text
        self._log: Any = None

    def get(self) -> Any:
        """The structlog logger (JSON lines, or plain lines at a terminal)."""
        if self._log is None:
            from skilld.mcp import ServeConfig, make_logger

            self._log = make_logger(
                ServeConfig(
                    log_file=self._args.log_file,
                    log_format="text" if self._text else "json",
                    log_level="warning" if self._text else "info",
                )
            ).bind(component="serve")
        return self._log


class _Bridge(logging.Handler):
    """Records of the stdlib loggers (sandbox, bundle, build) written by skilld's one logger."""

    def __init__(self, logger: _Logger):
        super().__init__()
        self._logger = logger

    def emit(self, record: logging.LogRecord) -> None:
        """Hand the record on at its level, naming the logger that wrote it; an exception
        as one field (its type and message), never a multi-line traceback."""
        fields: dict[str, str] = {"logger": record.name}
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            fields["exception"] = f"{type(exc).__name__}: {exc}".removesuffix(": ")
        self._logger.get().log(record.levelno, record.getMessage(), **fields)


def _setup_logging(logger: _Logger) -> None:
    bridge = _Bridge(logger)
    root = logging.getLogger("skilld")
    root.handlers[:] = [bridge]
    root.setLevel(logging.INFO)
    root.propagate = False
    # Everyone else's warnings (uvicorn's "Exception in ASGI application" when shutdown
    # cuts a request, asyncio, the MCP SDK) go through the same logger: without a handler
    # they would reach Python's last-resort handler, whose plain-text tracebacks break a
    # JSON log.
    # (Added beside any handler already there, such as a test runner's.)
    others = logging.getLogger()
    others.handlers[:] = [h for h in others.handlers if not isinstance(h, _Bridge)] + [bridge]
