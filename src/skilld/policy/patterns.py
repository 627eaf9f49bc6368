"""The pattern languages of the policy, shared by the compiler and the checks.

Each parser takes the operator's text and returns a normal form or raises
``ValueError`` with a sentence the compiler turns into a ``file:line`` error.
The checks (``skilld.permissions``) use the same functions on requests, so a
pattern and the thing it is matched against are always normalised alike.
"""

from __future__ import annotations

import bisect
import ipaddress
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# -- file system globs -------------------------------------------------------

_GLOB_FORBIDDEN = set("?[]{}\\")


def parse_path_pattern(text: str) -> tuple[str, ...]:
    """The segments of an absolute path pattern (``*`` one segment, ``**`` any depth).

    ``/`` is the empty tuple. A trailing slash is dropped.

    Raises:
        ValueError: relative, non-canonical (``.``/``..``/empty segments) or bad glob.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("a path must be a non-empty string")
    if not text.startswith("/"):
        raise ValueError(f"path {text!r} must be absolute (start with '/')")
    if "\x00" in text:
        raise ValueError("path contains a NUL byte")
    body = text[1:].removesuffix("/") if text != "/" else ""
    if not body:
        return ()
    segments = tuple(body.split("/"))
    for seg in segments:
        if seg in ("", ".", ".."):
            raise ValueError(f"path {text!r} is not canonical (empty, '.' or '..' segment)")
        bad = _GLOB_FORBIDDEN.intersection(seg)
        if bad:
            raise ValueError(
                f"bad glob {text!r}: {''.join(sorted(bad))!r} is not supported "
                "(only '*' within a segment and '**' as a whole segment)"
            )
        if "**" in seg and seg != "**":
            raise ValueError(f"bad glob {text!r}: '**' must be a whole path segment")
    return segments


def is_literal(segments: tuple[str, ...]) -> bool:
    """True when no segment has a wildcard."""
    return not any("*" in seg for seg in segments)


def literal_prefix(segments: tuple[str, ...]) -> str:
    """The directory before the first wildcard segment, as a path (``/`` for none)."""
    out: list[str] = []
    for seg in segments:
        if "*" in seg:
            break
        out.append(seg)
    return "/" + "/".join(out)


def join_path(segments: tuple[str, ...]) -> str:
    """Segments back to a path."""
    return "/" + "/".join(segments)


def path_regex(segments: tuple[str, ...]) -> str:
    """A regex matching whole canonical paths; ``**`` matches zero or more segments."""
    parts = ["^"]
    for seg in segments:
        if seg == "**":
            parts.append("(?:/[^/]+)*")
        else:
            parts.append("/" + "[^/]*".join(re.escape(p) for p in seg.split("*")))
    # \Z, not $: '$' also matches before a final newline, so "/a/secret\n" would
    # pass for "/a/secret" with re.match.
    parts.append("/?\\Z" if not segments else "\\Z")
    return "".join(parts)


def _segment_covers(grant: str, need: str) -> bool:
    # Sound because a grant's '*' is the only thing that can consume a need's
    # '*' character, and it matches any string a need's '*' could stand for.
    regex = "[^/]*".join(re.escape(p) for p in grant.split("*"))
    return re.fullmatch(regex, need) is not None


def pattern_covers(grant: tuple[str, ...], need: tuple[str, ...]) -> bool:
    """True when every path ``need`` matches is matched by ``grant`` (conservative)."""

    @cache
    def sub(i: int, j: int) -> bool:
        if i == len(need):
            return all(seg == "**" for seg in grant[j:])
        if j == len(grant):
            return False
        n, g = need[i], grant[j]
        if g == "**":
            return sub(i + 1, j) or sub(i, j + 1)
        if n == "**":
            return False
        return _segment_covers(g, n) and sub(i + 1, j + 1)

    return sub(0, 0)


def tree(segments: tuple[str, ...]) -> tuple[str, ...]:
    """The pattern a grant stands for: a literal path names its whole tree."""
    return (*segments, "**") if is_literal(segments) else segments


# -- hosts and addresses ----------------------------------------------------

# Every anchored pattern here ends in \Z, never $ (which matches before a final "\n").
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\Z")
# Already-canonical names (the common case) skip the general path below.
_CANONICAL_NAME = re.compile(
    r"(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\.)*[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
)
_NUM_PART = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)\Z")

METADATA: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle, Hetzner
        "169.254.170.2",  # AWS ECS task metadata and credentials
        "169.254.170.23",  # AWS EKS Pod Identity agent
        "169.254.169.123",  # AWS time sync
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure WireServer: a public address, so only this list refuses it
        "192.0.0.192",  # Oracle Cloud (legacy)
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::23",  # AWS EKS Pod Identity agent over IPv6
    )
)

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def parse_ipv4_loose(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address ``inet_aton`` would read from ``host``, or None.

    Browsers and C resolvers accept ``2130706433``, ``0x7f.1``, ``0177.0.0.1`` and
    ``127.1`` as 127.0.0.1; so must the check, or they walk past it.
    """
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_NUM_PART.match(p) for p in parts):
        return None
    values: list[int] = []
    for p in parts:
        if p.startswith("0x"):
            values.append(int(p[2:] or "0", 16))
        elif len(p) > 1 and p.startswith("0"):
            if any(c in "89" for c in p):
                return None
            values.append(int(p, 8))
        else:
            values.append(int(p))
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def unwrap(ip: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv4-mapped, NAT64 or 6to4 IPv6 address, else ``ip``."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


# A dotted quad exactly as ipaddress accepts it (0..255, no leading zeros): how
# normalize_host tells one from a name before handing it to _dotted.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}\Z")


def _dotted(text: str) -> ipaddress.IPv4Address:
    """The address of a dotted quad ipaddress would accept, at a tenth of its cost.

    inet_pton accepts exactly those (four decimal octets, no leading zeros; the
    tests compare it with ipaddress).

    Raises:
        ValueError: anything else.
    """
    try:
        packed = socket.inet_pton(socket.AF_INET, text)
    except OSError as exc:
        raise ValueError(f"{text!r} is not a dotted quad") from exc
    return ipaddress.IPv4Address(int.from_bytes(packed, "big"))


_GLOBAL, _SPECIAL, _METADATA = 0, 1, 2


def _kind(ip: IPAddress) -> int:
    if ip in METADATA:
        return _METADATA
    return _SPECIAL if not ip.is_global or ip.is_multicast else _GLOBAL


def _v4_segments() -> tuple[list[int], list[int]]:
    # is_global walks ipaddress's tables (~5 µs an address). Its answer only changes
    # where a network it knows (or a metadata address) starts or ends, so cut the
    # IPv4 space at every such edge and ask ipaddress itself once per piece.
    edges = {0}
    nets: list[object] = [*METADATA]
    # ipaddress keeps its IPv4 networks on a private, untyped class; only their edges
    # are read, and tests compare the table with ipaddress's own answers.
    constants = ipaddress.IPv4Address._constants  # type: ignore[attr-defined]
    for value in vars(constants).values():
        nets += value if isinstance(value, list | tuple) else [value]
    for net in nets:
        if isinstance(net, ipaddress.IPv4Address):
            net = ipaddress.IPv4Network(net)
        if isinstance(net, ipaddress.IPv4Network):
            edges |= {int(net.network_address), int(net.broadcast_address) + 1}
    starts = sorted(e for e in edges if e < 2**32)
    return starts, [_kind(ipaddress.IPv4Address(e)) for e in starts]


_V4_STARTS, _V4_KINDS = _v4_segments()


def _v4_kind(ip: ipaddress.IPv4Address) -> int:
    return _V4_KINDS[bisect.bisect_right(_V4_STARTS, int(ip)) - 1]


@lru_cache(maxsize=4096)
def parse_address(text: str) -> tuple[IPAddress, str, bool, bool]:
    """``(address, its text, is_metadata, is_special)`` of a resolved IP's text (unwrapped).

    Raises:
        ValueError: not an IP address.
    """
    try:
        v4 = _dotted(text)
    except ValueError:
        addr = unwrap(ipaddress.ip_address(text))
        return addr, str(addr), addr in METADATA, is_special(addr)
    kind = _v4_kind(v4)
    return v4, text, kind == _METADATA, kind != _GLOBAL


def is_special(ip: IPAddress) -> bool:
    """True for addresses a grant must name: private, loopback, link-local, metadata, ...

    The same answer as ``ip in METADATA or not ip.is_global or ip.is_multicast``;
    IPv4 addresses are looked up in a table of the ranges where that answer holds.
    """
    if isinstance(ip, ipaddress.IPv4Address):
        return _v4_kind(ip) != _GLOBAL
    return _special_v6(ip)


@lru_cache(maxsize=4096)
def _special_v6(ip: ipaddress.IPv6Address) -> bool:
    # Cached: is_global walks ipaddress's range tables; an appliance resolves few addresses.
    return _kind(ip) != _GLOBAL


@lru_cache(maxsize=4096)
def normalize_host(text: str) -> str | IPAddress:
    """A host name in canonical form (lowercase, no trailing dot, punycode) or its IP.

    Cached by text (failures are not): one appliance talks to few hosts.

    Raises:
        ValueError: empty, bad characters, or not valid IDNA.
    """
    if _DOTTED.match(text):
        return _dotted(text)
    if (
        _CANONICAL_NAME.fullmatch(text)
        and len(text) <= 253
        and not _NUM_PART.match(text[text.rfind(".") + 1 :])
    ):
        return text
    # No stripping: "db.test\n" or " db.test" is refused, never read as db.test.
    host = text
    if host.startswith("[") and host.endswith("]"):
        try:
            return unwrap(ipaddress.IPv6Address(host[1:-1]))
        except ValueError as exc:
            raise ValueError(f"bad IPv6 address {host!r}") from exc
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    if not host:
        raise ValueError("empty host")
    if ":" in host:
        try:
            return unwrap(ipaddress.IPv6Address(host))
        except ValueError as exc:
            raise ValueError(f"bad host {text!r}") from exc
    ip4 = parse_ipv4_loose(host)
    if ip4 is not None:
        return ip4
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ValueError(f"host {text!r} is not a valid internationalised name") from exc
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"bad host name {text!r}")
    if labels[-1].isdigit() or _NUM_PART.match(labels[-1]):
        # A name whose last label is numeric is an address in disguise (``1.2.3.999``).
        raise ValueError(f"bad host {text!r}: looks like an IP address but is not one")
    return host


