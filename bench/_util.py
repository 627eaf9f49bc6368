"""Small helpers for the benchmarks: timing loops, a table printer, an OTLP receiver."""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def timings(fn: Callable[[], object], *, n: int, warmup: int = 3) -> list[float]:
    """Seconds per run of ``fn``, ``n`` runs after ``warmup``."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(name: str, values: list[float]) -> str:
    """One table row in milliseconds: median, p99."""
    return f"| {name} | {statistics.median(values) * 1e3:.3f} | {pct(values, 0.99) * 1e3:.3f} |"


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


def _serve_sink(port: multiprocessing.queues.Queue[int]) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    port.put(server.server_address[1])
    server.serve_forever()


@contextmanager
def otlp_sink() -> Iterator[str]:
    """A local OTLP/HTTP receiver in a process of its own that takes every batch (200,
    nothing kept): its URL. Its CPU is neither the traced process's nor the benchmark
    client's (whose event loop a receiver thread would slow, as an exporter's batches
    arrive)."""
    port: multiprocessing.queues.Queue[int] = multiprocessing.Queue()
    proc = multiprocessing.Process(target=_serve_sink, args=(port,), daemon=True)
    proc.start()
    try:
        yield f"http://127.0.0.1:{port.get(timeout=30)}"
    finally:
        proc.terminate()
        proc.join()
