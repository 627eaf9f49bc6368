"""The linker: WASI (sealed) plus every ``skilld:skill`` import, adapted to wasmtime.

One linker serves every skill: host functions find the call they act for
through the thread-local :func:`~skilld.call.current`. Nothing a
host function raises may escape into wasmtime (its exception slot is a
process global), so every adapter turns failures into the WIT ``error`` value,
and a host bug into an ``internal`` error recorded on the call.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from wasmtime import component

from skilld import ABI_VERSION, telemetry
from skilld.call import current
from skilld.errors import ErrorCode, HostCallError, PermissionDenied
from skilld.sandbox.abi import Functions, HostFn, Kind

log = logging.getLogger("skilld.sandbox")

PACKAGE = "skilld:skill"
INTERFACES = ("log", "kv", "fs", "http", "tcp", "shell", "invoke", "transfer", "env", "mcp")


def import_name(interface: str) -> str:
    """The component import name of a skilld interface, e.g. ``skilld:skill/kv@0.1.0``."""
    return f"{PACKAGE}/{interface}@{ABI_VERSION}"


def to_py(value: Any) -> Any:
    """wasmtime values to plain Python: records to dicts with snake_case keys."""
    if isinstance(value, component.Record):
        return {k.replace("-", "_"): to_py(v) for k, v in vars(value).items()}
    if isinstance(value, component.Variant):
        return (value.tag, to_py(value.payload))
    if isinstance(value, list):
        return [to_py(v) for v in value]
    return value


def to_wit(value: Any) -> Any:
    """Plain Python to wasmtime values: dicts to records with kebab-case fields."""
    if isinstance(value, dict):
        rec = component.Record()
        for k, v in value.items():
            setattr(rec, k.replace("_", "-"), to_wit(v))
        return rec
    if isinstance(value, list):
        return [to_wit(v) for v in value]
    return value


def error_record(code: str, message: str, rule: str | None) -> component.Record:
    """The WIT ``error`` record."""
    rec: component.Record = to_wit({"code": str(code), "message": message, "rule": rule})
    return rec


def _adapt(interface: str, name: str, fn: HostFn, kind: Kind) -> Any:
    def ok(value: Any) -> Any:
        if kind == "result-tagged":
            return component.Variant("ok", to_wit(value))
        return to_wit(value)

    def err(code: str, message: str, rule: str | None) -> Any:
        rec = error_record(code, message, rule)
        return component.Variant("err", rec) if kind == "result-tagged" else rec

    span_name = f"skilld.host {interface}.{name}"

    def host_function(_store: Any, *args: Any) -> Any:
        ctx = current()
        try:
            with telemetry.span(span_name):
                value = fn(ctx, *[to_py(a) for a in args])
        except HostCallError as exc:
            return None if kind == "plain" else err(exc.code, exc.message, exc.rule)
        except PermissionDenied as exc:
            return None if kind == "plain" else err(ErrorCode.NOT_PERMITTED, exc.message, exc.rule)
        except Exception as exc:  # a host bug must cost one call, never the host
            log.exception("host function %s.%s failed", interface, name)
            ctx.record_fault(f"{interface}.{name}: {type(exc).__name__}: {exc}")
            return (
                None
                if kind == "plain"
                else err("internal", f"host error in {interface}.{name}", None)
            )
        if kind == "plain":
            return value
        return ok(value)

    return host_function


def functions_of(interface: str) -> Functions:
    """The host implementation of one interface (``skilld.sandbox.abi.INTERFACE``)."""
    module = importlib.import_module(f"skilld.sandbox.abi.{interface}")
    fns: Functions = module.FUNCTIONS
    return fns


def build_linker(engine: Any) -> component.Linker:
    """A linker with sealed WASI and every skilld import defined."""
    linker = component.Linker(engine)
    linker.add_wasip2()
    with linker.root() as root:
        for interface in INTERFACES:
            with root.add_instance(import_name(interface)) as inst:
                for name, (fn, kind) in functions_of(interface).items():
                    inst.add_func(name, _adapt(interface, name, fn, kind))
    return linker