@dataclass(frozen=True, slots=True)
class HostPattern:
    """A host in a grant: ``*`` (any), ``*.suffix`` (any subdomain), a name, an IP or a CIDR."""

    kind: str  # "any" | "suffix" | "name" | "ip" | "cidr"
    value: str  # canonical text: suffix without "*.", name, IP text, CIDR text

    def __str__(self) -> str:
        return {"any": "*", "suffix": f"*.{self.value}"}.get(self.kind, self.value)


def parse_host_pattern(text: str, *, cidr: bool) -> HostPattern:
    """Parse a grant's host.

    Raises:
        ValueError: a bad name, wildcard, IP or CIDR (CIDRs only where ``cidr``).
    """
    if not isinstance(text, str) or not text:
        raise ValueError("a host must be a non-empty string")
    if text == "*":
        return HostPattern("any", "*")
    if "/" in text:
        if not cidr:
            raise ValueError(f"a CIDR is not allowed here: {text!r}")
        try:
            net = ipaddress.ip_network(text.strip("[]"), strict=True)
        except ValueError as exc:
            raise ValueError(f"bad CIDR {text!r}: {exc}") from exc
        return HostPattern("cidr", str(net))
    if text.startswith("*."):
        rest = normalize_host(text[2:])
        if not isinstance(rest, str):
            raise ValueError(f"bad wildcard host {text!r}: '*.' needs a name after it")
        return HostPattern("suffix", rest)
    if "*" in text:
        raise ValueError(f"bad host {text!r}: '*' only as the whole host or a leading '*.'")
    host = normalize_host(text)
    if isinstance(host, str):
        return HostPattern("name", host)
    return HostPattern("ip", str(host))


