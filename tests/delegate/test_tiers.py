"""The inference tiers: templates and rules over MCP, Ollama and Anthropic against local servers."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from skilld.bundle import BuildResult
from skilld.delegate import InferenceConfig, parse_params
from skilld.delegate._infer import infer, system_prompt
from skilld.delegate._kits import Kit
from skilld.errors import CallCancelled, DeadlineExceeded, DelegateError, UsageError
from support.delegate import opened, service_of
from support.env import cache_dir

BAD = "Here it is:\n```python\nimport os\nresult = echo('hi')\n```"
GOOD = "```python\nresult = echo('hi') + ' ' + echo('there')\n```"
NOT_PYTHON = "```python\nwhile True:\n    result = echo('x')\n```"


class Canned:
    """A local HTTP server answering chat requests with canned replies, in order."""

    def __init__(self, replies: list[str], shape: str):
        self.replies = list(replies)
        self.shape = shape
        self.requests: list[dict[str, Any]] = []
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length))
                canned.requests.append(
                    {
                        "path": self.path,
                        "body": body,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                    }
                )
                text = canned.replies.pop(0) if canned.replies else "no more replies"
                data = json.dumps(canned.answer(text, body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, text: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.shape == "ollama":
            return {
                "model": body["model"],
                "created_at": "2026-11-23T00:00:00Z",
                "message": {"role": "assistant", "content": text},
                "done": True,
            }
        return {
            "id": f"msg_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _key(request: dict[str, Any]) -> str:
    """The API key a request carried (the SDK sends x-api-key or a bearer token)."""
    headers = request["headers"]
    return str(headers.get("x-api-key") or headers["authorization"].removeprefix("Bearer "))


@pytest.fixture
def ollama() -> Iterator[Canned]:
    """An Ollama-shaped server: a refused program first, then a corrected one."""
    server = Canned([BAD, GOOD], "ollama")
    yield server
    server.close()


@pytest.fixture
def claude() -> Iterator[Canned]:
    """An Anthropic-shaped server: a refused program first, then a corrected one."""
    server = Canned([BAD, GOOD], "anthropic")
    yield server
    server.close()


def _run(bundle: BuildResult, state: Path, config: InferenceConfig, intent: str) -> Any:
    with opened(bundle.out, state, config) as node:
        return service_of(node.registry).delegate(intent, "text")


def test_ollama_tier_corrects_a_refused_program(
    demo_bundle: BuildResult, ollama: Canned, tmp_path: Path
) -> None:
    """Ollama's first program is refused; the validator's words go back and the retry runs."""
    config = InferenceConfig(ollama_url=ollama.url, ollama_model="tiny")
    result = _run(demo_bundle, tmp_path, config, "say hi and then there")
    assert result["success"], result
    assert result["output"] == "hi there"
    assert result["generation_tier"] == "ollama"
    assert result["correction_attempts"] == 1
    assert [t["tool"] for t in result["trace"]] == ["echo", "echo"]
    assert [r["path"] for r in ollama.requests] == ["/api/chat", "/api/chat"]
    first, second = (r["body"]["messages"] for r in ollama.requests)
    assert first[0]["role"] == "system" and "echo(text)" in first[0]["content"]
    assert first[-1] == {"role": "user", "content": "say hi and then there"}
    assert "imports are not allowed" in second[-1]["content"]
    assert "line 1, column 0" in second[-1]["content"]
    assert second[-2] == {"role": "assistant", "content": BAD}


def test_anthropic_tier_with_key_file(
    demo_bundle: BuildResult, claude: Canned, tmp_path: Path
) -> None:
    """Anthropic through the official SDK: the key read from a file, a corrected retry."""
    key = tmp_path / "key"
    key.write_text("sk-test-file\n")
    config = InferenceConfig(anthropic_key_file=key, anthropic_url=claude.url)
    result = _run(demo_bundle, tmp_path / "state", config, "say hi and then there")
    assert result["success"], result
    assert result["generation_tier"] == "anthropic"
    assert result["correction_attempts"] == 1
    assert all(r["path"] == "/v1/messages" for r in claude.requests)
    assert _key(claude.requests[0]) == "sk-test-file"
    second = claude.requests[1]["body"]
    assert "Reply with the program only" in second["system"]
    assert "imports are not allowed" in second["messages"][-1]["content"]


def test_anthropic_key_from_environment(
    demo_bundle: BuildResult, claude: Canned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key may come from a named environment variable instead of a file."""
    monkeypatch.setenv("TEST_CLAUDE_KEY", "sk-test-env")
    config = InferenceConfig(anthropic_key_env="TEST_CLAUDE_KEY", anthropic_url=claude.url)
    result = _run(demo_bundle, tmp_path, config, "say hi and then there")
    assert result["success"] and result["generation_tier"] == "anthropic"
    assert _key(claude.requests[0]) == "sk-test-env"


