"""Name resolution shared by http and tcp: resolve once, check the address, use it."""

from __future__ import annotations

import ipaddress
import socket

from skilld.errors import HostCallError
from skilld.sandbox._context import CallContext
from skilld.sandbox.abi import decide


def resolve_checked(ctx: CallContext, capability: str, host: str, port: int) -> str:
    """Resolve ``host`` once and return the first address the tables allow.

    Every candidate is checked as ``check(capability, "address", "IP:PORT HOST")`` (IPv6
    in brackets), where private, loopback, link-local and metadata addresses are refused
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
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise HostCallError("unavailable", f"cannot resolve {host!r}: {exc}") from exc
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
            decide(ctx, capability, "address", f"{target} {host}", shown=f"{host} ({target})")
        except HostCallError as exc:
            last = exc
            continue
        return ip
    if last is not None:
        raise last
    raise HostCallError("unavailable", f"{host!r} resolved to no address")


def connect(ip: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP connection to an already-checked address.

    Raises:
        HostCallError: ``unavailable`` or ``timeout``.
    """
    try:
        return socket.create_connection((ip, port), timeout=timeout_s)
    except TimeoutError as exc:
        raise HostCallError("timeout", f"connecting to {ip}:{port} timed out") from exc
    except OSError as exc:
        raise HostCallError(
            "unavailable", f"cannot connect to {ip}:{port}: {exc.strerror or exc}"
        ) from exc
