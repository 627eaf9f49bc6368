"""``skilld serve``: load a bundle strictly and serve it over MCP."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from skilld import __version__, paths
from skilld.errors import UsageError

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


def _stage(timings: dict[str, float], name: str, since: float) -> float:
    now = time.perf_counter()
    timings[name] = round((now - since) * 1000, 2)
    return now


def load_registry(
    bundle_dir: Path,
    state_dir: Path,
    *,
    audit: Any,
    recompile: bool = False,
    lock_key: Path | None = None,
    prehash: Any = None,
) -> tuple[Any, Any, dict[str, float]]:
    """Verify and load a bundle into a ready registry; returns (registry, sandbox, timings).

    ``prehash`` is the bundle's files already being hashed (``prehash_bundle``).

    Raises:
        BundleError: the bundle is damaged, unknown content, or for another engine.
        PolicyError: its tables are malformed.
    """
    from skilld.bundle import open_bundle
    from skilld.permissions import SkillPermissions
    from skilld.registry import Registry, SkillEntry, annotations_for
    from skilld.sandbox import Sandbox
    from skilld.state import SqliteState
    from skilld.types import SkillSpec

    timings: dict[str, float] = {}
    t = time.perf_counter()
    sandbox = Sandbox(paths.cache_dir())
    verify = None
    if lock_key is not None:
        # The build side (and cryptography) only when a lock key asks for it.
        from skilld.bundle import verify_lock_signature

        verify = verify_lock_signature(lock_key)
    loaded = open_bundle(
        bundle_dir, sandbox, recompile=recompile, verify_lock=verify, prehash=prehash
    )
    timings.update({k: round(v, 2) for k, v in loaded.timings_ms.items()})
    tables = loaded.tables
    t = time.perf_counter()
    # describe: what each skill's describe export returned at build time, from the lock
    # (verified above), so serving never runs guest code before the first call.
    specs = {
        locked.id: SkillSpec.from_dict({**locked.spec, "id": locked.id, "version": locked.version})
        for locked in loaded.lock.skills
    }
    t = _stage(timings, "describe", t)
    state = SqliteState(state_dir / "state.sqlite3")
    registry = Registry(audit=audit)
    for locked in loaded.lock.skills:
        spec = specs[locked.id]
        checker = SkillPermissions.from_tables(tables, locked.id)
        limits = tables.limits(locked.id)
        loaded.components[locked.id].prewarm(limits)
        grants = tables.skill(locked.id)
        registry.add(
            SkillEntry(
                spec=spec,
                component=loaded.components[locked.id],
                limits=limits,
                kv=state.store(
                    locked.id, value_limit=limits.kv_value_bytes, total_limit=limits.kv_total_bytes
                )
                if grants.get("kv")
                else None,
                checker=checker,
                exposure=tables.exposure(locked.id),
                annotations=annotations_for(grants),
                description=locked.description,
            )
        )
    t = _stage(timings, "register", t)
    registry.mark_ready()
    return registry, sandbox, timings


def run(args: argparse.Namespace) -> int:
    """Handle ``skilld serve``."""
    from concurrent.futures import ThreadPoolExecutor

    _setup_logging(args.log_file)
    state_dir = args.state_dir or paths.state_dir()
    state_dir.mkdir(parents=True, exist_ok=True)
    bundle_dir = args.bundle or _demo_bundle()
    if not (bundle_dir / "bundle.lock").is_file():
        raise UsageError(
            f"{bundle_dir} is not a bundle (no bundle.lock)",
            hint="build one with 'skilld build -o DIR'",
        )
    started = time.perf_counter()
    # Start-up is mostly imports (which hold the GIL) and hashing the bundle (which does
    # not): the bundle's files are opened and hashed on other cores from here on, while
    # this thread imports the runtime and then the MCP SDK. Nothing is trusted yet:
    # open_bundle compares each digest with the verified lock before using a file.
    from skilld.bundle import prehash_bundle

    with prehash_bundle(bundle_dir) as prehash:
        from skilld.audit import JsonLinesSink

        if args.audit_log == "-":
            audit = JsonLinesSink(sys.stderr)
        else:
            audit = JsonLinesSink(
                Path(args.audit_log) if args.audit_log else state_dir / "audit.jsonl"
            )
        # The runtime's own modules are imported here, before the loader thread starts:
        # two threads importing at once only slow each other down.
        import skilld.bundle._load
        import skilld.permissions
        import skilld.registry
        import skilld.state  # noqa: F401

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="skilld-load") as pool:
            loading = pool.submit(
                load_registry,
                bundle_dir,
                state_dir,
                audit=audit,
                recompile=args.recompile,
                lock_key=args.lock_key,
                prehash=prehash,
            )
            from skilld.mcp import ServeConfig, serve

            registry, sandbox, timings = loading.result()
    log.info(
        "skilld ready: %s",
        json.dumps(
            {
                "event": "ready",
                "bundle": str(bundle_dir),
                "skills": len(registry.skills()),
                "tools": len(registry.tools()),
                "stages_ms": timings,
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
    try:
        serve(registry, config)
    finally:
        sandbox.close()
        audit.close()
    return 0


def _setup_logging(log_file: Path | None) -> None:
    handler: logging.Handler = (
        logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger("skilld")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def _demo_sources() -> tuple[Path, Path]:
    """skills/ and policies/ of the demo: $SKILLD_DEMO_DIR, else the source checkout."""
    base = Path(os.environ.get("SKILLD_DEMO_DIR") or Path(__file__).resolve().parents[3])
    skills, policies = base / "skills", base / "policies"
    if not (skills.is_dir() and policies.is_dir()):
        raise UsageError(
            "no demo skills and policies found",
            hint="pass --bundle DIR, or set SKILLD_DEMO_DIR to a directory holding "
            "skills/ and policies/",
        )
    return skills, policies


def _demo_bundle() -> Path:
    """The demo bundle in the cache, built from the demo sources when missing or stale."""
    import hashlib

    from skilld.sandbox import Sandbox, engine_fingerprint

    skills, policies = _demo_sources()
    # Everything the demo bundle is made of: its sources, the SDK and ABI compiled into
    # every skill, and this skilld (engine included) that compiles it.
    h = hashlib.sha256(f"{__version__} {engine_fingerprint()[1]}".encode())
    for root in (skills, policies, paths.sdk_dir(), paths.wit_dir()):
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
                h.update(path.read_bytes())
    out = paths.cache_dir() / "demo-bundle" / h.hexdigest()[:16]
    if not (out / "bundle.lock").is_file():
        print(
            f"building the demo bundle from {skills} and {policies} (first run only) ...",
            file=sys.stderr,
            flush=True,
        )
        start = time.monotonic()
        # The build toolchain (cryptography, componentize-py) only when building.
        from skilld.bundle import build_bundle

        with Sandbox(paths.cache_dir()) as sandbox:
            build_bundle(
                skills,
                policies,
                out,
                sandbox=sandbox,
                cache_dir=paths.cache_dir(),
                progress=lambda m: print(
                    f"[{time.monotonic() - start:6.1f}s] {m}", file=sys.stderr, flush=True
                ),
            )
    return out
