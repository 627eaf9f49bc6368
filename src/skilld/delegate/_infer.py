"""Inference tiers: from an intent to a program, tried in order with validate-and-retry.

1. ``templates``: the kit's patterns over the whole intent (compiled at build time);
2. ``rules``: the kit's keyword rules;
3. ``ollama``: a local model over Ollama's HTTP API (``/api/chat``), when configured;
4. ``anthropic``: Claude through the official SDK (the ``anthropic`` extra), when configured.

Templates and rules bind what they capture as the program's *parameters*: the text
of an intent never becomes program text. A model's program goes through the
validator; its problems (line, column, rule) go back to the model for a corrected
program, up to ``retries`` times, then the next tier is tried. The appliance
default configures no model: nothing reaches a network unless the operator says so.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from skilld.delegate._kits import Kit
from skilld.delegate._validate import BUILTINS, METHODS, Problem, validate
from skilld.errors import (
    CallCancelled,
    DeadlineExceeded,
    DelegateError,
    InferenceError,
    UsageError,
)

DEFAULT_RETRIES = 2
# Below this many seconds left, a model is not asked: no answer would come back in time.
MIN_MODEL_S = 0.5
# How often a call waiting for a model looks at its deadline and its client's cancel.
WAIT_SLICE_S = 0.05
OLLAMA_MODEL = "qwen2.5-coder:7b"
ANTHROPIC_MODEL = "claude-sonnet-5"
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True, slots=True)
class InferenceConfig:
    """Which model tiers run, where, and how often they may retry.

    Empty (the default) means templates and rules only. ``from_env`` reads
    ``SKILLD_DELEGATE_OLLAMA_URL``/``_MODEL`` and ``SKILLD_DELEGATE_ANTHROPIC_KEY_FILE``
    (or ``_KEY_ENV``: the name of a variable holding the key), ``_MODEL``, ``_URL``.
    """

    ollama_url: str | None = None
    ollama_model: str = OLLAMA_MODEL
    anthropic_key_file: Path | None = None
    anthropic_key_env: str | None = None
    anthropic_model: str = ANTHROPIC_MODEL
    anthropic_url: str | None = None
    retries: int = DEFAULT_RETRIES
    timeout_s: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> InferenceConfig:
        """The configuration the environment gives (nothing set: templates and rules only)."""
        e = os.environ if env is None else env
        p = "SKILLD_DELEGATE_"
        key_file = e.get(p + "ANTHROPIC_KEY_FILE")
        return cls(
            ollama_url=e.get(p + "OLLAMA_URL") or None,
            ollama_model=e.get(p + "OLLAMA_MODEL") or OLLAMA_MODEL,
            anthropic_key_file=Path(key_file) if key_file else None,
            anthropic_key_env=e.get(p + "ANTHROPIC_KEY_ENV") or None,
            anthropic_model=e.get(p + "ANTHROPIC_MODEL") or ANTHROPIC_MODEL,
            anthropic_url=e.get(p + "ANTHROPIC_URL") or None,
        )

    def tiers(self) -> list[str]:
        """The tier names that will be tried, in order."""
        out = ["templates", "rules"]
        if self.ollama_url:
            out.append("ollama")
        if self.anthropic_key_file or self.anthropic_key_env:
            out.append("anthropic")
        return out


@dataclass
class Generated:
    """A program for an intent, or why there is none."""

    program: str | None
    params: dict[str, Any]
    tier: str | None
    correction_attempts: int
    tiers_tried: list[dict[str, Any]] = field(default_factory=list)


class Model(Protocol):
    """A model tier: a chat turn in, program text out (bounded by ``timeout_s``)."""

    name: str

    def complete(self, system: str, messages: list[dict[str, str]], timeout_s: float) -> str:
        """The model's reply text.

        Raises:
            InferenceError: the provider failed or could not be reached.
        """
        ...


def infer(
    intent: str,
    kit: Kit,
    params: Mapping[str, Any],
    config: InferenceConfig,
    remaining: Callable[[], float],
    cancelled: Callable[[], bool] = lambda: False,
) -> Generated:
    """A valid program for ``intent`` over ``kit`` from the first tier that gives one.

    ``remaining`` says how many seconds the call has left; model tiers are bounded by it,
    and stop being waited for as soon as ``cancelled()`` is true.

    Raises:
        CallCancelled: the client cancelled the call while a model was asked.
        DeadlineExceeded: the call's deadline passed while a model was asked.
    """
    tried: list[dict[str, Any]] = []
    attempts = 0
    for tier, entries in (("templates", kit.templates), ("rules", kit.rules)):
        for entry in entries:
            captured = entry.match(intent)
            if captured is None:
                continue
            bound = {**captured, **params}
            problems = validate(entry.program, kit.tools, bound)
            if problems:  # compiled programs were validated at load; this is a host bug
                tried.append({"tier": tier, "id": entry.id, "problems": _texts(problems)})
                continue
            tried.append({"tier": tier, "id": entry.id, "matched": True})
            return Generated(entry.program, bound, tier, 0, tried)
        tried.append({"tier": tier, "matched": False})
    for model in _models(config):
        program, used, notes = _ask(
            model, intent, kit, params, config.retries, remaining, cancelled
        )
        attempts += used
        tried.append({"tier": model.name, **notes})
        if program is not None:
            return Generated(program, dict(params), model.name, attempts, tried)
    return Generated(None, dict(params), None, attempts, tried)


def _texts(problems: list[Problem]) -> list[str]:
    return [str(p) for p in problems]


def _ask(
    model: Model,
    intent: str,
    kit: Kit,
    params: Mapping[str, Any],
    retries: int,
    remaining: Callable[[], float],
    cancelled: Callable[[], bool],
) -> tuple[str | None, int, dict[str, Any]]:
    """(program, corrections asked for, notes) from one model with validate-and-retry."""
    system = system_prompt(kit, params)
    messages = [{"role": "user", "content": intent}]
    corrections = 0
    last: list[str] = []
    for attempt in range(retries + 1):
        budget = remaining()
        if budget <= MIN_MODEL_S:
            return None, corrections, {"error": "no time left for the model", "problems": last}
        try:
            reply = _within(model, system, messages, remaining, cancelled)
        except InferenceError as exc:
            return None, corrections, {"error": str(exc), "problems": last}
        program = extract_program(reply)
        problems = validate(program, kit.tools, params)
        if not problems:
            return program, corrections, {"attempts": attempt + 1}
        last = _texts(problems)
        if attempt == retries:
            break
        corrections += 1
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": feedback(problems)},
        ]
    return None, corrections, {"error": "no valid program", "problems": last}


def _within(
    model: Model,
    system: str,
    messages: list[dict[str, str]],
    remaining: Callable[[], float],
    cancelled: Callable[[], bool],
) -> str:
    """``model.complete`` on a helper thread, waited for until the call's deadline or its
    client's cancel, whichever comes first.

    An HTTP client's timeout bounds each read, not the whole answer: a model server that
    trickles its reply a byte at a time would hold the call past its deadline. Left
    behind, the helper (a daemon thread) ends with its own timeouts.

    Raises:
        InferenceError: the model failed.
        DeadlineExceeded: it did not answer within the call's deadline.
        CallCancelled: the client cancelled the call.
    """
    answer: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
    budget = remaining()

    def run() -> None:
        try:
            answer.put((True, model.complete(system, messages, budget)))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting call
            answer.put((False, exc))

    threading.Thread(target=run, name=f"skilld-model-{model.name}", daemon=True).start()
    while True:
        if cancelled():
            raise CallCancelled(f"the client cancelled the call while {model.name} was asked")
        left = remaining()
        if left <= 0:
            raise DeadlineExceeded(f"{model.name} did not answer within the call's deadline")
        try:
            ok, value = answer.get(timeout=min(left, WAIT_SLICE_S))
        except queue.Empty:
            continue
        if ok:
            return str(value)
        raise value


def feedback(problems: list[Problem]) -> str:
    """What a model is told when its program was refused."""
    lines = "\n".join(f"- {p}" for p in problems)
    return (
        f"The program was refused by the validator:\n{lines}\n"
        "Reply with the corrected program only, in one ```python block."
    )


def extract_program(reply: str) -> str:
    """The program in a model's reply: the first fenced block, else the whole text."""
    m = _FENCE.search(reply)
    return (m.group(1) if m else reply).strip() + "\n"


