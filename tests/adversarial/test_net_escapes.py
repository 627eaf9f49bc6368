"""http and tcp tricks, from the real prober under real compiled tables: no request escapes.

Every name the tests resolve is under ``.test`` (resolved by the suite's table) or an
IP literal; the only servers are on 127.0.0.1.
"""

from __future__ import annotations

import base64
import socket
from typing import Any

import pytest

from skilld.policy import Tables
from skilld.sandbox import Component
from support.adversarial import Probe, assert_outcome, case_ids, compile_dir

POLICY = """\
http:
  - id: pub
    url: http://127.0.0.1:{P}/pub/
    methods: [GET, HEAD]
    max_response_bytes: 1000
  - id: form
    url: http://127.0.0.1:{P}/form
    methods: [POST]
  - id: big
    url: http://127.0.0.1:{P}/big
  - id: redir
    url: http://127.0.0.1:{P}/redirect
  - id: api
    url: http://api.test:{P}/
    allow_private: true
  - id: idn
    url: http://bücher.test:{P}/
    allow_private: true
  - id: loop
    url: http://loop.test:{P}/
  - id: mapped
    url: http://mapped.test:{P}/
  - id: meta
    url: http://meta.test/
    allow_private: true
  - id: ten
    url: http://ten.test/
    addresses: [10.9.0.0/16]
  - id: gone
    url: http://gone.test/
  - id: flip
    url: http://flip.test:{P}/
    allow_private: true
tcp:
  - id: lo
    host: 127.0.0.0/30
    ports: {T}
  - id: db
    host: db.test
    ports: {T}
    allow_private: true
  - id: cache
    host: cache.test
    ports: {T}
  - id: range
    host: range.test
    ports: "{T}-{T2}"
    allow_private: true
  - id: meta-tcp
    host: meta.test
    ports: 80
    allow_private: true
  - id: flip-tcp
    host: flip.test
    ports: {T}
    allow_private: true
"""


@pytest.fixture(scope="module")
def tables(web: int, echo_server: int, tmp_path_factory: pytest.TempPathFactory) -> Tables:
    """The prober's network policy for this module's servers, compiled."""
    text = (
        POLICY.replace("{P}", str(web))
        .replace("{T2}", str(echo_server + 2))
        .replace("{T}", str(echo_server))
    )
    return compile_dir(tmp_path_factory.mktemp("policies"), {"prober": text})


@pytest.fixture
def probe(prober: Component, tables: Tables) -> Probe:
    """The prober under the compiled network policy."""
    return Probe(prober, tables)


DENY = "default-deny"


def status(code: int, body: str | None = None) -> Any:
    """An ``ok`` check on the HTTP status (and the body when given)."""
    return lambda v: v["status"] == code and (body is None or v["body"] == body)


