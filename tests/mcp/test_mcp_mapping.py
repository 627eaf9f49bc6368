"""How the dispatcher's tools, values, content, errors, resources and prompts look over MCP."""

from __future__ import annotations

import base64

import anyio
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from support.mcp_fakes import connect, fake_dispatcher, text_of

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        ("net/fetch", "[not-permitted, rule x] http GET https://x.test refused"),
        ("net/denied", "[not-permitted, rule fs-deny-etc] fs read /etc/passwd refused"),
        ("bad/guest", "[not-found] no such note"),
        ("bad/trap", "[fault] unreachable executed"),
        ("bad/slow", "[timeout] ran past 10 s"),
        ("bad/memory", "[limit-exceeded] over 256 MiB"),
        ("bad/usage", "[invalid-argument] method needs 'id'"),
        ("bad/bug", "[internal] the call failed unexpectedly: ZeroDivisionError"),
    ],
)
async def test_errors_become_tool_errors(tool: str, expected: str) -> None:
    """Every skilld error (and a plain bug) is an isError result naming its code and rule."""
    with anyio.fail_after(10):
        async with connect("memory") as session:
            result = await session.call_tool(tool, {})
            assert result.is_error
            assert text_of(result) == expected


async def test_arguments_are_validated_before_the_guest_runs() -> None:
    """Arguments failing the input schema are a tool error and the dispatcher is never called."""
    dispatcher = fake_dispatcher()
    with anyio.fail_after(10):
        async with connect("memory", dispatcher) as session:
            missing = await session.call_tool("notes/echo", {})
            assert missing.is_error
            assert "[invalid-argument]" in text_of(missing)
            assert "'text' is a required property" in text_of(missing)
            extra = await session.call_tool("notes/echo", {"text": "a", "more": 1})
            assert "Additional properties are not allowed" in text_of(extra)
            wrong = await session.call_tool("notes/echo", {"text": 3})
            assert "invalid arguments at text" in text_of(wrong)
    assert dispatcher.calls == []


async def test_tool_listing_carries_schemas_and_hints() -> None:
    """tools/list has the schemas, title and the four annotation hints from the dispatcher."""
    with anyio.fail_after(10):
        async with connect("memory") as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
    rich = tools["notes/rich"]
    assert rich.title == "Rich output"
    assert rich.annotations is not None
    hints = rich.annotations
    assert (hints.read_only_hint, hints.destructive_hint) == (False, True)
    assert (hints.idempotent_hint, hints.open_world_hint) == (False, True)
    echo = tools["notes/echo"].annotations
    assert echo is not None and echo.read_only_hint is True
    assert tools["notes/structured"].output_schema == {
        "type": "object",
        "properties": {"count": {"type": "integer"}},
    }
    # A non-object output schema is wrapped: MCP structured content is always an object.
    assert tools["notes/number"].output_schema == {
        "type": "object",
        "properties": {"result": {"type": "integer"}},
        "required": ["result"],
    }


async def test_values_and_content_blocks() -> None:
    """JSON values become text plus structuredContent; content blocks map to their MCP kinds."""
    with anyio.fail_after(10):
        async with connect("memory") as session:
            structured = await session.call_tool("notes/structured", {})
            assert structured.structured_content == {"count": 3}
            assert text_of(structured) == '{"count": 3}'
            number = await session.call_tool("notes/number", {})
            assert number.structured_content == {"result": 42}
            rich = await session.call_tool("notes/rich", {})
    assert rich.structured_content is None
    kinds = [block.type for block in rich.content]
    assert kinds == ["text", "text", "image", "audio", "resource", "resource"]
    image = rich.content[2]
    assert isinstance(image, types.ImageContent)
    assert base64.b64decode(image.data) == b"\x89PNG"
    text_res = rich.content[4]
    blob_res = rich.content[5]
    assert isinstance(text_res, types.EmbeddedResource)
    assert isinstance(text_res.resource, types.TextResourceContents)
    assert (str(text_res.resource.uri), text_res.resource.text) == ("note://1", "n1")
    assert isinstance(blob_res, types.EmbeddedResource)
    assert isinstance(blob_res.resource, types.BlobResourceContents)
    assert base64.b64decode(blob_res.resource.blob) == b"\x00\x01"


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")
async def test_resources_subscriptions_and_errors() -> None:
    """Resources keep their MIME type; unknown URIs are -32002; only real URIs can be watched."""
    with anyio.fail_after(10):
        async with connect("memory") as session:
            readme = (await session.read_resource("note://readme")).contents[0]
            assert isinstance(readme, types.TextResourceContents)
            assert (readme.text, readme.mime_type) == ("# Notes", "text/markdown")
            with pytest.raises(MCPError) as unknown:
                await session.read_resource("other://x")
            assert unknown.value.code == -32002
            await session.subscribe_resource("note://readme")
            await session.subscribe_resource("note://42")
            await session.unsubscribe_resource("note://readme")
            with pytest.raises(MCPError):
                await session.subscribe_resource("other://x")


async def test_prompts_and_completion() -> None:
    """Prompt arguments come from the schema, are checked, and complete from its enum."""
    with anyio.fail_after(10):
        async with connect("memory") as session:
            (greet,) = (await session.list_prompts()).prompts
            assert greet.arguments is not None
            assert [(a.name, a.required) for a in greet.arguments] == [("tone", True)]
            with pytest.raises(MCPError) as bad:
                await session.get_prompt("greet", {})
            assert bad.value.code == types.INVALID_PARAMS
            with pytest.raises(MCPError):
                await session.get_prompt("nope", {})
            ref = types.PromptReference(type="ref/prompt", name="greet")
            done = await session.complete(ref, {"name": "tone", "value": "f"})
            assert done.completion.values == ["formal", "friendly", "fierce"]
            narrowed = await session.complete(ref, {"name": "tone", "value": "fr"})
            assert narrowed.completion.values == ["friendly"]
