"""``tcp``: connections to allowlisted ``host:port`` pairs, on the checked address.

``connect`` checks ``check_tcp(host, port)``, resolves once and
checks the address; connections are handles that live for one call. Connect,
send and receive each wait no longer than the guest's ``timeout_ms`` (send: the
call's time) and never past the call's deadline; they look at the cancel flag
every slice of the wait (see ``_net``).
"""

from __future__ import annotations

import itertools
import socket
import time

from skilld.call import CallContext
from skilld.errors import HostCallError
from skilld.sandbox.abi import Functions, decide
from skilld.sandbox.abi._net import bounded, resolve_checked
from skilld.sandbox.abi._net import connect as open_socket

MAX_CONNECTIONS = 16
MAX_RECEIVE = 1 << 20
_ids = itertools.count(1)


def connect(ctx: CallContext, host: str, port: int, timeout_ms: int) -> int:
    """Open a connection; returns its handle.

    Raises:
        HostCallError: ``not-permitted``, ``limit-exceeded``, ``unavailable``, ``timeout``,
            ``cancelled``.
    """
    if len(ctx.handles) >= MAX_CONNECTIONS:
        raise HostCallError(
            "limit-exceeded", f"at most {MAX_CONNECTIONS} open connections per call"
        )
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    decide(ctx, "tcp", "connect", shown, question=lambda c: c.check_tcp(host, port))
    ip = resolve_checked(ctx, "tcp", host, port)
    sock = open_socket(ctx, ip, port, max(timeout_ms, 1) / 1000)
    handle = next(_ids) & 0xFFFFFFFF
    ctx.handles[handle] = sock
    return handle


def _sock(ctx: CallContext, handle: int) -> socket.socket:
    sock = ctx.handles.get(handle)
    if not isinstance(sock, socket.socket):
        raise HostCallError("not-found", f"no open connection {handle}")
    return sock


def send(ctx: CallContext, handle: int, data: bytes) -> int:
    """Send bytes; returns how many went out (waiting at most for the call's time).

    Raises:
        HostCallError: ``not-found`` (no such handle), ``timeout``, ``cancelled``, ``io``.
    """
    sock = _sock(ctx, handle)
    payload = bytes(data)

    def once(wait: float) -> int:
        sock.settimeout(wait)
        return sock.send(payload)

    try:
        return bounded(ctx, "tcp.send", None, once)
    except OSError as exc:
        raise HostCallError("io", f"send failed: {exc}") from exc


def receive(ctx: CallContext, handle: int, max_bytes: int, timeout_ms: int) -> bytes:
    """Receive up to ``max_bytes`` (empty at end of stream) within ``timeout_ms``.

    Raises:
        HostCallError: ``not-found`` (no such handle), ``timeout``, ``cancelled``, ``io``.
    """
    sock = _sock(ctx, handle)
    size = min(max(max_bytes, 0), MAX_RECEIVE)

    def once(wait: float) -> bytes:
        sock.settimeout(wait)
        return sock.recv(size)

    try:
        return bounded(ctx, "tcp.receive", time.monotonic() + max(timeout_ms, 1) / 1000, once)
    except OSError as exc:
        raise HostCallError("io", f"receive failed: {exc}") from exc


def close(ctx: CallContext, handle: int) -> None:
    """Close a connection (unknown handles are ignored)."""
    sock = ctx.handles.pop(handle, None)
    if sock is not None:
        sock.close()


FUNCTIONS: Functions = {
    "connect": (connect, "result"),
    "send": (send, "result"),
    "receive": (receive, "result"),
    "close": (close, "plain"),
}