# (id, url with {P} for the web port, method, body, expected)
HTTP: list[tuple[str, str, str, str | None, tuple[Any, ...]]] = [
    ("get-granted", "http://127.0.0.1:{P}/pub/x", "GET", None, ("ok", status(200, "GET /pub/x"))),
    ("head-granted", "http://127.0.0.1:{P}/pub/x", "HEAD", None, ("ok", status(200, ""))),
    (
        "post-granted",
        "http://127.0.0.1:{P}/form",
        "POST",
        "a=1",
        ("ok", status(200, "POST /form a=1")),
    ),
    ("lowercase-method", "http://127.0.0.1:{P}/pub/x", "get", None, ("ok", status(200))),
    ("uppercase-scheme", "HTTP://127.0.0.1:{P}/pub/x", "GET", None, ("ok", status(200))),
    ("dot-segments-inside", "http://127.0.0.1:{P}/pub/a/../y", "GET", None, ("ok", status(200))),
    ("decimal-ip-same-address", "http://2130706433:{P}/pub/x", "GET", None, ("ok", status(200))),
    (
        "name-with-allow-private",
        "http://api.test:{P}/anything",
        "GET",
        None,
        ("ok", status(200, "GET /anything")),
    ),
    ("uppercase-host", "http://API.TEST:{P}/x", "GET", None, ("ok", status(200))),
    ("trailing-dot-host", "http://api.test.:{P}/x", "GET", None, ("ok", status(200))),
    ("idn-host", "http://bücher.test:{P}/x", "GET", None, ("ok", status(200))),
    ("punycode-host", "http://xn--bcher-kva.test:{P}/x", "GET", None, ("ok", status(200))),
    ("uncapped-rule", "http://127.0.0.1:{P}/big", "GET", None, ("ok", status(200))),
    (
        "redirect-to-granted",
        "http://127.0.0.1:{P}/redirect?to=/pub/z",
        "GET",
        None,
        ("ok", status(200, "GET /pub/z")),
    ),
    # methods and sizes
    (
        "method-not-granted",
        "http://127.0.0.1:{P}/pub/x",
        "POST",
        "x",
        ("deny", "prober.pub", "allows GET, HEAD, not POST"),
    ),
    (
        "delete-not-granted",
        "http://127.0.0.1:{P}/form",
        "DELETE",
        None,
        ("deny", "prober.form", "not DELETE"),
    ),
    (
        "method-unsupported",
        "http://127.0.0.1:{P}/pub/x",
        "TRACE",
        None,
        ("error", "invalid-argument", "unsupported HTTP method"),
    ),
    (
        "method-injection",
        "http://127.0.0.1:{P}/pub/x",
        "GET /x HTTP/1.1\r\nX:",
        None,
        ("error", "invalid-argument", "unsupported HTTP method"),
    ),
    (
        "oversized-response",
        "http://127.0.0.1:{P}/pub/big",
        "GET",
        None,
        ("error", "limit-exceeded", "exceeds 1000 bytes"),
    ),
    # paths
    (
        "path-not-granted",
        "http://127.0.0.1:{P}/secret",
        "GET",
        None,
        ("deny", DENY, "127.0.0.1 is a private"),
    ),
    (
        "path-prefix-sibling",
        "http://127.0.0.1:{P}/pubevil",
        "GET",
        None,
        ("deny", DENY, "127.0.0.1 is a private"),
    ),
    ("dotdot-out", "http://127.0.0.1:{P}/pub/../secret", "GET", None, ("deny", DENY, "/secret")),
    (
        "pct-2e-dotdot-out",
        "http://127.0.0.1:{P}/pub/%2e%2e/secret",
        "GET",
        None,
        ("deny", DENY, "/secret"),
    ),
    (
        "pct-2f",
        "http://127.0.0.1:{P}/pub/..%2fsecret",
        "GET",
        None,
        ("deny", "http.bad-url", "encoded"),
    ),
    (
        "backslash",
        "http://127.0.0.1:{P}/pub\\..\\secret",
        "GET",
        None,
        ("deny", "http.bad-url", "back slashes"),
    ),
    (
        "fragment-at",
        "http://127.0.0.1:{P}#@api.test/pub/x",
        "GET",
        None,
        ("deny", DENY, "127.0.0.1 is a private"),
    ),
    (
        "control-chars",
        "http://127.0.0.1:{P}/pub/x\r\nHost: evil",
        "GET",
        None,
        ("deny", "http.bad-url", "control"),
    ),
    (
        "wrong-port",
        "http://127.0.0.1:1/pub/x",
        "GET",
        None,
        ("deny", DENY, "127.0.0.1 is a private"),
    ),
    # userinfo and schemes
    (
        "userinfo-host",
        "http://api.test@127.0.0.1:{P}/pub/x",
        "GET",
        None,
        ("deny", "http.userinfo", "userinfo"),
    ),
    (
        "userinfo-password",
        "http://u:p@127.0.0.1:{P}/pub/x",
        "GET",
        None,
        ("deny", "http.userinfo", "userinfo"),
    ),
    (
        "userinfo-empty",
        "http://@127.0.0.1:{P}/pub/x",
        "GET",
        None,
        ("deny", "http.userinfo", "userinfo"),
    ),
    ("scheme-ftp", "ftp://127.0.0.1:{P}/pub/x", "GET", None, ("deny", "http.bad-url", "scheme")),
    ("scheme-file", "file:///etc/passwd", "GET", None, ("deny", "http.bad-url", "scheme")),
    ("scheme-gopher", "gopher://127.0.0.1:{P}/_x", "GET", None, ("deny", "http.bad-url", "scheme")),
    ("no-scheme", "//127.0.0.1:{P}/pub/x", "GET", None, ("deny", "http.bad-url", "scheme")),
    # numeric, mapped and special addresses
    ("decimal-ipv4", "http://2130706433/", "GET", None, ("deny", DENY, "127.0.0.1 is a private")),
    ("hex-short-ipv4", "http://0x7f.1/", "GET", None, ("deny", DENY, "127.0.0.1 is a private")),
    ("octal-ipv4", "http://0177.0.0.1/", "GET", None, ("deny", DENY, "127.0.0.1 is a private")),
    ("short-ipv4", "http://127.1/", "GET", None, ("deny", DENY, "127.0.0.1 is a private")),
    (
        "mapped-ipv6",
        "http://[::ffff:127.0.0.1]/",
        "GET",
        None,
        ("deny", DENY, "127.0.0.1 is a private"),
    ),
    ("loopback-ipv6", "http://[::1]/", "GET", None, ("deny", DENY, "::1 is a private")),
    ("unspecified", "http://0.0.0.0/", "GET", None, ("deny", DENY, "0.0.0.0 is a private")),
    ("rfc1918", "http://10.0.0.1/", "GET", None, ("deny", DENY, "10.0.0.1 is a private")),
    (
        "metadata-aws",
        "http://169.254.169.254/latest/meta-data/",
        "GET",
        None,
        ("deny", DENY, "cloud metadata"),
    ),
    ("metadata-alibaba", "http://100.100.100.200/", "GET", None, ("deny", DENY, "cloud metadata")),
    ("metadata-ipv6", "http://[fd00:ec2::254]/", "GET", None, ("deny", DENY, "cloud metadata")),
    ("metadata-decimal", "http://2852039166/", "GET", None, ("deny", DENY, "cloud metadata")),
    (
        "metadata-azure-wireserver",
        "http://168.63.129.16/machine?comp=goalstate",
        "GET",
        None,
        ("deny", DENY, "168.63.129.16 is a cloud metadata address"),
    ),
    (
        "metadata-aws-ecs",
        "http://169.254.170.2/v2/credentials/x",
        "GET",
        None,
        ("deny", DENY, "169.254.170.2 is a cloud metadata address"),
    ),
    (
        "metadata-aws-eks-pod-identity",
        "http://169.254.170.23/v1/credentials",
        "GET",
        None,
        ("deny", DENY, "169.254.170.23 is a cloud metadata address"),
    ),
    # a trailing newline is a control character, never trimmed into a granted URL
    (
        "trailing-newline-path",
        "http://127.0.0.1:{P}/pub/x\n",
        "GET",
        None,
        ("deny", "http.bad-url", "spaces or control characters"),
    ),
    (
        "trailing-newline-host",
        "http://api.test\n:{P}/x",
        "GET",
        None,
        ("deny", "http.bad-url", "spaces or control characters"),
    ),
    (
        "trailing-newline-redirect",
        "http://127.0.0.1:{P}/redirect?to=/pub/x%0A",
        "GET",
        None,
        ("ok", status(200, "GET /pub/x%0A")),
    ),
    # names that resolve to special addresses
    (
        "name-to-loopback",
        "http://loop.test:{P}/x",
        "GET",
        None,
        ("deny", DENY, "loop.test (127.0.0.1"),
    ),
    (
        "name-to-mapped-loopback",
        "http://mapped.test:{P}/x",
        "GET",
        None,
        ("deny", DENY, "private, loopback"),
    ),
    (
        "name-to-metadata-allow-private",
        "http://meta.test/x",
        "GET",
        None,
        ("deny", DENY, "cloud metadata"),
    ),
    (
        "name-outside-addresses",
        "http://ten.test/x",
        "GET",
        None,
        ("deny", DENY, "10.1.2.3 is a private"),
    ),
    ("name-unlisted", "http://six.test/x", "GET", None, ("deny", DENY, "no http rule allows")),
    (
        "idn-lookalike",
        "http://bucher.test:{P}/x",
        "GET",
        None,
        ("deny", DENY, "no http rule allows"),
    ),
    (
        "name-unresolvable",
        "http://gone.test/x",
        "GET",
        None,
        ("error", "unavailable", "cannot resolve"),
    ),
    # redirects: every hop is checked
    (
        "redirect-to-forbidden-path",
        "http://127.0.0.1:{P}/redirect?to=http://127.0.0.1:{P}/secret",
        "GET",
        None,
        ("deny", DENY, "/secret"),
    ),
    (
        "redirect-to-private-name",
        "http://127.0.0.1:{P}/redirect?to=http://loop.test:{P}/x",
        "GET",
        None,
        ("deny", DENY, "loop.test (127.0.0.1"),
    ),
    (
        "redirect-to-metadata",
        "http://127.0.0.1:{P}/redirect?to=http://169.254.169.254/",
        "GET",
        None,
        ("deny", DENY, "cloud metadata"),
    ),
    (
        "redirect-to-decimal",
        "http://127.0.0.1:{P}/redirect?to=http://2130706433/",
        "GET",
        None,
        ("deny", DENY, "127.0.0.1 is a private"),
    ),
    (
        "redirect-to-file",
        "http://127.0.0.1:{P}/redirect?to=file:///etc/passwd",
        "GET",
        None,
        ("deny", "http.bad-url", "scheme"),
    ),
    (
        "redirect-to-userinfo",
        "http://127.0.0.1:{P}/redirect?to=http://a@127.0.0.1:{P}/pub/x",
        "GET",
        None,
        ("deny", "http.userinfo", "userinfo"),
    ),
    (
        "redirect-to-other-port",
        "http://127.0.0.1:{P}/redirect?to=http://127.0.0.1:1/pub/x",
        "GET",
        None,
        ("deny", DENY, "127.0.0.1 is a private"),
    ),
]


