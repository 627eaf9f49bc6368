"""The seccomp layer from inside a confined command: what Landlock, namespaces and file
modes leave open is refused by the filter, and what scripts need still works.

Each attack is a Python probe run as the command through :func:`skilld.confine.run`
with a real :class:`~skilld.confine.Confinement`. Where the same probe run unconfined
(or confined without the filter) succeeds, the test runs that control too: the attack
is real, and the filter is what stops it. Calls that the dropped capabilities refuse
as well are checked against the filter alone, in a process that keeps root's
capabilities (``filtered``).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from skilld import confine
from skilld.confine import Confinement, ProcessResult, _seccomp
from skilld.confine import _client as confine_client

PY = sys.executable
PATH = {"PATH": "/usr/bin:/bin"}


@pytest.fixture(autouse=True)
def _shared_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The filter alone is under test: commands run as the launcher's own uid, as for an
    unprivileged skilld, so its metadata rules apply (a separate uid per skill makes the
    kernel refuse those changes too: tests/adversarial/test_confined_host.py)."""
    monkeypatch.setenv(confine_client.IDENTITY_ENV, "shared")


# Helpers every probe starts with: ``call(name, nr, *args)`` prints ``name ok`` or
# ``name EPERM`` (the errno's name); integers go to the kernel as unsigned longs.
PRELUDE = """\
import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def raw(nr, *args):
    conv = [ctypes.c_ulong(a & (2**64 - 1)) if isinstance(a, int) else a for a in args]
    r = libc.syscall(ctypes.c_long(nr), *conv)
    return r, ctypes.get_errno() if r < 0 else 0
def say(name, r, e):
    print(name, errno.errorcode.get(e, e) if r < 0 else "ok", flush=True)
def call(name, nr, *args):
    r, e = raw(nr, *args)
    say(name, r, e)
    return r
def attempt(name, fn, *args):
    try:
        fn(*args)
        print(name, "ok", flush=True)
    except OSError as exc:
        print(name, errno.errorcode.get(exc.errno, exc.errno), flush=True)
"""


def probe(code: str, confinement: Confinement | None = None) -> ProcessResult:
    """Run the Python ``code`` (after PRELUDE) confined; Python's own files readable."""
    return confine.run(
        [PY, "-I", "-S", "-c", PRELUDE + textwrap.dedent(code)],
        confinement=confinement or Confinement(read_only=(sys.base_prefix,)),
        deadline=time.monotonic() + 30,
        env=PATH,
    )


