"""The image under a real Docker engine, as operators run it, called over MCP from outside.

Built with the README's commands (``just wheelhouse``, ``just image``, ``buildah push ...
docker-daemon:skilld:dev``) and run in two profiles:

- ``default``: the README's ``docker run --read-only -p ... -v STATE:/var/lib/skilld
  skilld:dev``: Docker's default seccomp profile and capabilities, no ``--security-opt``,
  ``--cap-add`` or ``--privileged``;
- ``restricted``: as Kubernetes' restricted profile runs it: ``--user 10001 --cap-drop ALL
  --security-opt no-new-privileges --read-only``.

To each the tests add only what they need to reach in: a published port on loopback, the
test bundle (``tests/appliance/bundle``: a wasm skill that runs a shell command, a wasm
Agent Skill and a hostile native Agent Skill) mounted read-only and served with
``--bundle``, the hostile skill's grant directories, and a directory holding host unix
sockets (one 0666). Through a real MCP client: a shell command, a wasm script, a native
script, and the attacks of issue 19 from inside; files and modes are checked unchanged
with ``docker exec``, and the next call must be answered.

Confinement in the container: a launcher that switches each call to a uid of its own in
its skill's group (``default``) or shares skilld's uid with metadata calls and calls on
other pids refused by seccomp (``restricted``); no user namespace is required. The attacks
of issue 27 (another call's process and skilld by pid, /proc, System V IPC, a tree over
the skill's memory limit) run in both, each with a control from a plain process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from support.env import ROOT, cache_dir
from support.mcp_fakes import text_of

DOCKER = shutil.which("docker", path="/usr/bin") or shutil.which("docker")
BUILDAH = shutil.which("buildah")
IMAGE = "skilld:dev"  # the README's name in Docker's store
UID = 10001
BUNDLE_SRC = Path(__file__).parent / "bundle"


def _engine_answers() -> bool:
    if DOCKER is None:
        return False
    try:
        done = subprocess.run([DOCKER, "info"], capture_output=True, check=False, timeout=20)
    except subprocess.TimeoutExpired:  # a daemon that hangs counts as none
        return False
    return done.returncode == 0


# CI (.ci/run) installs docker.io and starts dockerd, so there a missing engine fails the
# run instead of skipping these tests unseen.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (_engine_answers() and BUILDAH) and not os.environ.get("CI"),
        reason="no Docker engine answering (apt-get install docker.io buildah; dockerd)",
    ),
]

PROFILES = {
    "default": ["--read-only"],
    "restricted": [
        "--user",
        str(UID),
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--read-only",
    ],
}


def docker(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the Docker client; its completed process (text)."""
    assert DOCKER is not None, "docker is not installed (apt-get install docker.io)"
    return subprocess.run(
        [DOCKER, *args], capture_output=True, text=True, check=check, timeout=timeout
    )


