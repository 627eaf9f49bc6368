"""The :class:`Skill` object, its decorators, errors and rich content values."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints, overload

from skilld_sdk.schema import coerce, doc_parts, params_schema, result_schema, to_jsonable

F = TypeVar("F", bound=Callable[..., Any])

ERROR_CODES = (
    "not-permitted",
    "not-found",
    "invalid-argument",
    "limit-exceeded",
    "timeout",
    "unavailable",
    "io",
    "cancelled",
    "internal",
)


class SkillError(Exception):
    """A typed error a method returns to its caller (the WIT ``error`` record).

    Args:
        code: one of the WIT error codes, e.g. ``not-found``, ``invalid-argument``.
        message: what went wrong, for the caller.
        rule: the policy rule behind a denial, when passing one on.
    """

    def __init__(self, code: str, message: str, rule: str | None = None):
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}; use one of {ERROR_CODES}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.rule = rule

    def __str__(self) -> str:
        rule = f", rule {self.rule}" if self.rule else ""
        return f"[{self.code}{rule}] {self.message}"


class HostError(SkillError):
    """A host function refused or failed (``code == "not-permitted"`` for denials)."""


@dataclass(frozen=True)
class Text:
    """Text content for the MCP client."""

    text: str


@dataclass(frozen=True)
class Image:
    """Image content (raw bytes and their MIME type)."""

    data: bytes
    mime_type: str = "image/png"


@dataclass(frozen=True)
class Audio:
    """Audio content (raw bytes and their MIME type)."""

    data: bytes
    mime_type: str = "audio/wav"


@dataclass(frozen=True)
class Embedded:
    """An embedded resource: text or bytes under a URI."""

    uri: str
    text: str | None = None
    blob: bytes | None = None
    mime_type: str | None = None


@dataclass(frozen=True)
class Rich:
    """A result with rich content beside (or instead of) its JSON value."""

    value: Any = None
    content: list[Text | Image | Audio | Embedded] = field(default_factory=list)


@dataclass(frozen=True)
class Method:
    """One exported method: its function, its schemas and its parameters.

    Everything is worked out at registration, which runs at build time: every call
    starts from the interpreter snapshot taken after the skill module was imported,
    so work done here is free at call time and work left for later is repeated on
    every call.
    """

    name: str
    fn: Callable[..., Any]
    description: str
    params: dict[str, Any]
    result: dict[str, Any] | None
    # (name, annotation, required) per parameter, in order.
    signature: tuple[tuple[str, Any, bool], ...] = ()

    @classmethod
    def of(
        cls,
        name: str,
        fn: Callable[..., Any],
        description: str,
        params: dict[str, Any],
        result: dict[str, Any] | None,
    ) -> Method:
        """Build a method, resolving its signature once."""
        hints = get_type_hints(fn)
        sig = tuple(
            (pname, hints.get(pname, Any), p.default is inspect.Parameter.empty)
            for pname, p in inspect.signature(fn).parameters.items()
        )
        return cls(name, fn, description, params, result, sig)

    def invoke(self, args_json: str) -> Any:
        """Parse ``args_json``, check it against the signature and call the function.

        Raises:
            SkillError: ``invalid-argument`` when the arguments do not fit.
        """
        try:
            args = json.loads(args_json) if args_json.strip() else {}
        except json.JSONDecodeError as exc:
            raise SkillError("invalid-argument", f"arguments are not JSON: {exc}") from None
        if not isinstance(args, dict):
            raise SkillError("invalid-argument", "arguments must be a JSON object")
        known = {name for name, _, _ in self.signature}
        unknown = set(args) - known
        if unknown:
            raise SkillError("invalid-argument", f"unknown argument(s): {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for name, hint, required in self.signature:
            if name not in args:
                if required:
                    raise SkillError("invalid-argument", f"missing argument '{name}'")
                continue
            try:
                kwargs[name] = coerce(args[name], hint, name)
            except TypeError as exc:
                raise SkillError("invalid-argument", str(exc)) from None
        return self.fn(**kwargs)


@dataclass(frozen=True)
class Resource:
    """A resource (or URI template with ``{name}`` parts) and its reader."""

    uri: str
    name: str
    description: str
    mime_type: str | None
    fn: Callable[..., Any]

    @property
    def template(self) -> bool:
        """True when the URI has ``{placeholders}``."""
        return "{" in self.uri

    def match(self, uri: str) -> dict[str, str] | None:
        """The placeholder values when ``uri`` matches, else None."""
        if not self.template:
            return {} if uri == self.uri else None
        pattern = "".join(
            f"(?P<{part[1:-1]}>[^/]+)" if part.startswith("{") else re.escape(part)
            for part in re.split(r"(\{\w+\})", self.uri)
        )
        m = re.fullmatch(pattern, uri)
        return m.groupdict() if m else None


@dataclass(frozen=True)
class Prompt:
    """A prompt template and its renderer."""

    name: str
    description: str
    arguments: dict[str, Any]
    fn: Callable[..., Any]


class Skill:
    """The one object a skill module defines; decorators register its parts.

    Args:
        description: overrides the description from ``skill.yaml``.
    """

    def __init__(self, description: str | None = None):
        self.description = description
        self.methods: dict[str, Method] = {}
        self.resources: list[Resource] = []
        self.prompts: dict[str, Prompt] = {}

    @overload
    def method(self, fn: F) -> F: ...
    @overload
    def method(
        self,
        fn: None = None,
        *,
        name: str | None = None,
        input_schema: dict[str, Any] | None = None,
    ) -> Callable[[F], F]: ...

    def method(
        self,
        fn: Any = None,
        *,
        name: str | None = None,
        input_schema: dict[str, Any] | None = None,
    ) -> Any:
        """Export a function as a method; its schema comes from hints and docstring.

        ``input_schema``, when given, is the schema clients see instead (JSON Schema
        2020-12, e.g. with ``$defs``/``$ref``, conditionals, or ``x-mcp-header``
        annotations); the hints still check the arguments the function gets.

        Raises:
            SchemaError: a parameter's type cannot be expressed (names the parameter).
            ValueError: two methods share a name.
        """

        def register(f: F) -> F:
            mname = name or f.__name__
            if mname in self.methods:
                raise ValueError(f"method '{mname}' is defined twice")
            summary, _ = doc_parts(f)
            params = input_schema if input_schema is not None else params_schema(f, mname)
            self.methods[mname] = Method.of(mname, f, summary, params, result_schema(f, mname))
            return f

        return register(fn) if fn is not None else register

    def resource(
        self,
        uri: str,
        *,
        name: str | None = None,
        description: str = "",
        mime_type: str | None = None,
    ) -> Callable[[F], F]:
        """Serve a resource (or a ``{placeholder}`` template); the function returns str or bytes."""

        def register(f: F) -> F:
            summary, _ = doc_parts(f)
            self.resources.append(
                Resource(uri, name or f.__name__, description or summary, mime_type, f)
            )
            return f

        return register

    def prompt(self, name: str | None = None) -> Callable[[F], F]:
        """Serve a prompt; the function returns a string or a list of MCP prompt messages."""

        def register(f: F) -> F:
            pname = name or f.__name__
            summary, _ = doc_parts(f)
            self.prompts[pname] = Prompt(pname, summary, params_schema(f, pname), f)
            return f

        return register

    def call(self, method: str, args_json: str) -> Any:
        """Run a method with JSON arguments (the host-side test path and the guest path).

        Raises:
            SkillError: unknown method, bad arguments, or the method's own error.
        """
        found = self.methods.get(method)
        if found is None:
            raise SkillError("not-found", f"no method '{method}'; methods: {sorted(self.methods)}")
        return found.invoke(args_json)


def jsonable(value: Any) -> Any:
    """Re-exported for the export glue."""
    return to_jsonable(value)
