"""A routed call, resource read or prompt acts on the worker for the entry node's caller.

A native Agent Skill (``reporter``) runs on worker node-w1; two entry-only nodes serve
HTTP with named tokens (alice, mallory). alice's run through node-a keeps her report on
the worker, owned by her principal (``token:alice``, carried in the sealed envelope).
Reading it back routes ``resources/read`` to the worker, which must read it as the
envelope's caller: alice gets her bytes; mallory gets what a never-kept URI gets. And
the worker asks its own caller rules (issue 28 item 6): an entry node whose bundle lets
every authenticated caller through does not widen what the worker lets mallory do.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from skilld.agentskills._kept import digest_uri
from skilld.bundle import build_bundle
from skilld.sandbox import Sandbox
from support.callers import ALL_AUTHENTICATED
from support.cluster import Keys, NatsServer, NodeProc, start_node
from support.env import cache_dir
from support.mcp_fakes import as_caller, client_tokens

pytestmark = [pytest.mark.slow]

REPORT = """\
import sys
with open("report.txt", "w") as f:
    f.write(sys.argv[1] + "\\n" + "x" * (600 << 10))
print("done")
"""


ALICE_ONLY = "rules:\n  - id: alice\n    who: [{token: alice}]\n    skills: [reporter]\n"


@pytest.fixture
def reporter_bundle(
    sandbox: Sandbox, keys: Keys, tmp_path: Path, request: pytest.FixtureRequest
) -> Path:
    """The reporter Agent Skill (native executor), usable by every authenticated caller
    (or the caller rules a test gives it as its parameter)."""
    rules = getattr(request, "param", ALL_AUTHENTICATED)
    src = tmp_path / "src"
    skill = src / "skills" / "reporter"
    (skill / "scripts").mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: reporter\ndescription: Writes reports. Test use only.\n---\nRun it.\n"
    )
    (skill / "scripts" / "report.py").write_text(REPORT)
    (src / "policies" / "trust").mkdir(parents=True)
    (src / "policies" / "callers").mkdir()
    (src / "policies" / "callers" / "rules.yaml").write_text(rules)
    (src / "policies" / "reporter.yaml").write_text(
        "skill: reporter\nscripts:\n  executor: native\nlimits:\n  wall_time: 60s\n"
    )
    for trust_file in sorted(keys.trust.glob("*.pub.json")):
        shutil.copy(trust_file, src / "policies" / "trust" / trust_file.name)
    out = tmp_path / "bundle"
    build_bundle(
        src / "skills", src / "policies", out, sandbox=sandbox, cache_dir=cache_dir(), strict=False
    )
    return out


@pytest.fixture
def cluster(
    nats: NatsServer, keys: Keys, reporter_bundle: Path, gateway_bundle: Path, tmp_path: Path
) -> Iterator[tuple[NodeProc, NodeProc]]:
    """node-a (entry-only, named tokens) and node-w1 (runs reporter)."""
    tokens = client_tokens(tmp_path, "alice", "mallory")
    worker = start_node(
        "node-w1", reporter_bundle, nats.url, keys.member, tmp_path / "w1", http=False
    )
    entry = start_node(
        "node-a",
        gateway_bundle,
        nats.url,
        keys.member,
        tmp_path / "node-a",
        extra=["--entry-only", "--token-file", str(tokens)],
    )
    try:
        entry.seen(r"node node-w1 joined")
        yield entry, worker
    finally:
        for node in (entry, worker):
            node.stop()


async def _read_error(url: str, who: str, uri: str) -> tuple[int, str]:
    async def read(s: ClientSession) -> tuple[int, str]:
        with pytest.raises(MCPError) as err:
            await s.read_resource(uri)  # type: ignore[arg-type]
        return err.value.error.code, err.value.error.message.replace(digest_uri(uri), "URI")

    result: tuple[int, str] = await as_caller(url, who, read)
    return result


def test_a_routed_read_of_a_kept_output_is_its_callers(
    cluster: tuple[NodeProc, NodeProc],
) -> None:
    """alice reads her kept report back through the entry node (the worker reads it as
    her, the envelope's caller); mallory's read answers as a never-kept URI's."""
    entry, _worker = cluster
    url = entry.url
    assert url is not None

    async def go() -> None:
        async def run(s: ClientSession) -> Any:
            return await s.call_tool(
                "reporter/run_script", {"script": "scripts/report.py", "args": ["alice-s3cret"]}
            )

        result = await as_caller(url, "alice", run)
        assert not result.is_error, result.content[0].text
        [kept] = json.loads(result.content[0].text)["resources"]
        uri = kept["uri"]

        async def read(s: ClientSession) -> str:
            got = await s.read_resource(uri)  # type: ignore[arg-type]
            return str(got.contents[0].text)  # type: ignore[union-attr]

        assert (await as_caller(url, "alice", read)).startswith("alice-s3cret")
        base, _run, name = uri.rsplit("/", 2)
        never = f"{base}/{secrets.token_hex(8)}/{name}"
        assert await _read_error(url, "mallory", uri) == await _read_error(url, "mallory", never)

    anyio.run(_with_deadline, go)


async def _with_deadline(fn: Any) -> None:
    with anyio.fail_after(240):
        await fn()


@pytest.mark.parametrize("reporter_bundle", [ALICE_ONLY], indirect=True)
def test_the_worker_asks_its_own_caller_rules(cluster: tuple[NodeProc, NodeProc]) -> None:
    """The entry node lets every authenticated caller through; the worker's rules name
    alice alone: mallory's call of reporter and her read of its SKILL.md are refused
    (not-permitted, the worker's default-deny) and audited there under her name; alice's
    pass (the control)."""
    entry, worker = cluster
    url = entry.url
    assert url is not None
    arguments = {"script": "scripts/report.py", "args": ["x"]}

    async def go() -> None:
        async def run(s: ClientSession) -> Any:
            return await s.call_tool("reporter/run_script", arguments)

        async def read(s: ClientSession) -> Any:
            return await s.read_resource("skill://reporter/SKILL.md")  # type: ignore[arg-type]

        mine = await as_caller(url, "alice", run)
        assert not mine.is_error, mine.content[0].text
        assert (await as_caller(url, "alice", read)).contents
        theirs = await as_caller(url, "mallory", run)
        assert theirs.is_error
        assert "not-permitted" in theirs.content[0].text, theirs.content[0].text
        code, message = await _read_error(url, "mallory", "skill://reporter/SKILL.md")
        assert "not-permitted" in message, (code, message)

    anyio.run(_with_deadline, go)
    records = worker.audit_until(
        lambda rs: len([r for r in rs if r.get("principal") == "token:mallory"]) >= 2
    )
    theirs = [r for r in records if r.get("principal") == "token:mallory"]
    assert [(r["method"], r["outcome"], r.get("refused")) for r in theirs] == [
        ("run_script", "not-permitted", True),
        ("read-resource", "not-permitted", True),
    ], theirs
