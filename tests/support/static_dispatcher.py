"""Test doubles for the MCP layer: a Dispatcher made of plain Python callables.

:class:`StaticDispatcher` implements :class:`skilld.registry.Dispatcher` with no
wasm behind it, for tests of anything that serves or calls a dispatcher.
:func:`conformance_dispatcher` carries the tools, resources and prompts the
official MCP conformance suite exercises (``tests/skills/conformance`` carries the same
behaviours as a sandboxed skill: nothing here is special-cased by the server).

Run ``python tests/support/static_dispatcher.py [conformance|echo] [--http PORT]`` to serve one
over stdio (the default) or HTTP.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp.shared.uri_template import UriTemplate

from skilld.errors import GuestError, RegistryError, RunOnThread
from skilld.registry import CallerPolicy, CallerView, CallGate, Tool, ToolAnnotations
from skilld.types import (
    Caller,
    CallOutput,
    ClientChannel,
    ContentBlock,
    PromptSpec,
    ResourceSpec,
)

LOCAL = Caller.local()

ToolFn = Callable[[Mapping[str, Any], ClientChannel], Any]
"""Returns a :class:`CallOutput`, or any JSON value (wrapped as one)."""
ResourceFn = Callable[[str, Mapping[str, Any], ClientChannel], Any]
"""Gets the URI and the template's variables; returns outputs, one output, or a value."""
PromptFn = Callable[[Mapping[str, Any]], Sequence[Mapping[str, Any]]]

