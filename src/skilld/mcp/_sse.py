"""The legacy HTTP+SSE transport's stream (``GET /sse``): a session reads nothing more
while its client is not reading what the session sends.

Over this transport a ``POST /messages/`` is answered 202 once its message is handed to
the session, and the answer to the request it carries goes out later on the session's
event stream. A client that posted and never read its stream left every answer waiting
in the server, each in a task of its own, for as long as the stream stayed open (the
write timeout): one session of mallory posting 1 MB ``echo`` calls grew the server from
98 to 722 MiB after 200 calls in 6.4 s (about 3.1 MiB a call), and nothing bounded the
count.

Backpressure closes it the way TCP does. The SDK hands the stream its messages one at a
time (memory streams of size 0), so a message whose hand-over has not returned means
the client is not taking what is sent. While one waits, the session does not read the
next message, so the POST that carries it waits too, in progress: counted against the
caller's requests in progress and request body bytes (``max_requests_per_caller``,
``max_request_bytes_per_caller``, past which the caller gets 429). What a stuck session
holds is then the answers of the calls it had started before it stuck, and those are
bounded by the caller's requests in progress (``skilld.mcp._server``, ``_counted``).

Nothing waits on the session's reading for the stream to move (the SDK's writer and the
HTTP response take from it whatever the client reads), so this cannot deadlock: the
session reads on as soon as its client reads.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import anyio
from mcp.server.sse import SseServerTransport
from mcp.shared.message import SessionMessage
from starlette.types import Receive, Scope, Send

from skilld.mcp._server import McpService


class _Sending:
    """How many of a session's messages are being handed to its stream now."""

    def __init__(self) -> None:
        self.now = 0
        self._done: anyio.Event | None = None

    async def settled(self) -> None:
        """Return once no message is waiting for the stream to take it."""
        while self.now:
            if self._done is None:
                self._done = anyio.Event()
            await self._done.wait()

    def started(self) -> None:
        self.now += 1

    def finished(self) -> None:
        self.now -= 1
        if not self.now and self._done is not None:
            self._done.set()
            self._done = None


class _Through:
    """A stream of the session's, passed through with its hand-over counter: closing
    and the async context manager are the inner stream's."""

    def __init__(self, inner: Any, sending: _Sending):
        self._inner = inner
        self._sending = sending

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _Reading(_Through):
    """The session's read stream (the SDK's ``ReadStream``), read only while nothing
    waits to be sent."""

    @property
    def last_context(self) -> Any:
        """The sender's context of the last message read (the SDK's context streams)."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        await self._sending.settled()
        item: SessionMessage | Exception = await self._inner.receive()
        return item

    def __aiter__(self) -> _Reading:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


class _Writing(_Through):
    """The session's write stream (the SDK's ``WriteStream``), counting hand-overs."""

    async def send(self, item: SessionMessage, /) -> None:
        self._sending.started()
        try:
            await self._inner.send(item)
        finally:
            self._sending.finished()


class SseEndpoint:
    """The legacy SSE stream: one MCP session per GET, for as long as it stays open."""

    def __init__(self, service: McpService, transport: SseServerTransport):
        self._service = service
        self._transport = transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = self._service.server
        sending = _Sending()
        async with self._transport.connect_sse(scope, receive, send) as (read, write):
            await server.run(
                _Reading(read, sending),
                _Writing(write, sending),
                server.create_initialization_options(),
            )
