"""What tracing's hooks cost one call, off (the default) and on, measured in process.

A tool call of a wasm skill passes these hooks (docs/tracing.md): the worker-thread
hand-off (``carry``), two gate waits and the instance (stages: no span when quick), the
call's span, the guest run (a span when a host function's needs a parent), one span per
host function and one decision per permission question (the MCP SDK's request span is
not counted here). This times that set,
as one "call's hooks", with tracing off and then on (spans batched over OTLP/HTTP to a
receiver in another process that takes every batch), against nothing at all. The CPU time
is this process's (the batch exporter's thread included), so a loaded machine moves it less
than wall time.

    python bench_telemetry.py [--calls 20000] [--host-calls 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from _util import otlp_sink

from skilld import telemetry
from skilld.types import Caller, Decision

DECISION = Decision(True, "kv", "set", "k", "notes.kv", "granted")
# An MCP client without authentication, as the ring now passes it: a typed caller.
_CALLER = Caller.anonymous()


def one_call(host_calls: int) -> None:
    """The hooks one wasm tool call passes, in their nesting."""
    telemetry.carry(lambda: None)
    with telemetry.stage("skilld.gate.wait", {"skilld.skill": "notes"}):
        pass
    with telemetry.stage("skilld.gate.wait", {"skilld.skill": "notes"}):
        pass
    with telemetry.call_span("notes", "add", caller=_CALLER, depth=0, arguments="{}") as span:
        with telemetry.stage("skilld.instance", {"skilld.instance": "fresh"}):
            telemetry.annotate({"skilld.instance": "warm"})
        # As the sandbox runs a guest: a span once a host function's span needs a parent
        # (--host-calls 0: a quick run, no span).
        with telemetry.run_span("skilld.guest.run"):
            for _ in range(host_calls):
                with telemetry.span("skilld.host kv.set"):
                    telemetry.decision(DECISION)
        span.result(None)


def timed(fn: Callable[[], None], calls: int, rounds: int = 5) -> tuple[float, float]:
    """Median wall and CPU microseconds per ``fn()`` over ``rounds`` rounds of ``calls``."""
    walls, cpus = [], []
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            fn()
        walls.append((time.perf_counter() - w0) / calls * 1e6)
        cpus.append((time.process_time() - c0) / calls * 1e6)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    """Time nothing, the hooks off, the hooks on; print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--host-calls", type=int, default=2)
    parser.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    args = parser.parse_args()
    if args.quick:
        args.calls = 200
    rows = [("nothing", timed(lambda: None, args.calls))]
    rows.append(("tracing off", timed(lambda: one_call(args.host_calls), args.calls)))
    with otlp_sink() as url:
        # A queue that takes every span: none dropped, every one encoded and sent.
        os.environ.update(
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_ENDPOINT=url,
            OTEL_BSP_MAX_QUEUE_SIZE="1000000",
        )
        assert telemetry.configure(node="bench")
        try:
            rows.append(("tracing on", timed(lambda: one_call(args.host_calls), args.calls // 10)))
            # The batches still queued are part of the cost: sent before the clock stops.
            c0 = time.process_time()
            telemetry.flush(60.0)
            flushed = (time.process_time() - c0) / (5 * (args.calls // 10)) * 1e6
        finally:
            telemetry.shutdown()
    load = os.getloadavg()
    print(
        f"one call's tracing hooks ({args.host_calls} host calls); load average "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    print()
    print("| tracing | wall µs per call | CPU µs per call |")
    print("|---|---|---|")
    for name, (wall, cpu) in rows:
        print(f"| {name} | {wall:.2f} | {cpu:.2f} |")
    print()
    print(f"and the batches left queued at the end: {flushed:.2f} CPU µs per call more")


if __name__ == "__main__":
    main()