READ_ONLY = ToolAnnotations(read_only=True, destructive=False, idempotent=True, open_world=False)
NO_ARGS: Mapping[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class StaticTool:
    """A tool and the callable that runs it."""

    tool: Tool
    fn: ToolFn


def static_tool(
    name: str,
    fn: ToolFn,
    *,
    description: str = "",
    input_schema: Mapping[str, Any] = NO_ARGS,
    output_schema: Mapping[str, Any] | None = None,
    skill_id: str = "static",
    annotations: ToolAnnotations = READ_ONLY,
    title: str | None = None,
) -> StaticTool:
    """A :class:`StaticTool` with defaults for everything but its name and callable."""
    tool = Tool(
        name=name,
        description=description or name,
        input_schema=input_schema,
        output_schema=output_schema,
        annotations=annotations,
        skill_id=skill_id,
        method=name,
        title=title,
    )
    return StaticTool(tool, fn)


def _as_output(value: Any) -> CallOutput:
    return value if isinstance(value, CallOutput) else CallOutput(value=value)


@dataclass
class StaticDispatcher:
    """A :class:`skilld.registry.Dispatcher` over plain callables; blocks like the real one.

    Its resources and prompts belong to the skill ``skill_id``; each skill's gate has
    ``concurrency`` slots.
    """

    tools_: Sequence[StaticTool] = ()
    resources_: Sequence[tuple[ResourceSpec, ResourceFn]] = ()
    prompts_: Sequence[tuple[PromptSpec, PromptFn]] = ()
    is_ready: bool = True
    skill_id: str = "static"
    concurrency: int = 8
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    callers: list[Caller] = field(default_factory=list)
    # (skill, label, outcome) of each request refused before it ran.
    refusals: list[tuple[str, str, str]] = field(default_factory=list)
    gates: dict[str, CallGate] = field(default_factory=dict)
    # Who may list and call what (default: no caller rules, so local and anonymous only).
    caller_rules: CallerPolicy = field(default_factory=CallerPolicy)

    def tools(self) -> Sequence[Tool]:
        """Every tool, in the order given."""
        return [t.tool for t in self.tools_]

    def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        channel: ClientChannel,
        *,
        caller: Caller = LOCAL,
    ) -> CallOutput:
        """Run the tool's callable on this thread (``callers`` keeps who called).

        Raises:
            RegistryError: no tool has that name.
        """
        for entry in self.tools_:
            if entry.tool.name == tool:
                self.calls.append((tool, dict(arguments)))
                self.callers.append(caller)
                return _as_output(entry.fn(arguments, channel))
        raise RegistryError(f"no tool named '{tool}'")

    def call_inline(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        channel: ClientChannel,
        budget_s: float,
        *,
        caller: Caller = LOCAL,
    ) -> CallOutput:
        """Never inline: the callables may block.

        Raises:
            RunOnThread: always.
        """
        raise RunOnThread

    def refused(
        self,
        skill: str,
        label: str,
        arguments: Mapping[str, Any],
        outcome: str,
        error: str,
        *,
        caller: Caller = LOCAL,
    ) -> None:
        """Keep (skill, label, outcome) in ``refusals``."""
        self.refusals.append((skill, label, outcome))

    def gate(self, skill_id: str) -> CallGate:
        """The gate of ``skill_id`` (made on first use, ``concurrency`` slots)."""
        return self.gates.setdefault(skill_id, CallGate(skill_id, self.concurrency))

    def resources(self) -> Sequence[ResourceSpec]:
        """Every resource and template."""
        return [spec for spec, _fn in self.resources_]

    def _resource(self, uri: str) -> tuple[ResourceFn, Mapping[str, Any]]:
        for spec, fn in self.resources_:
            variables = UriTemplate.parse(spec.uri).match(uri) if spec.template else None
            if spec.uri == uri or variables is not None:
                return fn, variables or {}
        raise RegistryError(f"no resource '{uri}'")

    def resource_skill(self, uri: str) -> str:
        """``skill_id``, for any URI a resource or template matches.

        Raises:
            RegistryError: nothing serves ``uri``.
        """
        self._resource(uri)
        return self.skill_id

    def read_resource(
        self, uri: str, channel: ClientChannel, *, caller: Caller = LOCAL
    ) -> Sequence[CallOutput]:
        """Read ``uri`` from the first resource or template that matches it.

        Raises:
            RegistryError: nothing serves ``uri``.
        """
        fn, variables = self._resource(uri)
        result = fn(uri, variables, channel)
        if isinstance(result, list | tuple):
            return [_as_output(r) for r in result]
        return [_as_output(result)]

    def prompts(self) -> Sequence[PromptSpec]:
        """Every prompt."""
        return [spec for spec, _fn in self.prompts_]

    def _prompt(self, name: str) -> PromptFn:
        for spec, fn in self.prompts_:
            if spec.name == name:
                return fn
        raise RegistryError(f"no prompt named '{name}'")

    def prompt_skill(self, name: str) -> str:
        """``skill_id``, for any prompt it has.

        Raises:
            RegistryError: no prompt has that name.
        """
        self._prompt(name)
        return self.skill_id

    def get_prompt(
        self,
        name: str,
        arguments: Mapping[str, Any],
        channel: ClientChannel,
        *,
        caller: Caller = LOCAL,
    ) -> Sequence[Mapping[str, Any]]:
        """Render a prompt.

        Raises:
            RegistryError: no prompt has that name.
        """
        return self._prompt(name)(arguments)

    def use_callers(self, policy: CallerPolicy) -> None:
        """Answer every caller question under ``policy`` from now on."""
        self.caller_rules = policy

    def view(self, caller: Caller) -> CallerView:
        """What ``caller`` may list and call under ``caller_rules``."""
        return CallerView(self.caller_rules, caller, self)

    def ready(self) -> bool:
        """Whatever ``is_ready`` says."""
        return self.is_ready


# -- echo (the bench's workload) ------------------------------------------------

ECHO_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}


def echo_dispatcher() -> StaticDispatcher:
    """One ``echo`` tool returning ``{"text": ...}``: the same work as the echo skill."""
    return StaticDispatcher(
        tools_=[
            static_tool(
                "echo",
                lambda args, _ch: {"text": args["text"]},
                description="Echo the text back",
                input_schema=ECHO_SCHEMA,
                output_schema={
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"],
                },
                skill_id="echo",
            )
        ]
    )


# -- the conformance suite's behaviours -----------------------------------------

# A 1x1 red PNG and a 1-sample silent WAV: the smallest valid media for the suite.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)
WAV = (
    b"RIFF\x26\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x40\x1f\x00\x00"
    b"\x80\x3e\x00\x00\x02\x00\x10\x00data\x02\x00\x00\x00\x00\x00"
)
_PAUSE_S = 0.05  # the suite asks for ~50 ms between a tool's notifications


def _text(text: str) -> CallOutput:
    return CallOutput(value=None, content=(ContentBlock("text", text=text),))