@pytest.mark.parametrize(("name", "url", "method", "body", "expected"), HTTP, ids=case_ids(HTTP))
def test_http_case(
    probe: Probe,
    web: int,
    name: str,
    url: str,
    method: str,
    body: str | None,
    expected: tuple[Any, ...],
) -> None:
    """Each URL trick gets exactly the outcome in the table; every denial is a recorded decision."""
    out = probe("http_request", url=url.replace("{P}", str(web)), method=method, body=body)
    assert_outcome(out, expected)
    structural = expected[1] in ("http.userinfo", "http.bad-url")
    if expected[0] == "deny" and (not structural or name.startswith("redirect")):
        denied = [d for d in out.decisions if not d.allowed]
        assert denied and denied[-1].rule == expected[1]


def test_address_check_names_the_host(probe: Probe, web: int) -> None:
    """The address check names the host: api.test's allow_private does not help loop.test."""
    out = probe("http_request", url=f"http://loop.test:{web}/x")
    address = [d for d in out.decisions if d.action == "address"]
    assert [d.target for d in address] == [f"127.0.0.1:{web} loop.test"]
    assert not address[0].allowed
    ok = probe("http_request", url=f"http://api.test:{web}/x")
    assert [d.rule for d in ok.decisions if d.action == "address"] == ["prober.api"]


