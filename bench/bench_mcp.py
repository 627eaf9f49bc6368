"""tools/call over Streamable HTTP: skilld against a bare SDK ``MCPServer``, side by side.

Both servers run in their own process on 127.0.0.1 and serve an ``echo`` tool that
returns the text it is given; this process drives them with the SDK's client, one
client session per concurrent caller, and reports p50/p99 latency, throughput and the
server's CPU time per call at concurrency 1 and 16, then the skilld/bare ratios.

By default skilld serves the demo bundle through its registry (policy context, audit
record, the caller's warm wasm instance) and the tool is ``echo-wat/echo``: a skill
written in WebAssembly text, with no guest runtime, so the numbers are skilld's own
cost. Other subjects, through ``--dispatcher module:factory`` and ``--tool``:

    python bench_mcp.py                                   # skilld's full stack, echo-wat
    python bench_mcp.py --tool echo/echo                  # the Python echo (CPython in wasm)
    python bench_mcp.py --dispatcher support.static_dispatcher:echo_dispatcher --tool echo
                                                          # the MCP layer alone
    python bench_mcp.py --inline-ms 0                     # every call on a worker thread
    python bench_mcp.py --trace                           # skilld traced: OTLP/HTTP batches to
                                                          # a local receiver (docs/tracing.md)
    python bench_mcp.py --sides baseline,skilld,traced --baseline-src ../base/src
                                                          # a change's cost: each side its own
                                                          # server, rounds alternating
    python bench_mcp.py --trace --rounds 16 --processes 4 # four server processes per side:
                                                          # two processes of one server differ
                                                          # by several percent (docs/tracing.md)
    python bench_mcp.py --sides skilld,jwt                # what a JWT caller adds: skilld as
                                                          # an OAuth resource server (docs/mcp.md);
                                                          # --auth jwt says the same
    python bench_mcp.py --quick                           # seconds: that it runs (CI)

With the default dispatcher the sides are bare, skilld and fresh: skilld with every skill
under ``instances: fresh`` (``_bundle:echo_registry_fresh``), a new instance per call.

The machine's speed drifts (a shared VM), so each cell runs ``--rounds`` times,
alternating the sides (in order, then backwards): latencies are pooled, throughput and
CPU per call are the median of the rounds. Each server process has its own speed too
(the same server, started twice, differed by up to 12% in a run at 16 at once): ``--processes N``
starts N of each side, each pair of rounds (one forwards, one backwards) going to the
next of them, and prints each process's p50. Throughput counts from the moment every
caller has opened its session, listed the tools and warmed up, to the moment the last
call returns.

Run from ``bench/`` (``_bundle`` lives there).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import anyio
import httpx2
from _bundle import BENCH_ISSUER, bench_callers
from _util import otlp_sink, pct
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

# The tests' support modules (support.static_dispatcher) are dispatchers to measure too.
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- the two servers (each runs as ``bench_mcp.py --serve KIND``) ------------------


def serve_skilld(
    port: int, factory: str, log_level: str, inline_ms: float, jwks: str | None = None
) -> None:
    """skilld's MCP layer over the dispatcher ``factory`` returns; with ``jwks`` (a JWK set
    file) an OAuth resource server whose callers present JWTs signed with its key."""
    from skilld.mcp import ServeConfig, serve

    if os.environ.get("OTEL_TRACES_EXPORTER"):  # the traced side (a baseline tree may have none)
        from skilld import telemetry

        telemetry.configure(node="bench")  # as `skilld serve` does
    module, _, name = factory.partition(":")
    dispatcher = getattr(importlib.import_module(module), name)()
    auth = {}
    if jwks is not None:
        # With authentication on, a caller no rule names may call nothing.
        dispatcher.use_callers(bench_callers())
        auth = {
            "auth_issuer": BENCH_ISSUER,
            "auth_audience": f"http://127.0.0.1:{port}/mcp",
            "auth_jwks_file": Path(jwks),
        }
    config = ServeConfig(
        transport="http",
        port=port,
        log_level=log_level,  # type: ignore[arg-type]
        inline_ms=inline_ms,
        **auth,  # type: ignore[arg-type]
    )
    serve(dispatcher, config)


def _jwt_setup(directory: str, port: int) -> tuple[str, str]:
    """A fresh RSA key's JWK set in ``directory`` and an access token under it for the
    server on ``port``: (jwks file, token)."""
    import json

    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    path = str(Path(directory) / "jwks.json")
    with open(path, "w", encoding="utf-8") as out:
        json.dump({"keys": [{**public, "kid": "bench", "use": "sig", "alg": "RS256"}]}, out)
    now = int(time.time())
    claims = {
        "iss": BENCH_ISSUER,
        "sub": "bench",
        "aud": f"http://127.0.0.1:{port}/mcp",
        "scope": "tools:call",
        "iat": now,
        "exp": now + 24 * 3600,
    }
    return path, jwt.encode(claims, key, algorithm="RS256", headers={"kid": "bench"})


def serve_bare(port: int) -> None:
    """The SDK's high-level server with the same tool, no skilld in between."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("bare")

    @app.tool()
    def echo(text: str) -> dict[str, str]:
        """Echo the text back."""
        return {"text": text}

    uvicorn.run(
        app.streamable_http_app(),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
    )


