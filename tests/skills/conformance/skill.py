"""The MCP conformance suite's test tools, resources and prompts, as a sandboxed skill.

Method names are plain; the policy's ``mcp.names`` maps them to the names the suite
calls (``simple_text`` -> ``test_simple_text``), so the exposure overrides are
exercised too.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from typing import Any

from skilld_sdk import Audio, Embedded, Image, Rich, Skill, SkillError, Text, mcp

skill = Skill()

# A 1x1 red pixel.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


def _wav() -> bytes:
    rate, samples = 8000, 80
    data = b"\x80" * samples
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt "
    header += struct.pack("<IHHIIHH", 16, 1, 1, rate, rate, 1, 8) + b"data"
    return header + struct.pack("<I", len(data)) + data


WAV = _wav()


@skill.method
def simple_text() -> Rich:
    """Return a simple text response."""
    return Rich(content=[Text("This is a simple text response for testing.")])


@skill.method
def image_content() -> Rich:
    """Return an image."""
    return Rich(content=[Image(PNG, "image/png")])


@skill.method
def audio_content() -> Rich:
    """Return audio."""
    return Rich(content=[Audio(WAV, "audio/wav")])


@skill.method
def embedded_resource() -> Rich:
    """Return an embedded resource."""
    return Rich(
        content=[
            Embedded(
                "test://embedded-resource",
                text="This is an embedded resource content.",
                mime_type="text/plain",
            )
        ]
    )


@skill.method
def multiple_content_types() -> Rich:
    """Return text, an image and an embedded resource."""
    return Rich(
        content=[
            Text("Multiple content types test:"),
            Image(PNG, "image/png"),
            Embedded(
                "test://mixed-content-resource",
                text=json.dumps({"test": "data", "value": 123}),
                mime_type="application/json",
            ),
        ]
    )


@skill.method
def tool_with_logging() -> Rich:
    """Send three log messages while running."""
    mcp.log("info", "Tool execution started")
    time.sleep(0.05)
    mcp.log("info", "Tool processing data")
    time.sleep(0.05)
    mcp.log("info", "Tool execution completed")
    return Rich(content=[Text("Tool with logging executed successfully")])


@skill.method
def tool_with_progress() -> Rich:
    """Report progress 0, 50 and 100 of 100."""
    for step, value in enumerate((0, 50, 100)):
        if step:
            time.sleep(0.05)
        mcp.progress(value, 100, f"step {step + 1}")
    return Rich(content=[Text("Tool with progress executed successfully")])


@skill.method
def error_handling() -> None:
    """Always fail."""
    raise SkillError("internal", "This tool intentionally returns an error for testing")


@skill.method
def sampling(prompt: str) -> Rich:
    """Ask the client's model.

    Args:
        prompt: The prompt to send to the LLM.
    """
    result = mcp.sample(
        {
            "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
            "maxTokens": 100,
        }
    )
    content = result.get("content") or {}
    text = content.get("text") if isinstance(content, dict) else json.dumps(content)
    return Rich(content=[Text(f"LLM response: {text}")])


@skill.method
def elicitation(message: str) -> Rich:
    """Ask the user for a username and an email.

    Args:
        message: The message to show the user.
    """
    result = mcp.elicit(
        {
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "username": {"type": "string", "description": "User's response"},
                    "email": {"type": "string", "description": "User's email address"},
                },
                "required": ["username", "email"],
            },
        }
    )
    action, content = result.get("action"), result.get("content")
    return Rich(content=[Text(f"User response: action={action}, content={json.dumps(content)}")])


def _elicited(result: dict[str, Any]) -> Rich:
    text = f"Elicitation completed: action={result.get('action')}, "
    return Rich(content=[Text(text + f"content={json.dumps(result.get('content'))}")])


@skill.method
def elicitation_sep1034_defaults() -> Rich:
    """Elicit with defaults for every primitive type."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {
                "type": "string",
                "description": "User status",
                "enum": ["active", "inactive", "pending"],
                "default": "active",
            },
            "verified": {"type": "boolean", "description": "Verification status", "default": True},
        },
        "required": [],
    }
    return _elicited(
        mcp.elicit(
            {"message": "Please review and update the form fields", "requestedSchema": schema}
        )
    )