# (id, host, port offset from the echo server's port (or an absolute port), expected)
TCP: list[tuple[str, str, int | str, tuple[Any, ...]]] = [
    ("ip-in-cidr", "127.0.0.1", 0, ("ok", base64.b64encode(b"PING").decode())),
    ("name-allow-private", "db.test", 0, ("ok", base64.b64encode(b"PING").decode())),
    (
        "mapped-literal-same-address",
        "::ffff:127.0.0.1",
        0,
        ("ok", base64.b64encode(b"PING").decode()),
    ),
    ("decimal-literal-same-address", "2130706433", 0, ("ok", base64.b64encode(b"PING").decode())),
    ("range-low-edge", "range.test", 0, ("ok", base64.b64encode(b"PING").decode())),
    ("range-high-edge-permitted", "range.test", 2, ("error", "unavailable", "cannot connect")),
    ("cidr-other-address-permitted", "127.0.0.2", 0, ("error", "unavailable", "cannot connect")),
    ("range-below", "range.test", -1, ("deny", DENY, "no tcp rule allows")),
    ("range-above", "range.test", 3, ("deny", DENY, "no tcp rule allows")),
    ("unlisted-port", "127.0.0.1", 1, ("deny", DENY, "is a private or metadata address")),
    ("outside-cidr", "127.0.0.4", 0, ("deny", DENY, "is a private or metadata address")),
    ("name-to-loopback-no-allow", "cache.test", 0, ("deny", DENY, "cache.test (127.0.0.1")),
    ("name-not-listed", "localhost", 0, ("deny", DENY, "no tcp rule allows")),
    ("subdomain-not-listed", "evil.db.test", 0, ("deny", DENY, "no tcp rule allows")),
    ("uppercase-name", "DB.TEST", 0, ("ok", base64.b64encode(b"PING").decode())),
    ("trailing-dot-name", "db.test.", 0, ("ok", base64.b64encode(b"PING").decode())),
    ("metadata-literal", "169.254.169.254", "80", ("deny", DENY, "private or metadata")),
    ("metadata-name-allow-private", "meta.test", "80", ("deny", DENY, "cloud metadata")),
    ("rfc1918-literal", "10.0.0.1", "5432", ("deny", DENY, "private or metadata")),
    ("ipv6-loopback", "::1", 0, ("deny", DENY, "private or metadata")),
    ("port-zero", "db.test", "0", ("deny", "bad-request", "port out of range")),
    ("host-with-newline", "db.test\n127.0.0.1", 0, ("deny", "bad-request", "bad host")),
    ("host-with-port", "db.test:22", 0, ("deny", "bad-request", "bad host 'db.test:22'")),
    (
        "host-trailing-newline",
        "db.test\n",
        0,
        ("deny", "bad-request", "bad host name 'db.test\\n'"),
    ),
    (
        "ip-trailing-newline",
        "127.0.0.1\n",
        0,
        ("deny", "bad-request", "bad host name '127.0.0.1\\n'"),
    ),
    ("host-leading-space", " db.test", 0, ("deny", "bad-request", "bad host name ' db.test'")),
    (
        "metadata-azure-wireserver",
        "168.63.129.16",
        "80",
        ("deny", DENY, "168.63.129.16 is a private or metadata address"),
    ),
]


