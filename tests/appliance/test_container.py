"""The appliance image: built with buildah, served with oci-run, called over MCP from outside.

Chroot isolation has no ``--read-only``; instead the test reads the container's writable
layer after a tool call: it must hold nothing the server wrote, everything having gone to
the state volume. (Mounting the scratch directories read-only as well is not possible:
buildah 1.28 mounts several ``--volume``s in a random order and the state volume is then
sometimes hidden.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from support.env import ROOT, cache_dir
from support.otlp import otlp_receiver

# CI (.ci/run) installs buildah, podman and debootstrap, so there a missing buildah fails
# the run instead of skipping the image tests unseen.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("buildah") is None and not os.environ.get("CI"),
        reason="buildah is not installed (apt-get install buildah podman debootstrap)",
    ),
]

TAG = "localhost/skilld:test"
BASE = "docker.io/library/debian:bookworm-slim"
TOOLS = ROOT / "tools"
UID = 10001  # the image's skilld user
# What `buildah run` itself leaves in the writable layer.
RUN_FILES = {"run", "run/.containerenv"}


def _containers() -> set[str]:
    out = subprocess.run(
        ["buildah", "containers", "--json"], capture_output=True, text=True, check=True
    ).stdout
    return {c["id"] for c in json.loads(out) or []}  # "null" when there are none


@pytest.fixture(scope="module")
def image(demo_bundle: object) -> str:
    """The image built from the current tree (wheelhouse refreshed first); its tag.

    ``demo_bundle`` first: its components and native code land in this run's cache, which
    the image's build stage then reuses instead of compiling them again.
    """
    if subprocess.run(["podman", "image", "exists", BASE], check=False).returncode != 0:
        subprocess.run([str(TOOLS / "oci-base")], check=True)
    # As `just wheelhouse image`: a reproducible skilld wheel keeps buildah's layer cache.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", "wheelhouse", ".[build,otel]"],
        cwd=ROOT,
        check=True,
        env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"},
    )
    bud = ["buildah", "bud", "--isolation", "chroot", "--pull-never", "--layers", "--format"]
    # The builder stage's skill and native-code cache is this run's (digest-keyed, filled by
    # demo_bundle): the image's bundle is the same, built without compiling again.
    cache = ["--volume", f"{cache_dir()}:/tmp/skilld-cache"]
    subprocess.run(
        [*bud, "docker", *cache, "-t", TAG, "-f", "Containerfile", "."],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return TAG


def _inspect(kind: str, name: str) -> dict[str, Any]:
    out = subprocess.run(
        ["buildah", "inspect", "--type", kind, name], capture_output=True, text=True, check=True
    ).stdout
    info: dict[str, Any] = json.loads(out)
    return info


def _config(image: str) -> dict[str, Any]:
    config: dict[str, Any] = _inspect("image", image)["Docker"]["config"]
    return config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def served(image: str, tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """The image's entry point on a free port, stopped after.

    Yields (MCP url, host state dir, the container's writable layer).
    """
    with _serving(image, tmp_path) as found:
        yield found


@contextmanager
def _serving(
    image: str, tmp_path: Path, env: Sequence[str] = ()
) -> Iterator[tuple[str, Path, Path]]:
    """The image's entry point on a free port (``env``: K=V for its environment)."""
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, UID, -1)
    port = _free_port()
    entrypoint = _config(image)["Entrypoint"]
    assert isinstance(entrypoint, list)
    # As 10001 from the start (the restricted profile's way; a root start drops to it).
    vols = ["--volume", f"{state}:/var/lib/skilld", "--user", str(UID)]
    vols += [arg for pair in env for arg in ("--env", pair)]
    before = _containers()
    log = (tmp_path / "serve.log").open("wb")
    argv = [*entrypoint, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [str(TOOLS / "oci-run"), image, *vols, "--", *argv],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc, tmp_path / "serve.log")
        (ctr,) = _containers() - before
        yield f"http://127.0.0.1:{port}/mcp", state, _upper_dir(ctr)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        for ctr in _containers() - before:
            subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False)
    assert not _containers() - before, "the oci-run container was not removed"


def _upper_dir(ctr: str) -> Path:
    """The overlay directory that holds what the container wrote to its root."""
    upper = Path(_inspect("container", ctr)["MountPoint"]).parent / "diff"
    assert upper.is_dir(), upper
    return upper