def test_a_tier_out_of_retries_hands_over_to_the_next(
    demo_bundle: BuildResult, claude: Canned, tmp_path: Path
) -> None:
    """Ollama answers only refused programs; after its retries Anthropic's program runs."""
    stubborn = Canned([NOT_PYTHON] * 3, "ollama")
    try:
        key = tmp_path / "key"
        key.write_text("sk-test")
        config = InferenceConfig(
            ollama_url=stubborn.url, anthropic_key_file=key, anthropic_url=claude.url, retries=2
        )
        result = _run(demo_bundle, tmp_path / "state", config, "say hi and then there")
    finally:
        stubborn.close()
    assert len(stubborn.requests) == 3
    assert result["success"] and result["generation_tier"] == "anthropic"
    # two corrections asked of ollama, one of anthropic
    assert result["correction_attempts"] == 3
    ollama_try = next(t for t in result["tiers_tried"] if t["tier"] == "ollama")
    assert ollama_try["error"] == "no valid program"
    assert any("'while' is not allowed" in p for p in ollama_try["problems"])


def test_default_configuration_never_reaches_a_model(
    demo_bundle: BuildResult, ollama: Canned, tmp_path: Path
) -> None:
    """Without a configured model an intent no template or rule knows is refused; no HTTP."""
    with pytest.raises(DelegateError, match="no tier produced a valid program") as info:
        _run(demo_bundle, tmp_path, InferenceConfig(), "say hi and then there")
    assert "templates; rules" in str(info.value)
    assert ollama.requests == []
    assert InferenceConfig.from_env({}).tiers() == ["templates", "rules"]


def test_system_prompt_names_the_kit_and_bound_params(
    demo_bundle: BuildResult, tmp_path: Path
) -> None:
    """A model is told the kit's functions (positional order) and the names already bound."""
    with opened(demo_bundle.out, tmp_path) as node:
        kit = service_of(node.registry).kit("notes")
    prompt = system_prompt(kit, {"day": "monday"})
    assert "add(title, body)" in prompt and "titles()" in prompt
    assert "Names already bound: day." in prompt


def _serve_argv(bundle: Path, state: Path) -> list[str]:
    return [
        sys.executable, "-m", "skilld", "serve", "--bundle", str(bundle),
        "--transport", "stdio", "--state-dir", str(state),
    ]  # fmt: skip


def _payload(result: Any) -> Any:
    assert not result.is_error, result
    if result.structured_content is not None:
        return result.structured_content.get("result", result.structured_content)
    return json.loads("".join(getattr(c, "text", "") for c in result.content))


def test_templates_and_rules_end_to_end_over_mcp(demo_bundle: BuildResult, tmp_path: Path) -> None:
    """skilld serve lists the delegate tools; an SDK client delegates through both tiers."""
    env = {**os.environ, "SKILLD_CACHE": str(cache_dir())}
    argv = _serve_argv(demo_bundle.out, tmp_path / "state")

    async def run() -> None:
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
        with anyio.fail_after(120):
            async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
                await session.initialize()
                names = {t.name for t in (await session.list_tools()).tools}
                assert {
                    "delegate",
                    "run_program",
                    "validate_program",
                    "kit_list",
                    "kit_info",
                } <= names
                assert not any(n.startswith(("kit.", "pyrunner")) for n in names)
                kits = _payload(await session.call_tool("kit_list", {}))
                assert {k["kit"]: k["grade"]["label"] for k in kits} == {
                    "notes": "Grade(3, 1)",
                    "text": "Grade(0, 0)",
                }
                added = _payload(
                    await session.call_tool(
                        "delegate",
                        {"intent": "add a note todo saying buy milk", "kit": "notes"},
                    )
                )
                assert added["success"] and added["generation_tier"] == "templates"
                assert added["params"] == {"title": "todo", "body": "buy milk"}
                assert added["output"]["note"] == {"title": "todo", "body": "buy milk"}
                assert [t["tool"] for t in added["trace"]] == ["add", "get", "titles"]
                listed = _payload(
                    await session.call_tool(
                        "delegate", {"intent": "please list my notes", "kit": "notes"}
                    )
                )
                assert listed["success"] and listed["generation_tier"] == "rules"
                assert listed["output"] == ["todo"]
                checked = _payload(
                    await session.call_tool(
                        "validate_program", {"program": "import os", "kit": "notes"}
                    )
                )
                assert checked["valid"] is False
                assert checked["problems"][0]["rule"] == "delegate.import"
                unknown = await session.call_tool("delegate", {"intent": "x", "kit": "nope"})
                assert unknown.is_error
                assert "no kit named 'nope'" in "".join(
                    getattr(c, "text", "") for c in unknown.content
                )

    anyio.run(run)


