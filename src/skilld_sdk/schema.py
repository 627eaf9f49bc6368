"""JSON Schema from Python type hints, the way the MCP SDK does it for native tools.

Pure Python with no dependencies: it runs on the host (tests, ``skilld skill``)
and inside componentize-py guests alike.

Supported: ``str``, ``int``, the unsigned :data:`u8` / :data:`u16` / :data:`u32` /
:data:`u64` (``minimum: 0`` and the type's ``maximum`` in the schema, so a negative
number is refused before the guest runs), ``float``, ``bool``, ``None``, ``list[T]``,
``tuple[T, ...]``, ``set[T]``, ``dict[str, T]``, ``Optional[T]`` / ``T | None``,
unions, ``Literal[...]``, ``TypedDict``, dataclasses, and ``Any``. Anything else
raises :class:`SchemaError` naming the parameter. :func:`coerce` is never looser
than the schema (a bool is never a ``Literal`` int, a TypedDict's required keys are
required); it is stricter in one place: ``1.0`` is not an ``int``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
from collections.abc import Callable
from typing import Any, Literal, NewType, Union, get_args, get_origin, get_type_hints

__all__ = [
    "SchemaError",
    "coerce",
    "params_schema",
    "result_schema",
    "to_jsonable",
    "u8",
    "u16",
    "u32",
    "u64",
]

# Unsigned integers, as the WIT types a host call takes (``kv.keys``'s ``limit`` is a
# u32): a plain ``int`` passed on to such a call would trap on a negative value.
u8 = NewType("u8", int)
u16 = NewType("u16", int)
u32 = NewType("u32", int)
u64 = NewType("u64", int)
_UNSIGNED: dict[Any, int] = {u8: 8, u16: 16, u32: 32, u64: 64}


class SchemaError(TypeError):
    """A method's signature cannot be expressed as JSON Schema (names the parameter)."""


_NoneType = type(None)


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__")


def type_schema(tp: Any, where: str) -> dict[str, Any]:
    """JSON Schema for one annotation; ``where`` names it in errors.

    Raises:
        SchemaError: the annotation is not a supported type.
    """
    if tp is Any:
        return {}
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp in _UNSIGNED:
        return {"type": "integer", "minimum": 0, "maximum": (1 << _UNSIGNED[tp]) - 1}
    if tp is float:
        return {"type": "number"}
    if tp is None or tp is _NoneType:
        return {"type": "null"}
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Literal:
        if not all(isinstance(a, (str, int, bool)) or a is None for a in args):
            raise SchemaError(f"{where}: Literal values must be str, int, bool or None")
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not _NoneType]
        schemas = [type_schema(a, where) for a in options]
        if len(options) < len(args):
            schemas.append({"type": "null"})
        return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if origin in (list, tuple, set, frozenset) or tp in (list,):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise SchemaError(f"{where}: only tuple[T, ...] is supported, not {_name(tp)}")
        item = args[0] if args else Any
        return {"type": "array", "items": type_schema(item, f"{where}[]")}
    if origin is dict or tp is dict:
        key, value = args if args else (str, Any)
        if key is not str:
            raise SchemaError(f"{where}: dict keys must be str, not {_name(key)}")
        return {"type": "object", "additionalProperties": type_schema(value, f"{where}{{}}")}
    if _is_typeddict(tp):
        hints = get_type_hints(tp)
        required = sorted(getattr(tp, "__required_keys__", hints.keys()))
        return {
            "type": "object",
            "title": tp.__name__,
            "properties": {k: type_schema(v, f"{where}.{k}") for k, v in hints.items()},
            "required": required,
            "additionalProperties": False,
        }
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = get_type_hints(tp)
        props: dict[str, Any] = {}
        required = []
        for f in dataclasses.fields(tp):
            props[f.name] = type_schema(hints[f.name], f"{where}.{f.name}")
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.append(f.name)
            elif f.default is not dataclasses.MISSING and _json_default(f.default):
                props[f.name]["default"] = f.default
        return {
            "type": "object",
            "title": tp.__name__,
            "properties": props,
            "required": required,
            "additionalProperties": False,
        }
    raise SchemaError(f"{where}: unsupported type {_name(tp)}")


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or repr(tp)


