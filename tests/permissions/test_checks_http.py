"""URL and address checks: normalisation tricks, wildcards, ports, methods, private addresses."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skilld.permissions import SkillPermissions, UrlRefused, check_text, normalize_url
from skilld.policy import compile_policies
from skilld.policy.patterns import (
    _V4_STARTS,
    METADATA,
    is_special,
    normalize_host,
    parse_address,
    unwrap,
)

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
    d = check_text(c, "http", "address", target)
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


@pytest.mark.parametrize(
    "address",
    ["168.63.129.16", "169.254.170.2", "169.254.170.23", "100.100.100.200", "fd00:ec2::23"],
)
def test_cloud_metadata_addresses(make: Make, address: str) -> None:
    """Every cloud's metadata address is refused under allow_private and any-host rules."""
    c = make("http:\n  - url: 'http://*/'\n    allow_private: true\n")
    d = c.check_address(address, 80, "http", "any.example.com")
    assert (d.allowed, d.rule) == (False, "default-deny")
    assert d.reason.endswith("is a cloud metadata address; allow it only by naming it in a rule")
    host = f"[{address}]" if ":" in address else address
    assert "cloud metadata" in c.check_url(f"http://{host}/").reason


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com/v1/x\n",
        "https://api.example.com\n/v1/x",
        "https://api.example.com/v1\n",
        "https://api.example.com:443\n/v1/x",
    ],
)
def test_url_with_trailing_newline_is_refused(c: SkillPermissions, url: str) -> None:
    """A newline anywhere in the URL is a control character: refused, never trimmed."""
    d = c.check_url(url)
    assert (d.allowed, d.rule) == (False, "http.bad-url"), d.reason


# Every host kind for both capabilities, with and without allow_private and named addresses.
SCOPED = """
http:
  - id: h-name
    url: http://api.example.com/
  - id: h-name-private
    url: http://db.example.com/
    allow_private: true
  - id: h-suffix
    url: "http://*.example.com:8080/"
  - id: h-suffix-deep
    url: "http://*.b.example.com/"
    addresses: [10.1.0.0/16]
  - id: h-ip
    url: http://10.2.3.4/
  - id: h-any
    url: "https://*/"
tcp:
  - id: t-name
    host: db.example.com
    ports: 5432
    allow_private: true
  - id: t-suffix
    host: "*.example.com"
    ports: "6000-6100"
  - id: t-cidr
    host: 10.3.0.0/16
    ports: 22
  - id: t-ip
    host: 169.254.169.254
    ports: 80
  - id: t-any
    host: "*"
    ports: 443
"""
# (rule id, host kind, host, ports, allow_private, addresses it names) for each rule of SCOPED
_SCOPED_RULES = {
    "http": [
        ("s.h-name", "name", "api.example.com", (80,), False, ()),
        ("s.h-name-private", "name", "db.example.com", (80,), True, ()),
        ("s.h-suffix", "suffix", "example.com", (8080,), False, ()),
        ("s.h-suffix-deep", "suffix", "b.example.com", (80,), False, ("10.1.0.0/16",)),
        ("s.h-ip", "ip", "10.2.3.4", (80,), False, ("10.2.3.4/32",)),
        ("s.h-any", "any", "", (443,), False, ()),
    ],
    "tcp": [
        ("s.t-name", "name", "db.example.com", (5432,), True, ()),
        ("s.t-suffix", "suffix", "example.com", tuple(range(6000, 6101)), False, ()),
        ("s.t-cidr", "cidr", "", (22,), False, ("10.3.0.0/16",)),
        ("s.t-ip", "ip", "169.254.169.254", (80,), False, ("169.254.169.254/32",)),
        ("s.t-any", "any", "", (443,), False, ()),
    ],
}


def _scoped_reference(capability: str, ip: str, port: int, host: str) -> set[str]:
    """The rule ids that may allow ``ip:port`` for ``host``, from the rules' plain meaning."""
    addr = unwrap(ipaddress.ip_address(ip))
    metadata = addr in METADATA
    special = metadata or not addr.is_global or addr.is_multicast
    try:
        norm = normalize_host(host)
    except ValueError:
        return set()
    out = set()
    for rid, kind, value, ports, allow, named in _SCOPED_RULES[capability]:
        # A name narrows to the rules for it; an IP literal names itself (every rule).
        if isinstance(norm, str) and not (
            kind == "any"
            or (kind == "suffix" and norm.endswith("." + value))
            or (kind == "name" and norm == value)
        ):
            continue
        is_named = any(
            addr.version == n.version and addr in n for n in map(ipaddress.ip_network, named)
        )
        if port in ports and (is_named or (not metadata and (not special or allow))):
            out.add(rid)
    return out


@pytest.fixture(scope="module")
def scoped(tmp_path_factory: pytest.TempPathFactory) -> SkillPermissions:
    """The checker for SCOPED."""
    root = tmp_path_factory.mktemp("scoped")
    (root / "s.yaml").write_text(SCOPED)
    return SkillPermissions.from_tables(compile_policies(root).tables, "s")


@given(
    st.sampled_from(["http", "tcp"]),
    st.sampled_from(
        [
            "93.184.216.34",
            "10.1.2.3",
            "10.2.3.4",
            "10.3.0.9",
            "127.0.0.1",
            "169.254.169.254",
            "168.63.129.16",
            "::ffff:10.1.0.1",
            "2606:4700::1",
        ]
    ),
    st.sampled_from([22, 80, 443, 5432, 6000, 6100, 8080]),
    st.sampled_from(
        [
            "api.example.com",
            "API.Example.COM.",
            "db.example.com",
            "x.example.com",
            "x.b.example.com",
            "b.example.com",
            "example.com",
            "evil.com",
            "api.example.com.evil",
            "10.2.3.4",
            "169.254.169.254",
            "bad host",
            "db.example.com\n",
        ]
    ),
)
def test_host_scoped_address_check_property(
    scoped: SkillPermissions, capability: str, ip: str, port: int, host: str
) -> None:
    """Property: with a host, an address passes exactly when a rule for that host allows it."""
    d = scoped.check_address(ip, port, capability, host)
    allowed_by = _scoped_reference(capability, ip, port, host)
    assert d.allowed == bool(allowed_by), (d, allowed_by)
    if d.allowed:
        assert d.rule in allowed_by


_v4_edges = [e + d for e in _V4_STARTS for d in (-1, 0, 1) if 0 <= e + d < 2**32]


@given(st.one_of(st.integers(0, 2**32 - 1), st.sampled_from(_v4_edges)))
def test_ipv4_classification_agrees_with_ipaddress(number: int) -> None:
    """Property: the IPv4 range table answers what ipaddress answers, edges included."""
    ip = ipaddress.IPv4Address(number)
    metadata = ip in METADATA
    special = metadata or not ip.is_global or ip.is_multicast
    assert is_special(ip) == special
    assert parse_address(str(ip)) == (ip, str(ip), metadata, special)


@given(
    st.one_of(
        st.from_regex(r"[0-9]{1,4}(\.[0-9]{1,4}){0,4}", fullmatch=True),
        st.from_regex(r"[0-9a-f:.]{2,20}", fullmatch=True),
        st.text(alphabet="0123456789.:\n x", max_size=18),
    )
)
def test_address_parsing_agrees_with_ipaddress(text: str) -> None:
    """Property: the dotted-quad fast path accepts and reads exactly what ipaddress does."""
    try:
        expected = unwrap(ipaddress.ip_address(text))
    except ValueError:
        with pytest.raises(ValueError):
            parse_address(text)
        return
    assert parse_address(text)[0] == expected
