"""``skilld serve``: load a bundle strictly and serve it over MCP."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from skilld import paths

log = logging.getLogger("skilld.serve")


def register(sub: Any) -> None:
    """Add ``skilld serve``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="serve a bundle's skills as MCP tools",
        description="Verify the bundle (lock, signature, every digest) and serve its skills "
        "over MCP. Without --bundle, serves the demo bundle, building it first when missing. "
        "Only the state directory is written; nothing is fetched.",
    )
    p.add_argument("--bundle", type=Path, help="bundle directory (default: the demo bundle)")
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
    p.add_argument("--token-file", type=Path, help="bearer tokens for http, one per line")
    p.add_argument("--token-env", metavar="VAR", help="environment variable holding a bearer token")
    p.add_argument("--state-dir", type=Path, help=f"key-value state ({paths.state_dir()})")
    p.add_argument(
        "--audit-log",
        metavar="FILE|-",
        help="audit records as JSON lines (default: STATE_DIR/audit.jsonl; - = stderr)",
    )
    p.add_argument("--log-file", type=Path, help="skilld's own logs (default: stderr)")
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
    p.set_defaults(handler=run)


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
    """Handle ``skilld serve``."""
    from concurrent.futures import ThreadPoolExecutor

    from skilld.node import Node, NodeConfig, demo_bundle

    _setup_logging(args.log_file)
    bundle_dir = args.bundle or demo_bundle()
    node_config = NodeConfig(
        bundle=bundle_dir,
        state_dir=args.state_dir or paths.state_dir(),
        audit_log=args.audit_log,
        recompile=args.recompile,
        lock_key=args.lock_key,
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
        import skilld.bundle._load
        import skilld.permissions
        import skilld.registry
        import skilld.state  # noqa: F401

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="skilld-load") as pool:
            loading = pool.submit(Node.open, node_config, prehash=prehash)
            from skilld.mcp import ServeConfig, serve

            node = loading.result()
    with node:
        log.info(
            "skilld ready: %s",
            json.dumps(
                {
                    "event": "ready",
                    "bundle": str(bundle_dir),
                    "skills": len(node.registry.skills()),
                    "tools": len(node.registry.tools()),
                    "stages_ms": node.timings,
                    "total_ms": round((time.perf_counter() - started) * 1000, 2),
                }
            ),
        )
        config = ServeConfig(
            transport=args.transport,
            host=args.host,
            port=args.port,
            allowed_hosts=tuple(args.allowed_host),
            allowed_origins=tuple(args.allowed_origin),
            token_file=args.token_file,
            token_env=args.token_env,
            log_file=args.log_file,
            inline_ms=args.inline_ms,
            shutdown_grace_s=args.shutdown_grace,
            max_connections=args.max_connections,
            idle_timeout_s=args.idle_timeout,
            header_timeout_s=args.header_timeout,
        )
        serve(node.registry, config)
    return 0


def _setup_logging(log_file: Path | None) -> None:
    handler: logging.Handler = (
        logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger("skilld")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