@skill.method
def elicitation_sep1330_enums() -> Rich:
    """Elicit with all five enum variants."""
    schema = {
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
        "required": [],
    }
    return _elicited(mcp.elicit({"message": "Please select options", "requestedSchema": schema}))


@skill.resource(
    "test://static-text",
    name="static-text",
    mime_type="text/plain",
    description="A static text resource for testing",
)
def static_text() -> str:
    """A static text resource."""
    return "This is the content of the static text resource."


@skill.resource(
    "test://static-binary",
    name="static-binary",
    mime_type="image/png",
    description="A static binary resource (a PNG image) for testing",
)
def static_binary() -> bytes:
    """A static binary resource."""
    return PNG


@skill.resource(
    "test://template/{id}/data",
    name="template-data",
    mime_type="application/json",
    description="A resource template with an id parameter",
)
def template_data(id: str) -> str:  # noqa: A002  (the URI template names it id)
    """Data for one id."""
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


@skill.resource(
    "test://watched-resource",
    name="watched-resource",
    mime_type="text/plain",
    description="A resource clients may subscribe to",
)
def watched() -> str:
    """A resource to subscribe to."""
    return "Watched resource content."


@skill.prompt("test_simple_prompt")
def simple_prompt() -> str:
    """A simple prompt without arguments."""
    return "This is a simple prompt for testing."


@skill.prompt("test_prompt_with_arguments")
def prompt_with_arguments(arg1: str, arg2: str) -> str:
    """A prompt with two required arguments.

    Args:
        arg1: First test argument.
        arg2: Second test argument.
    """
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@skill.prompt("test_prompt_with_embedded_resource")
def prompt_with_embedded_resource(resourceUri: str) -> list[dict[str, Any]]:
    """A prompt that embeds a resource.

    Args:
        resourceUri: URI of the resource to embed.
    """
    return [
        {
            "role": "user",
            "content": {
                "type": "resource",
                "resource": {
                    "uri": resourceUri,
                    "mimeType": "text/plain",
                    "text": "Embedded resource content for testing.",
                },
            },
        },
        {
            "role": "user",
            "content": {"type": "text", "text": "Please process the embedded resource above."},
        },
    ]


@skill.prompt("test_prompt_with_image")
def prompt_with_image() -> list[dict[str, Any]]:
    """A prompt with an image."""
    return [
        {
            "role": "user",
            "content": {
                "type": "image",
                "data": base64.b64encode(PNG).decode(),
                "mimeType": "image/png",
            },
        },
        {"role": "user", "content": {"type": "text", "text": "Please analyze the image above."}},
    ]


# -- 2026-07-28: the diagnostic tools of the stateless and input-required scenarios --------
#
# Each question names its key in ``_meta`` (the suite looks for some by name); in the
# 2026-07-28 era it becomes an input-required round, in the 2025-11-25 era a request
# to the client as before. The guest is the same either way.

KEY = "io.skilld/input-key"


def _ask_name(key: str, message: str, field: str = "name") -> dict[str, Any]:
    return mcp.elicit(
        {
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {field: {"type": "string"}},
                "required": [field],
            },
            "_meta": {KEY: key},
        }
    )


def _content(result: dict[str, Any]) -> dict[str, Any]:
    content = result.get("content")
    return content if isinstance(content, dict) else {}


@skill.method
def missing_capability() -> Rich:
    """Ask the client's model: refused (-32021) when the client did not declare sampling."""
    result = mcp.sample(
        {
            "messages": [{"role": "user", "content": {"type": "text", "text": "ping"}}],
            "maxTokens": 10,
        }
    )
    return Rich(content=[Text(f"sampled: {_content(result).get('text')}")])


