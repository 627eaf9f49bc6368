"""delegate against direct tool calls: one intent that makes three tool calls, side by side.

One ``skilld serve`` process (stdio, the demo bundle) and one SDK client session. Each
round does the same work twice, alternating which goes first:

- ``delegate``: one ``tools/call`` of ``delegate`` with the intent
  ``add a note bench-N saying hello`` over the ``notes`` kit; the templates tier turns it
  into a program that calls ``add``, ``get`` and ``titles`` inside the sandbox;
- ``direct``: the client calls ``notes_add``, ``notes/get`` and ``notes/list`` itself.

It reports the median and p90 wall time per unit of work and the MCP round trips each
needs, plus the median time delegate spent generating and executing. Run from ``bench/``::

    python bench_delegate.py --rounds 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import anyio
from _util import pct
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


def _value(result: Any) -> Any:
    if result.is_error:
        raise RuntimeError("".join(getattr(c, "text", "") for c in result.content))
    if result.structured_content is not None:
        return result.structured_content.get("result", result.structured_content)
    return json.loads("".join(getattr(c, "text", "") for c in result.content))


async def _rounds(rounds: int, bundle: str | None, state: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "skilld", "serve", "--transport", "stdio", "--state-dir", state]
    if bundle:
        argv += ["--bundle", bundle]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))
    times: dict[str, list[float]] = {"delegate": [], "direct": []}
    trips = {"delegate": 0, "direct": 0}
    inner: dict[str, list[float]] = {"generation_ms": [], "execution_ms": []}
    async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
        await session.initialize()
        await session.list_tools()

        async def delegated(n: int) -> None:
            out = _value(
                await session.call_tool(
                    "delegate",
                    {"intent": f"add a note bench-{n} saying hello", "kit": "notes"},
                )
            )
            assert out["success"] and len(out["trace"]) == 3, out
            assert out["generation_tier"] == "templates"
            inner["generation_ms"].append(out["generation_time_ms"])
            inner["execution_ms"].append(out["execution_time_ms"])
            trips["delegate"] += 1

        async def direct(n: int) -> None:
            title = f"direct-{n}"
            _value(await session.call_tool("notes_add", {"title": title, "body": "hello"}))
            _value(await session.call_tool("notes/get", {"title": title}))
            _value(await session.call_tool("notes/list", {}))
            trips["direct"] += 3

        for n in range(-2, rounds):  # two warm-up rounds, not counted
            order = [("delegate", delegated), ("direct", direct)]
            if n % 2:
                order.reverse()
            for name, fn in order:
                t0 = time.perf_counter()
                await fn(n + 1000 * (n < 0))
                if n >= 0:
                    times[name].append((time.perf_counter() - t0) * 1000)
    return {
        name: {
            "median_ms": round(statistics.median(ts), 2),
            "p90_ms": round(pct(ts, 0.9), 2),
            "round_trips_per_unit": trips[name] // (rounds + 2),
        }
        for name, ts in times.items()
    } | {
        "delegate_inside": {k: round(statistics.median(v), 2) for k, v in inner.items()},
        "rounds": rounds,
    }


def main() -> None:
    """Run the comparison and print it (and the JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--bundle", help="a bundle with the notes kit (default: the demo bundle)")
    ap.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    args = ap.parse_args()
    if args.quick:
        args.rounds = 3
    import tempfile

    with tempfile.TemporaryDirectory(prefix="skilld-bench-delegate-") as state:
        out = anyio.run(_rounds, args.rounds, args.bundle, state)
    for name in ("delegate", "direct"):
        row = out[name]
        print(
            f"{name:9} median {row['median_ms']:8.2f} ms  p90 {row['p90_ms']:8.2f} ms  "
            f"MCP round trips {row['round_trips_per_unit']}"
        )
    print(f"delegate inside: {out['delegate_inside']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