def system_prompt(kit: Kit, params: Mapping[str, Any]) -> str:
    """The instructions a model gets: the language, the kit's tools, the bound names."""
    tools = "\n".join(
        f"- {t.name}({', '.join(t.params)}): {t.description or t.skill + '/' + t.method}"
        for t in kit.tools.values()
    )
    bound = ", ".join(sorted(params)) or "none"
    return (
        "Write a short Python program that fulfils the user's intent using only these "
        f"functions:\n{tools}\n"
        "Each returns JSON data (dicts, lists, strings, numbers). Assign the final answer to "
        "`result`. Allowed: assignments, `for` over a call or a name, `if`, comprehensions, "
        "f-strings, arithmetic, comparisons, calls to the functions above and to these "
        f"builtins: {', '.join(sorted(BUILTINS))}; methods: {', '.join(sorted(METHODS))}. "
        "Not allowed: import, def, class, while, try, lambda (except as key=), names or "
        "attributes starting with '_', .format, strings containing '__'.\n"
        f"Names already bound: {bound}.\n"
        "Reply with the program only, in one ```python block."
    )


def _models(config: InferenceConfig) -> list[Model]:
    out: list[Model] = []
    if config.ollama_url:
        out.append(Ollama(config.ollama_url, config.ollama_model, config.timeout_s))
    if config.anthropic_key_file or config.anthropic_key_env:
        out.append(
            Anthropic(
                config.anthropic_model,
                config.anthropic_key_file,
                config.anthropic_key_env,
                config.anthropic_url,
                config.timeout_s,
            )
        )
    return out