def unconfined(code: str) -> subprocess.CompletedProcess[bytes]:
    """The same probe with no confinement at all: the control. Only probes that are
    harmless when they succeed run here (reads, sockets, the probe's own children)."""
    return subprocess.run(
        [PY, "-I", "-S", "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        timeout=30,
        check=False,
    )


def answers(out: bytes) -> dict[str, str]:
    """``name result`` lines as a dict."""
    return dict(line.split(" ", 1) for line in out.decode().splitlines() if " " in line)


def refused(out: bytes, names: list[str], code: str = "EPERM") -> None:
    """Every probe in ``names`` answered ``code``."""
    got = answers(out)
    assert {n: got.get(n) for n in names} == dict.fromkeys(names, code), out


# In an empty network namespace, and in the host's (a tcp grant): neither changes a verdict.
CONFINEMENTS = (
    Confinement(read_only=(sys.base_prefix,)),
    Confinement(read_only=(sys.base_prefix,), tcp_connect=(9,)),
)
NETWORKS = [
    pytest.param(c, id=i) for c, i in zip(CONFINEMENTS, ("no-network", "host-network"), strict=True)
]


# -- keyrings ------------------------------------------------------------------

SYS_ADD_KEY, SYS_REQUEST_KEY, SYS_KEYCTL = 248, 249, 250
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING = -3, -4
KEYCTL_LINK = 8
KEYCTL_UPDATE, KEYCTL_REVOKE, KEYCTL_SETPERM, KEYCTL_SEARCH, KEYCTL_READ = 2, 3, 5, 10, 11
KEY_POS_ALL, KEY_USR_ALL = 0x3F000000, 0x003F0000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _keyctl(*args: object) -> int:
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    return int(_libc.syscall(SYS_KEYCTL, *conv))


@pytest.fixture
def user_key() -> Iterator[tuple[str, int]]:
    """A key in this uid's user keyring (root's, as the suite runs): (description, serial)."""
    desc = f"skilld-seccomp-{os.getpid()}"
    # Possess the user keyring through this process's session keyring, whichever that
    # is by now (another test's add_key to its session keyring may have made a fresh one).
    _keyctl(KEYCTL_LINK, KEY_SPEC_USER_KEYRING, KEY_SPEC_SESSION_KEYRING)
    payload = b"keyring-secret"
    serial = int(
        _libc.syscall(
            SYS_ADD_KEY, b"user", desc.encode(), payload, ctypes.c_size_t(len(payload)),
            ctypes.c_int(KEY_SPEC_USER_KEYRING),
        )
    )  # fmt: skip
    if serial < 0:
        pytest.skip(f"keyrings unavailable here: {os.strerror(ctypes.get_errno())}")
    # Readable by the uid, not only by a possessor: whichever session keyring this process
    # has by now (another test may have made it a fresh one), the uid reaches the key.
    assert _keyctl(KEYCTL_SETPERM, serial, KEY_POS_ALL | KEY_USR_ALL) == 0
    yield desc, serial
    _keyctl(KEYCTL_REVOKE, serial)


def key_payload(serial: int) -> bytes:
    """The key's payload, read by the test itself."""
    buf = ctypes.create_string_buffer(256)
    n = _keyctl(KEYCTL_READ, serial, buf, 256)
    return buf.raw[:n]


def test_keyring_search_read_and_update_are_refused(user_key: tuple[str, int]) -> None:
    """A command cannot find, read, overwrite or add to its uid's user keyring (root's is
    shared by every root process); unconfined, the same probe reads the key."""
    desc, serial = user_key
    read = f"""
    buf = ctypes.create_string_buffer(256)
    call("search", {SYS_KEYCTL}, {KEYCTL_SEARCH}, {KEY_SPEC_USER_KEYRING}, b"user", b"{desc}", 0)
    r = call("read", {SYS_KEYCTL}, {KEYCTL_READ}, {serial}, buf, 256)
    if r > 0:
        print("payload", buf.raw[:r].decode())
    """
    write = f"""
    call("update", {SYS_KEYCTL}, {KEYCTL_UPDATE}, {serial}, b"pwned", 5)
    call("add", {SYS_ADD_KEY}, b"user", b"x", b"y", 1, {KEY_SPEC_USER_KEYRING})
    call("request", {SYS_REQUEST_KEY}, b"user", b"{desc}", None, {KEY_SPEC_USER_KEYRING})
    call("join", {SYS_KEYCTL}, 1, None)
    """
    control = answers(unconfined(read).stdout)
    assert control["payload"] == "keyring-secret"
    for confinement in CONFINEMENTS:
        result = probe(textwrap.dedent(read) + textwrap.dedent(write), confinement)
        refused(result.stdout, ["search", "read", "update", "add", "request", "join"])
        assert "payload" not in answers(result.stdout)
    assert key_payload(serial) == b"keyring-secret"


# -- sockets -------------------------------------------------------------------


@pytest.fixture
def host_socket(tmp_path: Path) -> Iterator[Path]:
    """A world-writable (0666) pathname unix socket, listening, outside every grant."""
    path = tmp_path / "engine.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(8)
    path.chmod(0o666)
    yield path
    srv.close()


UNIX_CONNECT = """
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect({path!r})
    print("connect ok")
except OSError as exc:
    print("connect", errno.errorcode.get(exc.errno, exc.errno))
"""


@pytest.mark.parametrize("confinement", NETWORKS)
def test_pathname_unix_socket_outside_the_grants_is_refused(
    host_socket: Path, confinement: Confinement
) -> None:
    """connect() to a 0666 pathname socket (a container engine's API, say) fails: no
    AF_UNIX socket can be made; unconfined, the same probe connects."""
    code = UNIX_CONNECT.format(path=str(host_socket))
    assert answers(unconfined(code).stdout)["connect"] == "ok"
    refused(probe(code, confinement).stdout, ["connect"])


def test_a_grant_naming_a_socket_lets_af_unix_through(host_socket: Path) -> None:
    """When a grant names a socket, AF_UNIX is allowed, and then (the filter cannot read
    paths) every pathname socket the uid may open is reachable: the documented cost."""
    code = UNIX_CONNECT.format(path=str(host_socket))
    granted = Confinement(read_only=(sys.base_prefix, str(host_socket)))
    assert answers(probe(code, granted).stdout)["connect"] == "ok"


def test_socketpair_still_works() -> None:
    """socketpair() and multiprocessing's Pipe (built on it) still work under the filter."""
    code = """
    a, b = socket.socketpair()
    a.sendall(b"ping")
    print("pair", b.recv(4).decode())
    import multiprocessing.connection as mc
    r, w = mc.Pipe()
    w.send("pong")
    print("pipe", r.recv())
    """
    result = probe(code)
    assert answers(result.stdout) == {"pair": "ping", "pipe": "pong"}, result.stderr


@pytest.fixture
def host_datagram_socket(tmp_path: Path) -> Iterator[socket.socket]:
    """A world-writable (0666) pathname datagram socket outside every grant (``/dev/log``
    and journald's sockets are such)."""
    path = tmp_path / "log.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(str(path))
    path.chmod(0o666)
    srv.settimeout(0)
    yield srv
    srv.close()


DATAGRAM_PAIR = """
try:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    print("pair ok")
    a.sendto(b"forged", {path!r})
    print("sendto ok")
except OSError as exc:
    print("pair", errno.errorcode.get(exc.errno, exc.errno))
"""


@pytest.mark.parametrize("confinement", NETWORKS)
def test_a_datagram_socketpair_cannot_reach_a_pathname_socket(
    host_datagram_socket: socket.socket, confinement: Confinement
) -> None:
    """A datagram socketpair's end can ``sendto`` (or ``connect`` to) any pathname datagram
    socket, which no AF_UNIX refusal stops: the filter refuses datagram pairs. Unconfined,
    the same probe delivers its datagram."""
    code = DATAGRAM_PAIR.format(path=host_datagram_socket.getsockname())
    assert answers(unconfined(code).stdout)["sendto"] == "ok"
    assert host_datagram_socket.recv(64) == b"forged"
    refused(probe(code, confinement).stdout, ["pair"])
    with pytest.raises(BlockingIOError):
        host_datagram_socket.recv(64)


LOCAL_SOCKETS = """
import sys
here, there = sys.argv[1], sys.argv[2]
def act(name, fn):
    try:
        fn()
        print(name, "ok", flush=True)
    except OSError as exc:
        print(name, errno.errorcode.get(exc.errno, exc.errno), flush=True)
own = socket.socket(socket.AF_UNIX)
act("bind", lambda: own.bind(here + "/pipe"))
act("listen", lambda: own.listen(1))
act("connect-own", lambda: socket.socket(socket.AF_UNIX).connect(here + "/pipe"))
act("connect-host", lambda: socket.socket(socket.AF_UNIX).connect(there))
act("connect-tcp", lambda: socket.create_connection(("127.0.0.1", 9)))
act("dgram", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
act("dgram-pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM))
act("seqpacket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).close())
act("stream-pair", lambda: socket.socketpair())
"""


def test_local_sockets_listen_but_connect_nowhere(tmp_path: Path, host_socket: Path) -> None:
    """The filter for a command with socket directories (LibreOffice's pipe): stream and
    seqpacket unix sockets bind and listen, but connect() is refused everywhere (its own
    socket, a 0666 host socket, TCP), and datagram sockets and pairs are refused. With
    root's capabilities kept, so the filter alone decides; unconfined, the same probe
    connects to the host socket."""
    code = textwrap.dedent(LOCAL_SOCKETS)
    control = subprocess.run(
        [PY, "-I", "-S", "-c", PRELUDE + code, str(tmp_path), str(host_socket)],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    assert answers(control.stdout)["connect-host"] == "ok"
    (tmp_path / "pipe").unlink()
    bpf = _seccomp.compile_filter(unix_sockets=False, udp=False, metadata=True, local_sockets=True)
    setup = (
        "from skilld.confine import _seccomp\n"
        "libc.prctl(38, 1, 0, 0, 0)\n"
        f"_seccomp.install(bytes.fromhex({bpf.hex()!r}))\n"
    )
    done = subprocess.run(
        [PY, "-c", PRELUDE + setup + code, str(tmp_path), str(host_socket)],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    got = answers(done.stdout)
    assert got["bind"] == got["listen"] == got["seqpacket"] == got["stream-pair"] == "ok", got
    refused(done.stdout, ["connect-own", "connect-host", "connect-tcp", "dgram", "dgram-pair"])


def test_local_sockets_need_a_separate_identity(tmp_path: Path) -> None:
    """Sharing skilld's uid, a command that may remove files in /tmp could remove
    skilld's: it is refused (this module's launcher shares the uid)."""
    with pytest.raises(confine.ConfinementUnavailable, match="remove skilld's own files"):
        confine.run(
            ["/bin/true"],
            confinement=Confinement(socket_dirs=(str(tmp_path),)),
            deadline=time.monotonic() + 10,
            env=PATH,
        )


def test_temp_paths_need_a_separate_identity() -> None:
    """Sharing skilld's uid, a command given a declared temporary path is refused."""
    with pytest.raises(confine.ConfinementUnavailable, match="needs its own uid") as err:
        confine.run(
            ["/bin/true"],
            confinement=Confinement(temp_paths=("/tmp/skilld-never-made",)),
            deadline=time.monotonic() + 10,
            env=PATH,
        )
    assert err.value.feature == "temp-paths"
    assert not os.path.lexists("/tmp/skilld-never-made")


def test_local_sockets_never_come_with_network(tmp_path: Path) -> None:
    """connect() refused and a network granted cannot both hold: the command is refused."""
    with pytest.raises(confine.ConfinementUnavailable, match="network"):
        confine.run(
            ["/bin/true"],
            confinement=Confinement(socket_dirs=(str(tmp_path),), tcp_connect=(9,)),
            deadline=time.monotonic() + 10,
            env=PATH,
        )


SOCKETS = """
def sock(name, domain, kind, proto=0):
    call(name, 41, domain, kind, proto)
sock("netlink", 16, 3, 0)
sock("netlink-dgram", 16, 2, 15)
sock("packet", 17, 3, 0x0300)
sock("raw", 2, 3, 1)
sock("raw6", 10, 3, 58)
sock("udp", 2, 2, 0)
sock("udp6", 10, 2, 0)
sock("udp-cloexec", 2, 2 | 0o2000000 | 0o4000, 17)
sock("ping", 2, 2, 1)
sock("inet-packet", 2, 10, 0)
sock("sctp", 2, 1, 132)
sock("sctp-seq", 2, 5, 132)
sock("mptcp", 2, 1, 262)
sock("vsock", 40, 1, 0)
sock("alg", 38, 5, 0)
sock("unix-high-bits", (1 << 32) | 1, 1, 0)
sock("tcp-high-proto", 2, 1, (1 << 32) | 6)
sock("tcp", 2, 1, 0)
sock("tcp6", 10, 1 | 0o2000000 | 0o4000, 6)
"""
DENIED_SOCKETS = [
    "netlink", "netlink-dgram", "packet", "raw", "raw6", "udp", "udp6", "udp-cloexec",
    "ping", "inet-packet", "sctp", "sctp-seq", "mptcp", "vsock", "alg", "unix-high-bits",
    "tcp-high-proto",
]  # fmt: skip


@pytest.mark.parametrize("confinement", NETWORKS)
def test_netlink_packet_raw_and_udp_sockets_are_refused(confinement: Confinement) -> None:
    """Netlink, packet, raw, UDP, ping, SCTP, MPTCP, vsock and AF_ALG sockets cannot be
    made, nor AF_UNIX with high bits set in the domain; TCP (v4 and v6) still can.
    Unconfined, netlink and UDP (which need no capability) are made by the same probe."""
    control = answers(unconfined(SOCKETS).stdout)
    assert control["netlink"] == control["udp"] == control["udp6"] == "ok"
    result = probe(SOCKETS, confinement)
    refused(result.stdout, DENIED_SOCKETS)
    assert answers(result.stdout)["tcp"] == answers(result.stdout)["tcp6"] == "ok"


def filtered(code: str, *, unix_sockets: bool = False, udp: bool = False) -> dict[str, str]:
    """Run the probe under the filter alone, in a process that keeps root's capabilities
    (so that what capabilities would refuse is refused by the filter, or not at all)."""
    bpf = _seccomp.compile_filter(unix_sockets=unix_sockets, udp=udp, metadata=True)
    setup = (
        "from skilld.confine import _seccomp\n"
        "libc.prctl(38, 1, 0, 0, 0)\n"
        f"_seccomp.install(bytes.fromhex({bpf.hex()!r}))\n"
    )
    done = subprocess.run(
        [PY, "-c", PRELUDE + setup + textwrap.dedent(code)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return answers(done.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root's CAP_NET_RAW for the control")
def test_raw_and_packet_sockets_are_refused_by_the_filter_itself() -> None:
    """With root's capabilities kept, the filter alone refuses raw and packet sockets
    (the dropped capabilities are a second wall, not the only one)."""
    assert answers(unconfined(SOCKETS).stdout)["raw"] == "ok"
    got = filtered(SOCKETS)
    assert {n: got[n] for n in DENIED_SOCKETS} == dict.fromkeys(DENIED_SOCKETS, "EPERM")


def test_granted_udp_and_unix_sockets_leave_the_rest_refused() -> None:
    """``udp`` and ``unix_sockets`` open exactly UDP and AF_UNIX: raw, packet and netlink
    sockets stay refused."""
    code = SOCKETS + 'sock("unix", 1, 1, 0)\nsock("unix-dgram", 1, 2, 0)\n'
    got = filtered(code, unix_sockets=True, udp=True)
    for name in ("udp", "udp6", "udp-cloexec", "unix", "unix-dgram", "tcp", "tcp6"):
        assert got[name] == "ok", name
    for name in ("netlink", "packet", "raw", "raw6", "ping", "sctp", "mptcp", "alg", "vsock"):
        assert got[name] == "EPERM", name


SERVER = """
import sys
from skilld.confine import _seccomp
libc.prctl(38, 1, 0, 0, 0)
_seccomp.install(bytes.fromhex(sys.argv[1]))
opt = ctypes.c_int()
size = ctypes.c_uint(4)
for line in sys.stdin:
    d, t, p = (int(x) for x in line.split())
    fd, e = raw(41, d, t, p)
    if fd < 0:
        print("err", e, flush=True)
        continue
    got = []
    for o in (39, 3, 38):  # SO_DOMAIN, SO_TYPE, SO_PROTOCOL
        libc.getsockopt(int(fd), 1, o, ctypes.byref(opt), ctypes.byref(size))
        got.append(opt.value)
    os.close(fd)
    print("ok", *got, flush=True)
"""


@pytest.fixture(scope="module")
def socket_oracle() -> Iterator[subprocess.Popen[str]]:
    """A process under the filter (no grants) with root's capabilities kept: it makes the
    socket each line asks for and says what it got."""
    proc = _start_oracle(SERVER, metadata=True)
    yield proc
    _stop_oracle(proc)


def _start_oracle(server: str, *, metadata: bool) -> subprocess.Popen[str]:
    """A process running ``server`` (after PRELUDE) under the filter (no grants; what
    ``metadata`` says of file metadata), with root's capabilities kept so that only the
    filter can refuse: it reads one request a line on stdin and answers a line on stdout."""
    bpf = _seccomp.compile_filter(unix_sockets=False, udp=False, metadata=metadata)
    return subprocess.Popen(
        [PY, "-c", PRELUDE + server, bpf.hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _stop_oracle(proc: subprocess.Popen[str]) -> None:
    """End an oracle of :func:`_start_oracle`: its stdin closed, it exits."""
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=10)


def _ask(oracle: subprocess.Popen[str], line: str) -> list[str]:
    """The words of an oracle's answer to the request ``line`` (it must still be alive)."""
    assert oracle.stdin is not None
    assert oracle.stdout is not None
    oracle.stdin.write(line + "\n")
    oracle.stdin.flush()
    answer = oracle.stdout.readline().split()
    assert answer, "the oracle died"
    return answer


U64 = st.integers(0, 2**64 - 1)
HIGH = st.integers(0, 2**32 - 1).map(lambda h: h << 32)
DOMAINS = st.one_of(st.integers(0, 50), U64, st.tuples(HIGH, st.integers(0, 50)).map(sum))
TYPES = st.one_of(
    st.tuples(st.integers(0, 15), st.sampled_from([0, 0o2000000, 0o4000, 0o2004000])).map(sum),
    U64,
    st.tuples(HIGH, st.integers(0, 15)).map(sum),
)
PROTOCOLS = st.one_of(
    st.sampled_from([0, 1, 6, 17, 58, 132, 136, 255, 262, 0x0300]),
    st.integers(0, 300),
    U64,
    st.tuples(HIGH, st.sampled_from([0, 6, 17])).map(sum),
)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(domain=DOMAINS, kind=TYPES, protocol=PROTOCOLS)
def test_no_argument_values_yield_a_unix_raw_or_udp_socket(
    socket_oracle: subprocess.Popen[str], domain: int, kind: int, protocol: int
) -> None:
    """Whatever 64-bit values socket() gets (high bits, flags, odd protocols), the only
    sockets the filter lets the kernel make are TCP over IPv4 or IPv6."""
    answer = _ask(socket_oracle, f"{domain} {kind} {protocol}")
    if answer[0] == "ok":
        got_domain, got_type, got_protocol = (int(x) for x in answer[1:])
        assert got_domain in (socket.AF_INET, socket.AF_INET6)
        assert got_type == socket.SOCK_STREAM
        assert got_protocol == socket.IPPROTO_TCP


PAIR_SERVER = """
import sys
from skilld.confine import _seccomp
libc.prctl(38, 1, 0, 0, 0)
_seccomp.install(bytes.fromhex(sys.argv[1]))
opt = ctypes.c_int()
size = ctypes.c_uint(4)
pair = (ctypes.c_int * 2)()
for line in sys.stdin:
    d, t, p = (int(x) for x in line.split())
    r, e = raw(53, d, t, p, ctypes.addressof(pair))
    if r < 0:
        print("err", e, flush=True)
        continue
    libc.getsockopt(pair[0], 1, 3, ctypes.byref(opt), ctypes.byref(size))  # SO_TYPE
    os.close(pair[0])
    os.close(pair[1])
    print("ok", opt.value, flush=True)
"""


@pytest.fixture(scope="module")
def pair_oracle() -> Iterator[subprocess.Popen[str]]:
    """A process under the filter (no grants) that makes the socketpair each line asks for
    and says its type."""
    proc = _start_oracle(PAIR_SERVER, metadata=True)
    yield proc
    _stop_oracle(proc)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    domain=st.one_of(st.just(socket.AF_UNIX), DOMAINS),
    kind=TYPES,
    protocol=st.one_of(st.just(0), PROTOCOLS),
)
# Datagram and raw pairs, with flags and high bits the kernel drops.
@example(domain=1, kind=2, protocol=0)
@example(domain=1, kind=2 | 0o2004000, protocol=0)
@example(domain=1, kind=(7 << 32) | 2, protocol=0)
@example(domain=1, kind=3, protocol=0)
def test_no_argument_values_yield_a_datagram_socketpair(
    pair_oracle: subprocess.Popen[str], domain: int, kind: int, protocol: int
) -> None:
    """Whatever 64-bit values socketpair() gets, the only pairs the filter lets the kernel
    make are stream and seqpacket ones (and the plain stream pair is made: not vacuous)."""
    for line in (f"{domain} {kind} {protocol}", "1 1 0"):
        answer = _ask(pair_oracle, line)
        if answer[0] == "ok":
            assert int(answer[1]) in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET), line
    assert answer == ["ok", str(int(socket.SOCK_STREAM))]


def test_the_oracle_makes_what_it_is_allowed() -> None:
    """The property above is not vacuous: TCP sockets are made under the same filter,
    high bits in the type (which the kernel drops) included."""
    got = filtered('call("tcp", 41, 2, 1, 0)\ncall("tcp-hi", 41, 10, (7 << 32) | 1, 6)\n')
    assert got == {"tcp": "ok", "tcp-hi": "ok"}


# -- namespaces, mounts, other processes, kernel surface --------------------------

CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17

# Harmless when it works: a child in a new user namespace that exits at once, and
# setns on a bad descriptor. The only part of NAMESPACES the control runs unconfined.
CLONE_PROBE = f"""
r, e = raw(56, {CLONE_NEWUSER} | {SIGCHLD}, 0, 0, 0, 0)
if r == 0:
    os._exit(0)  # a child in a new user namespace: the attack worked; leave quietly
say("clone-newuser", r, e)
if r > 0:
    os.waitpid(r, 0)
call("setns", 308, (1 << 32) - 1, 0)
"""
# Mounts aim at the test's own scratch directory (sys.argv[1]), never at a system path:
# a broken filter must not be able to hide anything of the host.
NAMESPACES = (
    CLONE_PROBE
    + f"""
args = (ctypes.c_uint64 * 11)({CLONE_NEWUSER}, 0, 0, 0, {SIGCHLD}, 0, 0, 0, 0, 0, 0)
call("clone3", 435, ctypes.byref(args), 88)
scratch = sys.argv[1].encode()
call("mount", 165, b"none", scratch, b"tmpfs", 0, None)
call("fsopen", 430, b"tmpfs", 0)
call("open_tree", 428, (1 << 32) - 100, scratch, 1)
call("pivot_root", 155, scratch, scratch)
call("chroot", 161, scratch)
call("unshare-user", 272, {CLONE_NEWUSER})
call("unshare-mount", 272, {CLONE_NEWNS})
"""
)


@pytest.mark.parametrize("confinement", NETWORKS)
def test_namespaces_and_mounts_are_refused(tmp_path: Path, confinement: Confinement) -> None:
    """unshare, clone with CLONE_NEWUSER, setns and every mount call are refused (clone3
    with ENOSYS, so libc falls back to clone); unconfined, clone into a new user
    namespace and setns reach the kernel (setns(-1) answers EBADF there)."""
    control = answers(unconfined(CLONE_PROBE).stdout)
    assert control["clone-newuser"] == "ok"
    assert control["setns"] == "EBADF"
    scratch = Path(os.path.realpath(tmp_path))
    result = confine.run(
        [PY, "-I", "-S", "-c", PRELUDE + NAMESPACES, str(scratch)],
        confinement=Confinement(
            read_only=(sys.base_prefix,),
            read_write=(str(scratch),),
            tcp_connect=confinement.tcp_connect,
        ),
        deadline=time.monotonic() + 30,
        env=PATH,
    )
    names = ["unshare-user", "unshare-mount", "clone-newuser", "setns", "mount", "fsopen"]
    refused(result.stdout, [*names, "open_tree", "pivot_root", "chroot"])
    refused(result.stdout, ["clone3"], "ENOSYS")


def test_threads_fork_and_subprocesses_still_work() -> None:
    """Threads (libc's clone3 falls back to clone), fork and subprocess still work."""
    code = f"""
    import threading, subprocess
    out = []
    t = threading.Thread(target=out.append, args=("thread",))
    t.start(); t.join()
    print("thread", out[0])
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    print("fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    done = subprocess.run([{PY!r}, "-I", "-S", "-c", "print(6*7)"], capture_output=True)
    print("subprocess", done.stdout.decode().strip())
    """
    result = probe(code)
    assert answers(result.stdout) == {"thread": "thread", "fork": "7", "subprocess": "42"}, (
        result.stderr
    )


KERNEL = """
params = ctypes.create_string_buffer(120)
call("io_uring_setup", 425, 8, params)
call("io_uring_enter", 426, 0, 0, 0, 0, None, 0)
attr = ctypes.create_string_buffer(128)
call("bpf", 321, 0, attr, 72)
perf = ctypes.create_string_buffer(128)
ctypes.memmove(perf, (1).to_bytes(4, "little") + (128).to_bytes(4, "little"), 8)
perf[40] = 0b1100000  # exclude_kernel | exclude_hv
call("perf_event_open", 298, perf, 0, (1 << 64) - 1, (1 << 64) - 1, 0)
call("userfaultfd", 323, 1)
call("open_by_handle_at", 304, 0, None, 0)
call("personality-query", 135, 0xffffffff)
call("personality-no-aslr", 135, 0x0040000)
call("personality-rx", 135, 0x0400000)
call("personality-high-bits", 135, (1 << 32) | 0x0040000)
call("personality-linux", 135, 0)
"""
KERNEL_REFUSED = [
    "io_uring_setup", "io_uring_enter", "bpf", "perf_event_open", "userfaultfd",
    "open_by_handle_at", "personality-no-aslr", "personality-rx", "personality-high-bits",
]  # fmt: skip


def test_kernel_attack_surface_is_refused() -> None:
    """io_uring (whose socket and connect pass no seccomp filter), bpf, perf_event_open,
    userfaultfd, open_by_handle_at and personality changes are refused; the persona query
    and PER_LINUX still answer. Unconfined, io_uring, perf and userfaultfd are made."""
    control = answers(unconfined(KERNEL).stdout)
    for name in ("io_uring_setup", "perf_event_open", "userfaultfd"):
        assert control[name] == "ok", (name, control)
    result = probe(KERNEL)
    refused(result.stdout, KERNEL_REFUSED)
    got = answers(result.stdout)
    assert got["personality-query"] == got["personality-linux"] == "ok"


PTRACE = """
r_fd, w_fd = os.pipe()
child = os.fork()
if child == 0:
    os.close(w_fd)
    os.read(r_fd, 1)
    os._exit(0)
call("ptrace-attach", 101, 16, child, 0, 0)
call("ptrace-seize", 101, 0x4206, child, 0, 0)
local = (ctypes.c_uint64 * 2)(ctypes.addressof(ctypes.create_string_buffer(8)), 8)
remote = (ctypes.c_uint64 * 2)(id(0), 8)
call("process_vm_readv", 310, child, local, 1, remote, 1, 0)
call("process_vm_writev", 311, child, local, 1, remote, 1, 0)
call("kcmp", 312, os.getpid(), child, 0, 0, 0)
pidfd = call("pidfd_open", 434, child, 0)
call("pidfd_getfd", 438, pidfd, 0, 0)
call("process_madvise", 440, pidfd, local, 1, 21, 0)
os.close(w_fd)
os.waitpid(child, 0)
"""


def test_other_processes_cannot_be_traced_or_read() -> None:
    """ptrace (attach, seize), process_vm_readv/writev, kcmp, pidfd_open (``ENOSYS``:
    callers fall back to waitpid), pidfd_getfd and process_madvise of the command's own
    child are refused; unconfined, the same probe attaches, reads its child's memory
    and opens a pidfd."""
    control = answers(unconfined(PTRACE).stdout)
    assert control["ptrace-attach"] == control["process_vm_readv"] == "ok"
    assert control["pidfd_open"] == "ok"
    result = probe(PTRACE)
    refused(result.stdout, ["pidfd_open"], "ENOSYS")
    refused(
        result.stdout,
        [
            "ptrace-attach", "ptrace-seize", "process_vm_readv", "process_vm_writev",
            "kcmp", "pidfd_getfd", "process_madvise",
        ],
    )  # fmt: skip


# -- file metadata -------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """rw/ (to be granted) with a file; ro/ with a 0600 private key; out/ (never granted)
    with a copy of ``id`` owned by this uid (root's binary when the suite runs as root)."""
    root = Path(os.path.realpath(tmp_path))
    for name in ("rw", "ro", "out"):
        (root / name).mkdir()
    (root / "rw" / "notes").write_text("notes")
    (root / "ro" / "key").write_text("private")
    (root / "ro" / "key").chmod(0o600)
    shutil.copy(shutil.which("id") or "/usr/bin/id", root / "out" / "id")
    (root / "out" / "id").chmod(0o755)
    return root


def inode_state(path: Path) -> tuple[int, int, int, int, list[str]]:
    """Mode, owner, group, mtime and extended attributes of a file."""
    st_ = path.stat()
    return st_.st_mode, st_.st_uid, st_.st_gid, st_.st_mtime_ns, sorted(os.listxattr(path))


METADATA = """
rw, ro, out = sys.argv[1:4]
notes, key, victim = rw + "/notes", ro + "/key", out + "/id"
attempt("chmod-rw", os.chmod, notes, 0o777)
attempt("chmod-setuid", os.chmod, victim, 0o4755)
attempt("chown-rw", os.chown, notes, 1234, 1234)
attempt("lchown-rw", os.lchown, notes, 1234, 1234)
attempt("utime-rw", os.utime, notes, (0, 0))
attempt("setxattr-rw", os.setxattr, notes, "user.x", b"1")
attempt("removexattr-rw", os.removexattr, notes, "user.keep")
fd = os.open(key, os.O_RDONLY)
attempt("fchmod-key", os.fchmod, fd, 0o644)
attempt("fchown-key", os.fchown, fd, 1234, 1234)
attempt("fsetxattr-key", os.setxattr, fd, "user.x", b"1")
attempt("futimens-key", os.utime, fd, (0, 0))
call("ioctl-setflags", 16, fd, 0x40086602, ctypes.byref(ctypes.c_int(0)))
os.close(fd)
path_fd = os.open(victim, os.O_PATH)
call("fchmodat2-empty-path", 452, path_fd, b"", 0o4755, 0x1000)
call("fchownat-empty-path", 260, path_fd, b"", 1234, 1234, 0x1000)
call("utimensat-o-path", 280, path_fd, None, None, 0)
call("setxattrat", 463, path_fd, b"", 0x1000, b"user.x", None, 32)
call("removexattrat", 466, path_fd, b"", 0x1000, b"user.x")
call("file_setattr", 469, path_fd, b"", None, 24, 0x1000)
"""
METADATA_CALLS = [
    "chmod-rw", "chmod-setuid", "chown-rw", "lchown-rw", "utime-rw", "setxattr-rw",
    "removexattr-rw", "fchmod-key", "fchown-key", "fsetxattr-key", "futimens-key",
    "ioctl-setflags", "fchmodat2-empty-path", "fchownat-empty-path", "utimensat-o-path",
    "setxattrat", "removexattrat", "file_setattr",
]  # fmt: skip


def metadata_probe(files: Path) -> ProcessResult:
    """The metadata attacks against rw/ (granted rw), ro/ (granted ro) and out/ (not granted)."""
    return confine.run(
        [PY, "-I", "-S", "-c", PRELUDE + METADATA, *(str(files / n) for n in ("rw", "ro", "out"))],
        confinement=Confinement(
            read_only=(sys.base_prefix, str(files / "ro")), read_write=(str(files / "rw"),)
        ),
        deadline=time.monotonic() + 30,
        env=PATH,
    )


def test_metadata_changes_are_refused_inside_and_outside_the_grants(files: Path) -> None:
    """chmod (a setuid bit on a copy of ``id``, a private key's mode), chown, utime,
    setxattr, removexattr, inode flags, by path, by descriptor and through an O_PATH
    descriptor of a file outside every grant: all refused, modes and times unchanged,
    inside the rw grant too (the command runs as the uid that owns skilld's files)."""
    os.setxattr(files / "rw" / "notes", "user.keep", b"1")
    targets = [files / "rw" / "notes", files / "ro" / "key", files / "out" / "id"]
    before = [inode_state(p) for p in targets]
    result = metadata_probe(files)
    refused(result.stdout, METADATA_CALLS)
    assert [inode_state(p) for p in targets] == before


def test_without_the_metadata_rules_landlock_alone_lets_chmod_through(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: confined with the filter's metadata rules off, the same probe makes
    the copy of ``id`` setuid and the private key world-readable (Landlock does not
    govern metadata): the rules above are what stop it."""
    real = _seccomp.compile_filter

    def no_metadata(**options: bool) -> bytes:
        # Whatever else the launcher asks for, as it asks (no copy of the signature to drift).
        return real(**{**options, "metadata": False})

    monkeypatch.setattr(_seccomp, "compile_filter", no_metadata)
    got = answers(metadata_probe(files).stdout)
    assert got["chmod-setuid"] == got["fchmod-key"] == "ok"
    assert (files / "out" / "id").stat().st_mode & stat.S_ISUID


# -- other ABIs ----------------------------------------------------------------

I386_GETPID = """
import mmap
# mov eax, 20 (getpid in i386's table); int 0x80; ret
code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
print("i386", "ok" if fn() == os.getpid() else "other", flush=True)
"""
X32_GETPID = """
print("x32", libc.syscall(0x40000000 | 39), flush=True)
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="i386 and x32 are x86_64's")
def test_i386_int80_system_calls_kill_the_command() -> None:
    """A system call through i386's ``int 0x80`` (another syscall table, where the
    filter's numbers mean other calls) kills the command with SIGSYS; unconfined, the
    same machine code answers getpid."""
    if answers(unconfined(I386_GETPID).stdout).get("i386") != "ok":
        pytest.skip("this kernel has no i386 emulation: int 0x80 never reaches a filter")
    result = probe(I386_GETPID)
    assert result.signal == signal.SIGSYS, result
    assert b"i386" not in result.stdout


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="i386 and x32 are x86_64's")
def test_x32_system_calls_kill_the_command() -> None:
    """A system call with x32's bit (1 << 30) set kills the command with SIGSYS, whether
    or not the kernel has x32 (the filter judges it first)."""
    result = probe(X32_GETPID)
    assert result.signal == signal.SIGSYS, result
    assert b"x32" not in result.stdout


# -- scripts still work, failing closed -------------------------------------------


def test_git_and_curl_work_under_the_filter(tmp_path: Path, listener: int) -> None:
    """git add/commit/log in a repository inside a rw grant, and curl to a granted port,
    work under the filter. (Writing git's config, hence ``git init``, does not with the
    metadata rules on: git chmods its config lock; docs/confinement.md says so.)"""
    work = Path(os.path.realpath(tmp_path))
    env = {
        **PATH, "HOME": str(work), "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@b",
    }  # fmt: skip
    subprocess.run(["git", "init", "-q", str(work / "repo")], check=True, env=env)
    script = (
        f"cd {work}/repo && echo hi > f && git add f && "
        f"git commit -qm one && git log --format=%s && "
        f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{listener}/; echo \" $?\""
    )
    result = confine.run(
        ["/bin/sh", "-c", script],
        confinement=Confinement(
            read_write=(str(work),),
            executables=tuple(str(shutil.which(p)) for p in ("git", "curl")),
            tcp_connect=(listener,),
        ),
        deadline=time.monotonic() + 30,
        env=env,
    )
    # curl connected, then the listener closed at once: an empty reply (52) or a reset
    # (56); 7 would be a refused connection.
    words = result.stdout.decode().split()
    assert words[:2] == ["one", "000"], result.stderr
    assert words[2] in ("52", "56"), result.stderr


def test_a_missing_binding_refuses_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without pyseccomp (or libseccomp) nothing runs: ConfinementUnavailable names
    ``seccomp`` and says what to install."""
    marker = tmp_path / "ran"
    monkeypatch.setattr(_seccomp, "_cache", {})
    monkeypatch.setitem(sys.modules, "pyseccomp", None)
    with pytest.raises(confine.ConfinementUnavailable) as caught:
        confine.run(
            ["/bin/touch", str(marker)],
            confinement=Confinement(read_write=(str(tmp_path),)),
            deadline=time.monotonic() + 10,
        )
    assert caught.value.feature == "seccomp"
    assert "pyseccomp" in (caught.value.hint or "")
    assert "libseccomp2" in (caught.value.hint or "")
    assert not marker.exists()
    assert _seccomp.available()[0] is False


def test_a_filter_the_kernel_refuses_refuses_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter the kernel will not load (here a malformed program) ends in
    ``unavailable seccomp`` from inside, and the command never runs."""
    marker = tmp_path / "ran"
    # One instruction that is not a return: the kernel's checker refuses it.
    monkeypatch.setattr(_seccomp, "compile_filter", lambda **_: bytes(8))
    with pytest.raises(confine.ConfinementUnavailable) as caught:
        confine.run(
            ["/bin/touch", str(marker)],
            confinement=Confinement(read_write=(str(tmp_path),)),
            deadline=time.monotonic() + 10,
        )
    assert caught.value.feature == "seccomp"
    assert not marker.exists()


def test_install_needs_no_new_privs() -> None:
    """install() refuses to load a filter in a process without no_new_privs."""
    bpf = _seccomp.compile_filter(unix_sockets=False, udp=False, metadata=True)
    code = (
        "from skilld.confine import _seccomp\n"
        f"try:\n _seccomp.install(bytes.fromhex({bpf.hex()!r}))\n"
        "except OSError as exc: print('refused', exc)\n"
    )
    done = subprocess.run([PY, "-c", code], capture_output=True, timeout=30, check=False)
    assert done.stdout.startswith(b"refused"), done


def test_available_reports_the_library() -> None:
    """available() names the libseccomp version in use (for the active profile)."""
    ok, detail = _seccomp.available()
    assert ok, detail
    assert detail.startswith("libseccomp 2.")


# -- other processes by pid -----------------------------------------------------

PID_SERVER = """
import sys
from skilld.confine import _seccomp
libc.prctl(38, 1, 0, 0, 0)
_seccomp.install(bytes.fromhex(sys.argv[1]))
buf = ctypes.create_string_buffer(1024)
print("ready", os.getpid(), flush=True)
for line in sys.stdin:
    name, a, b = line.split()
    a, b = int(a), int(b)
    if name == "prlimit":
        r, e = raw(302, a, 0, 0, ctypes.addressof(buf))  # prlimit64(pid, CPU, NULL, &old)
    elif name == "affinity":
        r, e = raw(204, a, 128, ctypes.addressof(buf))  # sched_getaffinity
    elif name == "scheduler":
        r, e = raw(145, a)  # sched_getscheduler
    elif name == "priority":
        r, e = raw(140, a, b)  # getpriority(which, who)
    else:
        r, e = raw(252, a, b)  # ioprio_get(which, who)
    print("ok" if r >= 0 else "err", e, flush=True)
"""


@pytest.fixture(scope="module")
def pid_oracle() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """A process under the filter, with root's capabilities kept (so only the filter can
    refuse), that reads another process's limits, CPUs, scheduling and priorities as
    each line asks; its own pid and the pid of a process beside it."""
    other = subprocess.Popen(["sleep", "600"])
    proc = _start_oracle(PID_SERVER, metadata=False)
    assert proc.stdout is not None
    ready = proc.stdout.readline().split()
    assert ready[0] == "ready", ready
    yield proc, int(ready[1]), other.pid
    _stop_oracle(proc)
    other.kill()
    other.wait()


# What the kernel reads of each call's arguments as pid or "which": the low 32 bits.
LOW = st.one_of(st.sampled_from(["self", "other", 0, 1, 2, 3]), st.integers(0, 2**32 - 1))
# Refused as long as any argument the filter reads is not exactly the caller's own.
ALLOWED = {
    "prlimit": (0, None),
    "affinity": (0, None),
    "scheduler": (0, None),
    "priority": (0, 0),
    "ioprio": (1, 0),
}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 system call numbers")
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(sorted(ALLOWED)),
    low_a=LOW,
    high_a=st.one_of(st.just(0), HIGH),
    low_b=LOW,
    high_b=st.one_of(st.just(0), HIGH),
)
@example(name="prlimit", low_a="other", high_a=0, low_b=0, high_b=0)
@example(name="prlimit", low_a=0, high_a=1 << 32, low_b=0, high_b=0)
@example(name="priority", low_a=2, high_a=0, low_b=0, high_b=0)  # PRIO_USER, who 0: all of a uid
def test_no_argument_values_reach_another_process(
    pid_oracle: tuple[subprocess.Popen[str], int, int],
    name: str,
    low_a: int | str,
    high_a: int,
    low_b: int | str,
    high_b: int,
) -> None:
    """Whatever 64-bit values the pid (or which/who) arguments get, a call by pid goes
    through only when every argument the filter reads is the caller's own (pid 0;
    PRIO_PROCESS or IOPRIO_WHO_PROCESS with who 0): another process's pid, a pid whose
    high word is not zero, a process group or a user are refused."""
    oracle, me, other = pid_oracle
    pids = {"self": me, "other": other}
    a = high_a | int(pids.get(str(low_a), low_a))
    b = high_b | int(pids.get(str(low_b), low_b))
    answer = _ask(oracle, f"{name} {a} {b}")
    want_a, want_b = ALLOWED[name]
    if answer[0] == "ok":
        assert a == want_a and (want_b is None or b == want_b), (name, a, b)


def test_the_pid_oracle_reads_what_it_is_allowed_and_unfiltered_reads_the_other() -> None:
    """The control: the oracle's own reads (pid 0) go through the filter; the same reads
    of another process's pid, unconfined, go through the kernel."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        code = """
small, big = ctypes.create_string_buffer(16), ctypes.create_string_buffer(128)
call("prlimit", 302, {0}, 0, 0, ctypes.addressof(small))
call("affinity", 204, {0}, 128, ctypes.addressof(big))
call("priority", 140, 0, {0})
call("ioprio", 252, 1, {0})
"""
        mine = filtered(code.format(0))
        theirs = answers(unconfined(code.format(other.pid)).stdout)
    finally:
        other.kill()
        other.wait()
    assert mine == theirs == dict.fromkeys(("prlimit", "affinity", "priority", "ioprio"), "ok")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 system call numbers")
def test_group_and_session_by_pid_no_longer_tell_which_pids_exist() -> None:
    """``getpgid``/``getsid`` of another process's pid answer ESRCH under the filter,
    exactly as for a pid that does not exist; the caller's own (pid 0) still answer.
    The control: unconfined, the live pid answers and the free one says ESRCH."""
    other = subprocess.Popen(["sleep", "60"])
    free = 4_000_000  # above pid_max's limit (2^22): never a process
    code = """
call("pgid-live", 121, {0})
call("sid-live", 124, {0})
call("pgid-free", 121, {1})
call("sid-free", 124, {1})
call("pgid-self", 121, 0)
call("sid-self", 124, 0)
"""
    try:
        mine = filtered(code.format(other.pid, free))
        theirs = answers(unconfined(code.format(other.pid, free)).stdout)
    finally:
        other.kill()
        other.wait()
    assert theirs["pgid-live"] == theirs["sid-live"] == "ok", theirs
    assert theirs["pgid-free"] == theirs["sid-free"] == "ESRCH", theirs
    assert mine == {
        "pgid-live": "ESRCH", "sid-live": "ESRCH", "pgid-free": "ESRCH", "sid-free": "ESRCH",
        "pgid-self": "ok", "sid-self": "ok",
    }, mine  # fmt: skip
