"""Shared by http and tcp: resolve once, check the address, use it; wait only in slices.

Every wait here (the name lookup, the connect, each read and write) is cut into
slices of :data:`~skilld.call.WAIT_SLICE_S` by
:meth:`CallContext.waits <skilld.call.CallContext.waits>`, so it ends at
the smaller of the guest's own timeout and the call's deadline, and soon after the
client cancels the call, whatever the peer does (trickles bytes, holds the line).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

from skilld.call import CallContext
from skilld.errors import HostCallError
from skilld.sandbox.abi import decide

T = TypeVar("T")


def resolve_checked(ctx: CallContext, capability: str, host: str, port: int) -> str:
    """Resolve ``host`` once and return the first address the tables allow.

    Every candidate is checked as ``check_address(ip, port, capability, host)``, where
    private, loopback, link-local and metadata addresses are refused
    unless a rule names them; the host name narrows the check to the rules for that
    host, so one host's ``allow_private`` cannot let another name reach a private address.
    The caller connects to the returned address, never to the name, so a second lookup
    cannot answer differently.

    Raises:
        HostCallError: ``invalid-argument`` for a host with spaces or NUL, ``unavailable``
            when the name does not resolve, ``not-permitted`` when no resolved address
            is allowed.
    """
    if not host or any(c.isspace() for c in host) or "\x00" in host:
        raise HostCallError("invalid-argument", f"bad host name {host!r}")
    infos = _lookup(ctx, host, port)
    seen: list[str] = []
    last: HostCallError | None = None
    for info in infos:
        ip = str(info[4][0])
        if ip in seen:
            continue
        seen.append(ip)
        addr = ipaddress.ip_address(ip)
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            ip = str(addr.ipv4_mapped)
            addr = addr.ipv4_mapped
        target = f"[{ip}]:{port}" if addr.version == 6 else f"{ip}:{port}"
        try:
            decide(
                ctx,
                capability,
                "address",
                f"{target} {host}",
                f"{host} ({target})",
                lambda c: c.check_address(ip, port, capability, host),  # noqa: B023 - asked at once
            )
        except HostCallError as exc:
            last = exc
            continue
        return ip
    if last is not None:
        raise last
    raise HostCallError("unavailable", f"{host!r} resolved to no address")


def _lookup(ctx: CallContext, host: str, port: int) -> list[Any]:
    """``getaddrinfo``, given up at the call's deadline (a resolver may take far longer)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:  # a literal address resolves at once, without a thread
        return _getaddrinfo(host, port)
    return ctx.off_thread(f"resolving {host!r}", lambda: _getaddrinfo(host, port))


def _getaddrinfo(host: str, port: int) -> list[Any]:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise HostCallError("unavailable", f"cannot resolve {host!r}: {exc}") from exc


def connect(ctx: CallContext, ip: str, port: int, timeout_s: float | None) -> socket.socket:
    """A TCP connection to an already-checked address, within ``timeout_s`` and the call's time.

    Raises:
        HostCallError: ``unavailable``, ``timeout`` or ``cancelled``.
    """
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        code = sock.connect_ex((ip, port))
        if code == errno.EINPROGRESS:
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            for wait in ctx.waits(f"connecting to {ip}:{port}", timeout_s):
                if poller.poll(wait * 1000):
                    break
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    except HostCallError:
        sock.close()
        raise
    except OSError as exc:
        sock.close()
        code = exc.errno or errno.EIO
    if code:
        sock.close()
        raise HostCallError("unavailable", f"cannot connect to {ip}:{port}: {os.strerror(code)}")
    return sock


def bounded(ctx: CallContext, what: str, until: float | None, op: Callable[[float], T]) -> T:
    """``op(wait)`` again and again until it does not time out, within the call's time.

    ``op`` sets its socket's timeout to ``wait`` and does one operation; ``until`` is
    the monotonic end of the guest's own timeout (``None``: the call's deadline only).

    Raises:
        HostCallError: ``timeout`` or ``cancelled``.
    """
    timeout_s = None if until is None else until - time.monotonic()
    for wait in ctx.waits(what, timeout_s):
        try:
            return op(wait)
        except TimeoutError:
            continue
    raise AssertionError("unreachable: waits() raises when the time is up")  # pragma: no cover


class _Bounded:
    """What makes a socket's blocking reads and writes wait in slices (see :func:`bounded`).

    ``http.client`` reads through ``recv_into`` (via ``makefile``) and writes through
    ``sendall``, so a response fed one byte at a time still ends at the deadline.
    """

    _ctx: CallContext
    _what: str
    _until: float | None

    def bound(self, ctx: CallContext, what: str, until: float | None) -> None:
        """Tie the socket to a call: ``until`` is the guest's own end (monotonic)."""
        self._ctx, self._what, self._until = ctx, what, until

    def _op(self, op: Callable[[], T]) -> T:
        sock: Any = self

        def once(wait: float) -> T:
            sock.settimeout(wait)
            return op()

        return bounded(self._ctx, self._what, self._until, once)

    # Arguments pass through as given: plain and TLS sockets default them differently.
    def recv_into(self, *args: Any) -> int:
        parent: Any = super()
        return self._op(lambda: int(parent.recv_into(*args)))

    def recv(self, *args: Any) -> bytes:
        parent: Any = super()
        return self._op(lambda: bytes(parent.recv(*args)))

    def send(self, *args: Any) -> int:
        parent: Any = super()
        return self._op(lambda: int(parent.send(*args)))

    def sendall(self, data: Any, flags: int = 0) -> None:
        view = memoryview(data).cast("B")
        while view:
            view = view[self.send(view, flags) :]


class BoundedSocket(_Bounded, socket.socket):
    """A plain TCP socket whose waits are bounded by its call."""


class BoundedSSLSocket(_Bounded, ssl.SSLSocket):
    """A TLS socket whose waits (handshake included) are bounded by its call."""

    def handshake(self) -> None:
        """The TLS handshake, in slices like every other wait."""
        parent: Any = super()
        self._op(lambda: parent.do_handshake())


def bound_socket(
    ctx: CallContext, raw: socket.socket, what: str, until: float | None
) -> BoundedSocket:
    """``raw`` (connected) as a :class:`BoundedSocket` of this call."""
    sock = BoundedSocket(raw.family, raw.type, raw.proto, fileno=raw.detach())
    sock.bound(ctx, what, until)
    return sock
