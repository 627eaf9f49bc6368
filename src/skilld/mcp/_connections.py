"""Bounded HTTP connections: header and idle timeouts, a cap, quiet accept errors.

uvicorn closes a connection idle after a response (its keep-alive timeout), but
not one that never sends a request, nor one that sends its headers a byte at a
time; and it accepts connections until the process runs out of descriptors, when
asyncio logs every failed ``accept`` with a traceback (on Linux, hundreds per
readiness event). An idle crowd of about a thousand then made ``/healthz`` time
out and wrote tens of megabytes of log in seconds. Here:

- a connection must complete each request's headers within ``header_timeout_s``
  of connecting (or of its previous response), else it is closed;
- a connection whose client stops reading is closed (aborted) once a response has
  waited ``write_timeout_s`` for room in the socket: a client that pipelines requests
  and never reads their answers, or never reads a stream, holds no slot for ever;
- at most ``cap`` connections are open at once. When a new one would exceed it,
  the connection idle longest (no request in progress) is closed to make room, so
  an idle crowd cannot lock out a probe; when none is idle, the newcomer's request
  is answered ``503`` with a short body and ``Connection: close`` (the probes
  ``/healthz`` and ``/readyz`` are still answered);
- the cap defaults to what the descriptor limit allows after a reserve for the
  rest of the server (state, audit, native code, sockets to the cluster), and
  connections are accepted in small batches (the listen queue stays long), so
  connections closed to make room are gone before the next batch;
- "out of descriptors" accept errors are logged at most once per ``_ACCEPT_LOG_S``,
  with how many were left unlogged.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from skilld.mcp._metrics import Metrics

# Answered whatever the connection count and without a credential (orchestrators' probes).
PROBES = frozenset({"/healthz", "/readyz"})

# Descriptors kept back from the connection cap for everything else the server opens
# (about 80 at rest: native code, state, audit, the event loop, pipes) and for one
# batch of accepts (ACCEPT_BATCH) made before the connections they evict are closed.
_RESERVE_MIN = 160
# asyncio accepts up to ``backlog`` connections per readiness event, in one callback,
# and on EMFILE goes on trying (logging and scheduling a retry each time) for the rest
# of them. A small batch lets evicted connections close between batches.
ACCEPT_BATCH = 32
_ACCEPT_LOG_S = 10.0
_ACCEPT_ERROR = "socket.accept() out of system resource"


def connection_cap(configured: int) -> int:
    """``configured``, lowered to what the soft descriptor limit leaves for connections.

    A quarter of the limit (at least 160 descriptors) is kept for the rest of the server.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    room = soft - max(_RESERVE_MIN, soft // 4)
    return max(1, min(configured, room))


class ConnectionGuard:
    """The cap and timeouts shared by one server's connections (see the module docstring)."""

    def __init__(
        self,
        cap: int,
        header_timeout_s: float,
        metrics: Metrics,
        log: Any,
        *,
        write_timeout_s: float = 30.0,
    ):
        self.cap = cap
        self.header_timeout_s = header_timeout_s
        self.write_timeout_s = write_timeout_s
        self._metrics = metrics
        self._log = log
        # Idle connections, oldest first (dicts keep insertion order).
        self._idle: dict[GuardedH11, None] = {}
        self._accept_errors = 0
        self._accept_logged = -_ACCEPT_LOG_S

    def protocol_class(self) -> type[GuardedH11]:
        """The uvicorn protocol class bound to this guard."""
        guard = self

        class Bound(GuardedH11):
            _guard = guard

        return Bound

    def idle(self, conn: GuardedH11) -> None:
        """``conn`` has no request in progress."""
        self._idle[conn] = None

    def busy(self, conn: GuardedH11) -> None:
        """``conn`` has a request in progress, or is gone."""
        self._idle.pop(conn, None)

    def make_room(self, newcomer: GuardedH11, open_now: int) -> bool:
        """Close the longest-idle connection if ``open_now`` is over the cap.

        Returns False when the cap is exceeded and no other connection is idle.
        """
        if open_now <= self.cap:
            return True
        for conn in self._idle:
            if conn is not newcomer:
                self.busy(conn)
                conn.close_idle()
                return True
        return False

    def write_stalled(self) -> None:
        """A connection was aborted because its client did not read."""
        self._metrics.write_timed_out()

    def refused(self) -> None:
        """A request over the cap was answered 503."""
        self._metrics.http_rejected(503)

    def exception_handler(
        self, previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None
    ) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]:
        """A loop exception handler that rate-limits accept errors and passes the rest on."""

        def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if context.get("message") != _ACCEPT_ERROR:
                if previous is not None:
                    previous(loop, context)
                else:
                    loop.default_exception_handler(context)
                return
            self._accept_errors += 1
            now = time.monotonic()
            if now - self._accept_logged >= _ACCEPT_LOG_S:
                exc = context.get("exception")
                self._log.error(
                    "accept_failed",
                    error=str(exc),
                    failures=self._accept_errors,
                    hint="raise the descriptor limit (ulimit -n) or lower --max-connections",
                )
                self._accept_errors = 0
                self._accept_logged = now

        return handle


