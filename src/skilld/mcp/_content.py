"""Skill values, content and errors as MCP results: what a guest's answer looks like to a client.

The functions a worker thread runs for a request (:func:`call_tool`, :func:`read_resource`,
:func:`render_prompt`) live here too: each calls the dispatcher and maps its output, so
that a call goes down from the adapter through the ring (``_ring``) to the dispatcher and
comes back the same way, without returning into the adapter on its thread.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from mcp import types
from pydantic import ValidationError

from skilld.errors import GuestError, SkilldError
from skilld.mcp._channel import SessionChannel
from skilld.registry import Dispatcher, Tool
from skilld.types import Caller, CallOutput, ContentBlock, PromptSpec


def error_text(exc: SkilldError) -> tuple[str, str | None, str]:
    """The WIT error code, the rule id (if any) and the message a tool error shows."""
    # Each error class carries its code (skilld.errors' table).
    code, rule = exc.code, exc.rule
    head = f"[{code}, rule {rule}]" if rule else f"[{code}]"
    return code, rule, f"{head} {SkilldError.__str__(exc)}"


def error_result(text: str) -> types.CallToolResult:
    """A tool error (``isError``) showing ``text``."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _b64(data: bytes | None) -> str:
    return base64.b64encode(data or b"").decode("ascii")


def content_block(block: ContentBlock) -> types.ContentBlock:
    """One skill content block as MCP content.

    Raises:
        GuestError: the block's kind is unknown (code ``internal``).
    """
    if block.kind == "text":
        return types.TextContent(type="text", text=block.text or "")
    if block.kind == "image":
        return types.ImageContent(
            type="image", data=_b64(block.data), mime_type=block.mime_type or "image/png"
        )
    if block.kind == "audio":
        return types.AudioContent(
            type="audio", data=_b64(block.data), mime_type=block.mime_type or "audio/wav"
        )
    if block.kind == "embedded":
        return types.EmbeddedResource(type="resource", resource=_resource_contents(block, ""))
    raise GuestError("internal", f"the skill returned content of unknown kind '{block.kind}'")


def _resource_contents(
    block: ContentBlock, uri: str, default_mime: str | None = None
) -> types.TextResourceContents | types.BlobResourceContents:
    where = block.uri or uri
    mime = block.mime_type or default_mime
    if block.text is not None and block.data is None:
        return types.TextResourceContents(
            uri=where, mime_type=mime or "text/plain", text=block.text
        )
    return types.BlobResourceContents(
        uri=where, mime_type=mime or "application/octet-stream", blob=_b64(block.data)
    )


def resource_contents(
    uri: str, outputs: Sequence[CallOutput], mime: str | None
) -> list[types.TextResourceContents | types.BlobResourceContents]:
    """What ``resources/read`` returns for the outputs a skill produced.

    Content blocks become contents (text or base64 blob; an embedded block keeps
    its own URI); an output without blocks contributes its value: a string as
    text, anything else as JSON.
    """
    contents: list[types.TextResourceContents | types.BlobResourceContents] = []
    for output in outputs:
        if output.content:
            contents += [_resource_contents(b, uri, mime) for b in output.content]
        elif isinstance(output.value, str):
            contents.append(
                types.TextResourceContents(
                    uri=uri, mime_type=mime or "text/plain", text=output.value
                )
            )
        else:
            contents.append(
                types.TextResourceContents(
                    uri=uri,
                    mime_type=mime or "application/json",
                    text=json.dumps(output.value, separators=(",", ":")),
                )
            )
    return contents


def object_schema(schema: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """An output schema MCP accepts (an object) and whether values are wrapped as ``result``."""
    if schema.get("type") == "object":
        return dict(schema), False
    return {"type": "object", "properties": {"result": dict(schema)}, "required": ["result"]}, True


def tool_result(tool: Tool, output: CallOutput) -> types.CallToolResult:
    """``tool``'s output as a ``CallToolResult`` (text, content blocks, structured content).

    Raises:
        GuestError: a content block of unknown kind (code ``internal``).
    """
    value = output.value
    content: list[types.ContentBlock] = []
    if not (value is None and output.content):
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        content.append(types.TextContent(type="text", text=text))
    content += [content_block(b) for b in output.content]
    structured: dict[str, Any] | None = None
    if tool.output_schema is not None:
        _schema, wrapped = object_schema(tool.output_schema)
        if wrapped:
            structured = {"result": value}
        elif isinstance(value, dict):
            structured = value
    return types.CallToolResult(content=content, structured_content=structured)


def call_tool(
    dispatcher: Dispatcher,
    tool: Tool,
    arguments: Mapping[str, Any],
    caller: Caller,
    channel: SessionChannel,
) -> types.CallToolResult:
    """Run ``tool`` for ``caller`` (on a worker thread) and map its output.

    Raises:
        SkilldError: as ``Dispatcher.call``.
    """
    return tool_result(tool, dispatcher.call(tool.name, arguments, channel, caller=caller))


def call_tool_inline(
    dispatcher: Dispatcher,
    tool: Tool,
    arguments: Mapping[str, Any],
    caller: Caller,
    budget_s: float,
    channel: SessionChannel,
) -> types.CallToolResult:
    """Try ``tool`` on the event loop within ``budget_s`` and map its output.

    Raises:
        RunOnThread: the call must go to a worker thread (``call_tool``).
        SkilldError: as ``Dispatcher.call_inline``.
    """
    output = dispatcher.call_inline(tool.name, arguments, channel, budget_s, caller=caller)
    return tool_result(tool, output)


def read_resource(
    dispatcher: Dispatcher,
    uri: str,
    mime: str | None,
    caller: Caller,
    channel: SessionChannel,
) -> list[types.TextResourceContents | types.BlobResourceContents]:
    """Read ``uri`` for ``caller`` (on a worker thread) and map its contents.

    Raises:
        SkilldError: as ``Dispatcher.read_resource``.
    """
    return resource_contents(uri, dispatcher.read_resource(uri, channel, caller=caller), mime)


def render_prompt(
    dispatcher: Dispatcher,
    spec: PromptSpec,
    arguments: Mapping[str, Any],
    caller: Caller,
    channel: SessionChannel,
) -> types.GetPromptResult:
    """Render the prompt ``spec`` for ``caller`` (on a worker thread).

    Raises:
        GuestError: the skill rendered messages MCP does not accept (code ``internal``).
        SkilldError: as ``Dispatcher.get_prompt``.
    """
    messages = dispatcher.get_prompt(spec.name, arguments, channel, caller=caller)
    try:
        return types.GetPromptResult(
            description=spec.description,
            messages=[types.PromptMessage.model_validate(m) for m in messages],
        )
    except ValidationError as exc:
        raise GuestError("internal", f"prompt {spec.name} rendered malformed messages") from exc