# -- the client side ----------------------------------------------------------------


def _prepare(dispatcher: str) -> None:
    """Let the dispatcher's module build what it serves (``prepare()``) before any timing."""
    module = importlib.import_module(dispatcher.partition(":")[0])
    prepare = getattr(module, "prepare", None)
    if prepare is not None:
        prepare()


async def _wait_up(kind: str, port: int, proc: subprocess.Popen[bytes]) -> None:
    # 30 s to start a server whose bundle is built already (_prepare): loading takes ~1 s.
    with anyio.fail_after(30):
        async with httpx2.AsyncClient(timeout=1) as http:
            while True:
                if proc.poll() is not None:
                    raise SystemExit(
                        f"bench_mcp: the {kind} server exited ({proc.returncode}) before it "
                        f"listened:\n{_log_tail(proc)}"
                    )
                try:
                    await http.get(f"http://127.0.0.1:{port}/mcp")
                except httpx2.TransportError:
                    await anyio.sleep(0.05)  # polling a child process that is starting up
                else:
                    return


class _Barrier:
    """Lets every one of ``parties`` tasks through once the last arrives; notes when."""

    def __init__(self, parties: int):
        self._waiting = parties
        self._all_here = anyio.Event()
        self.at = 0.0

    async def wait(self) -> None:
        self._waiting -= 1
        if self._waiting == 0:
            self.at = time.perf_counter()
            self._all_here.set()
        await self._all_here.wait()


async def _caller(
    url: str,
    tool: str,
    calls: int,
    latencies: list[float],
    warmup: int,
    warmed: _Barrier,
    finished: _Barrier,
    token: str | None,
) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await session.list_tools()
        for _ in range(warmup):
            await session.call_tool(tool, {"text": "warm"})
        await warmed.wait()
        for i in range(calls):
            started = time.perf_counter()
            result = await session.call_tool(tool, {"text": f"hello {i}"})
            latencies.append(time.perf_counter() - started)
            assert not result.is_error, result
        # Sessions close after the clock stops, not while other callers still call.
        await finished.wait()