@skill.method
def ir_elicitation() -> Rich:
    """Ask the user's name in one input-required round."""
    name = _content(_ask_name("user_name", "What is your name?")).get("name")
    return Rich(content=[Text(f"Hello, {name}!")])


@skill.method
def ir_sampling() -> Rich:
    """Ask the client's model in one input-required round."""
    result = mcp.sample(
        {
            "messages": [
                {
                    "role": "user",
                    "content": {"type": "text", "text": "What is the capital of France?"},
                }
            ],
            "maxTokens": 100,
            "_meta": {KEY: "capital_question"},
        }
    )
    return Rich(content=[Text(f"LLM response: {_content(result).get('text')}")])


def _confirm() -> bool:
    result = mcp.elicit(
        {
            "message": "Please confirm",
            "requestedSchema": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
            },
            "_meta": {KEY: "confirm"},
        }
    )
    return bool(_content(result).get("ok"))


@skill.method
def ir_request_state() -> Rich:
    """Ask for a confirmation; the retry's requestState finds this very call again."""
    return Rich(content=[Text(f"state-ok: confirmed={_confirm()}")])


@skill.method
def ir_tampered_state() -> Rich:
    """Ask for a confirmation (a tampered requestState never reaches this guest)."""
    return Rich(content=[Text(f"confirmed={_confirm()}")])


@skill.method
def ir_multi_round() -> Rich:
    """Ask two questions, one round each."""
    name = _content(_ask_name("step1", "Step 1: What is your name?")).get("name")
    color = _content(_ask_name("step2", "Step 2: What is your favorite color?", field="color")).get(
        "color"
    )
    return Rich(content=[Text(f"{name} likes {color}")])


@skill.method
def ir_capabilities() -> Rich:
    """Ask only what the client declared: elicitation, else sampling."""
    try:
        answer = _content(_ask_name("user_name", "What is your name?")).get("name")
    except SkillError:
        result = mcp.sample(
            {
                "messages": [{"role": "user", "content": {"type": "text", "text": "A name?"}}],
                "maxTokens": 20,
                "_meta": {KEY: "name_sample"},
            }
        )
        answer = _content(result).get("text")
    return Rich(content=[Text(f"answer: {answer}")])


@skill.prompt("test_input_required_result_prompt")
def ir_prompt() -> list[dict[str, Any]]:
    """A prompt that first asks the user for its context."""
    result = mcp.elicit(
        {
            "message": "What context should the prompt use?",
            "requestedSchema": {
                "type": "object",
                "properties": {"context": {"type": "string"}},
                "required": ["context"],
            },
            "_meta": {KEY: "user_context"},
        }
    )
    context = _content(result).get("context")
    return [{"role": "user", "content": {"type": "text", "text": f"Context: {context}"}}]


@skill.method
def streaming_elicitation() -> Rich:
    """Ask the user something: in 2026-07-28 a round, never a request on the call's stream."""
    name = _content(_ask_name("user_name", "What is your name?")).get("name")
    return Rich(content=[Text(f"Hello, {name}!")])


@skill.method
def logging_tool() -> Rich:
    """Log at every level; a 2026-07-28 client hears only what its request asked for."""
    for level in ("debug", "info", "warning", "error"):
        mcp.log(level, f"a {level} message")
    return Rich(content=[Text("logged")])


@skill.method
def ir_list_roots() -> Rich:
    """Ask for the client's roots in one input-required round."""
    roots = mcp.roots().get("roots") or []
    return Rich(content=[Text("roots: " + ", ".join(str(r.get("uri")) for r in roots))])


