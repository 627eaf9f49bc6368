"""The round gate and the relay's request context, on a real RoundChannel and worker thread."""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.to_thread
import pytest
from mcp import types

from skilld.mcp._channel import KEY_META
from skilld.mcp._relay import ForwardedSession, run_relayed
from skilld.mcp._rounds import ParkedCalls, RoundChannel
from skilld.types import Caller

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
CAPS = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}


def _question(text: str) -> dict[str, Any]:
    return {
        "message": text,
        "requestedSchema": {"type": "object", "properties": {"v": {"type": "string"}}},
        "_meta": {KEY_META: "same"},
    }


async def test_a_copy_of_an_answered_retry_does_not_answer_the_next_question() -> None:
    """A guest asks twice under one key: the first round's retry sent again after the guest
    asked the second question answers nothing; the second round's own retry does."""
    channel = RoundChannel(
        ForwardedSession(MODERN, CAPS, Caller.local()),
        None,
        skill="s",
        min_level=lambda: None,
        request_timeout_s=5,
        prefilled={},
        capabilities=ForwardedSession(MODERN, CAPS, Caller.local()).check_client_capability,
    )

    def guest() -> str:
        first = channel.elicit(_question("first?"))["content"]["v"]
        second = channel.elicit(_question("second?"))["content"]["v"]
        return f"{first}+{second}"

    async def run() -> str:
        return await anyio.to_thread.run_sync(guest)

    parked = ParkedCalls("node-a", 60)
    with anyio.fail_after(30):
        call = parked.start("tool", "d", channel, run)
        one = await parked.step(call)
        assert isinstance(one, types.InputRequiredResult)
        state_one = str(one.request_state)
        assert json.loads(state_one)["r"] == 1
        parked.answer(call, state_one, {"same": {"action": "accept", "content": {"v": "a"}}})
        two = await parked.step(call)
        assert isinstance(two, types.InputRequiredResult)
        state_two = str(two.request_state)
        assert json.loads(state_two)["r"] == 2
        # The copy: round one's state with another answer, while round two waits.
        parked.answer(call, state_one, {"same": {"action": "accept", "content": {"v": "copy"}}})
        again = await parked.step(call)
        assert isinstance(again, types.InputRequiredResult)
        assert json.loads(str(again.request_state))["r"] == 2
        parked.answer(call, state_two, {"same": {"action": "accept", "content": {"v": "b"}}})
        done = await parked.step(call)
    assert done == "a+b"


async def test_the_relay_takes_only_a_modern_retry() -> None:
    """A forwarded request without a requestState, of another era or another method is
    refused before any handler runs: the relay cannot start a call."""
    ran: list[str] = []

    async def handler(ctx: Any, params: Any) -> types.CallToolResult:
        ran.append(ctx.method)
        return types.CallToolResult(content=[])

    handlers = {"tools/call": handler}
    params = {"name": "t", "arguments": {}, "_meta": CAPS}
    refused = [
        await run_relayed({"method": "tools/call", "params": params, "version": MODERN}, handlers),
        await run_relayed(
            {
                "method": "tools/call",
                "params": {**params, "requestState": "{}"},
                "version": "2025-11-25",
            },
            handlers,
        ),
        await run_relayed(
            {"method": "tools/list", "params": {"requestState": "{}"}, "version": MODERN},
            handlers,
        ),
    ]
    taken = await run_relayed(
        {
            "method": "tools/call",
            "params": {**params, "requestState": "{}"},
            "version": MODERN,
            "caller": Caller.local().as_dict(),
        },
        handlers,
    )
    assert all(r["error"]["code"] == types.INVALID_PARAMS for r in refused), refused
    assert taken == {"result": {"content": [], "isError": False, "resultType": "complete"}}
    assert ran == ["tools/call"]