def _logging(args: Mapping[str, Any], ch: ClientChannel) -> CallOutput:
    ch.log("info", "Tool execution started")
    time.sleep(_PAUSE_S)
    ch.log("info", "Tool processing data")
    time.sleep(_PAUSE_S)
    ch.log("info", "Tool execution completed")
    return _text("Tool with logging executed successfully")


def _progress(args: Mapping[str, Any], ch: ClientChannel) -> CallOutput:
    for step in (0, 50, 100):
        ch.progress(step, 100, f"step {step}")
        if step < 100:
            time.sleep(_PAUSE_S)
    return _text("Tool with progress executed successfully")


def _fail(args: Mapping[str, Any], ch: ClientChannel) -> CallOutput:
    raise GuestError("internal", "This tool intentionally returns an error for testing")


def _sampling(args: Mapping[str, Any], ch: ClientChannel) -> CallOutput:
    result = ch.sample(
        {
            "messages": [{"role": "user", "content": {"type": "text", "text": args["prompt"]}}],
            "maxTokens": 100,
        }
    )
    content = result.get("content")
    blocks = content if isinstance(content, list) else [content]
    text = " ".join(b.get("text", "") for b in blocks if isinstance(b, dict))
    return _text(f"LLM response: {text}")


def _elicit_with(schema: Mapping[str, Any], message: str, prefix: str) -> ToolFn:
    def run(args: Mapping[str, Any], ch: ClientChannel) -> CallOutput:
        result = ch.elicit({"message": args.get("message", message), "requestedSchema": schema})
        content = json.dumps(result.get("content"))
        return _text(f"{prefix}action={result.get('action')}, content={content}")

    return run


_USER_SCHEMA = {
    "type": "object",
    "properties": {
        "username": {"type": "string", "description": "User's response"},
        "email": {"type": "string", "description": "User's email address"},
    },
    "required": ["username", "email"],
}
_DEFAULTS_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {
            "type": "string",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "default": True},
    },
}
_ENUMS_SCHEMA = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}
_JSON_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


def _string_args(*names: str) -> Mapping[str, Any]:
    return {
        "type": "object",
        "properties": {n: {"type": "string", "description": n} for n in names},
        "required": list(names),
    }


def _conformance_tools() -> list[StaticTool]:
    image = ContentBlock("image", mime_type="image/png", data=PNG)
    return [
        static_tool(
            "test_simple_text", lambda a, c: _text("This is a simple text response for testing.")
        ),
        static_tool("test_image_content", lambda a, c: CallOutput(None, (image,))),
        static_tool(
            "test_audio_content",
            lambda a, c: CallOutput(
                None, (ContentBlock("audio", mime_type="audio/wav", data=WAV),)
            ),
        ),
        static_tool(
            "test_embedded_resource",
            lambda a, c: CallOutput(
                None,
                (
                    ContentBlock(
                        "embedded",
                        uri="test://embedded-resource",
                        mime_type="text/plain",
                        text="This is an embedded resource content.",
                    ),
                ),
            ),
        ),
        static_tool(
            "test_multiple_content_types",
            lambda a, c: CallOutput(
                None,
                (
                    ContentBlock("text", text="Multiple content types test:"),
                    image,
                    ContentBlock(
                        "embedded",
                        uri="test://mixed-content-resource",
                        mime_type="application/json",
                        text='{"test":"data","value":123}',
                    ),
                ),
            ),
        ),
        static_tool("test_tool_with_logging", _logging),
        static_tool("test_tool_with_progress", _progress),
        static_tool("test_error_handling", _fail),
        static_tool("test_sampling", _sampling, input_schema=_string_args("prompt")),
        static_tool(
            "test_elicitation",
            _elicit_with(_USER_SCHEMA, "", "User response: "),
            input_schema=_string_args("message"),
        ),
        static_tool(
            "test_elicitation_sep1034_defaults",
            _elicit_with(_DEFAULTS_SCHEMA, "Please review the defaults", "Elicitation completed: "),
        ),
        static_tool(
            "test_elicitation_sep1330_enums",
            _elicit_with(_ENUMS_SCHEMA, "Please pick options", "Elicitation completed: "),
        ),
        static_tool(
            "json_schema_2020_12_tool",
            lambda a, c: {"received": dict(a)},
            description="Tool with JSON Schema 2020-12 features",
            input_schema=_JSON_2020_12,
        ),
    ]


