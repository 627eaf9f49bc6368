"""URL and address checks: normalisation tricks, wildcards, ports, methods, private addresses."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skilld.permissions import SkillPermissions, UrlRefused, normalize_url

POLICY = """
http:
  - id: api
    url: https://api.example.com/v1/
    methods: [GET, POST]
  - url: https://*.cdn.example.org/
  - url: "*://files.example.net:8000-8100/pub"
  - id: internal
    url: http://intranet.corp/
    allow_private: true
  - id: meta
    url: http://169.254.169.254/latest/
  - id: router
    url: http://192.168.1.1/
  - id: svc
    url: https://svc.example.com/
    addresses: [10.1.0.0/16]
  - url: "https://xn--bcher-kva.example/"
"""

Make = Callable[..., SkillPermissions]


@pytest.fixture
def c(make: Make) -> SkillPermissions:
    """The checker for POLICY."""
    return make(POLICY)


@pytest.mark.parametrize(
    ("url", "method", "allowed", "rule"),
    [
        ("https://api.example.com/v1/things", "GET", True, "s.api"),
        ("https://api.example.com/v1", "POST", True, "s.api"),
        ("https://api.example.com/v1/x", "DELETE", False, "s.api"),
        ("https://api.example.com/v1evil", "GET", False, "default-deny"),
        ("https://api.example.com/v2/x", "GET", False, "default-deny"),
        ("https://api.example.com/v1/../admin", "GET", False, "default-deny"),
        ("https://api.example.com/v1/%2e%2e/admin", "GET", False, "default-deny"),
        ("https://api.example.com/v1/a/../b", "GET", True, "s.api"),
        ("https://api.example.com/v1/..%2fadmin", "GET", False, "http.bad-url"),
        ("http://api.example.com/v1/x", "GET", False, "default-deny"),
        ("https://api.example.com:8443/v1/x", "GET", False, "default-deny"),
        ("https://api.example.com:443/v1/x", "GET", True, "s.api"),
        ("HTTPS://API.EXAMPLE.COM/v1/x", "get", True, "s.api"),
        ("https://api.example.com./v1/x", "GET", True, "s.api"),
        ("https://api.example.com@evil.com/v1/", "GET", False, "http.userinfo"),
        ("https://user:pw@api.example.com/v1/", "GET", False, "http.userinfo"),
        ("https://evil.com#@api.example.com/v1/", "GET", False, "default-deny"),
        ("https://api.example.com.evil.com/v1/", "GET", False, "default-deny"),
        ("https://evilapi.example.com/v1/", "GET", False, "default-deny"),
        ("https://a.cdn.example.org/x", "GET", True, "s.fs[1]".replace("fs", "http")),
        ("https://a.b.cdn.example.org/x", "GET", True, "s.http[1]"),
        ("https://cdn.example.org/x", "GET", False, "default-deny"),
        ("https://evilcdn.example.org/x", "GET", False, "default-deny"),
        ("http://files.example.net:8050/pub/a", "GET", True, "s.http[2]"),
        ("https://files.example.net:8100/pub", "HEAD", True, "s.http[2]"),
        ("https://files.example.net:8101/pub", "GET", False, "default-deny"),
        ("https://files.example.net/pub", "GET", False, "default-deny"),
        ("https://files.example.net:8050/pub", "POST", False, "s.http[2]"),
        ("https://bücher.example/", "GET", True, "s.http[7]"),
        ("https://BÜCHER.example./x", "GET", True, "s.http[7]"),
        ("ftp://api.example.com/v1/", "GET", False, "http.bad-url"),
        ("https://api.example.com /v1/", "GET", False, "http.bad-url"),
        ("https://api.example.com:99999/v1/", "GET", False, "http.bad-url"),
        ("https:///v1/", "GET", False, "http.bad-url"),
    ],
)
def test_urls(c: SkillPermissions, url: str, method: str, allowed: bool, rule: str) -> None:
    """URLs are normalised before matching; prefixes are segment-bounded; methods count."""
    d = c.check_url(url, method)
    assert (d.allowed, d.rule) == (allowed, rule), d.reason


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://localhost./",
        "http://2130706433/",
        "http://0x7f.1/",
        "http://0177.0.0.1/",
        "http://127.1/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:7f00:1]/",
        "http://169.254.169.254/other",
        "http://[fd00:ec2::254]/latest/",
        "http://10.0.0.1/",
        "http://0/",
    ],
)
def test_ip_literal_tricks_are_refused(c: SkillPermissions, url: str) -> None:
    """Loopback, private and metadata addresses in any spelling are refused unless named."""
    assert not c.check_url(url).allowed


def test_named_addresses_are_allowed(c: SkillPermissions) -> None:
    """A rule that names an address allows it, in any spelling, under its prefix only."""
    assert c.check_url("http://169.254.169.254/latest/meta-data").rule == "s.meta"
    assert c.check_url("http://2852039166/latest/").rule == "s.meta"
    assert c.check_url("http://[::ffff:169.254.169.254]/latest/").allowed
    assert c.check_url("http://192.168.1.1/").rule == "s.router"
    assert c.check_url("http://0xc0.0xa8.1.1/").rule == "s.router"


def test_normalize_url_forms() -> None:
    """The normal form lowercases, strips the dot, punycodes and unwraps addresses."""
    u = normalize_url("HTTP://Bücher.Example.:8080/a/./b/../c")
    assert (u.scheme, u.host, u.port, u.path) == ("http", "xn--bcher-kva.example", 8080, "/a/c")
    assert normalize_url("http://0x7f.1/").host == "127.0.0.1"
    assert normalize_url("http://[::ffff:10.0.0.1]/").host == "10.0.0.1"
    assert normalize_url("http://[64:ff9b::a9fe:a9fe]/").host == "169.254.169.254"


@pytest.mark.parametrize(
    ("target", "allowed", "rule"),
    [
        ("93.184.216.34:443", True, None),
        ("127.0.0.1:80 api.example.com", False, "default-deny"),
        ("127.0.0.1:443", False, "default-deny"),
        ("[::1]:443", False, "default-deny"),
        ("[::ffff:127.0.0.1]:443", False, "default-deny"),
        ("127.0.0.1:80 intranet.corp", True, "s.internal"),
        ("10.1.2.3:443 api.example.com", False, "default-deny"),
        ("10.1.2.3:443 svc.example.com", True, "s.svc"),
        ("169.254.169.254:80 api.example.com", False, "default-deny"),
        ("169.254.169.254:80", True, "s.meta"),
        ("169.254.169.254:443", False, "default-deny"),
        ("[fd00:ec2::254]:80", False, "default-deny"),
        ("100.100.100.200:80", False, "default-deny"),
        ("10.9.9.9:80", True, "s.internal"),
        ("10.1.2.3:443", True, "s.svc"),
        ("192.168.1.1:80", True, "s.router"),
        ("fe80::1:80", False, "bad-request"),
    ],
)
def test_resolved_addresses(
    c: SkillPermissions, target: str, allowed: bool, rule: str | None
) -> None:
    """The address check refuses private and metadata addresses unless a rule names them."""
    d = c.check("http", "address", target)
    assert d.allowed == allowed, d.reason
    if rule:
        assert d.rule == rule


def test_metadata_needs_naming_even_with_allow_private(make: Make) -> None:
    """allow_private covers private ranges but never the metadata address."""
    c = make("http:\n  - url: 'http://*/'\n    allow_private: true\n")
    assert c.check_address("10.0.0.1", 80).allowed
    assert c.check_url("http://10.0.0.1/").allowed
    assert not c.check_address("169.254.169.254", 80).allowed
    assert not c.check_url("http://169.254.169.254/").allowed
    assert not c.check_address("fd00:ec2::254", 80).allowed


def test_no_http_rules_deny_everything(make: Make) -> None:
    """Without http rules, neither URLs nor addresses are allowed."""
    c = make("kv: {}\n")
    assert c.check_url("https://example.com/").rule == "default-deny"
    assert not c.check_address("93.184.216.34", 443).allowed


_hosts = st.sampled_from(
    [
        "api.example.com",
        "API.example.com",
        "api.example.com.",
        "example.com",
        "evil.com",
        "api.example.com.evil.com",
        "127.0.0.1",
        "2130706433",
        "[::1]",
        "a.api.example.com",
    ]
)
_segs = st.lists(
    st.sampled_from(["v1", "v1evil", "v2", "..", ".", "%2e%2e", "x", "", "V1"]), max_size=5
)


@given(
    st.sampled_from(["http", "https", "HTTPS", "ftp"]),
    st.sampled_from(["", "user@", "a:b@"]),
    _hosts,
    st.sampled_from(["", ":443", ":80", ":8443"]),
    _segs,
)
def test_url_never_allowed_outside_grant(
    scheme: str, userinfo: str, host: str, port: str, segs: list[str]
) -> None:
    """Property: only https://api.example.com[:443] under /v1 (after normalisation) passes."""
    c = SkillPermissions(
        "p",
        {
            "http": [
                {
                    "id": "p.api",
                    "url": "https://api.example.com/v1",
                    "schemes": ["https"],
                    "host": "api.example.com",
                    "ports": None,
                    "path": "/v1",
                    "methods": ["GET"],
                    "max_response_bytes": None,
                    "allow_private": False,
                    "addresses": [],
                }
            ]
        },
    )
    url = f"{scheme}://{userinfo}{host}{port}/" + "/".join(segs)
    d = c.check_url(url, "GET")
    if d.allowed:
        u = normalize_url(url)
        assert u.scheme == "https" and u.host == "api.example.com" and u.port == 443
        assert u.path == "/v1" or u.path.startswith("/v1/")
        assert not userinfo
        resolved: list[str] = []
        for s in ("/".join(segs).replace("%2e", ".")).split("/"):
            if s == "..":
                if resolved:
                    resolved.pop()
            elif s != ".":
                resolved.append(s)
        assert resolved[:1] == ["v1"]


_label = st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z0-9]", fullmatch=True)
_path_chars = st.text(alphabet="abz09-_.~/%;=:@", max_size=20)


@given(
    st.sampled_from(["http", "https"]),
    st.lists(_label, min_size=1, max_size=4),
    st.sampled_from(["", ":80", ":443", ":8080", ":65535"]),
    _path_chars,
    st.sampled_from(["", "?q=1", "#frag", "?a=b@c"]),
)
def test_fast_path_agrees_with_general_parser(
    scheme: str, labels: list[str], port: str, path: str, tail: str
) -> None:
    """Property: the fast path for simple URLs gives what the general parser gives."""
    url = f"{scheme}://{'.'.join(labels)}{port}/{path}{tail}"
    general = f"{scheme.upper()}://{'.'.join(labels)}{port}/{path}{tail}"  # skips the fast path
    try:
        slow = normalize_url(general)
    except UrlRefused:
        with pytest.raises(UrlRefused):
            normalize_url(url)
        return
    assert normalize_url(url) == slow
