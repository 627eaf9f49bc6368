"""What the egress proxy of native scripts costs, side by side in one run.

1. Starting and stopping the proxy of one command (``EgressProxy``: a port found free
   on every address, a listener on 127.0.0.1, its accepting thread), which
   ``shell.run`` and the native executor do per command of a skill with http grants.
2. ``shell.run`` of ``/bin/true`` with no network, with a tcp grant, and with an http
   grant (the proxy started and stopped around it).
3. ``curl`` of a local page through ``shell.run``: through the proxy (http grant) and
   straight to it (tcp grant, ``--noproxy '*'``).

Run: ``python bench/bench_egress.py [--scale F]`` (``--scale 0.1`` runs a tenth of the
iterations, to check the bench works). Needs Landlock with TCP rules and ``curl``.
"""

from __future__ import annotations

import argparse
import http.server
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from _util import row, timings

from skilld.permissions import SkillPermissions
from skilld.policy import compile_policies
from skilld.registry import NullChannel
from skilld.sandbox import CallContext
from skilld.sandbox._egress import EgressProxy
from skilld.sandbox.abi import shell

CURL = "/usr/bin/curl"


class _Page(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def _calls(policy: str) -> Callable[[], CallContext]:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "s.yaml").write_text(policy)
        tables = compile_policies(tmp).tables
    checker = SkillPermissions.from_tables(tables, "s")

    def new() -> CallContext:
        deadline = time.monotonic() + 30
        return CallContext("s", checker.limits, NullChannel(), checker=checker, deadline=deadline)

    return new


def main() -> int:
    """Time each path, print a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    args = parser.parse_args()
    if args.quick:
        args.scale = 0.01
    n = max(3, int(500 * args.scale))
    m = max(3, int(60 * args.scale))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/"
    shell_rules = f"shell:\n  - program: /bin/true\n  - program: {CURL}\n    args: ['**']\n"
    proxied = _calls(f"http:\n  - url: {url}\n{shell_rules}")
    tcp = _calls(f"tcp:\n  - host: 127.0.0.1\n    ports: {port}\n{shell_rules}")
    bare = _calls(shell_rules)

    def start_stop() -> None:
        with EgressProxy(proxied(), time.monotonic() + 30):
            pass

    def run(new: Callable[[], CallContext], *argv: str) -> None:
        out = shell.run(new(), {"argv": list(argv)})
        assert out["exit_code"] == 0, out

    print("| path | median (ms) | p99 (ms) |")
    print("|---|---|---|")
    print(row("proxy start + stop", timings(start_stop, n=n)))
    print(row("`shell.run /bin/true`, no network", timings(lambda: run(bare, "/bin/true"), n=m)))
    print(row("`shell.run /bin/true`, tcp grant", timings(lambda: run(tcp, "/bin/true"), n=m)))
    print(
        row(
            "`shell.run /bin/true`, http grant (proxy)",
            timings(lambda: run(proxied, "/bin/true"), n=m),
        )
    )
    print(row("`curl` through the proxy", timings(lambda: run(proxied, CURL, "-sS", url), n=m)))
    print(
        row(
            "`curl` straight (tcp grant)",
            timings(lambda: run(tcp, CURL, "-sS", "--noproxy", "*", url), n=m),
        )
    )
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