async def measure(
    port: int, tool: str, concurrency: int, requests: int, token: str | None = None
) -> tuple[list[float], float]:
    """Latencies of ``requests`` calls spread over ``concurrency`` sessions, and the wall time.

    The clock starts once every session has warmed up and stops when the last call returns.
    """
    url = f"http://127.0.0.1:{port}/mcp"
    latencies: list[float] = []
    per_caller = max(1, requests // concurrency)
    warmed, finished = _Barrier(concurrency), _Barrier(concurrency)
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(_caller, url, tool, per_caller, latencies, 10, warmed, finished, token)
    return latencies, finished.at - warmed.at


def _spawn(args: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
    # kept, not shown (info logs each call): it says why a server did not start
    log = tempfile.TemporaryFile()  # noqa: SIM115  # lives as long as the server
    proc = subprocess.Popen(
        [sys.executable, __file__, *args], env=env, stdout=subprocess.DEVNULL, stderr=log
    )
    _LOGS[proc.pid] = log  # Popen keeps no handle on a file it was given (stderr is None)
    return proc


_LOGS: dict[int, IO[bytes]] = {}


def _log_tail(proc: subprocess.Popen[bytes], size: int = 4000) -> str:
    """The end of what a server spawned by :func:`_spawn` wrote to stderr."""
    log = _LOGS[proc.pid]
    log.seek(0)
    return log.read().decode(errors="replace")[-size:]


def _rss_mb(pid: int) -> tuple[float, float]:
    """(resident, peak resident) MiB of process ``pid`` (Linux; NaN elsewhere)."""
    found = {"VmRSS": math.nan, "VmHWM": math.nan}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in found:
                    found[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return found["VmRSS"], found["VmHWM"]


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The sides a run can put against each other (``--sides``), each its own server process:
#   bare     the SDK's MCPServer with the same tool, no skilld in between
#   skilld   skilld as served (tracing off: the default)
#   traced   skilld tracing every request (OTLP/HTTP batches to a receiver in a process of
#            its own)
#   baseline skilld from another source tree (``--baseline-src``: say, the commit before a
#            change), tracing off
#   fresh    skilld with every skill under ``instances: fresh`` (the default dispatcher's
#            registry, ``_bundle:echo_registry_fresh``): a new instance per call
#   jwt      skilld as an OAuth resource server (``--auth-jwks``: a JWK set file) whose
#            client presents an RS256 JWT on every request; against skilld, what a JWT
#            caller adds
SIDES = ("bare", "skilld", "traced", "baseline", "fresh", "jwt")
DEFAULT_DISPATCHER = "_bundle:echo_registry"
FRESH_DISPATCHER = "_bundle:echo_registry_fresh"


def _start_side(
    side: str,
    port: int,
    dispatcher: str,
    skilld_args: Sequence[str],
    traced: dict[str, str],
    baseline_src: str | None,
    keys: str,
) -> tuple[subprocess.Popen[bytes], str | None]:
    """One server process of ``side`` on ``port``, and the token its client presents (the
    jwt side's, for this port's audience; else None)."""
    listen = ["--port", str(port)]
    if side == "bare":
        return _spawn(["--serve", "bare", *listen]), None
    if side == "baseline":
        if baseline_src is None:
            raise SystemExit("bench_mcp: the baseline side needs --baseline-src DIR")
        # The other tree's skilld first on the path; this bench's helpers after it.
        path = os.pathsep.join([baseline_src, *sys.path])
        return _spawn(["--serve", "skilld", *listen, *skilld_args], {"PYTHONPATH": path}), None
    if side == "fresh":
        if dispatcher != DEFAULT_DISPATCHER:
            raise SystemExit("bench_mcp: the fresh side serves the default dispatcher only")
        fresh_args = ["--dispatcher", FRESH_DISPATCHER, *skilld_args[2:]]
        return _spawn(["--serve", "skilld", *listen, *fresh_args]), None
    if side == "jwt":
        jwks, token = _jwt_setup(tempfile.mkdtemp(dir=keys), port)
        return _spawn(["--serve", "skilld", *listen, "--jwks", jwks, *skilld_args]), token
    env = traced if side == "traced" else {}
    return _spawn(["--serve", "skilld", *listen, *skilld_args], env), None


async def run(
    requests: int,
    dispatcher: str,
    tool: str,
    log_level: str,
    rounds: int,
    inline_ms: float,
    sides: Sequence[str] = ("bare", "skilld"),
    baseline_src: str | None = None,
    processes: int = 1,
) -> None:
    """Build what skilld serves, start each side's servers (``processes`` each), measure
    each cell, print the table (ratios against the first side)."""
    with otlp_sink() as sink, tempfile.TemporaryDirectory() as keys:
        traced = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": sink}
        await _run(
            requests,
            dispatcher,
            tool,
            log_level,
            rounds,
            inline_ms,
            sides,
            traced,
            baseline_src,
            keys,
            processes,
        )


async def _run(
    requests: int,
    dispatcher: str,
    tool: str,
    log_level: str,
    rounds: int,
    inline_ms: float,
    sides: Sequence[str],
    traced: dict[str, str],
    baseline_src: str | None,
    keys: str,
    processes: int,
) -> None:
    _prepare(dispatcher)
    # servers[side]: that side's server processes, each (port, process, its client's token)
    servers: dict[str, list[tuple[int, subprocess.Popen[bytes], str | None]]] = {}
    skilld_args = [
        "--dispatcher",
        dispatcher,
        "--log-level",
        log_level,
        "--inline-ms",
        str(inline_ms),
    ]
    for side in sides:
        for _ in range(processes):
            port = _free_port()
            proc, token = _start_side(
                side, port, dispatcher, skilld_args, traced, baseline_src, keys
            )
            servers.setdefault(side, []).append((port, proc, token))
    # (side, concurrency) -> pooled latencies, per-round throughput, per-round CPU ms/call
    lats: dict[tuple[str, int], list[float]] = {}
    rates: dict[tuple[str, int], list[float]] = {}
    cpus: dict[tuple[str, int], list[float]] = {}
    # (side, concurrency) -> each server process's own latencies (the spread among them)
    each: dict[tuple[str, int], dict[int, list[float]]] = {}
    rss: dict[str, tuple[float, float]] = {}
    loads = [os.getloadavg()]
    try:
        for side, started in servers.items():
            for port, proc, _ in started:
                await _wait_up(side, port, proc)
        for concurrency in (1, 16):
            for turn in range(rounds):
                # Every other round backwards: the side measured right after another
                # shares the machine with that server's tail of work (its exporter's last
                # batch, its collector), so no side may always come second. A side's
                # processes take turns by pairs of rounds (one forwards, one backwards).
                which = (turn // 2) % processes
                for side in sides if turn % 2 == 0 else sides[::-1]:
                    name = "echo" if side == "bare" else tool
                    port, proc, token = servers[side][which]
                    before = _cpu_s(proc.pid)
                    lat, wall = await measure(port, name, concurrency, requests, token)
                    after = _cpu_s(proc.pid)
                    key = (side, concurrency)
                    lats.setdefault(key, []).extend(lat)
                    each.setdefault(key, {}).setdefault(which, []).extend(lat)
                    rates.setdefault(key, []).append(len(lat) / wall)
                    if before is not None and after is not None:
                        cpus.setdefault(key, []).append((after - before) / len(lat) * 1e3)
        rss = {side: _rss_mb(started[0][1].pid) for side, started in servers.items()}
        loads.append(os.getloadavg())
    finally:
        for started in servers.values():
            for _, proc, _ in started:
                proc.terminate()
        for started in servers.values():
            for _, proc, _ in started:
                proc.wait(timeout=60)

    def cell(key: tuple[str, int]) -> tuple[float, float, float, float]:
        cpu = statistics.median(cpus[key]) if cpus.get(key) else math.nan
        return (
            statistics.median(lats[key]) * 1e3,
            pct(lats[key], 0.99) * 1e3,
            statistics.median(rates[key]),
            cpu,
        )

    load = [max(at[i] for at in loads) for i in range(3)]
    print(
        f"tools/call over Streamable HTTP: {', '.join(sides)}; skilld's tool {tool} "
        f"(dispatcher {dispatcher}), bare's echo; {requests} calls per cell, {rounds} "
        f"alternating rounds, {processes} server process(es) per side, inline_ms "
        f"{inline_ms}; traced: OTLP/HTTP batches to a local receiver; jwt: an RS256 JWT "
        f"caller, keys from a JWK set file; load average "
        f"(1, 5, 15 min, the higher of start and end) "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    print()
    print("| server | concurrency | p50 ms | p99 ms | calls/s | server CPU ms/call |")
    print("|---|---|---|---|---|---|")
    for concurrency in (1, 16):
        for side in sides:
            p50, p99, rate, cpu = cell((side, concurrency))
            print(f"| {side} | {concurrency} | {p50:.2f} | {p99:.2f} | {rate:.0f} | {cpu:.2f} |")
    if processes > 1:
        print()
        print(f"p50 ms of each server process (of {processes} per side), by concurrency:")
        for concurrency in (1, 16):
            for side in sides:
                spread = " ".join(
                    f"{statistics.median(lat) * 1e3:.2f}"
                    for _, lat in sorted(each[(side, concurrency)].items())
                )
                print(f"  {side} c={concurrency}: {spread}")
    print()
    for side, (now, peak) in rss.items():
        print(
            f"{side} server resident memory at the end: {now:.0f} MiB (peak {peak:.0f} MiB)"
            + (" (its first process)" if processes > 1 else "")
        )
    first = sides[0]
    for side in sides[1:]:
        print()
        print(
            f"| concurrency | p50 {side}/{first} | p99 {side}/{first} "
            f"| throughput {side}/{first} | CPU/call {side}/{first} |"
        )
        print("|---|---|---|---|---|")
        for concurrency in (1, 16):
            s, b = cell((side, concurrency)), cell((first, concurrency))
            print(
                f"| {concurrency} | {s[0] / b[0]:.3f} | {s[1] / b[1]:.3f} | {s[2] / b[2]:.3f} "
                f"| {s[3] / b[3]:.3f} |"
            )


def main() -> None:
    """Parse the options: run the benchmark, or serve one side of it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="calls per cell and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per cell")
    parser.add_argument(
        "--dispatcher",
        default=DEFAULT_DISPATCHER,
        help="module:factory returning the Dispatcher skilld serves (default: the demo "
        "bundle's registry)",
    )
    parser.add_argument(
        "--tool",
        default="echo-wat/echo",
        help="the dispatcher's echo tool, taking {'text': str} (default: echo-wat/echo)",
    )
    parser.add_argument(
        "--log-level", default="info", help="skilld's log level (info logs each call)"
    )
    parser.add_argument(
        "--inline-ms",
        type=float,
        default=1.0,
        help="skilld's inline budget (default 1.0, the server's; 0 runs every call on a thread)",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="skilld traces every request (OTLP/HTTP batches to a local receiver): the sides "
        "bare and traced",
    )
    parser.add_argument(
        "--auth",
        choices=["jwt"],
        help="jwt: the sides skilld and jwt, skilld without authentication against skilld "
        "with a JWT caller (the cost of verifying the caller)",
    )
    parser.add_argument(
        "--sides",
        default=None,
        help=f"comma-separated sides to put against each other, the first the reference "
        f"(of {', '.join(SIDES)}; default bare,skilld,fresh with the default dispatcher, "
        "else bare,skilld)",
    )
    parser.add_argument(
        "--baseline-src",
        default=None,
        help="the src/ directory of another skilld tree, served as the side 'baseline'",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="server processes per side (default 1), taking turns by pairs of rounds: two "
        "processes of the same server differ by several percent at 16 at once (docs/tracing.md), "
        "which more of them average out",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a few calls, one round: that it runs (CI)"
    )
    parser.add_argument("--serve", choices=["skilld", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--jwks", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sides: tuple[str, ...] = ("bare", "traced" if args.trace else "skilld")
    if not args.trace and args.dispatcher == DEFAULT_DISPATCHER:
        sides = (*sides, "fresh")
    if args.auth == "jwt":
        sides = ("skilld", "jwt")
    if args.quick:
        args.requests, args.rounds, args.processes = 32, 1, 1
    if args.sides:
        sides = tuple(args.sides.split(","))
        if not set(sides) <= set(SIDES) or len(set(sides)) != len(sides):
            parser.error(f"--sides: distinct names of {', '.join(SIDES)}")
    if args.processes < 1:
        parser.error("--processes: one or more")
    if args.processes > 1 and args.rounds < 2 * args.processes:
        parser.error("--rounds: at least two per server process (--processes)")
    if args.serve == "skilld":
        serve_skilld(args.port, args.dispatcher, args.log_level, args.inline_ms, args.jwks)
    elif args.serve == "bare":
        serve_bare(args.port)
    else:
        anyio.run(
            run,
            args.requests,
            args.dispatcher,
            args.tool,
            args.log_level,
            args.rounds,
            args.inline_ms,
            sides,
            args.baseline_src,
            args.processes,
        )


if __name__ == "__main__":
    main()
