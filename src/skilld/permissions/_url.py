"""Request URLs in the one form the checks compare against grants.

The tricks this defeats: userinfo (``https://api.example.com@evil/``),
uppercase and trailing dots, Unicode host names (IDNA → punycode), IPv4 written
as ``2130706433``, ``0x7f.1`` or ``0177.0.0.1``, IPv4-mapped IPv6
(``[::ffff:127.0.0.1]``), and dot segments (``/v1/../admin``, ``%2e%2e``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from skilld.policy.patterns import IPAddress, default_port, normalize_host

_ENCODED_DOT = re.compile("%2e", re.IGNORECASE)
# The common shape (lowercase scheme and name, optional port, plain path): parsed
# without urlsplit. Anything else, including every trick, takes the general path.
_SIMPLE = re.compile(
    r"(https?)://((?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\.)*[a-z][a-z0-9_-]{0,62})"
    r"(?::([1-9][0-9]{0,4}))?(/[A-Za-z0-9_~!$&'()*+,;=:@%/-]*(?:\.[A-Za-z0-9_~!$&'()*+,;=:@%/-]+)*)?"
    r"(?:[?#][^\x00-\x20\x7f]*)?"
)
_ENCODED_SEP = re.compile("%2f|%5c", re.IGNORECASE)


class UrlRefused(ValueError):
    """The URL cannot be checked; ``rule`` names why (``http.userinfo``, ``http.bad-url``)."""

    def __init__(self, message: str, rule: str):
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True, slots=True)
class NormalUrl:
    """A URL reduced to what grants talk about."""

    scheme: str
    host: str  # canonical name, or the IP's text (IPv6 without brackets)
    ip: IPAddress | None
    port: int
    path: str


def normalize_path(path: str) -> str:
    """``path`` with ``%2e`` decoded and dot segments resolved (RFC 3986 5.2.4).

    Raises:
        UrlRefused: an encoded slash or backslash, which servers disagree about.
    """
    if "\\" in path or _ENCODED_SEP.search(path):
        raise UrlRefused("encoded or back slashes in the path are refused", "http.bad-url")
    if not path:
        return "/"
    path = _ENCODED_DOT.sub(".", path)
    if "/." not in path and not path.startswith("."):
        return path if path.startswith("/") else "/" + path
    out: list[str] = []
    segments = path.split("/")
    for seg in segments:
        if seg == "..":
            if len(out) > 1:
                out.pop()
        elif seg != ".":
            out.append(seg)
    result = "/".join(out)
    if segments[-1] in (".", ".."):
        result += "/"
    return result if result.startswith("/") else "/" + result


def normalize_url(url: str) -> NormalUrl:
    """Parse and normalise a request URL.

    Raises:
        UrlRefused: unsupported scheme, userinfo, a bad host or port, control characters.
    """
    m = _SIMPLE.fullmatch(url)
    if m is not None and "%" not in (m.group(4) or ""):
        scheme, host, port_text, path = m.groups()
        if "/." not in (path or "") and (port_text is None or int(port_text) <= 65535):
            fast_port = int(port_text) if port_text else default_port(scheme)
            return NormalUrl(scheme, host, None, fast_port, path or "/")
    if any(ord(c) < 0x21 or c == "\x7f" for c in url):
        raise UrlRefused("URLs with spaces or control characters are refused", "http.bad-url")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UrlRefused(f"malformed URL: {exc}", "http.bad-url") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UrlRefused(f"scheme must be http or https, not {scheme!r}", "http.bad-url")
    netloc = parts.netloc
    if "@" in netloc:
        raise UrlRefused("URLs with userinfo (user@host) are refused", "http.userinfo")
    host_text = netloc
    if host_text.startswith("["):
        host_text = host_text[: host_text.find("]") + 1]
    else:
        host_text = host_text.split(":", 1)[0]
    if not host_text or "%" in host_text:
        raise UrlRefused("the URL has no usable host", "http.bad-url")
    try:
        host = normalize_host(host_text)
    except ValueError as exc:
        raise UrlRefused(str(exc), "http.bad-url") from exc
    if port == 0:
        raise UrlRefused("port 0 is not a port", "http.bad-url")
    path = normalize_path(parts.path)
    if isinstance(host, str):
        return NormalUrl(scheme, host, None, port or default_port(scheme), path)
    return NormalUrl(scheme, str(host), host, port or default_port(scheme), path)
