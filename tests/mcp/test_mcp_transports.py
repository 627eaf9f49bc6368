"""End to end through the SDK's own client over stdio, legacy SSE and Streamable HTTP."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest
from mcp import types

from support.mcp_fakes import Gate, Inbox, connect, fake_dispatcher, text_of

pytestmark = pytest.mark.anyio

TRANSPORTS = ["stdio", "sse", "streamable-http"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_list_and_call(transport: str) -> None:
    """A real client lists the dispatcher's tools and gets a tool's JSON value back."""
    with anyio.fail_after(30):
        async with connect(transport) as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert "notes/echo" in tools
            assert tools["notes/echo"].input_schema["required"] == ["text"]
            result = await session.call_tool("notes/echo", {"text": "hi"})
            assert not result.is_error
            assert text_of(result) == '{"text": "hi"}'


@pytest.mark.filterwarnings("ignore:The logging capability is deprecated")
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_progress_and_logs_reach_the_client(transport: str) -> None:
    """Progress notifications and guest logs arrive, filtered by the session's log level."""
    inbox = Inbox()
    with anyio.fail_after(30):
        async with connect(transport, inbox=inbox) as session:
            result = await session.call_tool(
                "work/progress", {}, progress_callback=inbox.on_progress
            )
            assert not result.is_error
            assert [p[0] for p in inbox.progress] == [1, 2, 3]
            assert inbox.progress[-1] == (3, 3, "step 3")
            # The default level is info: the debug line was filtered out.
            assert [log.data for log in inbox.logs] == [{"msg": "working", "steps": 3}]
            assert inbox.logs[0].logger == "work"

            await session.set_logging_level("debug")
            await session.call_tool("work/progress", {})
            assert [log.level for log in inbox.logs] == ["info", "info", "debug"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_denied_permission_is_a_tool_error(transport: str) -> None:
    """A host refusal comes back as isError with its code and rule, and the session lives on."""
    with anyio.fail_after(30):
        async with connect(transport) as session:
            result = await session.call_tool("net/fetch", {})
            assert result.is_error
            assert text_of(result).startswith("[not-permitted, rule x] ")
            assert "https://x.test" in text_of(result)
            after = await session.call_tool("notes/echo", {"text": "still here"})
            assert not after.is_error


async def test_channel_works_from_a_dispatcher_thread() -> None:
    """Logs and progress sent from a thread the dispatcher started still reach the client."""
    inbox = Inbox()
    with anyio.fail_after(30):
        async with connect("streamable-http", inbox=inbox) as session:
            result = await session.call_tool("work/nested", {}, progress_callback=inbox.on_progress)
            assert not result.is_error
    assert [log.data for log in inbox.logs] == ["from a nested thread"]
    assert inbox.progress == [(1, 1, None)]


async def test_stdout_carries_only_the_protocol() -> None:
    """A tool printing to stdout (and writing to fd 1) does not corrupt the stdio stream."""
    with anyio.fail_after(30):
        async with connect("stdio") as session:
            noisy = await session.call_tool("work/noisy", {})
            assert text_of(noisy) == '{"quiet": true}'
            assert not (await session.call_tool("notes/echo", {"text": "ok"})).is_error


@pytest.mark.parametrize("transport", ["sse", "streamable-http"])
async def test_sampling_and_elicitation_round_trip(transport: str) -> None:
    """A guest's sampling and elicitation requests reach the client and its answers come back."""
    with anyio.fail_after(30):
        async with connect(transport) as session:
            sampled = await session.call_tool("ask/sample", {"prompt": "ping"})
            assert not sampled.is_error, text_of(sampled)
            assert '"answer": "echo: ping"' in text_of(sampled)
            elicited = await session.call_tool("ask/elicit", {})
            assert '"action": "accept"' in text_of(elicited)
            assert '"name": "Ada"' in text_of(elicited)


@pytest.mark.parametrize("transport", ["memory", "streamable-http"])
async def test_client_cancellation_sets_the_cancelled_flag(transport: str) -> None:
    """notifications/cancelled from the client is seen by the running guest through the channel."""
    gate = Gate()
    with anyio.fail_after(30):
        async with connect(transport, fake_dispatcher(gate)) as session:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    await session.call_tool("work/wait", {})

                tg.start_soon(call)
                await anyio.to_thread.run_sync(gate.started.wait)
                tg.cancel_scope.cancel()
            seen = await anyio.to_thread.run_sync(gate.saw_cancel.wait, 10.0)
            assert seen
            # The session still serves after the cancelled call ended.
            assert not (await session.call_tool("notes/echo", {"text": "x"})).is_error


async def test_unknown_tool_is_a_protocol_error() -> None:
    """An unknown tool name is a JSON-RPC error, not a tool result."""
    with anyio.fail_after(30):
        async with connect("streamable-http") as session:
            with pytest.raises(Exception, match="Unknown tool: nope"):
                await session.call_tool("nope", {})


async def test_resources_and_prompts_over_http() -> None:
    """Resources, templates, prompts and completion come from the dispatcher over HTTP."""
    with anyio.fail_after(30):
        async with connect("streamable-http") as session:
            listed = await session.list_resources()
            assert [str(r.uri) for r in listed.resources] == ["note://readme", "note://wait"]
            templates = await session.list_resource_templates()
            assert [t.uri_template for t in templates.resource_templates] == ["note://{id}"]
            read = await session.read_resource("note://7")
            content = read.contents[0]
            assert isinstance(content, types.TextResourceContents)
            assert (content.text, content.mime_type) == ('{"id":"7"}', "application/json")
            prompt = await session.get_prompt("greet", {"tone": "formal"})
            first = prompt.messages[0].content
            assert isinstance(first, types.TextContent) and first.text == "Be formal."


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_reads_one_after_another_each_get_a_turn(transport: str) -> None:
    """A caller's reads take turns (two at once) and each turn ends with its read's
    response: five reads in a row on one session, and four at once, all answered, over
    every transport (a turn held by the session's stream instead would stop the third)."""
    with anyio.fail_after(30):
        async with connect(transport) as session:
            for n in range(5):
                read = await session.read_resource(f"note://{n}")
                assert read.contents[0].text == f'{{"id":"{n}"}}'  # type: ignore[union-attr]
            texts: list[str] = []

            async def one(n: int) -> None:
                got = await session.read_resource(f"note://{n}")
                texts.append(got.contents[0].text)  # type: ignore[union-attr]

            async with anyio.create_task_group() as tg:
                for n in range(4):
                    tg.start_soon(one, n)
            assert sorted(texts) == sorted(f'{{"id":"{n}"}}' for n in range(4))