@pytest.fixture(scope="module")
def image() -> str:
    """The image built from this tree with the README's commands and copied into Docker."""
    assert _engine_answers(), "the Docker engine does not answer (is dockerd running?)"
    env = {**os.environ, "SKILLD_CACHE": str(cache_dir())}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env['PATH']}"
    just = shutil.which("just", path=env["PATH"])
    assert just is not None, "just is not installed (pip install rust-just: the test extra)"
    for recipe in ("wheelhouse", "image"):
        subprocess.run([just, recipe], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["buildah", "push", "-q", "localhost/skilld:dev", f"docker-daemon:{IMAGE}"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return IMAGE


@pytest.fixture(scope="module")
def test_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/appliance/bundle built on the host (same wheelhouse, so the same engine)."""
    out = tmp_path_factory.mktemp("appliance") / "bundle"
    skilld = ROOT / ".venv" / "bin" / "skilld"
    build = [str(skilld), "build", "--skills", str(BUNDLE_SRC / "skills")]
    subprocess.run(
        [*build, "--policies", str(BUNDLE_SRC / "policies"), "-o", str(out), "-q"],
        env={**os.environ, "SKILLD_CACHE": str(cache_dir())},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    for path in [out, *out.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out


class SocketWatch:
    """Unix sockets on the host (0666, 0660 and 0600) that record every connection they get."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.connections: list[str] = []
        self._socks = []
        for name, mode in (("open.sock", 0o666), ("group.sock", 0o660), ("root.sock", 0o600)):
            s = socket.socket(socket.AF_UNIX)
            s.bind(str(directory / name))
            (directory / name).chmod(mode)
            s.listen()
            s.settimeout(0.2)
            self._socks.append((name, s))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            for name, s in self._socks:
                with contextlib.suppress(TimeoutError, OSError):
                    conn, _ = s.accept()
                    self.connections.append(name)
                    conn.close()

    def close(self) -> None:
        """Stop accepting and close the sockets."""
        self._stop.set()
        self._thread.join()
        for _name, s in self._socks:
            s.close()


@dataclass
class Running:
    """One container serving the test bundle."""

    profile: str
    name: str
    url: str
    rw: Path
    ro: Path
    sockets: SocketWatch
    token: str

    def exec(self, *argv: str, check: bool = True) -> str:
        """``docker exec`` in the container (as its own user); stdout."""
        return docker("exec", self.name, *argv, check=check).stdout

    def call(self, tool: str, args: dict[str, Any], timeout: float = 60) -> Any:
        """One tools/call through a real MCP client over HTTP; the result."""

        async def go() -> Any:
            with anyio.fail_after(timeout):
                async with (
                    httpx2.AsyncClient(timeout=timeout, headers=self.auth) as http,
                    streamable_http_client(self.url, http_client=http) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    return await session.call_tool(tool, args)

        return anyio.run(go)

    def list_tools(self, timeout: float = 60) -> list[str]:
        """The tool names tools/list shows this caller (a real MCP client over HTTP)."""

        async def go() -> list[str]:
            with anyio.fail_after(timeout):
                async with (
                    httpx2.AsyncClient(timeout=timeout, headers=self.auth) as http,
                    streamable_http_client(self.url, http_client=http) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    return [t.name for t in (await session.list_tools()).tools]

        return anyio.run(go)

    @property
    def auth(self) -> dict[str, str]:
        """The header carrying the token the container made at first start."""
        return {"Authorization": f"Bearer {self.token}"}

    def script(self, skill: str, script: str, *args: str) -> Any:
        """run_script of an Agent Skill; the result."""
        return self.call(f"{skill}/run_script", {"script": script, "args": list(args)})


def value_of(result: Any) -> dict[str, Any]:
    """A run_script result's value (its first text block is the JSON)."""
    assert not result.is_error, text_of(result)
    value: dict[str, Any] = json.loads(result.content[0].text)
    return value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_healthy(name: str, limit_s: float) -> float:
    """Seconds from now until Docker says healthy (polled; fails past ``limit_s``)."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        status = docker("inspect", "-f", "{{.State.Health.Status}}", name).stdout.strip()
        if status == "healthy":
            return time.monotonic() - started
        if docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() != "true":
            raise AssertionError(f"the container exited: {docker('logs', name).stderr}")
        time.sleep(0.1)  # polling the engine: it has no wait-for-healthy
    raise AssertionError(f"not healthy within {limit_s} s: {docker('logs', name).stderr}")


def _token(name: str) -> str:
    """The token the container made at first start, from the one log line that shows it."""
    for line in docker("logs", name).stderr.splitlines():
        if '"token_created"' in line:
            return str(json.loads(line)["token"])
    raise AssertionError(f"no token_created line: {docker('logs', name).stderr[-2000:]}")


@contextlib.contextmanager
def serve(profile: str, image: str, bundle: Path, tmp: Path) -> Iterator[Running]:
    """A container of ``image`` in ``profile`` serving ``bundle``; removed after."""
    name = f"skilld-test-{profile}-{uuid.uuid4().hex[:8]}"
    volume = name
    rw, ro, sock = tmp / "rw", tmp / "ro", tmp / "sock"
    for d in (rw, ro, sock):
        d.mkdir()
    rw.chmod(0o777)  # the script's identity (its own, or the server's) writes here
    (ro / "key.pem").write_text("PRIVATE KEY")
    if os.geteuid() == 0:  # owned by the server's uid: the worst case in shared identity
        os.chown(ro / "key.pem", UID, UID)
    (ro / "key.pem").chmod(0o600)
    watch = SocketWatch(sock)
    port = _free_port()
    argv = [
        "run", "-d", "--name", name, *PROFILES[profile],
        "-p", f"127.0.0.1:{port}:8080", "-v", f"{volume}:/var/lib/skilld",
        "-v", f"{bundle}:/opt/test-bundle:ro", "-v", f"{rw}:/srv/rw", "-v", f"{ro}:/srv/ro",
        "-v", f"{sock}:/srv/sock",
        image, "--bundle", "/opt/test-bundle",
    ]  # fmt: skip
    docker(*argv)
    try:
        _wait_healthy(name, 60)
        yield Running(profile, name, f"http://127.0.0.1:{port}/mcp", rw, ro, watch, _token(name))
    finally:
        docker("rm", "-f", name, check=False)
        docker("volume", "rm", "-f", volume, check=False)
        watch.close()


@pytest.fixture(scope="module", params=sorted(PROFILES))
def running(
    request: pytest.FixtureRequest,
    image: str,
    test_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Running]:
    """The image serving the test bundle, in each profile."""
    with serve(request.param, image, test_bundle, tmp_path_factory.mktemp(request.param)) as r:
        yield r


# -- the image itself ---------------------------------------------------------------


def test_version_through_the_entry_point(image: str) -> None:
    """``docker run IMAGE --version`` prints the version and exits 0."""
    out = docker("run", "--rm", image, "--version")
    assert out.stdout.startswith("skilld "), out


def test_image_starts_as_root_to_drop_to_a_pinned_uid_and_gid(image: str) -> None:
    """No USER (serve drops to SKILLD_RUN_AS itself); user and group skilld are 10001."""
    config = json.loads(docker("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] in ("", None)
    assert f"SKILLD_RUN_AS={UID}" in config["Env"]
    ent = docker("run", "--rm", "--entrypoint", "getent", image, "passwd", "skilld").stdout
    assert ent.split(":")[2:4] == [str(UID), str(UID)], ent
    group = docker("run", "--rm", "--entrypoint", "getent", image, "group", "skilld").stdout
    assert group.split(":")[2] == str(UID), group


def test_image_carries_no_deb_files(image: str) -> None:
    """Neither the base's nor any stage's apt downloads are in the image."""
    argv = ["find", "/", "-xdev", "-name", "*.deb"]
    found = docker("run", "--rm", "--entrypoint", argv[0], image, *argv[1:]).stdout
    assert found.strip() == ""


def test_healthcheck_runs_within_seconds(image: str) -> None:
    """The health check's interval is a few seconds (not 30)."""
    config = json.loads(docker("image", "inspect", image).stdout)[0]["Config"]
    assert config["Healthcheck"]["Interval"] <= 5 * 10**9, config["Healthcheck"]


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_healthy_within_seconds_of_start_as_the_readme_runs_it(
    profile: str, image: str, tmp_path: Path
) -> None:
    """The README's exact ``docker run`` (its demo bundle, a named volume): healthy within
    10 s; under ``--read-only`` only the state volume was written."""
    name = f"skilld-test-plain-{uuid.uuid4().hex[:8]}"
    docker("run", "-d", "--name", name, *PROFILES[profile],
           "-p", "127.0.0.1::8080", "-v", f"{name}:/var/lib/skilld", image)  # fmt: skip
    try:
        took = _wait_healthy(name, 30)
        assert took < 10, took
        changed = docker("diff", name).stdout.split()
        assert changed == [], changed
    finally:
        docker("rm", "-f", name, check=False)
        docker("volume", "rm", "-f", name, check=False)


# -- what runs inside ---------------------------------------------------------------


def test_a_wasm_agent_skill_script_runs(running: Running) -> None:
    """A wasm Agent Skill script runs under --read-only; its workspace is in the volume."""
    value = value_of(running.script("filler", "scripts/fill.py", "hello"))
    assert value["exit_status"] == 0, value["stderr"]
    assert value["stdout"].strip() == "hello from wasm"
    assert running.exec("stat", "-c", "%a", "/var/lib/skilld/work").strip() == "711"


def test_filling_a_wasm_workspace_and_rw_grant_is_stopped(running: Running) -> None:
    """64 MiB (at about 100 MiB/s) into a 16 MiB workspace, then into the rw grant:
    limit-exceeded naming the cap, ended while it writes (far less than 64 MiB landed); the
    next call is answered."""
    full = running.script("filler", "scripts/fill.py", "fill", "/workspace/big", "64")
    assert full.is_error and "[limit-exceeded" in text_of(full), text_of(full)
    assert "16 MiB" in text_of(full)
    grant = running.script("filler", "scripts/fill.py", "fill", "/srv/rw/big", "64")
    assert grant.is_error and "write budget of 16 MiB" in text_of(grant), text_of(grant)
    assert (running.rw / "big").stat().st_size < 48 << 20
    assert value_of(running.script("filler", "scripts/fill.py", "hello"))["exit_status"] == 0


def test_a_shell_command_runs(running: Running) -> None:
    """shell.run of /bin/echo (a wasm skill's grant) runs confined in the container."""
    result = running.call("sheller/run", {"argv": ["/bin/echo", "from the container"]})
    assert not result.is_error, text_of(result)
    assert "from the container" in text_of(result)


def test_a_native_agent_skill_script_runs(running: Running) -> None:
    """A native Agent Skill script runs, neither as root nor (where a launcher can switch
    identity) as the server's uid."""
    value = value_of(running.script("hostile", "scripts/attack.py", "hello"))
    assert value["exit_status"] == 0, value["stderr"]
    words = value["stdout"].split()
    assert words[:3] == ["hello", "from", "native"]
    assert words[3] != "0"
    if running.profile == "default":
        assert words[3] != str(UID), "the script ran as the server's own uid"


def _modes(running: Running, paths: list[str]) -> str:
    argv = ["stat", "-c", "%n %a %u %g %Y", *paths]
    return running.exec(*argv, check=False)


TARGETS = ["/srv/ro/key.pem", "/var/lib/skilld/audit.jsonl", "/var/lib/skilld/state.sqlite3"]


@pytest.mark.parametrize("case", ["chmod", "chown", "utime", "setxattr"])
def test_metadata_outside_the_grants_is_unchanged(running: Running, case: str) -> None:
    """chmod, chown, utime and setxattr on files outside the grants (a private key, the
    audit log, the state) are refused; modes, owners and times are unchanged."""
    before = _modes(running, TARGETS)
    value = value_of(running.script("hostile", "scripts/attack.py", case, *TARGETS))
    lines = value["stdout"].splitlines()
    assert lines and all(line.startswith("BLOCKED") for line in lines), value
    after = _modes(running, TARGETS)
    # Modes and owners exactly; times exactly for the key, while the audit log and the
    # state, which the server itself writes for every call (this attack's call included),
    # may only have moved forward: a script's utime sets them back to 0.
    for was, now in zip(before.splitlines(), after.splitlines(), strict=True):
        *meta_was, time_was = was.split()
        *meta_now, time_now = now.split()
        assert meta_now == meta_was, (was, now)
        if meta_was[0].startswith("/var/lib/skilld/"):
            assert int(time_now) >= int(time_was), (was, now)
        else:
            assert time_now == time_was, (was, now)
    assert len(after.splitlines()) == len(TARGETS), after
    xattrs = running.exec(
        "/opt/skilld/bin/python", "-c",
        "import os,sys; print([os.listxattr(p) for p in sys.argv[1:]])", *TARGETS,
    )  # fmt: skip
    assert "skilld" not in xattrs
    assert value_of(running.script("hostile", "scripts/attack.py", "hello"))["exit_status"] == 0


@pytest.mark.parametrize("case", ["unix", "keyring", "udp", "netlink", "raw", "packet"])
def test_sockets_and_keyrings_are_refused(running: Running, case: str) -> None:
    """Pathname unix sockets (bind-mounted 0666, 0660 and 0600 ones), the keyring, UDP,
    netlink, raw and packet sockets: all refused; the host sockets got no connection."""
    socks = ["/srv/sock/open.sock", "/srv/sock/group.sock", "/srv/sock/root.sock"]
    targets = socks if case == "unix" else []
    value = value_of(running.script("hostile", "scripts/attack.py", case, *targets))
    lines = value["stdout"].splitlines()
    assert lines and all(line.startswith("BLOCKED") for line in lines), value
    assert running.sockets.connections == []
    assert value_of(running.script("hostile", "scripts/attack.py", "hello"))["exit_status"] == 0


def test_a_daemon_does_not_outlive_its_call(running: Running) -> None:
    """A grandchild in its own session that ticks a file stops ticking when the call ends."""
    ticks = running.rw / f"ticks-{uuid.uuid4().hex[:6]}"
    running.script("hostile", "scripts/attack.py", "daemon", f"/srv/rw/{ticks.name}")
    assert ticks.is_file() and ticks.stat().st_size > 0, "the daemon never ticked"
    size = ticks.stat().st_size
    time.sleep(0.5)  # ten ticks' time: a living daemon would have written more
    assert ticks.stat().st_size == size, "the daemon outlived its call"


def test_a_process_tree_stays_under_its_memory_limit(running: Running) -> None:
    """Four forked children each asking for twice the skill's 256 MiB limit are all refused;
    the server stays up and the next call is answered."""
    value = value_of(running.script("hostile", "scripts/attack.py", "memtree"))
    lines = value["stdout"].splitlines()
    assert lines and all(line.startswith("BLOCKED") for line in lines), value
    assert value_of(running.script("hostile", "scripts/attack.py", "hello"))["exit_status"] == 0


def test_filling_a_native_workspace_and_rw_grant_is_stopped(running: Running) -> None:
    """A native script writing 1 GiB into its workspace, then into its rw grant: ended at
    16 MiB (limit-exceeded naming the cap); the next call is answered."""
    full = running.script("hostile", "scripts/attack.py", "fill", "big")
    assert full.is_error and "16 MiB" in text_of(full), text_of(full)
    grant = running.script("hostile", "scripts/attack.py", "fill", "/srv/rw/native-big")
    assert grant.is_error and "write budget of 16 MiB" in text_of(grant), text_of(grant)
    assert (running.rw / "native-big").stat().st_size < 64 << 20
    assert value_of(running.script("hostile", "scripts/attack.py", "hello"))["exit_status"] == 0


def test_doctor_reports_the_active_profile(running: Running) -> None:
    """``skilld doctor`` in the running container says which confinement layers are active."""
    out = running.exec("/opt/skilld/bin/skilld", "doctor")
    assert "landlock" in out.lower(), out


# -- authentication -------------------------------------------------------------------


def test_nothing_answers_without_a_credential(running: Running) -> None:
    """Under the README's docker run, every route but the probes and the public resource
    metadata is 401 without the token (and with a wrong one); the probes say only their
    status; the token made at first start is in the state volume, 0600, the server's own."""
    base = running.url.removesuffix("/mcp")
    wrong = {"Authorization": "Bearer " + "x" * 43}
    for headers in ({}, wrong):
        assert httpx2.post(running.url, json={}, headers=headers).status_code == 401
        assert httpx2.get(running.url, headers=headers).status_code == 401
        assert httpx2.get(f"{base}/sse", headers=headers).status_code == 401
        assert httpx2.post(f"{base}/messages/", json={}, headers=headers).status_code == 401
        assert httpx2.get(f"{base}/metrics", headers=headers).status_code == 401
    assert httpx2.get(f"{base}/healthz").json() == {"status": "ok"}
    assert httpx2.get(f"{base}/readyz").json() == {"status": "ready"}
    assert httpx2.get(f"{base}/metrics", headers=running.auth).status_code == 200
    mode = running.exec("stat", "-c", "%a %u", "/var/lib/skilld/tokens").split()
    assert mode == ["600", str(UID)]


def test_a_caller_added_at_run_time_gets_what_its_scope_gives(running: Running) -> None:
    """As the README adds a caller: a token-file line with the scope `skilld:use`, then
    SIGHUP. alice (with the scope) lists and calls the skills; bob (without it) lists
    nothing and is refused; neither needed a new image."""
    alice, bob = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    lines = f"alice {alice} skilld:use\nbob {bob}\n"
    running.exec("sh", "-c", f"printf '{lines}' >> /var/lib/skilld/tokens")
    docker("kill", "-s", "HUP", running.name)
    as_alice, as_bob = (dataclasses.replace(running, token=t) for t in (alice, bob))
    deadline = time.monotonic() + 30
    while True:  # the reload is asynchronous: wait until alice is known
        if httpx2.post(running.url, json={}, headers=as_alice.auth).status_code != 401:
            break
        assert time.monotonic() < deadline, docker("logs", running.name).stderr[-2000:]
        time.sleep(0.2)
    tools = as_alice.list_tools()
    assert tools, "alice's scope names every skill"
    assert as_bob.list_tools() == []
    refused = as_bob.call(tools[0], {})
    assert refused.is_error and "not-permitted" in text_of(refused), text_of(refused)


# -- shutdown -------------------------------------------------------------------------


def test_stop_cuts_a_long_call_as_server_shutdown_before_sigkill(
    image: str, test_bundle: Path, tmp_path: Path
) -> None:
    """``docker stop`` during a call longer than the drain: the client is answered that
    the server shut down (the log and the audit record say ``shutdown``, not a client's
    cancel), the server exits 0 well before Docker's SIGKILL (10 s), and every log line
    is JSON."""
    with serve("default", image, test_bundle, tmp_path) as r:
        results: list[Any] = []
        held = threading.Thread(
            target=lambda: results.append(r.script("filler", "scripts/fill.py", "spin"))
        )
        held.start()
        # Stop only once the call is in flight (the server's own gauge says so).
        metrics = r.url.removesuffix("/mcp") + "/metrics"
        deadline = time.monotonic() + 30
        while "skilld_tool_calls_in_flight 1" not in httpx2.get(metrics, headers=r.auth).text:
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.05)  # polling the server's gauge
        started = time.monotonic()
        docker("stop", r.name, timeout=30)
        took = time.monotonic() - started
        held.join(30)
        status = docker("inspect", "-f", "{{.State.ExitCode}}", r.name).stdout.strip()
        logs = docker("logs", r.name).stderr.splitlines()
        # The state volume (named as the container) outlives it: read its audit log.
        audit = docker("run", "--rm", "-v", f"{r.name}:/state", "--entrypoint", "cat",
                       image, "/state/audit.jsonl").stdout  # fmt: skip
    assert took < 9, f"docker stop took {took:.1f} s (SIGKILL at 10 s)"
    assert status == "0", status
    (result,) = results
    assert result.is_error and "the server shut down" in text_of(result), text_of(result)
    bad = [line for line in logs if not line.startswith("{")]
    assert not bad, bad
    assert any('"outcome": "shutdown"' in line for line in logs), logs[-5:]
    records = [json.loads(line) for line in audit.splitlines()]
    cut = [r for r in records if r.get("skill") == "filler" and r.get("outcome") == "shutdown"]
    assert cut, records[-2:]


# -- the call is the unit of isolation (issue 27) --------------------------------------

FIND = """
import os, sys
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    if pid == os.getpid():
        continue
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
        ppid = next(l for l in open(f"/proc/{pid}/status") if l.startswith("PPid:")).split()[1]
    except (OSError, StopIteration):
        continue
    if any(sys.argv[1].encode() in a for a in argv):
        print(pid, ppid)
        break
"""

# The control: the same calls from a plain process of the server's uid in the container,
# on a child of its own.
REACH_CONTROL = """
import os, resource, subprocess
child = subprocess.Popen(["sleep", "30"])
for name, fn in (
    ("prlimit", lambda: resource.prlimit(child.pid, resource.RLIMIT_CPU, (0, 0))),
    ("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, child.pid, 19)),
    ("affinity", lambda: os.sched_setaffinity(child.pid, {0})),
    ("getpgid", lambda: os.getpgid(child.pid)),
    ("getsid", lambda: os.getsid(child.pid)),
):
    fn()
    print("ok", name)
child.kill()
"""

IPC_CONTROL = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
key = 0x5C222AB5
if sys.argv[1] == "plant":
    shm = libc.shmget(key, 4096, 0o1666)
    ctypes.memmove(libc.shmat(shm, None, 0), b"planted", 7)
else:
    shm = libc.shmget(key, 0, 0)
    print(ctypes.string_at(libc.shmat(shm, None, 0), 7).decode())
    libc.shmctl(shm, 0, None)
"""

TREE_CONTROL = """
import os, time
r, w = os.pipe()
kids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        block = bytearray(200 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        os.write(w, b"x")
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
held = 0
while held < 8:
    held += len(os.read(r, 8))
print("held", held)
for pid in kids:
    os.kill(pid, 9)
"""


def _py(running: Running, code: str, *args: str) -> str:
    """Python as the server's uid in the container (``docker exec --user``): stdout."""
    argv = ["exec", "--user", str(UID), running.name, "/opt/skilld/bin/python", "-c", code]
    return docker(*argv, *args).stdout


def _pid(running: Running, needle: str) -> tuple[int, int]:
    """(pid, parent pid) in the container of the first process with ``needle`` in its argv."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = running.exec("/opt/skilld/bin/python", "-c", FIND, needle).split()
        if found:
            return int(found[0]), int(found[1])
        time.sleep(0.05)  # polling the container: the call is starting
    raise AssertionError(f"no process with {needle} in its argv")


def test_a_call_reaches_neither_another_call_nor_skilld(running: Running) -> None:
    """While a call of the hostile skill waits, another call of it tries prlimit(RLIMIT_CPU,
    0), setpriority and sched_setaffinity on that call's process, on skilld and on the
    launcher, and asks their process group and session: all refused; the waiting call
    finds itself unchanged and ends normally; the server answers. Control: a plain
    process of the server's uid does all five to its own child."""
    flag = f"flag-{uuid.uuid4().hex[:8]}"
    results: list[Any] = []
    waiting = threading.Thread(
        target=lambda: results.append(
            running.script("hostile", "scripts/attack.py", "victim", f"/srv/rw/{flag}")
        )
    )
    waiting.start()
    try:
        victim, _ = _pid(running, flag)
        launcher, server = _pid(running, "_launcher.py")
        attack = value_of(
            running.script(
                "hostile", "scripts/attack.py", "reach", *map(str, (victim, server, launcher))
            )
        )
    finally:
        (running.rw / flag).write_text("")
        waiting.join(60)
    lines = attack["stdout"].splitlines()
    assert len(lines) == 3 and all(line.startswith("BLOCKED") for line in lines), attack
    (waited,) = results
    assert value_of(waited)["stdout"].splitlines()[-1].startswith("BLOCKED victim"), waited
    assert value_of(running.script("hostile", "scripts/attack.py", "hello"))["exit_status"] == 0
    assert _py(running, REACH_CONTROL).split() == [
        "ok",
        "prlimit",
        "ok",
        "setpriority",
        "ok",
        "affinity",
        "ok",
        "getpgid",
        "ok",
        "getsid",
    ]


def test_a_call_finds_no_other_process_of_its_uid(running: Running) -> None:
    """Under the README's ``docker run`` (a uid per call) a call scanning /proc/PID with
    stat() finds no process of its uid but itself while another call runs; with the
    restricted profile's shared uid (the control: no uid to give each call) it finds
    the other call and skilld, which the test above shows it cannot touch."""
    flag = f"flag-{uuid.uuid4().hex[:8]}"
    waiting = threading.Thread(
        target=lambda: running.script("hostile", "scripts/attack.py", "victim", f"/srv/rw/{flag}")
    )
    waiting.start()
    try:
        victim, _ = _pid(running, flag)
        found = value_of(running.script("hostile", "scripts/attack.py", "proc"))
    finally:
        (running.rw / flag).write_text("")
        waiting.join(60)
    words = found["stdout"].splitlines()[0].split()
    assert words[0] == "same-uid", found
    me, same = int(words[1]), [int(w) for w in words[2:]]
    if running.profile == "default":
        assert same == [me], found
    else:
        assert victim in same and len(same) > 2, found


def test_ipc_does_not_outlive_its_call(running: Running) -> None:
    """System V shared memory and a message queue: a call can neither plant them (no IPC
    namespace can be made in a container: the filter refuses every IPC call) nor read
    what was planted. Control: two plain processes of the server's uid plant and read."""
    planted = value_of(running.script("hostile", "scripts/attack.py", "ipc", "plant"))
    assert planted["stdout"].startswith("BLOCKED ipc plant 1"), planted
    read = value_of(running.script("hostile", "scripts/attack.py", "ipc", "read"))
    assert read["stdout"].startswith("BLOCKED ipc read 1"), read
    _py(running, IPC_CONTROL, "plant")
    assert _py(running, IPC_CONTROL, "read").strip() == "planted"


def test_a_tree_over_the_skills_memory_limit_is_killed(running: Running) -> None:
    """Eight processes of 200 MiB each for a skill limited to 256 MiB: the call ends
    ``[limit-exceeded]`` naming memory, the tree killed before it held it all; the next
    call is answered. Control: the same tree as a plain process holds all eight."""
    over = running.script("hostile", "scripts/attack.py", "tree")
    assert over.is_error, text_of(over)
    assert "[limit-exceeded]" in text_of(over) and "memory limit of 256 MiB" in text_of(over)
    assert value_of(running.script("hostile", "scripts/attack.py", "hello"))["exit_status"] == 0
    assert _py(running, TREE_CONTROL).strip() == "held 8"
