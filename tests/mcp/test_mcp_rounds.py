"""Input-required rounds (2026-07-28) for a wasm guest, and the same guest for 2025-11-25 clients.

A real registry serves the conformance skill (compiled to wasm, with its policy) over a
real HTTP server; the official Python SDK's ``Client`` speaks to it in either era, and
raw HTTP requests play a hostile client against the ``requestState``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters, stdio_client

from skilld.audit import MemorySink
from skilld.mcp import HttpServer, ServeConfig
from skilld.registry import Registry
from skilld.sandbox import Sandbox
from support.conformance import conformance_registry
from support.mcp_fakes import running_http, text_of
from support.modern_http import MODERN, modern, payload

# The static test dispatcher, served as a script (it is no part of the package).
STATIC = Path(__file__).resolve().parents[1] / "support" / "static_dispatcher.py"

pytestmark = pytest.mark.anyio


@pytest.fixture
async def server(conformance: tuple[Registry, MemorySink]) -> AsyncIterator[HttpServer]:
    """The registry over Streamable HTTP on a free port."""
    async with running_http(conformance[0], ServeConfig(transport="http", port=0)) as srv:
        yield srv


def tool(registry: Registry, method: str) -> str:
    """The exposed name of one of the conformance skill's methods."""
    return next(t.name for t in registry.tools() if t.method == method)


async def answer_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    """A user who answers every form with a name and a colour."""
    return types.ElicitResult(action="accept", content={"name": "Ada", "color": "teal"})


async def answer_sample(
    context: Any, params: types.CreateMessageRequestParams
) -> types.CreateMessageResult:
    """A model that always says Paris."""
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="Paris"), model="fake"
    )


async def answer_roots(context: Any) -> types.ListRootsResult:
    """A client with one root."""
    return types.ListRootsResult(roots=[types.Root(uri="file:///work", name="work")])


@pytest.mark.parametrize("mode", [MODERN, "legacy"])
async def test_sdk_client_completes_a_guest_that_elicits_and_samples(
    server: HttpServer, conformance: tuple[Registry, MemorySink], mode: str
) -> None:
    """The Python SDK in 2026-07-28 mode (rounds) and in 2025-11-25 mode (server requests) gets
    the same answers from the same wasm guest, and each call runs (and is audited) once."""
    registry, sink = conformance
    with anyio.fail_after(60):
        async with Client(
            server.url,
            mode=mode,
            elicitation_callback=answer_elicit,
            sampling_callback=answer_sample,
            list_roots_callback=answer_roots,
        ) as client:
            two = await client.call_tool(tool(registry, "ir_multi_round"), {})
            sampled = await client.call_tool(tool(registry, "ir_sampling"), {})
            three = await client.call_tool(tool(registry, "ir_multiple_inputs"), {})
    assert text_of(two) == "Ada likes teal"
    assert text_of(sampled) == "LLM response: Paris"
    assert text_of(three) == "Paris Ada (1 roots)"
    records = [r for r in sink.records if r.get("skill") == "conformance"]
    assert [r.get("outcome") for r in records] == ["ok", "ok", "ok"], records


async def first_round(http: httpx.AsyncClient, url: str, name: str) -> dict[str, Any]:
    """Start a call of ``name`` and return its input-required result."""
    result = payload(await modern(http, url, "tools/call", {"name": name, "arguments": {}}))
    assert result["result"]["resultType"] == "input_required", result
    return dict(result["result"])


# The answer ir_request_state's one question (confirm) wants.
CONFIRM = {"confirm": {"action": "accept", "content": {"ok": True}}}


async def retry(
    http: httpx.AsyncClient,
    url: str,
    name: str,
    state: str,
    answers: dict[str, Any] = CONFIRM,
) -> dict[str, Any]:
    """The JSON-RPC answer to a retry of a call of ``name`` under ``state``, answering its
    questions with ``answers``."""
    params = {"name": name, "arguments": {}, "inputResponses": answers, "requestState": state}
    return dict(payload(await modern(http, url, "tools/call", params)))


async def test_a_tampered_or_replayed_request_state_is_refused(
    server: HttpServer, conformance: tuple[Registry, MemorySink]
) -> None:
    """A flipped byte, a state moved to another tool, and a state replayed after its call
    ended are each refused with -32602; the guest's side effects ran once."""
    registry, sink = conformance
    name = tool(registry, "ir_request_state")
    other = tool(registry, "ir_tampered_state")
    async with httpx.AsyncClient(timeout=30) as http:
        first = await first_round(http, server.url, name)
        state = first["requestState"]
        flipped = state[:-2] + ("A" if state[-2] != "A" else "B") + state[-1]
        for target, token in ((name, flipped), (other, state), (name, state + "x")):
            refused = await retry(http, server.url, target, token)
            assert refused["error"]["code"] == types.INVALID_PARAMS, refused
        done = await retry(http, server.url, name, state)
        assert "state-ok" in done["result"]["content"][0]["text"], done
        replayed = await retry(http, server.url, name, state)
    assert replayed["error"]["code"] == types.INVALID_PARAMS, replayed
    assert "over" in replayed["error"]["message"]
    assert [r.get("outcome") for r in sink.records if r.get("skill") == "conformance"] == ["ok"]