def _conformance_resources() -> list[tuple[ResourceSpec, ResourceFn]]:
    def template(uri: str, v: Mapping[str, Any], ch: ClientChannel) -> Any:
        return {"id": v["id"], "templateTest": True, "data": f"Data for ID: {v['id']}"}

    return [
        (
            ResourceSpec(
                "test://static-text", "static-text", "A static text resource", "text/plain"
            ),
            lambda u, v, c: "This is the content of the static text resource.",
        ),
        (
            ResourceSpec(
                "test://static-binary", "static-binary", "A static PNG image", "image/png"
            ),
            lambda u, v, c: CallOutput(
                None, (ContentBlock("image", mime_type="image/png", data=PNG),)
            ),
        ),
        (
            ResourceSpec(
                "test://watched-resource",
                "watched-resource",
                "A resource to subscribe to",
                "text/plain",
            ),
            lambda u, v, c: "Watched resource content.",
        ),
        (
            ResourceSpec(
                "test://template/{id}/data",
                "template-data",
                "Data for one id",
                "application/json",
                template=True,
            ),
            template,
        ),
    ]


def _user(content: Mapping[str, Any]) -> Mapping[str, Any]:
    return {"role": "user", "content": content}


def _conformance_prompts() -> list[tuple[PromptSpec, PromptFn]]:
    png = base64.b64encode(PNG).decode("ascii")
    return [
        (
            PromptSpec("test_simple_prompt", "A simple prompt without arguments", NO_ARGS),
            lambda a: [_user({"type": "text", "text": "This is a simple prompt for testing."})],
        ),
        (
            PromptSpec(
                "test_prompt_with_arguments",
                "A prompt with two arguments",
                _string_args("arg1", "arg2"),
            ),
            lambda a: [
                _user(
                    {
                        "type": "text",
                        "text": f"Prompt with arguments: arg1='{a['arg1']}', arg2='{a['arg2']}'",
                    }
                )
            ],
        ),
        (
            PromptSpec(
                "test_prompt_with_embedded_resource",
                "A prompt embedding a resource",
                _string_args("resourceUri"),
            ),
            lambda a: [
                _user(
                    {
                        "type": "resource",
                        "resource": {
                            "uri": a["resourceUri"],
                            "mimeType": "text/plain",
                            "text": "Embedded resource content for testing.",
                        },
                    }
                ),
                _user({"type": "text", "text": "Please process the embedded resource above."}),
            ],
        ),
        (
            PromptSpec("test_prompt_with_image", "A prompt with an image", NO_ARGS),
            lambda a: [
                _user({"type": "image", "data": png, "mimeType": "image/png"}),
                _user({"type": "text", "text": "Please analyze the image above."}),
            ],
        ),
    ]


def conformance_dispatcher() -> StaticDispatcher:
    """Every tool, resource and prompt the official MCP conformance suite calls for."""
    return StaticDispatcher(
        tools_=_conformance_tools(),
        resources_=_conformance_resources(),
        prompts_=_conformance_prompts(),
    )


FACTORIES: Mapping[str, Callable[[], StaticDispatcher]] = {
    "conformance": conformance_dispatcher,
    "echo": echo_dispatcher,
}


def main(argv: Sequence[str] | None = None) -> None:
    """Serve a test dispatcher: over stdio by default, over HTTP with ``--http PORT``."""
    from skilld.mcp import ServeConfig, serve

    parser = argparse.ArgumentParser(prog="python tests/support/static_dispatcher.py")
    parser.add_argument("dispatcher", nargs="?", default="conformance", choices=sorted(FACTORIES))
    parser.add_argument("--http", type=int, metavar="PORT", help="serve HTTP on 127.0.0.1:PORT")
    args = parser.parse_args(argv)
    config = (
        ServeConfig(transport="http", port=args.http)
        if args.http is not None
        else ServeConfig(transport="stdio")
    )
    serve(FACTORIES[args.dispatcher](), config)


if __name__ == "__main__":
    main()