def host_pattern_covers(grant: HostPattern, need: HostPattern) -> bool:
    """True when every host ``need`` matches is matched by ``grant``."""
    if grant.kind == "any":
        return True
    if grant == need:
        return True
    if grant.kind == "suffix":
        return need.kind in ("name", "suffix") and need.value.endswith("." + grant.value)
    if grant.kind == "cidr":
        net = ipaddress.ip_network(grant.value)
        if need.kind == "ip":
            return ipaddress.ip_address(need.value) in net
        if need.kind == "cidr":
            inner = ipaddress.ip_network(need.value)
            return inner.version == net.version and inner.subnet_of(net)  # type: ignore[arg-type]
    return False


# -- ports -------------------------------------------------------------------

PortRanges = tuple[tuple[int, int], ...]
ALL_PORTS: PortRanges = ((1, 65535),)


def parse_ports(value: object) -> PortRanges:
    """``5432``, ``"8000-8100"``, ``"*"`` or a list of those, as sorted merged ranges.

    Raises:
        ValueError: a port outside 1..65535 or a range whose start exceeds its end.
    """
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ValueError("an empty port list grants nothing; leave the key out or list ports")
    ranges: list[tuple[int, int]] = []
    for item in items:
        if item == "*":
            ranges.append(ALL_PORTS[0])
            continue
        if isinstance(item, int) and not isinstance(item, bool):
            lo = hi = item
        elif isinstance(item, str) and re.fullmatch(r"\d+(?:-\d+)?", item.strip()):
            a, _, b = item.strip().partition("-")
            lo, hi = int(a), int(b or a)
        else:
            raise ValueError(f"bad port {item!r}: use 443, '8000-8100' or '*'")
        if not (1 <= lo <= 65535 and 1 <= hi <= 65535):
            raise ValueError(f"bad port {item!r}: ports are 1..65535")
        if lo > hi:
            raise ValueError(f"bad port range {item!r}: start is after end")
        ranges.append((lo, hi))
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def port_in(port: int, ranges: PortRanges) -> bool:
    """True when ``port`` lies in one of ``ranges``."""
    return any(lo <= port <= hi for lo, hi in ranges)