@skill.method
def ir_multiple_inputs() -> Rich:
    """Ask three questions of three kinds in one round."""
    answers = mcp.ask(
        {
            "user_name": {
                "method": "elicitation/create",
                "params": {
                    "message": "What is your name?",
                    "requestedSchema": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                },
            },
            "greeting": {
                "method": "sampling/createMessage",
                "params": {
                    "messages": [
                        {"role": "user", "content": {"type": "text", "text": "Generate a greeting"}}
                    ],
                    "maxTokens": 50,
                },
            },
            "client_roots": {"method": "roots/list", "params": {}},
        }
    )
    name = _content(answers["user_name"]).get("name")
    greeting = _content(answers["greeting"]).get("text")
    count = len(answers["client_roots"].get("roots") or [])
    return Rich(content=[Text(f"{greeting} {name} ({count} roots)")])


JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


@skill.method(input_schema=JSON_SCHEMA_2020_12)
def json_schema_2020_12_tool(
    name: str = "",
    address: dict[str, Any] | None = None,
    contactMethod: str = "",
    phone: str = "",
    email: str = "",
) -> Rich:
    """Tool with JSON Schema 2020-12 features."""
    city = (address or {}).get("city", "")
    return Rich(content=[Text(f"contact {name} ({city}) by {contactMethod or 'any'}")])


CUSTOM_HEADERS = {
    "type": "object",
    "properties": {
        "region": {"type": "string", "description": "A region", "x-mcp-header": "Region"},
        "query": {"type": "string", "description": "Not mirrored into a header"},
    },
    "required": ["region"],
}


@skill.method(input_schema=CUSTOM_HEADERS)
def custom_headers(region: str, query: str = "") -> Rich:
    """A tool whose region argument is mirrored in the Mcp-Param-Region header."""
    return Rich(content=[Text(f"region={region} query={query}")])


# -- the tasks extension's fixtures (served as tasks per ServeConfig.task_tools) ----------


@skill.method
def greet(name: str = "world") -> Rich:
    """Greet someone (a plain, synchronous tool)."""
    return Rich(content=[Text(f"Hello, {name}!")])


@skill.method
def slow_compute(seconds: float = 1.0, label: str = "") -> Rich:
    """Work for ``seconds`` (stopping early when cancelled), then answer."""
    end = time.monotonic() + max(0.0, seconds)
    while time.monotonic() < end:
        if mcp.cancelled():
            raise SkillError("cancelled", "cancelled")
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))
    return Rich(content=[Text(f"computed {label} after {seconds:g} s")])


@skill.method
def failing_job() -> None:
    """Fail as a tool, after a second."""
    time.sleep(1.0)
    raise SkillError("unavailable", "the job failed (a tool execution error)")


@skill.method
def protocol_error_job() -> None:
    """Crash (the guest panics): a protocol-level failure."""
    raise RuntimeError("the job panicked")


@skill.method
def confirm_delete(filename: str = "example.txt") -> Rich:
    """Ask before deleting (nothing is deleted)."""
    result = mcp.elicit(
        {
            "message": f"Delete {filename}?",
            "requestedSchema": {
                "type": "object",
                "properties": {"confirm": {"type": "boolean"}},
                "required": ["confirm"],
            },
            "_meta": {KEY: "confirm"},
        }
    )
    return Rich(content=[Text(f"confirmed={bool(_content(result).get('confirm'))}")])


@skill.method
def multi_input() -> Rich:
    """Ask two questions at once."""
    form = {
        "type": "object",
        "properties": {"value": {"type": "string"}},
        "required": ["value"],
    }
    answers = mcp.ask(
        {
            "first": {
                "method": "elicitation/create",
                "params": {"message": "First value?", "requestedSchema": form},
            },
            "second": {
                "method": "elicitation/create",
                "params": {"message": "Second value?", "requestedSchema": form},
            },
        }
    )
    values = [_content(answers[k]).get("value") for k in ("first", "second")]
    return Rich(content=[Text(f"values: {values}")])


@skill.method
def tool_with_task() -> Rich:
    """Ask the user's name, then work on it as a task."""
    name = _content(_ask_name("user_name", "What is your name?")).get("name")
    time.sleep(0.2)
    return Rich(content=[Text(f"Hello, {name}, from a task")])
