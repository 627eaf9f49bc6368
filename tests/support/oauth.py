"""The test authorization server (``support.oauth_server``) as a process, and a skilld
server that trusts it."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2

from skilld.mcp import HttpServer, ServeConfig, bind, serve_http_async
from skilld.registry import Dispatcher
from support.mcp_fakes import TESTS


@dataclass
class Authority:
    """A running ``support.oauth_server``: its issuer URL and its test controls."""

    issuer: str
    process: subprocess.Popen[str] = field(repr=False)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx2.post(f"{self.issuer}{path}", json=body, timeout=30)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    def token(self, client: str, resource: str, scope: str = "", **form: str) -> str:
        """An access token from the token endpoint (client_credentials, RFC 8707 resource)."""
        response = httpx2.post(
            f"{self.issuer}/token",
            data={"grant_type": "client_credentials", "resource": resource, "scope": scope, **form},
            auth=(client, f"{client}-secret"),
            timeout=30,
        )
        response.raise_for_status()
        return str(response.json()["access_token"])

    def mint(self, **spec: Any) -> str:
        """A token as ``spec`` says (see ``Authority.mint`` in ``support.oauth_server``)."""
        return str(self._post("/test/mint", spec)["token"])

    def rotate(self) -> str:
        """A new signing key (the old one is no longer published); its kid."""
        return str(self._post("/test/rotate", {})["kid"])

    def jwks_fetches(self) -> int:
        """How many times the key set was fetched."""
        return int(self.stats()["jwks_fetches"])

    def stats(self) -> dict[str, int]:
        """Counts: ``jwks_fetches``, ``introspections``, ``introspecting_most`` (at once)."""
        stats: dict[str, int] = httpx2.get(f"{self.issuer}/test/stats", timeout=30).json()
        return stats

    def introspect_delay(self, seconds: float) -> None:
        """Make each introspection answer take ``seconds`` (a slow issuer)."""
        self._post("/test/introspect-delay", {"seconds": seconds})


@contextmanager
def authority() -> Iterator[Authority]:
    """Start the authorization server as a process of its own; stop it on exit."""
    process = subprocess.Popen(
        [sys.executable, "-m", "support.oauth_server"],
        cwd=TESTS,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        issuer = process.stdout.readline().strip()
        assert issuer.startswith("http://127.0.0.1:"), issuer
        yield Authority(issuer, process)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@asynccontextmanager
async def resource_server(
    dispatcher: Dispatcher, issuer: str, **fields: Any
) -> AsyncIterator[HttpServer]:
    """skilld on a free port of 127.0.0.1 as an OAuth resource server of ``issuer``: its
    audience is its own ``/mcp`` URL; ``fields`` are the rest of its ``ServeConfig``."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = ServeConfig(
        **fields,
        transport="http",
        host="127.0.0.1",
        port=port,
        auth_issuer=issuer,
        auth_audience=f"http://127.0.0.1:{port}/mcp",
    )
    async with anyio.create_task_group() as tg:
        server: HttpServer = await tg.start(
            functools.partial(serve_http_async, sock=sock), dispatcher, config
        )
        try:
            yield server
        finally:
            server.stop()