def ports_cover(grant: PortRanges, need: PortRanges) -> bool:
    """True when every port of ``need`` is in ``grant``."""
    return all(any(g0 <= lo and hi <= g1 for g0, g1 in grant) for lo, hi in need)


def ports_text(ranges: PortRanges) -> str:
    """Ranges as operators write them."""
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


# -- URL patterns ------------------------------------------------------------

_SCHEMES = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class UrlPattern:
    """A grant's URL: schemes, host pattern, ports and a path prefix (segment-bounded)."""

    schemes: tuple[str, ...]
    host: HostPattern
    ports: PortRanges | None  # None: the scheme's default port
    path: str  # "/" or "/a/b" without trailing slash

    def __str__(self) -> str:
        scheme = self.schemes[0] if len(self.schemes) == 1 else "*"
        port = f":{ports_text(self.ports)}" if self.ports else ""
        return f"{scheme}://{self.host}{port}{self.path}"


def parse_url_pattern(text: str) -> UrlPattern:
    """Parse ``scheme://host[:port]/path-prefix`` with wildcards.

    Raises:
        ValueError: unknown scheme, userinfo, bad host, port or path.
    """
    if not isinstance(text, str) or "://" not in text:
        raise ValueError(f"bad URL pattern {text!r}: expected scheme://host/path")
    scheme, _, rest = text.partition("://")
    scheme = scheme.lower()
    if scheme == "*":
        schemes: tuple[str, ...] = ("http", "https")
    elif scheme in _SCHEMES:
        schemes = (scheme,)
    else:
        raise ValueError(f"bad URL pattern {text!r}: scheme must be http, https or *")
    if any(c in rest for c in "?#@\\ ") or any(ord(c) < 0x21 for c in rest):
        raise ValueError(
            f"bad URL pattern {text!r}: no userinfo, query, fragment or spaces allowed"
        )
    slash = rest.find("/")
    authority, path = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise ValueError(f"bad URL pattern {text!r}: unclosed '['")
        host_text, port_text = authority[: end + 1], authority[end + 1 :]
        if port_text and not port_text.startswith(":"):
            raise ValueError(f"bad URL pattern {text!r}")
        port_text = port_text[1:]
    else:
        host_text, _, port_text = authority.partition(":")
    try:
        host = parse_host_pattern(host_text, cidr=False)
        ports = parse_ports(port_text) if port_text else None
    except ValueError as exc:
        raise ValueError(f"bad URL pattern {text!r}: {exc}") from exc
    if path.endswith("/**"):
        path = path[:-3]
    elif path.endswith("/*"):
        path = path[:-2]
    if "*" in path:
        raise ValueError(
            f"bad URL pattern {text!r}: the path is a prefix; '*' only as a final '/*' or '/**'"
        )
    segments = [s for s in path.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise ValueError(f"bad URL pattern {text!r}: '.' or '..' in the path")
    return UrlPattern(schemes, host, ports, "/" + "/".join(segments))


def path_under(path: str, prefix: str) -> bool:
    """True when ``path`` is ``prefix`` or below it, on segment boundaries."""
    if prefix == "/":
        return True
    return path == prefix or path.startswith(prefix + "/")


def url_pattern_covers(grant: UrlPattern, need: UrlPattern) -> bool:
    """True when every URL ``need`` matches is matched by ``grant``."""
    if not set(need.schemes) <= set(grant.schemes):
        return False
    if not host_pattern_covers(grant.host, need.host):
        return False
    for scheme in need.schemes:
        default = ((_SCHEMES[scheme], _SCHEMES[scheme]),)
        if not ports_cover(grant.ports or default, need.ports or default):
            return False
    return path_under(need.path, grant.path)


def default_port(scheme: str) -> int:
    """80 for http, 443 for https."""
    return _SCHEMES[scheme]


# -- shell argument patterns ---------------------------------------------------


def arg_regex(pattern: str) -> str:
    """A regex matching one whole argument; ``*`` is any run of characters."""
    return "^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "\\Z"


def args_cover(grant: tuple[str, ...], need: tuple[str, ...]) -> bool:
    """True when every argv tail ``need`` allows is allowed by ``grant`` (conservative)."""
    g_rest = bool(grant) and grant[-1] == "**"
    n_rest = bool(need) and need[-1] == "**"
    g_fixed = grant[:-1] if g_rest else grant
    n_fixed = need[:-1] if n_rest else need
    if n_rest and not g_rest:
        return False
    if len(n_fixed) < len(g_fixed) or (len(n_fixed) > len(g_fixed) and not g_rest):
        return False
    return all(
        re.fullmatch(arg_regex(g).replace(".*", "(?s:.*)"), n) is not None
        for g, n in zip(g_fixed, n_fixed, strict=False)
    )


# -- names (env variables, skills, nodes) ------------------------------------

NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?\Z")
SKILL_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*\Z")


def name_covers(grant: str, need: str) -> bool:
    """True when every name ``need`` matches is matched by ``grant``."""
    if grant.endswith("*"):
        return need.startswith(grant[:-1])
    return grant == need


# -- sizes and durations -------------------------------------------------------

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}
_TIME = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def _amount(value: object, units: Mapping[str, int], unit: str, kind: str, advice: str) -> int:
    """``value`` in the base unit of ``units``: a positive int as it is, or a string of a
    positive number and a unit (matching the pattern ``unit``, looked up lower-cased) times
    that unit's factor.

    Raises:
        ValueError: anything else, as a bad ``kind``, with ``advice`` on what to write.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        m = re.fullmatch(rf"\s*(\d+)\s*({unit})\s*", value)
        if m and m.group(2).lower() in units and int(m.group(1)) > 0:
            return int(m.group(1)) * units[m.group(2).lower()]
    raise ValueError(f"bad {kind} {value!r}: {advice}")


def parse_size(value: object) -> int:
    """Bytes from ``1048576``, ``"64MiB"``, ``"10MB"``.

    Raises:
        ValueError: not a positive size.
    """
    return _amount(value, _UNITS, "[a-zA-Z]*", "size", "use bytes or e.g. '64MiB', '10MB'")


def parse_duration_ms(value: object) -> int:
    """Milliseconds from ``500`` (ms), ``"500ms"``, ``"5s"``, ``"2m"``.

    Raises:
        ValueError: not a positive duration.
    """
    # Units are lower-case only here ("5S" is refused), unlike sizes.
    advice = "use milliseconds or e.g. '500ms', '5s', '2m'"
    return _amount(value, _TIME, "[a-z]+", "duration", advice)