async def _refuse(scope: Any, receive: Any, send: Any) -> None:
    body = b"server at its connection limit; retry later\n"
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                (b"retry-after", b"1"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol under a :class:`ConnectionGuard`."""

    _guard: ConnectionGuard
    _header_timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None
    _over_cap = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Count the connection; make room under the cap; start the header clock."""
        super().connection_made(transport)
        self._guard.idle(self)
        if not self._guard.make_room(self, len(self.connections)):
            self._over_cap = True
            app = self.app

            async def refuse_unless_probe(scope: Any, receive: Any, send: Any) -> None:
                if scope["type"] == "http" and scope["path"] in PROBES:
                    await app(scope, receive, send)
                else:
                    self._guard.refused()
                    await _refuse(scope, receive, send)

            self.app = refuse_unless_probe
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection."""
        self._guard.busy(self)
        self._cancel_header_timer()
        self._cancel_write_timer()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The socket is full: the client has this long to read before it is dropped."""
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(
                self._guard.write_timeout_s, self._write_stalled
            )

    def resume_writing(self) -> None:
        """The client read: its clock stops."""
        super().resume_writing()
        self._cancel_write_timer()

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_stalled(self) -> None:
        self._write_timer = None
        self._guard.write_stalled()
        self._guard.busy(self)
        # abort, not close: close would wait for the buffer the client never reads.
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        """Parse as uvicorn does; once a request's headers are in, it is busy."""
        super().data_received(data)
        if self._in_request():
            self._guard.busy(self)
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        """Idle again: the next request's headers are due within the header timeout."""
        super().on_response_complete()
        if not self.transport.is_closing() and not self._in_request():
            self._guard.idle(self)
            self._arm_header_timer()

    def close_idle(self) -> None:
        """Close this connection (it has no request in progress)."""
        self._cancel_header_timer()
        if not self.transport.is_closing():
            self.transport.close()

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self._guard.header_timeout_s, self._headers_late)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self._in_request():
            self._guard.busy(self)
            self.close_idle()


class CallerShares:
    """How many of one kind of thing (sessions, streams, requests, request body bytes) each
    caller holds, against a per-caller cap. Used on the event loop only: a take is atomic there."""

    def __init__(self, what: str, cap: int):
        self.what = what
        self.cap = cap
        self._held: dict[str, int] = {}

    def take(self, key: str, n: int = 1, *, first: bool = False) -> bool:
        """``n`` more for ``key``; False (nothing taken) when that would pass ``cap``, unless
        ``first`` and ``key`` holds nothing (one thing larger than the cap may pass alone)."""
        held = self._held.get(key, 0)
        if held + n > self.cap and not (first and held == 0):
            return False
        self._held[key] = held + n
        return True

    def give(self, key: str, n: int = 1) -> None:
        """``key`` holds ``n`` less."""
        held = self._held.get(key, 0) - n
        if held > 0:
            self._held[key] = held
        else:
            self._held.pop(key, None)

    def held(self, key: str) -> int:
        """How many ``key`` holds now."""
        return self._held.get(key, 0)