class Ollama:
    """A model served by Ollama (``POST {url}/api/chat``, no streaming)."""

    name = "ollama"

    def __init__(self, url: str, model: str, timeout_s: float):
        self.url = url.rstrip("/") + "/api/chat"
        self.model = model
        self.timeout_s = timeout_s

    def complete(self, system: str, messages: list[dict[str, str]], timeout_s: float) -> str:
        """One chat turn.

        Raises:
            InferenceError: HTTP or connection failure, or a reply without a message.
        """
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "system", "content": system}, *messages],
                "stream": False,
                "options": {"temperature": 0},
            }
        ).encode()
        req = urllib.request.Request(  # noqa: S310 - the operator's configured URL
            self.url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=min(timeout_s, self.timeout_s)) as resp:  # noqa: S310
                data = json.loads(resp.read(4 * 1024 * 1024))
        except urllib.error.HTTPError as exc:
            raise InferenceError(f"ollama answered HTTP {exc.code}", location=self.url) from exc
        except (OSError, ValueError) as exc:
            raise InferenceError(f"ollama failed: {exc}", location=self.url) from exc
        content = (data.get("message") or {}).get("content") if isinstance(data, dict) else None
        if not isinstance(content, str):
            raise InferenceError("ollama's reply has no message content", location=self.url)
        return content


class Anthropic:
    """Claude through the official ``anthropic`` SDK (an optional extra)."""

    name = "anthropic"

    def __init__(
        self,
        model: str,
        key_file: Path | None,
        key_env: str | None,
        base_url: str | None,
        timeout_s: float,
    ):
        self.model = model
        self.key_file = key_file
        self.key_env = key_env
        self.base_url = base_url
        self.timeout_s = timeout_s

    def _key(self) -> str:
        if self.key_file is not None:
            try:
                key = self.key_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise InferenceError(
                    f"cannot read the Anthropic key: {exc.strerror}", location=str(self.key_file)
                ) from exc
        else:
            key = os.environ.get(self.key_env or "", "").strip()
        if not key:
            where = str(self.key_file) if self.key_file else f"${self.key_env}"
            raise InferenceError("the Anthropic key is empty", location=where)
        return key

    def complete(self, system: str, messages: list[dict[str, str]], timeout_s: float) -> str:
        """One Messages API turn.

        Raises:
            InferenceError: the SDK is missing, the key is unreadable, or the API failed.
        """
        try:
            import anthropic
        except ImportError as exc:
            raise InferenceError(
                "the anthropic tier needs the anthropic SDK",
                hint="pip install 'skilld[anthropic]'",
            ) from exc
        client = anthropic.Anthropic(
            api_key=self._key(),
            base_url=self.base_url,
            timeout=min(timeout_s, self.timeout_s),
            max_retries=0,
        )
        try:
            resp = client.messages.create(
                model=self.model,
                max_tokens=2048,
                system=system,
                messages=messages,  # type: ignore[arg-type]
            )
        except anthropic.APIError as exc:
            raise InferenceError(f"anthropic failed: {exc}", location=self.model) from exc
        finally:
            client.close()
        text = "".join(getattr(block, "text", "") for block in resp.content)
        if not text:
            raise InferenceError("anthropic's reply has no text", location=self.model)
        return text


def parse_params(items: list[str]) -> dict[str, Any]:
    """``k=v`` pairs from the command line; a value that parses as JSON is that value.

    Raises:
        UsageError: an item without ``=`` or with a bad name.
    """
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise UsageError(f"--param takes NAME=VALUE with a lowercase name, got {item!r}")
        try:
            out[name] = json.loads(value)
        except ValueError:
            out[name] = value
    return out


def no_program(intent: str, kit: Kit, generated: Generated) -> DelegateError:
    """The error when no tier produced a program."""
    return DelegateError(
        f"no tier produced a valid program for {intent!r} over kit '{kit.name}'",
        location=f"kit {kit.name}",
        hint="add a template or rule to the kit, or configure a model tier "
        "(docs/delegate.md); tried: "
        + "; ".join(str(t.get("tier")) for t in generated.tiers_tried),
    )


def monotonic_budget(deadline: float | None) -> Callable[[], float]:
    """A ``remaining`` function for a monotonic deadline (None: unbounded)."""
    if deadline is None:
        return lambda: float("inf")
    return lambda: max(0.0, deadline - time.monotonic())
