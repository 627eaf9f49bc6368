"""Load components and run one call each in a fresh store, under hard limits.

A call gets a new :class:`wasmtime.Store` (memory cap, epoch deadline, sealed
WASI whose stdout and stderr are captured) and a new instance of the
pre-compiled component. Nothing survives the call but what host functions
wrote (key-value state, files). Traps, deadlines and memory exhaustion become
:class:`~skilld.errors.GuestFault` subclasses: a failing guest costs one call.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import wasmtime
from wasmtime import component

from skilld.errors import (
    CompileError,
    DeadlineExceeded,
    GuestError,
    GuestTrap,
    LinkError,
    MemoryExhausted,
    SandboxError,
    StackExhausted,
)
from skilld.sandbox._context import CallContext, entered
from skilld.sandbox._engine import TICK_S, Engine
from skilld.sandbox._host import INTERFACES, PACKAGE, build_linker, import_name, to_py
from skilld.sandbox._native import NativeCache, load_native
from skilld.types import (
    CallOutput,
    ContentBlock,
    MethodSpec,
    PromptSpec,
    ResourceSpec,
    SkillSpec,
)

GUEST = f"{PACKAGE}/guest"
_WASI_OK = re.compile(r"^wasi:(io|clocks|random|cli|filesystem|sockets)/")


class Sandbox:
    """The engine, the linker and the native-code cache: one per process.

    Args:
        cache_dir: where native code is cached (``None``: compile in memory only).
    """

    def __init__(self, cache_dir: Path | None = None):
        self.engine = Engine()
        self.linker = build_linker(self.engine.wasmtime)
        self.cache = NativeCache(self.engine, cache_dir) if cache_dir is not None else None

    def close(self) -> None:
        """Stop the epoch ticker."""
        self.engine.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def load(self, wasm: bytes, *, name: str, granted: Iterable[str] | None = None) -> Component:
        """Compile (or load cached native code for) ``wasm`` and check its imports.

        Args:
            granted: the skilld interfaces the policy grants (``None``: all).

        Raises:
            CompileError: not a valid component.
            LinkError: it imports an interface that is not granted, or unknown imports.
        """
        if self.cache is not None:
            comp = self.cache.load(wasm, name=name)
        else:
            from skilld.sandbox._native import compile_component

            comp = compile_component(self.engine, wasm, name=name)
        return Component(self, comp, name, granted)

    def load_native(
        self, path: Path, sha256: str, *, name: str, granted: Iterable[str] | None = None
    ) -> Component:
        """Load verified native code (from a bundle) and check its imports.

        Raises:
            DigestMismatch: the file is not the expected bytes.
            CompileError, LinkError: as for :meth:`load`.
        """
        return Component(self, load_native(self.engine, path, sha256), name, granted)


@dataclass(frozen=True, slots=True)
class _Exports:
    describe: component.ExportIndex
    call: component.ExportIndex
    read_resource: component.ExportIndex
    get_prompt: component.ExportIndex


class Component:
    """A loaded skill component; :meth:`call` runs one method in a fresh instance."""

    def __init__(
        self, sandbox: Sandbox, comp: component.Component, name: str, granted: Iterable[str] | None
    ):
        self.sandbox = sandbox
        self.native = comp
        self.name = name
        self.imports = self._check_imports(granted)
        guest = comp.get_export_index(f"{GUEST}@{_abi()}")
        if guest is None:
            raise LinkError(
                f"{name}: does not export {GUEST}@{_abi()}",
                hint="build it with 'skilld skill build'",
            )
        idx = {
            n: comp.get_export_index(n, guest)
            for n in ("describe", "call", "read-resource", "get-prompt")
        }
        found = {n: i for n, i in idx.items() if i is not None}
        missing = sorted(set(idx) - set(found))
        if missing:
            raise LinkError(f"{name}: guest export lacks {', '.join(missing)}")
        self._exports = _Exports(
            found["describe"], found["call"], found["read-resource"], found["get-prompt"]
        )

    def _check_imports(self, granted: Iterable[str] | None) -> frozenset[str]:
        allowed = set(INTERFACES if granted is None else granted) | {"log"}
        used: set[str] = set()
        for imp in self.native.type.imports(self.sandbox.engine.wasmtime):
            if _WASI_OK.match(imp):
                continue
            for interface in INTERFACES:
                if imp == import_name(interface):
                    used.add(interface)
                    break
            else:
                if imp != f"{PACKAGE}/types@{_abi()}":
                    raise LinkError(f"{self.name}: imports {imp}, which skilld does not provide")
        denied = sorted(used - allowed)
        if denied:
            raise LinkError(
                f"{self.name}: imports {', '.join(denied)} but its policy does not grant "
                f"{'it' if len(denied) == 1 else 'them'}",
                hint="grant the capability in policies/, or rebuild the skill without the need",
            )
        return frozenset(used)

    # -- calls -------------------------------------------------------------

    def _run(self, ctx: CallContext, export: component.ExportIndex, *args: Any) -> Any:
        engine = self.sandbox.engine
        store = wasmtime.Store(engine.wasmtime)
        wasi = wasmtime.WasiConfig()
        wasi.stdout_custom = lambda data: ctx.capture(ctx.stdout, bytes(data))
        wasi.stderr_custom = lambda data: ctx.capture(ctx.stderr, bytes(data))
        store.set_wasi(wasi)
        store.set_limits(memory_size=ctx.limits.memory_bytes)
        # +1: the first tick may land at once, since the ticker runs on its own phase.
        store.set_epoch_deadline(math.ceil(ctx.limits.timeout_ms / 1000 / TICK_S) + 1)
        engine.ticker.enter()
        try:
            with entered(ctx):
                instance = self.sandbox.linker.instantiate(store, self.native)
                func = instance.get_func(store, export)
                if func is None:  # pragma: no cover - checked at load
                    raise LinkError(f"{self.name}: export vanished")
                result = func(store, *args)
                func.post_return(store)
                return result
        except wasmtime.WasmtimeError as exc:
            raise self._fault(exc, ctx) from None
        finally:
            engine.ticker.leave()
            ctx.close_handles()

    def _fault(self, exc: wasmtime.WasmtimeError, ctx: CallContext) -> SandboxError:
        text = str(exc)
        cause = (
            text.split("Caused by:")[-1].strip().splitlines()[0]
            if "Caused by:" in text
            else text.splitlines()[0]
        )
        where = f"skill '{ctx.skill_id}'"
        stderr = bytes(ctx.stderr).decode(errors="replace")
        if "wasm trap: interrupt" in text:
            return DeadlineExceeded(
                f"{where} ran past its deadline of {ctx.limits.timeout_ms} ms and was stopped"
            )
        if "call stack exhausted" in text:
            return StackExhausted(f"{where} overflowed its stack")
        if "MemoryError" in stderr or ("memory" in cause and "limit" in cause):
            return MemoryExhausted(
                f"{where} exceeded its memory cap of {ctx.limits.memory_bytes // (1 << 20)} MiB"
            )
        tail = f"; guest stderr: {stderr.strip()[-500:]}" if stderr.strip() else ""
        return GuestTrap(f"{where} trapped: {cause}{tail}")

    def _guest_error(self, rec: Any, ctx: CallContext) -> SandboxError | GuestError:
        err = to_py(rec)
        if err["code"] == "limit-exceeded" and "out of memory" in err["message"]:
            return MemoryExhausted(
                f"skill '{ctx.skill_id}' exceeded its memory cap of "
                f"{ctx.limits.memory_bytes // (1 << 20)} MiB"
            )
        return GuestError(
            err["code"], err["message"], rule=err["rule"], location=f"skill '{ctx.skill_id}'"
        )

    def describe(self, ctx: CallContext) -> SkillSpec:
        """Ask the guest what it is and offers.

        Raises:
            GuestFault: the guest failed; CompileError: its answer is malformed.
        """
        info = to_py(self._run(ctx, self._exports.describe))
        try:
            return SkillSpec(
                id=info["id"],
                version=info["version"],
                description=info["description"],
                methods=tuple(
                    MethodSpec(
                        m["name"],
                        m["description"],
                        json.loads(m["params_schema"]),
                        json.loads(m["result_schema"]) if m["result_schema"] else None,
                    )
                    for m in info["methods"]
                ),
                resources=tuple(
                    ResourceSpec(
                        r["uri"], r["name"], r["description"], r["mime_type"], r["template"]
                    )
                    for r in info["resources"]
                ),
                prompts=tuple(
                    PromptSpec(p["name"], p["description"], json.loads(p["arguments_schema"]))
                    for p in info["prompts"]
                ),
            )
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise CompileError(f"{self.name}: describe returned malformed data: {exc}") from exc

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        """Run ``method`` with JSON arguments in a fresh instance.

        Raises:
            GuestError: the guest returned a typed error.
            GuestFault: trap, deadline, memory or stack exhaustion.
        """
        result = self._run(ctx, self._exports.call, method, args_json)
        if result.tag == "err":
            raise self._guest_error(result.payload, ctx)
        return _output(to_py(result.payload))

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        """Read a resource the skill serves.

        Raises:
            GuestError, GuestFault: as for :meth:`call`.
        """
        result = self._run(ctx, self._exports.read_resource, uri)
        if isinstance(result, component.Record):
            raise self._guest_error(result, ctx)
        return [_output(to_py(o)) for o in result]

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        """Render a prompt to MCP messages.

        Raises:
            GuestError, GuestFault: as for :meth:`call`.
        """
        result = self._run(ctx, self._exports.get_prompt, name, args_json)
        if isinstance(result, component.Record):
            raise self._guest_error(result, ctx)
        messages = json.loads(result)
        if not isinstance(messages, list):
            raise GuestError("internal", "get-prompt did not return a JSON array")
        return messages


def _output(out: dict[str, Any]) -> CallOutput:
    try:
        value = json.loads(out["value"])
    except json.JSONDecodeError as exc:
        raise GuestError("internal", f"the skill returned invalid JSON: {exc}") from exc
    blocks = []
    for tag, payload in out["content"]:
        if tag == "text":
            blocks.append(ContentBlock("text", text=payload))
        elif tag in ("image", "audio"):
            blocks.append(
                ContentBlock(tag, mime_type=payload["mime_type"], data=bytes(payload["data"]))
            )
        else:
            blocks.append(
                ContentBlock(
                    "embedded",
                    uri=payload["uri"],
                    mime_type=payload["mime_type"],
                    text=payload["text"],
                    data=None if payload["blob"] is None else bytes(payload["blob"]),
                )
            )
    return CallOutput(value=value, content=tuple(blocks))


def _abi() -> str:
    from skilld import ABI_VERSION

    return ABI_VERSION