def test_model_tiers_stop_when_the_call_has_no_time_left(
    demo_bundle: BuildResult, ollama: Canned, tmp_path: Path
) -> None:
    """A model tier is bounded by the call's deadline: with none left it is not asked."""
    with opened(demo_bundle.out, tmp_path, InferenceConfig(ollama_url=ollama.url)) as node:
        kit = service_of(node.registry).kit("text")
    generated = infer("say hi", kit, {}, InferenceConfig(ollama_url=ollama.url), lambda: 0.1)
    assert generated.program is None and ollama.requests == []
    assert generated.tiers_tried[-1] == {
        "tier": "ollama",
        "error": "no time left for the model",
        "problems": [],
    }


def test_configuration_from_the_environment() -> None:
    """SKILLD_DELEGATE_* variables turn model tiers on, in order; nothing set means none."""
    config = InferenceConfig.from_env(
        {
            "SKILLD_DELEGATE_OLLAMA_URL": "http://127.0.0.1:11434",
            "SKILLD_DELEGATE_ANTHROPIC_KEY_ENV": "MY_KEY",
            "SKILLD_DELEGATE_ANTHROPIC_MODEL": "claude-haiku-4-5",
        }
    )
    assert config.tiers() == ["templates", "rules", "ollama", "anthropic"]
    assert config.anthropic_model == "claude-haiku-4-5" and config.anthropic_key_env == "MY_KEY"


@pytest.mark.parametrize(
    ("items", "expected"),
    [(["n=3", "s=hello", "j=[1, 2]"], {"n": 3, "s": "hello", "j": [1, 2]}), ([], {})],
)
def test_params_from_the_command_line(items: list[str], expected: dict[str, Any]) -> None:
    """--param NAME=VALUE: JSON values stay typed, anything else is a string."""
    assert parse_params(items) == expected


@pytest.mark.parametrize("item", ["novalue", "Bad=1", "_x=1", "=1"])
def test_bad_params_are_usage_errors(item: str) -> None:
    """A --param without '=' or with a bad name is refused."""
    with pytest.raises(UsageError, match="--param takes NAME=VALUE"):
        parse_params([item])


class Trickle:
    """An Ollama-shaped server that sends its headers, then one byte of its reply every
    0.2 s: each read is quick, so no HTTP client's read timeout ever fires."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        trickle = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "100000")
                self.end_headers()
                while not trickle.stop.wait(0.2):
                    try:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    except OSError:
                        return

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def trickling(demo_bundle: BuildResult, tmp_path: Path) -> Iterator[tuple[InferenceConfig, Kit]]:
    """A model server that never finishes its reply, slowly; its configuration and a kit."""
    server = Trickle()
    config = InferenceConfig(ollama_url=server.url, timeout_s=30)
    with opened(demo_bundle.out, tmp_path, config) as node:
        kit = service_of(node.registry).kit("text")
    yield config, kit
    server.close()


def test_a_trickling_model_ends_at_the_deadline(trickling: tuple[InferenceConfig, Kit]) -> None:
    """A model server dripping its reply holds the call no longer than its deadline."""
    config, kit = trickling
    deadline = time.monotonic() + 1.5
    with pytest.raises(DeadlineExceeded, match="ollama did not answer"):
        infer("say hi", kit, {}, config, lambda: max(0.0, deadline - time.monotonic()))
    assert time.monotonic() - deadline < 2.0


def test_a_cancel_stops_waiting_for_the_model(trickling: tuple[InferenceConfig, Kit]) -> None:
    """The client's cancel ends a call waiting for a model at once, as ``cancelled``."""
    config, kit = trickling
    cancel_at = time.monotonic() + 0.5
    with pytest.raises(CallCancelled, match="cancelled the call while ollama was asked"):
        infer("say hi", kit, {}, config, lambda: 60.0, lambda: time.monotonic() > cancel_at)
    assert time.monotonic() - cancel_at < 2.0