async def test_state_sealed_by_another_node_is_refused(
    conformance: tuple[Registry, MemorySink],
) -> None:
    """A requestState minted by another node (another key) is refused by this one."""
    registry, _sink = conformance
    name = tool(registry, "ir_request_state")
    async with (
        running_http(registry, ServeConfig(transport="http", port=0)) as one,
        running_http(registry, ServeConfig(transport="http", port=0)) as two,
        httpx.AsyncClient(timeout=30) as http,
    ):
        state = (await first_round(http, one.url, name))["requestState"]
        refused = await retry(http, two.url, name, state)
        assert refused["error"]["code"] == types.INVALID_PARAMS, refused
        # the call is still parked on the first node, which answers the retry
        done = await retry(http, one.url, name, state)
    assert "state-ok" in done["result"]["content"][0]["text"], done


async def test_a_call_needing_an_undeclared_capability_is_refused_with_32021(
    server: HttpServer, conformance: tuple[Registry, MemorySink]
) -> None:
    """A guest that samples for a client that declared no sampling: -32021, HTTP 400, naming it."""
    registry, _sink = conformance
    async with httpx.AsyncClient(timeout=30) as http:
        response = await modern(
            http,
            server.url,
            "tools/call",
            {"name": tool(registry, "missing_capability"), "arguments": {}},
            caps={},
        )
    assert response.status_code == 400
    error = payload(response)["error"]
    assert error["code"] == -32021
    assert error["data"] == {"requiredCapabilities": {"sampling": {}}}


async def test_a_parked_call_never_retried_ends_at_its_deadline_and_is_audited(
    server: HttpServer, conformance: tuple[Registry, MemorySink]
) -> None:
    """The client asks, is asked, and walks away: the guest ends at its wall time (5 s here),
    its call is audited as a timeout, and its state names a call that is over."""
    registry, sink = conformance
    name = tool(registry, "ir_elicitation")
    async with httpx.AsyncClient(timeout=30) as http:
        state = (await first_round(http, server.url, name))["requestState"]
        with anyio.fail_after(30):
            while not [r for r in sink.records if r.get("skill") == "conformance"]:
                await anyio.sleep(0.1)  # waiting on the guest's own deadline, not synchronising
        answers = {"user_name": {"action": "accept", "content": {"name": "x"}}}
        late = await retry(http, server.url, name, state, answers)
    [record] = [r for r in sink.records if r.get("skill") == "conformance"]
    assert record.get("outcome") != "ok", record
    assert late["error"]["code"] == types.INVALID_PARAMS, late


async def test_a_retry_on_another_entry_node_is_told_where_its_call_is(
    conformance: tuple[Registry, MemorySink],
) -> None:
    """Two entry nodes sharing the sealing key: the other node opens the state, finds the call
    is not its own and says which node holds it (until the cluster forwards retries there)."""
    registry, _sink = conformance
    name = tool(registry, "ir_request_state")
    key = (b"k" * 32,)
    one_config = ServeConfig(transport="http", port=0, node_id="node-a", request_state_keys=key)
    two_config = dataclasses.replace(one_config, node_id="node-b")
    async with (
        running_http(registry, one_config) as one,
        running_http(registry, two_config) as two,
        httpx.AsyncClient(timeout=30) as http,
    ):
        state = (await first_round(http, one.url, name))["requestState"]
        elsewhere = await retry(http, two.url, name, state)
        done = await retry(http, one.url, name, state)
    assert elsewhere["error"]["code"] == types.INVALID_PARAMS
    assert "node-a" in elsewhere["error"]["message"], elsewhere
    assert "state-ok" in done["result"]["content"][0]["text"], done


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(state=st.text(max_size=300) | st.binary(max_size=200).map(lambda b: "v1." + b.hex()))
async def test_hostile_request_state_is_always_a_clean_refusal(
    server: HttpServer, conformance: tuple[Registry, MemorySink], state: str
) -> None:
    """Any requestState a client makes up is refused with -32602, and no guest runs."""
    registry, sink = conformance
    before = len(sink.records)
    params = {"name": tool(registry, "ir_elicitation"), "arguments": {}, "requestState": state}
    async with httpx.AsyncClient(timeout=30) as http:
        refused = payload(await modern(http, server.url, "tools/call", params))
    assert refused["error"]["code"] == types.INVALID_PARAMS, refused
    assert len(sink.records) == before


async def test_ask_is_refused_whole_when_one_question_is_not_granted(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> None:
    """Under a policy without ``roots``, a guest asking three questions at once gets
    not-permitted and the client is asked nothing (no question goes out before the check)."""
    registry, _sink = conformance_registry(
        sandbox,
        component_path("conformance"),
        tmp_path,
        replacing={"client: [sample, elicit, roots]": "client: [sample, elicit]"},
    )
    asked: list[str] = []

    async def note(context: Any, params: Any) -> types.ElicitResult:
        asked.append("elicit")
        return types.ElicitResult(action="decline")

    with anyio.fail_after(60):
        async with (
            running_http(registry, ServeConfig(transport="http", port=0)) as srv,
            Client(srv.url, mode=MODERN, elicitation_callback=note) as client,
        ):
            result = await client.call_tool(tool(registry, "ir_multiple_inputs"), {})
    assert result.is_error
    assert "not-permitted" in text_of(result) and "roots" in text_of(result)
    assert asked == []


@pytest.mark.parametrize("mode", [MODERN, "legacy"])
async def test_stdio_serves_both_eras(mode: str) -> None:
    """Over stdio too: a 2026-07-28 client answers the elicitation in a round, a 2025-11-25
    one as a server request, and both get the same result."""

    async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "a@b"})

    server = StdioServerParameters(command=sys.executable, args=[str(STATIC), "conformance"])
    with anyio.fail_after(60):
        async with Client(stdio_client(server), mode=mode, elicitation_callback=answer) as client:
            result = await client.call_tool("test_elicitation", {"message": "hi"})
    assert text_of(result) == (
        'User response: action=accept, content={"username": "ada", "email": "a@b"}'
    )
