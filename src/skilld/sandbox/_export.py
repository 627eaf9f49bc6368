"""Call a component export with its types read once per component, not once per call.

wasmtime-py's ``component.Func.__call__`` asks the C library for the function's type
on every call, and converting the answer back asks again for every nested type (a
record's fields, a variant's cases, a list's element): for a guest's ``call`` that is
11 value types built and freed per call, and each string crosses through a
ctypes array type made for its length. In process, on a warm ``echo/echo`` call that
took 16 µs (type) + 14 µs (arguments) + 57 µs (result) around a 52 µs guest
(docs/runtime.md, "Wave 7"). :class:`ExportCall` reads the types once, when a
component's export is first called, turns them into a tree of small converters, and
then does per call what ``Func.__call__`` does: the same C calls in the same order,
the same values built (``component.Record``, ``component.Variant``, lists, ``bytes``
for ``list<u8>``, ``None`` for an empty option), the same frees.

The types are the component's: every instance of it (every store) has the same ones,
so one :class:`ExportCall` serves all of them. Kinds this module does not convert
itself (tuples, flags, resources, ...) fall back to wasmtime-py's own converter for
that type, which is correct, only slower. Pinned to wasmtime-py 50 (``pyproject.toml``),
whose private ``_func``/``_context`` it uses, as ``_gil.py`` and ``_sandbox.py`` already
use its C bindings.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from ctypes import byref
from typing import Any

from wasmtime import _ffi as ffi
from wasmtime import component
from wasmtime.component._enter import enter_wasm

# One converter per type: from a C value (which it consumes) to the Python value.
Lift = Callable[[Any], Any]

_BOOL = ffi.WASMTIME_COMPONENT_BOOL
_STRING = ffi.WASMTIME_COMPONENT_STRING


def _text(vec: Any) -> str:
    """A C byte vector's UTF-8 text (without ``ffi.to_str``'s per-length array type)."""
    size = vec.size
    return ctypes.string_at(vec.data, size).decode("utf-8") if size else ""


def _lift_string(c: Any) -> str:
    text = _text(c.of.string)
    ffi.wasm_byte_vec_delete(byref(c.of.string))
    return text


def _cleared(val: Any) -> None:
    """Mark a converted C value empty, so its container's delete does not free it again."""
    val.kind = _BOOL
    val.of.boolean = False


def _record(ty: component.RecordType) -> Lift:
    fields = [(name, lifter(sub)) for name, sub in ty.fields]

    def lift(c: Any) -> Any:
        try:
            ret = component.Record()
            data = c.of.record.data
            for i, (name, sub) in zip(range(c.of.record.size), fields, strict=False):
                raw = data[i]
                setattr(ret, name, sub(raw.val))
                _cleared(raw.val)
            return ret
        finally:
            ffi.wasmtime_component_valrecord_delete(c.of.record)

    return lift


def _list(ty: component.ListType) -> Lift:
    element = lifter(ty.element)
    as_bytes = ty._is_bytes()

    def lift(c: Any) -> Any:
        try:
            ret = []
            data = c.of.tuple.data
            for i in range(c.of.record.size):
                raw = data[i]
                ret.append(element(raw))
                _cleared(raw)
            return bytes(ret) if as_bytes else ret
        finally:
            ffi.wasmtime_component_valtuple_delete(byref(c.of.tuple))

    return lift


def _cases(ty: Any) -> Callable[[str, Any], Any]:
    """``VariantLikeType._lift`` with the cases read once: (tag, payload pointer) -> value."""
    tagged = ty._tagged()
    cases = {name: None if sub is None else lifter(sub) for name, sub in ty._cases()}

    def lift(tag: str, ptr: Any) -> Any:
        if tag not in cases:
            raise ValueError(f"tag {tag} not found in variant cases")
        sub = cases[tag]
        if sub is None:
            return component.Variant(tag) if tagged else None
        payload = sub(ptr.contents)
        _cleared(ptr.contents)
        ffi.wasmtime_component_val_delete(ptr)
        return component.Variant(tag, payload) if tagged else payload

    return lift


def _variant(ty: component.VariantType) -> Lift:
    cases = _cases(ty)

    def lift(c: Any) -> Any:
        tag = _text(c.of.variant.discriminant)
        ffi.wasm_byte_vec_delete(byref(c.of.variant.discriminant))
        return cases(tag, c.of.variant.val)

    return lift


def _option(ty: component.OptionType) -> Lift:
    cases = _cases(ty)
    return lambda c: cases("some" if c.of.option else "none", c.of.option)


def _result(ty: component.ResultType) -> Lift:
    cases = _cases(ty)
    return lambda c: cases("ok" if c.of.result.is_ok else "err", c.of.result.val)


def lifter(ty: Any) -> Lift:
    """The converter for values of type ``ty`` (its nested types read now, once)."""
    if isinstance(ty, component.String):
        return _lift_string
    if isinstance(ty, component.RecordType):
        return _record(ty)
    if isinstance(ty, component.ListType):
        return _list(ty)
    if isinstance(ty, component.ResultType):
        return _result(ty)
    if isinstance(ty, component.OptionType):
        return _option(ty)
    if isinstance(ty, component.VariantType):
        return _variant(ty)
    # Scalars read no type; the rest (tuples, flags, enums, resources) are rare here.
    convert: Lift = ty.convert_from_c
    return convert


class ExportCall:
    """Calls of one export of one component, its types read from the first instance's func.

    ``call(func, store, *params)`` returns what ``func(store, *params)`` returns; for
    a function whose parameters are not all strings it is exactly that call.
    """

    def __init__(self, func: component.Func, store: Any):
        """Read ``func``'s type (from ``store``, one of the component's instances' stores)."""
        fty = func.type(store)
        params = fty.params
        self._strings = all(isinstance(ty, component.String) for _name, ty in params)
        self._count = len(params)
        self._array = ffi.wasmtime_component_val_t * self._count
        result = fty.result
        self._lift: Lift | None = None if result is None else lifter(result)

    def __call__(self, func: component.Func, store: Any, *params: Any) -> Any:
        """Call ``func`` in ``store`` with ``params``; its result as wasmtime-py gives it.

        Raises:
            TypeError: the wrong number of parameters.
            wasmtime.WasmtimeError: the guest trapped (as ``Func.__call__``).
        """
        if not self._strings or not all(isinstance(p, str) for p in params):
            return func(store, *params)
        if len(params) != self._count:
            raise TypeError(
                f"wrong number of parameters provided: given {len(params)}, expected {self._count}"
            )
        capi = self._array()
        n = 0
        try:
            for value in params:
                data = value.encode("utf-8")
                slot = capi[n]
                vec = ffi.wasm_byte_vec_t()
                ffi.wasm_byte_vec_new_uninitialized(byref(vec), len(data))
                ctypes.memmove(vec.data, data, len(data))
                slot.of.string = vec
                slot.kind = _STRING
                n += 1
            space = ffi.wasmtime_component_val_t() if self._lift is not None else None
            out = None if space is None else byref(space)
            raw = func._func
            context = store._context()
            enter_wasm(
                lambda: ffi.wasmtime_component_func_call(
                    byref(raw), context, capi, n, out, 0 if space is None else 1
                )
            )
            if self._lift is None:
                return None
            return self._lift(space)
        finally:
            for i in range(n):
                ffi.wasmtime_component_val_delete(byref(capi[i]))
