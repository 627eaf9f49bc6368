"""A task whose call runs a native Agent Skill script on a worker, cancelled through another
entry node than the one that created it: the script's process is gone."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2 as httpx
import pytest
from test_tasks_cluster import rpc, task_audit

from skilld.bundle import build_bundle
from skilld.sandbox import Sandbox
from support.cluster import Keys, NatsServer, NodeProc, entry_nodes
from support.env import ROOT, cache_dir

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

HOSTILE = ROOT / "tests" / "agentskills" / "hostile"
POLICY = """\
skill: hostile
scripts:
  executor: native
  interpreters: [python]
mcp:
  tasks: {run_script: optional}
limits:
  wall_time: 90s
"""


def processes_with(token: str) -> list[int]:
    """The pids whose command line carries ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdecimal():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


@pytest.fixture
def scripts_bundle(sandbox: Sandbox, keys: Keys, tmp_path: Path) -> Path:
    """A bundle of the hostile Agent Skill (native executor), its run_script a task tool."""
    src = tmp_path / "src"
    shutil.copytree(HOSTILE, src / "skills" / "hostile")
    (src / "policies" / "trust").mkdir(parents=True)
    (src / "policies" / "hostile.yaml").write_text(POLICY)
    for trust_file in sorted(keys.trust.glob("*.pub.json")):  # one per node key
        shutil.copy(trust_file, src / "policies" / "trust" / trust_file.name)
    out = tmp_path / "bundle"
    build_bundle(
        src / "skills", src / "policies", out, sandbox=sandbox, cache_dir=cache_dir(), strict=False
    )
    return out


@pytest.fixture
def cluster(
    nats: NatsServer, keys: Keys, scripts_bundle: Path, gateway_bundle: Path, tmp_path: Path
) -> Iterator[tuple[NodeProc, NodeProc, NodeProc]]:
    """node-a and node-c entry-only with tasks in JetStream KV; node-w1 runs the scripts."""
    with entry_nodes(
        nats.url,
        keys.member,
        scripts_bundle,
        gateway_bundle,
        tmp_path,
        extra=["--cluster-kv"],
        worker="node-w1",
    ) as (worker, a, c):
        yield a, c, worker


async def test_a_cancel_at_another_entry_node_ends_the_script_process(
    cluster: tuple[NodeProc, NodeProc, NodeProc],
) -> None:
    """A spinning script started as a task through node-a is running (its process is
    seen); tasks/cancel through node-c ends it: the process is gone, the worker audits the
    call cancelled, and the task reads cancelled on both entry nodes."""
    a, c, worker = cluster
    assert a.url is not None and c.url is not None
    token = f"skilld-task-{uuid.uuid4().hex}"
    arguments = {"script": "scripts/probe.py", "args": ["cpu-spin", json.dumps({"t": token})]}
    async with httpx.AsyncClient(timeout=30) as http:
        created = await rpc(
            http, a.url, "tools/call", {"name": "hostile/run_script", "arguments": arguments}
        )
        assert created["result"]["resultType"] == "task", created
        task_id = created["result"]["taskId"]
        with anyio.fail_after(30):
            while not processes_with(token):
                await anyio.sleep(0.05)
        ack = await rpc(http, c.url, "tasks/cancel", {"taskId": task_id})
        assert ack["result"]["resultType"] == "complete", ack
        with anyio.fail_after(15):
            while processes_with(token):
                await anyio.sleep(0.05)
        for url in (a.url, c.url):
            got = (await rpc(http, url, "tasks/get", {"taskId": task_id}))["result"]
            assert got["status"] == "cancelled", (url, got)
    records = worker.audit_until(
        lambda rs: any(r.get("method") == "run_script" and "cancel" in r["outcome"] for r in rs)
    )
    assert [r["outcome"] for r in records if r.get("method") == "run_script"][-1] in (
        "cancelled",
        "error:cancelled",
    )
    assert [r["status"] for r in task_audit(c, task_id)] == ["cancel-requested"]