def _wait_ready(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Poll /readyz until the bundle is loaded (the server's start takes about a second)."""

    async def poll() -> None:
        with anyio.fail_after(120):
            async with httpx2.AsyncClient(timeout=2) as http:
                while proc.poll() is None:
                    try:
                        if (await http.get(f"{base}/readyz")).status_code == 200:
                            return
                    except httpx2.TransportError:
                        pass
                    await anyio.sleep(0.2)
        raise AssertionError(f"server exited: {log.read_text()}")

    anyio.run(poll)


def test_image_drops_to_its_user_serves_http_with_healthcheck(image: str) -> None:
    """No USER: serve drops to SKILLD_RUN_AS=10001 itself; http on 8080; a health check."""
    config = _config(image)
    assert not config.get("User")
    assert f"SKILLD_RUN_AS={UID}" in config["Env"]
    assert config["Entrypoint"][:2] == ["/opt/skilld/bin/skilld", "serve"]
    assert "--transport" in config["Entrypoint"]
    assert "8080/tcp" in config["ExposedPorts"]
    assert "/healthz" in " ".join(config["Healthcheck"]["Test"])


def test_only_the_state_volume_is_writable(image: str) -> None:
    """Besides the state volume, the image's user can write only to scratch directories."""
    argv = ["find", "/", "-xdev", "-writable", "-not", "-type", "l"]
    run = [str(TOOLS / "oci-run"), image, "--user", str(UID), "--", *argv]
    out = subprocess.run(run, capture_output=True, text=True, check=False).stdout
    writable = {line for line in out.splitlines() if line}
    allowed = {"/var/lib/skilld", "/tmp", "/var/tmp", "/run/lock", "/var/lock"}
    assert writable and writable <= allowed, writable - allowed


def _auth(state: Path) -> dict[str, str]:
    """The header carrying the token the entry point made at first start in ``state``."""
    lines = (state / "tokens").read_text().splitlines()
    token = next(line.split()[1] for line in lines if line[:1].isalnum())
    return {"Authorization": f"Bearer {token}"}


def test_tool_call_from_outside(served: tuple[str, Path, Path]) -> None:
    """An MCP client on the host calls echo/echo in the container; only the volume is written."""
    url, state, upper = served
    # The entry point made a named token at first start, in the state volume, private.
    tokens = state / "tokens"
    assert tokens.stat().st_uid == UID and tokens.stat().st_mode & 0o777 == 0o600
    auth = _auth(state)

    async def call() -> None:
        with anyio.fail_after(60):
            assert httpx2.post(url, json={}).status_code == 401
            async with (
                httpx2.AsyncClient(timeout=30, headers=auth) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                names = {t.name for t in (await session.list_tools()).tools}
                assert "echo/echo" in names
                result = await session.call_tool("echo/echo", {"text": "from outside"})
                assert not result.is_error
                assert [getattr(c, "text", None) for c in result.content] == ["from outside"]

    anyio.run(call)
    audit = state / "audit.jsonl"
    assert audit.is_file() and audit.stat().st_uid == UID
    assert "echo" in audit.read_text()
    written = {p.relative_to(upper).as_posix() for p in upper.rglob("*")}
    assert written <= RUN_FILES, f"written outside the state volume: {written - RUN_FILES}"


def test_the_image_sends_traces_to_a_collector(image: str, tmp_path: Path) -> None:
    """With OTEL_TRACES_EXPORTER=otlp and an endpoint, the image (the otel extra installed)
    sends a tools/call's spans over OTLP/HTTP: the request span under the client's
    traceparent, the call beneath it, service.name skilld (docs/tracing.md)."""
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    with otlp_receiver() as receiver:
        env = [
            "OTEL_TRACES_EXPORTER=otlp",
            f"OTEL_EXPORTER_OTLP_ENDPOINT={receiver.url}",
            "OTEL_BSP_SCHEDULE_DELAY=100",
            "SKILLD_TRACE_STAGE_MIN_MS=0",  # the echo's short guest run a span too
        ]
        with _serving(image, tmp_path, env) as (url, state, _upper):

            async def call() -> None:
                with anyio.fail_after(60):
                    async with (
                        httpx2.AsyncClient(timeout=30, headers=_auth(state)) as http,
                        streamable_http_client(url, http_client=http) as (read, write),
                        ClientSession(read, write) as session,
                    ):
                        await session.initialize()
                        result = await session.call_tool(
                            "echo/echo",
                            {"text": "traced"},
                            meta={"traceparent": f"00-{trace_id}-{parent}-01"},
                        )
                        assert not result.is_error

            anyio.run(call)
            spans = receiver.wait(  # both spans read below: they may come in two batches
                lambda seen: {"skilld.guest.run", "tools/call echo/echo"}
                <= {s.name for s in seen if s.trace_id == trace_id},
                timeout=60,
            )
    server = next(s for s in spans if s.name == "tools/call echo/echo")
    assert (server.trace_id, server.parent_id) == (trace_id, parent)
    assert server.resource["service.name"] == "skilld"
