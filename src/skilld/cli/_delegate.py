"""``skilld delegate``: an intent (or a program file to run or validate) over a kit, from the shell.

It opens the bundle as a node like ``skilld serve`` and calls the ``delegate`` skill through the
registry, so a CLI run is the same code as an MCP call: slots, audit, the sandbox.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from skilld import paths
from skilld.call import Call
from skilld.errors import UsageError
from skilld.types import Caller


def register(sub: Any) -> None:
    """Add ``skilld delegate``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "delegate",
        help="turn an intent into a program over a kit and run it (or validate a program)",
        description="skilld delegate INTENT --kit NAME [--param k=v]: the tiers (templates, "
        "rules, then any configured model) write a program over the kit's tools; it is "
        "validated and run in the sandbox, and the result with its trace is printed as JSON. "
        "skilld delegate validate FILE --kit NAME: check a program without running it "
        "(exit 1 when refused). skilld delegate run FILE --kit NAME [--args JSON]: validate "
        "and run a program you wrote, as the run_program tool does. See docs/delegate.md.",
    )
    p.add_argument(
        "words", nargs="+", metavar="INTENT", help="the intent (or: validate FILE, run FILE)"
    )
    p.add_argument("--kit", required=True, help="the kit's name")
    p.add_argument(
        "--param", action="append", default=[], metavar="NAME=VALUE", help="bind a parameter"
    )
    p.add_argument(
        "--args",
        metavar="JSON",
        help="with run FILE: the program's parameters as one JSON object",
    )
    p.add_argument("--bundle", type=Path, help="bundle directory (default: the demo bundle)")
    p.add_argument(
        "--state-dir",
        type=Path,
        help="key-value state (default: the one `skilld serve` uses for the bundle)",
    )
    p.add_argument(
        "--audit-log", metavar="FILE|-", help="audit records (default: STATE_DIR/audit.jsonl)"
    )
    p.add_argument("--ollama-url", help="use a local Ollama model at this URL as a tier")
    p.add_argument("--ollama-model", help="the Ollama model's name")
    p.add_argument("--anthropic-key-file", type=Path, help="use Anthropic; the key is in FILE")
    p.add_argument("--anthropic-key-env", metavar="VAR", help="use Anthropic; the key is in $VAR")
    p.add_argument("--anthropic-model", help="the Anthropic model's name")
    p.add_argument(
        "--retries", type=int, default=None, help="corrections asked of a model per tier (2)"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handle ``skilld delegate``."""
    from dataclasses import replace

    from skilld.delegate import SKILL_ID, InferenceConfig, parse_params
    from skilld.node import Node, NodeConfig, demo_bundle

    if args.words[0] in ("validate", "run") and len(args.words) == 2:
        source = Path(args.words[1])
        try:
            program = source.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {source}: {exc.strerror}") from exc
        if args.words[0] == "validate":
            method, call_args = "validate_program", {"program": program, "kit": args.kit}
        else:
            params = {**_json_object(args.args), **parse_params(args.param)}
            call_args = {"program": program, "kit": args.kit, "params": params}
            method = "run_program"
    else:
        intent = " ".join(args.words)
        params = parse_params(args.param)
        method, call_args = "delegate", {"intent": intent, "kit": args.kit, "params": params}
    config = InferenceConfig.from_env()
    overrides = {
        "ollama_url": args.ollama_url,
        "ollama_model": args.ollama_model,
        "anthropic_key_file": args.anthropic_key_file,
        "anthropic_key_env": args.anthropic_key_env,
        "anthropic_model": args.anthropic_model,
        "retries": args.retries,
    }
    config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
    # The same state as `skilld serve` of that bundle, so a kit sees the served notes.
    state_name = "demo" if args.bundle is None else paths.bundle_state_name(args.bundle)
    node_config = NodeConfig(
        bundle=args.bundle or demo_bundle(),
        state_dir=args.state_dir or paths.state_dir(state_name),
        audit_log=args.audit_log,
        delegate=config,
    )
    with Node.open(node_config) as node:
        if SKILL_ID not in {s.spec.id for s in node.registry.skills()}:
            raise UsageError("this bundle has no kits", hint="declare kits in policies/kits/")
        out = node.registry.call_method(
            Call(SKILL_ID, method, call_args, caller=Caller.local("cli"))
        )
    print(json.dumps(out.value, indent=2, ensure_ascii=False))
    if method == "validate_program":
        return 0 if out.value["valid"] else 1
    return 0 if out.value["success"] else 1


def _json_object(text: str | None) -> dict[str, Any]:
    """``--args``: one JSON object (none: no parameters).

    Raises:
        UsageError: it is not JSON, or not an object.
    """
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--args is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise UsageError('--args must be a JSON object, e.g. \'{"text": "hi"}\'')
    return value