def _json_default(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


_ARG_LINE = re.compile(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")


def doc_parts(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The summary of a docstring and its Google-style ``Args:`` descriptions."""
    doc = inspect.getdoc(fn) or ""
    summary_lines: list[str] = []
    params: dict[str, str] = {}
    section = "summary"
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            section, current = "args", None
            continue
        if stripped.endswith(":") and stripped[:-1] in ("Returns", "Raises", "Yields", "Example"):
            section = "other"
            continue
        if section == "summary":
            summary_lines.append(line)
        elif section == "args":
            match = _ARG_LINE.match("  " + line if not line.startswith("  ") else line)
            if match and not line.startswith(" " * 6):
                current = match.group(1)
                params[current] = match.group(2).strip()
            elif current and stripped:
                params[current] += " " + stripped
    summary = "\n".join(summary_lines).strip()
    return summary, params


def params_schema(fn: Callable[..., Any], method: str) -> dict[str, Any]:
    """The JSON Schema of a method's parameters (an object with one property each).

    Raises:
        SchemaError: a parameter lacks an annotation or has an unsupported type;
            the message names the method and the parameter.
    """
    sig = inspect.signature(fn)
    try:
        hints = get_type_hints(fn)
    except Exception as exc:
        raise SchemaError(f"method '{method}': cannot resolve type hints: {exc}") from exc
    _, descriptions = doc_parts(fn)
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise SchemaError(
                f"method '{method}', parameter '{name}': *args/**kwargs are not supported"
            )
        if name not in hints:
            raise SchemaError(f"method '{method}', parameter '{name}': missing type annotation")
        schema = type_schema(hints[name], f"method '{method}', parameter '{name}'")
        if name in descriptions:
            schema = {**schema, "description": descriptions[name]}
        if param.default is inspect.Parameter.empty:
            required.append(name)
        elif _json_default(param.default):
            schema = {**schema, "default": param.default}
        props[name] = schema
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


def result_schema(fn: Callable[..., Any], method: str) -> dict[str, Any] | None:
    """The JSON Schema of a method's return value, or None when it does not say.

    MCP structured output needs an object schema, so scalars are not declared.

    Raises:
        SchemaError: the return annotation is not a supported type.
    """
    hints = get_type_hints(fn)
    if "return" not in hints or hints["return"] in (None, _NoneType, Any):
        return None
    if getattr(hints["return"], "__name__", "") == "Rich":  # content, not a structured value
        return None
    schema = type_schema(hints["return"], f"method '{method}', return value")
    return schema if schema.get("type") == "object" else None


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Turn a JSON value into ``tp`` (dataclasses built from objects), checking shape.

    Raises:
        TypeError: the value does not fit the annotation; the message says where.
    """
    if tp is Any:
        return value
    origin = get_origin(tp)
    args = get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and _NoneType in args:
            return None
        errors = []
        for option in args:
            if option is _NoneType:
                continue
            try:
                return coerce(value, option, where)
            except TypeError as exc:
                errors.append(str(exc))
        raise TypeError(f"{where}: {value!r} matches none of the allowed types")
    if origin is Literal:
        # Equality alone is looser than the schema's enum: True == 1 and 0 == False.
        if not any(type(value) is type(a) and value == a for a in args):
            raise TypeError(f"{where}: must be one of {list(args)}, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{where}: expected a number, got {type(value).__name__}")
        return float(value)
    if tp is int or tp in _UNSIGNED:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{where}: expected an integer, got {type(value).__name__}")
        if tp in _UNSIGNED and not 0 <= value < (1 << _UNSIGNED[tp]):
            raise TypeError(f"{where}: must be between 0 and {(1 << _UNSIGNED[tp]) - 1}")
        return value
    if tp in (str, bool):
        if type(value) is not tp:
            raise TypeError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
        return value
    if tp is None or tp is _NoneType:
        if value is not None:
            raise TypeError(f"{where}: expected null")
        return None
    if origin in (list, tuple, set, frozenset) or tp is list:
        if not isinstance(value, list):
            raise TypeError(f"{where}: expected an array, got {type(value).__name__}")
        item = args[0] if args else Any
        items = [coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return (origin or list)(items) if origin not in (None, list) else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected an object, got {type(value).__name__}")
        vt = args[1] if args else Any
        return {k: coerce(v, vt, f"{where}.{k}") for k, v in value.items()}
    if _is_typeddict(tp) or (dataclasses.is_dataclass(tp) and isinstance(tp, type)):
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected an object, got {type(value).__name__}")
        hints = get_type_hints(tp)
        unknown = set(value) - set(hints)
        if unknown:
            raise TypeError(f"{where}: unknown field(s) {sorted(unknown)}")
        # A dataclass's constructor refuses missing fields; a TypedDict's does not.
        missing = set(getattr(tp, "__required_keys__", ())) - set(value)
        if missing:
            raise TypeError(f"{where}: missing field(s) {sorted(missing)}")
        fields = {k: coerce(v, hints[k], f"{where}.{k}") for k, v in value.items()}
        try:
            return tp(**fields)
        except TypeError as exc:
            raise TypeError(f"{where}: {exc}") from None
    raise TypeError(f"{where}: unsupported type {_name(tp)}")


def to_jsonable(value: Any) -> Any:
    """Dataclasses to dicts, tuples and sets to lists, recursively; the rest as is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    return value
