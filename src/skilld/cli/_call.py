"""``skilld call``: run one method of a component, for debugging skills."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from skilld import paths
from skilld.cli._common import parse_json_object
from skilld.errors import UsageError
from skilld.types import Caller

# `skilld call` acts for the local user at the terminal.
CLI = Caller.local("cli")

# The runtime is imported by the handler, not here: every command's parser is built on
# each start (also `skilld serve`'s), and none of them should pay for wasmtime.


def register(sub: Any) -> None:
    """Add ``skilld call``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "call",
        help="call one method of a skill component (debugging)",
        description="Load PATH.wasm, call METHOD with the JSON arguments and print the result "
        "as JSON (--describe: list its methods and their argument schemas instead). "
        "Key-value state persists in --state-dir, in the namespace named by "
        "--skill-id. Host capabilities other than log, kv and mcp are denied (no policy "
        "applies here).",
    )
    p.add_argument("component", type=Path, metavar="PATH.wasm", help="the skill component")
    p.add_argument(
        "method", nargs="?", metavar="METHOD", help="the method to call (not with --describe)"
    )
    p.add_argument(
        "args",
        nargs="?",
        default="{}",
        metavar="JSON",
        help="the arguments as a JSON object (default: {})",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where key-value state lives (default: $SKILLD_STATE_DIR, else "
        f"{paths.state_dir('call')}, apart from every served bundle's)",
    )
    p.add_argument(
        "--skill-id",
        default=None,
        metavar="ID",
        help="the key-value namespace the call uses (default: wasm-<first 16 hex digits of "
        "the component's sha256>). The id the component describes is never used for this: "
        "any component can claim any id, so trusting it would hand it that skill's keys. The "
        "default keeps a component's state to components with the same bytes; give the id "
        "explicitly to work with a skill's existing state",
    )
    p.add_argument(
        "--timeout-ms", type=int, default=10_000, metavar="MS", help="wall-clock deadline (10000)"
    )
    p.add_argument(
        "--memory-mb", type=int, default=256, metavar="MIB", help="memory cap in MiB (256)"
    )
    p.add_argument(
        "--describe",
        action="store_true",
        help="print the skill's methods and their argument schemas instead of calling one",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="show guest logs and output on stderr"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handle ``skilld call``."""
    from skilld.call import CallContext
    from skilld.registry import NullChannel
    from skilld.sandbox import Sandbox
    from skilld.state import SqliteState
    from skilld.types import Limits

    if not args.component.is_file():
        raise UsageError(f"no such component: {args.component}")
    if args.method is None and not args.describe:
        raise UsageError(
            "which method? give METHOD, or --describe to list them",
            hint=f"skilld call {args.component} --describe",
        )
    if args.method is not None and args.describe:
        raise UsageError("--describe calls nothing: leave out METHOD and JSON")
    if args.timeout_ms <= 0 or args.memory_mb <= 0:
        raise UsageError("--timeout-ms and --memory-mb must be positive")
    if args.skill_id is not None and not args.skill_id.strip():
        raise UsageError("--skill-id must not be empty")
    params = parse_json_object(args.args, "JSON arguments")
    wasm = args.component.read_bytes()
    skill_id = args.skill_id or default_skill_id(wasm)
    limits = Limits(memory_bytes=args.memory_mb << 20, timeout_ms=args.timeout_ms)
    with Sandbox(paths.cache_dir()) as sandbox:
        comp = sandbox.load(wasm, name=str(args.component))
        probe = CallContext(skill_id, limits, NullChannel())
        spec = comp.describe(probe)
        if args.describe:
            print(json.dumps(spec.as_dict(), indent=2))
            return 0
        state = SqliteState((args.state_dir or paths.state_dir("call")) / "state.sqlite3")
        try:
            kv = state.store(
                skill_id, value_limit=limits.kv_value_bytes, total_limit=limits.kv_total_bytes
            )
            # Messages name the skill as the component describes itself; its key-value
            # namespace stays ``skill_id`` (see --skill-id: a claimed id is never trusted).
            ctx = CallContext(spec.id or skill_id, limits, NullChannel(), kv=kv, caller=CLI)
            try:
                out = comp.call(
                    args.method, json.dumps(params, separators=(",", ":"), sort_keys=True), ctx
                )
            finally:
                if args.verbose:
                    _show_guest_output(ctx)
        finally:
            state.close()
    print(json.dumps(out.value, indent=2, ensure_ascii=False))
    for block in out.content:
        print(
            f"[{block.kind} content: {block.mime_type or ''} "
            f"{len(block.data or b'') or len(block.text or '')} bytes]",
            file=sys.stderr,
        )
    return 0


def default_skill_id(wasm: bytes) -> str:
    """The namespace of a component called without ``--skill-id``: derived from its bytes."""
    return f"wasm-{hashlib.sha256(wasm).hexdigest()[:16]}"


def _show_guest_output(ctx: Any) -> None:
    for level, message in ctx.logs:
        print(f"guest {level}: {message}", file=sys.stderr)
    for name, stream in (("stdout", ctx.stdout), ("stderr", ctx.stderr)):
        if stream:
            print(f"guest {name}:\n{bytes(stream).decode(errors='replace')}", file=sys.stderr)