@pytest.mark.parametrize(("name", "host", "port", "expected"), TCP, ids=case_ids(TCP))
def test_tcp_case(
    probe: Probe,
    echo_server: int,
    name: str,
    host: str,
    port: int | str,
    expected: tuple[Any, ...],
) -> None:
    """Each host:port trick gets exactly the outcome in the table."""
    real = int(port) if isinstance(port, str) else echo_server + port
    out = probe("tcp_exchange", host=host, port=real, send="ping")
    assert_outcome(out, expected)
    if expected[0] == "deny":
        assert [d for d in out.decisions if not d.allowed][-1].rule == expected[1]


def test_connection_goes_to_the_checked_address(
    probe: Probe, web: int, echo_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name is resolved once: a rebinding answer on a second lookup cannot move the connection.

    flip.test answers 127.0.0.1 (the servers) first and 127.0.0.2 (nothing listens) after;
    a host that looked the name up again to connect would fail, or reach another address.
    """
    table = socket.getaddrinfo  # the suite's .test resolver
    lookups: list[str] = []

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if str(host) != "flip.test":
            return table(host, port, *args, **kwargs)
        lookups.append(str(host))
        ip = "127.0.0.1" if len(lookups) == 1 else "127.0.0.2"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, int(port)))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    out = probe("http_request", url=f"http://flip.test:{web}/x")
    assert_outcome(out, ("ok", status(200, "GET /x")))
    assert lookups == ["flip.test"]
    assert [(d.target, d.rule) for d in out.decisions if d.action == "address"] == [
        (f"127.0.0.1:{web} flip.test", "prober.flip")
    ]
    lookups.clear()
    out = probe("tcp_exchange", host="flip.test", port=echo_server, send="ping")
    assert_outcome(out, ("ok", base64.b64encode(b"PING").decode()))
    assert lookups == ["flip.test"]
    assert [(d.target, d.rule) for d in out.decisions if d.action == "address"] == [
        (f"127.0.0.1:{echo_server} flip.test", "prober.flip-tcp")
    ]
