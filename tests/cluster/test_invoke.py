"""``invoke`` across nodes: the caller's node checks its grant, the holder its consent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from mcp import types

from skilld.sandbox import Sandbox
from support.cluster import Keys, NatsServer, NodeProc, make_bundle, mcp_client, start_node

pytestmark = pytest.mark.anyio

# The callers' operator lets hostile call echo, which only other nodes hold (and grants
# what else hostile imports: a skill links only when its policy grants all of it).
GRANTED = (
    "skill: hostile\nkv: {}\nfs:\n  - path: {data}\n    mode: ro\n"
    "invoke:\n  id: reach-echo\n  remote_calls: [echo]\n"
)
# node-b's operator lets hostile call echo from node-a only, and echo-wat from anywhere.
CONSENT = "skill: echo\ninvoke:\n  id: from-node-a\n  remote_called_by: [node-a/hostile]\n"
ANYONE = "skill: echo-wat\ninvoke:\n  remote_called_by: ['*']\n"
ECHO = {"skill_id": "echo", "method": "echo", "args": {"text": "over there"}}


@pytest.fixture(scope="module")
def nodes(
    sandbox: Sandbox, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, NodeProc]]:
    """node-b holds echo and echo-wat; node-a and node-x hold hostile, granted echo only."""
    root = tmp_path_factory.mktemp("xinvoke")
    granted = GRANTED.replace("{data}", str(root))
    callers = make_bundle(sandbox, root / "callers", ["hostile"], keys, {"hostile.yaml": granted})
    holder = make_bundle(
        sandbox,
        root / "holder",
        ["echo", "echo-wat"],
        keys,
        {"echo.yaml": CONSENT, "echo-wat.yaml": ANYONE},
    )
    server = NatsServer(root / "jetstream")
    server.start()
    started: dict[str, NodeProc] = {}
    try:
        started["b"] = start_node("node-b", holder, server.url, keys.member, root / "b", http=False)
        # Both hold hostile, which keeps kv state: in JetStream KV, or node-x would
        # withdraw it and send its calls to node-a.
        for name in ("a", "x"):
            started[name] = start_node(
                f"node-{name}",
                callers,
                server.url,
                keys.member,
                root / name,
                extra=["--cluster-kv"],
            )
        yield started
    finally:
        for node in started.values():
            node.stop()
        server.stop()


async def _relay(node: NodeProc, skill: str = "echo") -> Any:
    assert node.url is not None
    async with mcp_client(node.url) as client:
        await client.wait_tools(lambda n: {"echo/echo", "echo-wat/echo"} <= n)
        result = await client.session.call_tool("hostile/relay", {**ECHO, "skill_id": skill})
    assert not result.is_error, result.content
    text = "".join(b.text for b in result.content if isinstance(b, types.TextContent))
    # A string comes back as the text itself; a refusal (hostile's dict) as JSON.
    return json.loads(text) if text.startswith("{") else text


def _audited(node: NodeProc, caller: str) -> dict[str, Any]:
    """``node``'s first audit record of a call by ``caller`` (waiting for it)."""
    records = node.audit_until(lambda rs: any(r.get("caller") == caller for r in rs))
    return next(r for r in records if r.get("caller") == caller)


async def test_allowed_on_both_sides_returns_the_result(nodes: dict[str, NodeProc]) -> None:
    """node-a grants, node-b consents: echo runs on node-b, both nodes audit the call."""
    assert await _relay(nodes["a"]) == "over there"
    there = _audited(nodes["b"], "node:node-a<skill:hostile<anonymous")
    assert (there["skill"], there["outcome"]) == ("echo", "ok")
    assert there["decisions"][0]["rule"] == "echo.from-node-a"
    here = nodes["a"].audit_until(
        lambda rs: any(r["skill"] == "hostile" and r["outcome"] == "ok" for r in rs)
    )
    relay = next(r for r in here if r["skill"] == "hostile")
    assert relay["decisions"][0]["rule"] == "hostile.reach-echo"
    assert relay["decisions"][0]["allowed"] is True


async def test_refused_by_the_callers_policy_never_reaches_the_holder(
    nodes: dict[str, NodeProc],
) -> None:
    """echo-wat (node-b consents to anyone) is not in node-a's grant: refused on node-a."""
    denied = await _relay(nodes["a"], "echo-wat")
    assert denied["denied"] == "not-permitted"
    assert denied["rule"] == "default-deny"
    assert "add 'echo-wat' to invoke.calls" in denied["message"], denied
    assert "invoke.remote_calls" in denied["message"], denied
    audit = nodes["a"].audit_until(
        lambda rs: any(
            r["skill"] == "hostile" and r["decisions"][0]["target"] == "echo-wat" for r in rs
        )
    )
    relay = next(
        r for r in audit if r["skill"] == "hostile" and r["decisions"][0]["target"] == "echo-wat"
    )
    assert relay["decisions"][0]["allowed"] is False
    # node-b audits routed calls in the order they come: once a later call of echo is
    # in its audit, a call of echo-wat would have been as well.
    seen = len(nodes["b"].audit())
    assert await _relay(nodes["a"]) == "over there"
    records = nodes["b"].audit_until(lambda rs: any(r["skill"] == "echo" for r in rs[seen:]))
    assert not any(r["skill"] == "echo-wat" for r in records)


async def test_refused_by_the_holders_consent_names_the_holders_rule(
    nodes: dict[str, NodeProc],
) -> None:
    """node-x grants hostile echo, but node-b consents to node-a's hostile only."""
    denied = await _relay(nodes["x"])
    assert denied["denied"] == "not-permitted"
    assert denied["rule"] == "echo.from-node-a"
    assert "remote_called_by" in denied["message"], denied
    there = _audited(nodes["b"], "node:node-x<skill:hostile<anonymous")
    assert (there["skill"], there["outcome"]) == ("echo", "error:not-permitted")
    decision = there["decisions"][0]
    assert (decision["allowed"], decision["target"]) == (False, "node-x/hostile")
    # node-x granted it (its own rule) and audits the routed call's refusal as well.
    here = _audited(nodes["x"], "skill:hostile<anonymous")
    assert (here["skill"], here["outcome"]) == ("echo", "error:not-permitted")
    records = nodes["x"].audit_until(lambda rs: any(r["skill"] == "hostile" for r in rs))
    granted = next(r for r in records if r["skill"] == "hostile")["decisions"][0]
    assert (granted["allowed"], granted["rule"]) == (True, "hostile.reach-echo")
