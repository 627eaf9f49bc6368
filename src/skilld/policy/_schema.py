"""The policy language: YAML documents → typed grants, with ``file:line`` errors.

A policy document (``policies/<skill>.yaml``, ``policies/defaults.yaml``) and a
skill's declared *needs* (``needs:`` in ``skill.yaml`` / the package manifest)
share one vocabulary: the sections below. :func:`parse_grants` reads either.

Each rule is a frozen value with a stable ``id`` (``notes.fs[0]``, or
``notes.<id>`` when the operator writes ``id:``), the ``source`` it came from
(``notes.yaml:12``), a ``covers`` test (is everything another rule allows
allowed by this one?) and ``meet`` (the intersection with a rule it covers or
that covers it), which the compiler uses to intersect needs with grants.

``grant.meet(need, scope)`` is always called on the grant. Leaving a key out of the
needs can only narrow what the operator granted. Where an empty value would mean
*more* (a shell rule without ``cwd`` runs in ``/``; no cap; no ``max_depth``), the
result keeps the grant's value. Where a need asks for something (methods, variable
names passed to a program, private addresses), the result is what both name, so a
need that names none gets none.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from skilld.errors import PolicyError
from skilld.policy import patterns as p
from skilld.policy._yaml import LList, LMap
from skilld.types import Limits

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
DEFAULT_HTTP_METHODS = ("GET", "HEAD")
MODES = ("ro", "rw")
DEFAULT_MAX_DEPTH = 4
MAX_DEPTH = 64  # the sandbox's invoke ceiling (sandbox/abi/invoke.py) is the same number
# \Z, not $: '$' also matches before a final newline ("notes\n" would pass).
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_./-]{1,64}\Z")
_NODE = re.compile(r"^[a-z0-9*][a-z0-9*._-]*\Z")
_CLIENT_FEATURES = ("sample", "elicit", "roots")
# How a method may run as an MCP task (``mcp.tasks``); a method not named never does.
TASK_MODES = ("optional", "required")

CAPABILITY_SECTIONS = ("fs", "http", "tcp", "shell", "env", "invoke", "transfer", "kv")
POLICY_KEYS = (
    "skill", "description", *CAPABILITY_SECTIONS, "limits", "instances", "mcp", "scripts",
    "telemetry",
)  # fmt: skip
# How an Agent Skill's scripts run (docs/agent-skills.md): the executor, the programs a
# native script may be started with, and packages baked into its environment at build.
EXECUTORS = ("wasm", "native")
_INTERPRETER = re.compile(r"^[A-Za-z0-9_.+-]{1,64}\Z")
# A fixed temporary path a skill's programs use (``/tmp/libreoffice_docx_profile``): one
# name directly under /tmp, whose sticky bit keeps the launcher's directory there its own.
_TEMP_PATH = re.compile(r"^/tmp/[A-Za-z0-9_.+@=-]{1,200}\Z")
_REQUIREMENT = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?([<>=!~]=?[A-Za-z0-9.*+!_-]+)?\Z"
)
# Needs use the grants' vocabulary; ``mcp`` there is the client interface
# (progress, logs, and ``client: [sample, elicit]``), ``log`` is always granted.
NEEDS_KEYS = (*CAPABILITY_SECTIONS, "mcp", "log")


@dataclass(frozen=True, slots=True)
class Where:
    """Where a value was written: a source name and a line (0 when unknown)."""

    source: str
    line: int = 0

    def __str__(self) -> str:
        return f"{self.source}:{self.line}" if self.line else self.source


def _fail(where: Where, message: str, hint: str | None = None) -> PolicyError:
    return PolicyError(message, location=str(where), hint=hint)


def _line(container: object, key: str | int, fallback: Where) -> Where:
    if isinstance(container, LMap) and isinstance(key, str):
        return Where(fallback.source, container.line_of(key))
    if isinstance(container, LList) and isinstance(key, int):
        return Where(fallback.source, container.line_of(key))
    if isinstance(container, LMap | LList):
        return Where(fallback.source, container.line)
    return fallback


def _mapping(value: object, where: Where, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, f"{what} must be a mapping, got {type(value).__name__}")
    return value


def _list(value: object, where: Where, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(where, f"{what} must be a list, got {type(value).__name__}")
    return value


def _check_keys(
    m: Mapping[str, Any],
    allowed: tuple[str, ...],
    where: Where,
    what: str,
    required: tuple[str, ...] = (),
) -> None:
    for key in m:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"{what} takes: {', '.join(allowed)}"
            raise _fail(_line(m, key, where), f"unknown key '{key}' in {what}", hint)
    for key in required:
        if key not in m:
            raise _fail(_line(m, "", where), f"{what} needs '{key}'")


def _str_list(value: object, where: Where, what: str) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise _fail(_line(value, i, where), f"{what} must be a non-empty string, got {item!r}")
    return tuple(items)


def _bool(value: object, where: Where, what: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, f"{what} must be true or false, got {value!r}")
    return value


def _rule_id(skill: str, section: str, index: int, m: Mapping[str, Any], where: Where) -> str:
    explicit = m.get("id")
    if explicit is None:
        return f"{skill}.{section}[{index}]"
    if not isinstance(explicit, str) or not _ID.match(explicit):
        raise _fail(
            _line(m, "id", where),
            f"bad rule id {explicit!r}: letters, digits and _.:- only, at most 64",
        )
    return f"{skill}.{explicit}"


def _addresses(value: object, where: Where) -> tuple[str, ...]:
    out = []
    for i, item in enumerate(_str_list(value, where, "addresses")):
        try:
            out.append(str(ipaddress.ip_network(item.strip("[]"), strict=True)))
        except ValueError as exc:
            raise _fail(_line(value, i, where), f"bad CIDR {item!r}: {exc}") from exc
    return tuple(out)


def _nets_cover(grant: tuple[str, ...], need: tuple[str, ...]) -> bool:
    return all(any(_subnet(n, g) for g in grant) for n in need)


def _subnet(inner: str, outer: str) -> bool:
    a, b = ipaddress.ip_network(inner), ipaddress.ip_network(outer)
    return a.version == b.version and a.subnet_of(b)  # type: ignore[arg-type]


def _nets_meet(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    keep = {x for x in a if any(_subnet(x, y) for y in b)}
    keep |= {y for y in b if any(_subnet(y, x) for x in a)}
    return tuple(sorted(keep))


def _dirs_meet(grant: tuple[str, ...], need: tuple[str, ...]) -> tuple[str, ...]:
    # The directories under both lists: for each overlapping pair, the deeper one.
    # A need without a list takes the grant's (unspecified is not "anywhere").
    if not need:
        return grant
    out = [n for n in need if any(p.path_under(n, g) for g in grant)]
    out += [g for g in grant if g not in out and any(p.path_under(g, n) for n in need)]
    return tuple(out)


def _min_opt(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


# -- rules -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FsRule:
    """Files under ``path`` (a directory tree, or a glob's matches), ``ro`` or ``rw``."""

    id: str
    source: str
    path: str
    mode: str

    @property
    def segments(self) -> tuple[str, ...]:
        """The path pattern's segments."""
        return p.parse_path_pattern(self.path)

    def covers(self, other: FsRule) -> bool:
        """Everything ``other`` allows, this allows."""
        return MODES.index(other.mode) <= MODES.index(self.mode) and p.pattern_covers(
            p.tree(self.segments), p.tree(other.segments)
        )

    def meet(self, other: FsRule, scope: FsRule) -> FsRule:
        """The intersection, scoped to ``scope`` (the narrower of the two)."""
        mode = MODES[min(MODES.index(self.mode), MODES.index(other.mode))]
        return replace(scope, id=self.id, source=self.source, mode=mode)

    def table(self) -> dict[str, Any]:
        """JSON form for the tables."""
        return {"id": self.id, "source": self.source, "path": self.path, "mode": self.mode}


@dataclass(frozen=True, slots=True)
class HttpRule:
    """Requests to URLs under ``url`` with ``methods``; private addresses only if named."""

    id: str
    source: str
    url: p.UrlPattern
    methods: tuple[str, ...]
    max_response_bytes: int | None = None
    allow_private: bool = False
    addresses: tuple[str, ...] = ()

    def covers(self, other: HttpRule) -> bool:
        """Everything ``other`` allows, this allows."""
        return (
            p.url_pattern_covers(self.url, other.url)
            and set(other.methods) <= set(self.methods)
            and (self.allow_private or not other.allow_private)
            and _nets_cover(self.addresses, other.addresses)
        )

    def meet(self, other: HttpRule, scope: HttpRule) -> HttpRule:
        """The intersection, scoped to ``scope``."""
        return replace(
            scope,
            id=self.id,
            source=self.source,
            methods=tuple(m for m in self.methods if m in other.methods),
            max_response_bytes=_min_opt(self.max_response_bytes, other.max_response_bytes),
            allow_private=self.allow_private and other.allow_private,
            addresses=_nets_meet(self.addresses, other.addresses),
        )

    def table(self) -> dict[str, Any]:
        """JSON form for the tables."""
        return {
            "id": self.id,
            "source": self.source,
            "url": str(self.url),
            "schemes": list(self.url.schemes),
            "host": str(self.url.host),
            "ports": [list(r) for r in self.url.ports] if self.url.ports else None,
            "path": self.url.path,
            "methods": list(self.methods),
            "max_response_bytes": self.max_response_bytes,
            "allow_private": self.allow_private,
            "addresses": list(self.addresses),
        }


@dataclass(frozen=True, slots=True)
class TcpRule:
    """Connections to ``host`` (name, ``*.suffix``, IP or CIDR) on ``ports``."""

    id: str
    source: str
    host: p.HostPattern
    ports: p.PortRanges
    allow_private: bool = False

    def covers(self, other: TcpRule) -> bool:
        """Everything ``other`` allows, this allows."""
        return (
            p.host_pattern_covers(self.host, other.host)
            and p.ports_cover(self.ports, other.ports)
            and (self.allow_private or not other.allow_private)
        )

    def meet(self, other: TcpRule, scope: TcpRule) -> TcpRule:
        """The intersection, scoped to ``scope``."""
        return replace(
            scope,
            id=self.id,
            source=self.source,
            allow_private=self.allow_private and other.allow_private,
        )

    def table(self) -> dict[str, Any]:
        """JSON form for the tables."""
        return {
            "id": self.id,
            "source": self.source,
            "host": str(self.host),
            "ports": [list(r) for r in self.ports],
            "allow_private": self.allow_private,
        }


@dataclass(frozen=True, slots=True)
class ShellRule:
    """``program`` with arguments matching ``args`` (whole-argument globs), in ``cwd``."""

    id: str
    source: str
    program: str
    args: tuple[str, ...] = ()
    cwd: tuple[str, ...] = ()
    timeout_ms: int | None = None
    output_bytes: int | None = None
    env: tuple[str, ...] = ()

    def covers(self, other: ShellRule) -> bool:
        """Everything ``other`` allows, this allows."""
        return (
            self.program == other.program
            and p.args_cover(self.args, other.args)
            and all(any(p.path_under(c, g) for g in self.cwd) for c in other.cwd)
            and all(any(p.name_covers(g, e) for g in self.env) for e in other.env)
        )

    def meet(self, other: ShellRule, scope: ShellRule) -> ShellRule:
        """The intersection, scoped to ``scope``; a need without ``cwd`` keeps the grant's.

        A rule without ``cwd`` runs only in ``/``, so taking the need's empty list
        would move a command out of the directories the operator chose.
        """
        return replace(
            scope,
            id=self.id,
            source=self.source,
            cwd=_dirs_meet(self.cwd, other.cwd) if self.cwd else (),
            timeout_ms=_min_opt(self.timeout_ms, other.timeout_ms),
            output_bytes=_min_opt(self.output_bytes, other.output_bytes),
        )

    def table(self) -> dict[str, Any]:
        """JSON form for the tables."""
        return {
            "id": self.id,
            "source": self.source,
            "program": self.program,
            "args": list(self.args),
            "cwd": list(self.cwd),
            "timeout_ms": self.timeout_ms,
            "output_bytes": self.output_bytes,
            "env": list(self.env),
        }


@dataclass(frozen=True, slots=True)
class EnvRule:
    """Reading the environment variable ``name`` (``PREFIX_*`` for a family)."""

    id: str
    source: str
    name: str

    def covers(self, other: EnvRule) -> bool:
        """Everything ``other`` allows, this allows."""
        return p.name_covers(self.name, other.name)

    def meet(self, other: EnvRule, scope: EnvRule) -> EnvRule:
        """The intersection, scoped to ``scope``."""
        return replace(scope, id=self.id, source=self.source)

    def table(self) -> dict[str, Any]:
        """JSON form for the tables."""
        return {"id": self.id, "source": self.source, "name": self.name}


@dataclass(frozen=True, slots=True)
class TransferRule:
    """File transfer with ``nodes`` (globs) from (``ro``) or also into (``rw``) ``paths``."""

    id: str
    source: str
    nodes: tuple[str, ...]
    paths: tuple[str, ...]
    mode: str = "ro"

    def covers(self, other: TransferRule) -> bool:
        """Everything ``other`` allows, this allows."""
        return (
            MODES.index(other.mode) <= MODES.index(self.mode)
            and all(any(p.name_covers(g, n) for g in self.nodes) for n in other.nodes)
            and all(any(p.path_under(q, g) for g in self.paths) for q in other.paths)
        )

    def meet(self, other: TransferRule, scope: TransferRule) -> TransferRule:
        """The intersection, scoped to ``scope``."""
        mode = MODES[min(MODES.index(self.mode), MODES.index(other.mode))]
        return replace(scope, id=self.id, source=self.source, mode=mode)

    def table(self) -> dict[str, Any]:
        """JSON form for the tables."""
        return {
            "id": self.id,
            "source": self.source,
            "nodes": list(self.nodes),
            "paths": list(self.paths),
            "mode": self.mode,
        }


@dataclass(frozen=True, slots=True)
class InvokeRule:
    """Which skills this one may call, which may call it, and how deep a chain may go."""

    id: str
    source: str
    calls: tuple[str, ...] = ()
    called_by: tuple[str, ...] = ()
    max_depth: int | None = None  # None: not written (DEFAULT_MAX_DEPTH in the tables)
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, hash=False)
    # A cluster: skills other nodes hold that this one may call, and ``[NODE/]SKILL``
    # patterns of skills on other nodes that may call this one (checked by this node).
    remote_calls: tuple[str, ...] = ()
    remote_called_by: tuple[str, ...] = ()

    def covers(self, other: InvokeRule) -> bool:
        """Everything ``other`` allows, this allows (a need's calls, local or remote)."""
        return set(other.calls) <= set(self.calls) | set(self.remote_calls)

    def meet(self, other: InvokeRule, scope: InvokeRule) -> InvokeRule:
        """The intersection: calls both name; who may call us is the grant's alone."""
        granted = self.max_depth or DEFAULT_MAX_DEPTH  # a grant without one stands for 4
        return replace(
            self,
            calls=tuple(c for c in self.calls if c in other.calls),
            remote_calls=tuple(c for c in self.remote_calls if c in other.calls),
            max_depth=min(granted, other.max_depth or granted),
        )

    def table(self) -> dict[str, Any]:
        """JSON form for the tables."""
        return {
            "id": self.id,
            "source": self.source,
            "calls": sorted(self.calls),
            "called_by": sorted(self.called_by),
            "max_depth": self.max_depth or DEFAULT_MAX_DEPTH,
            "remote_calls": sorted(self.remote_calls),
            "remote_called_by": sorted(self.remote_called_by),
        }


@dataclass(frozen=True, slots=True)
class KvRule:
    """A private key-value namespace."""

    id: str
    source: str

    def covers(self, other: KvRule) -> bool:
        """A namespace covers any need for one."""
        return True

    def meet(self, other: KvRule, scope: KvRule) -> KvRule:
        """The grant itself."""
        return self

    def table(self) -> dict[str, Any]:
        """JSON form for the tables."""
        return {"id": self.id, "source": self.source}


Rule = FsRule | HttpRule | TcpRule | ShellRule | EnvRule | TransferRule | InvokeRule | KvRule


@dataclass(frozen=True, slots=True)
class Exposure:
    """The ``mcp`` section: how the skill's methods become MCP tools."""

    per_skill: bool = False
    hidden: tuple[str, ...] = ()
    names: Mapping[str, str] = field(default_factory=dict)
    titles: Mapping[str, str] = field(default_factory=dict)
    descriptions: Mapping[str, str] = field(default_factory=dict)
    client: tuple[str, ...] = ()
    # method (or, per-skill, the skill id) -> "optional" | "required": may run as an MCP task
    tasks: Mapping[str, str] = field(default_factory=dict)

    def table(self) -> dict[str, Any]:
        """JSON form for the tables (``tasks`` only when some method has it, so the
        tables of a policy without it are what they were)."""
        out: dict[str, Any] = {
            "tools": "per-skill" if self.per_skill else "per-method",
            "hidden": sorted(self.hidden),
            "names": dict(self.names),
            "titles": dict(self.titles),
            "descriptions": dict(self.descriptions),
            "client": sorted(self.client),
        }
        if self.tasks:
            out["tasks"] = dict(sorted(self.tasks.items()))
        return out


@dataclass(frozen=True, slots=True)
class Grants:
    """One document's sections, parsed: a policy, the defaults, or a skill's needs."""

    source: str
    rules: Mapping[str, tuple[Rule, ...]]
    limits: Mapping[str, int] = field(default_factory=dict)
    mcp: Mapping[str, Any] = field(default_factory=dict)
    lines: Mapping[str, int] = field(default_factory=dict)
    scripts: Mapping[str, Any] = field(default_factory=dict)
    telemetry: Mapping[str, Any] = field(default_factory=dict)


# -- section parsers ---------------------------------------------------------


def _fs(skill: str, i: int, m: Mapping[str, Any], where: Where) -> FsRule:
    _check_keys(m, ("path", "mode", "id"), where, "an fs rule", ("path",))
    try:
        segments = p.parse_path_pattern(m["path"])
    except ValueError as exc:
        raise _fail(_line(m, "path", where), str(exc)) from exc
    mode = m.get("mode", "ro")
    if mode not in MODES:
        raise _fail(_line(m, "mode", where), f"mode must be ro or rw, got {mode!r}")
    return FsRule(_rule_id(skill, "fs", i, m, where), str(where), p.join_path(segments), mode)


def _http(skill: str, i: int, m: Mapping[str, Any], where: Where) -> HttpRule:
    keys = ("url", "methods", "max_response_bytes", "allow_private", "addresses", "id")
    _check_keys(m, keys, where, "an http rule", ("url",))
    try:
        url = p.parse_url_pattern(m["url"])
    except ValueError as exc:
        raise _fail(_line(m, "url", where), str(exc)) from exc
    methods: tuple[str, ...] = DEFAULT_HTTP_METHODS
    if "methods" in m:
        raw = _str_list(m["methods"], _line(m, "methods", where), "a method")
        methods = HTTP_METHODS if "*" in raw else tuple(x.upper() for x in raw)
        for x in methods:
            if x not in HTTP_METHODS:
                raise _fail(
                    _line(m, "methods", where),
                    f"unknown HTTP method {x!r}",
                    f"use {', '.join(HTTP_METHODS)} or '*'",
                )
    cap = None
    if "max_response_bytes" in m:
        try:
            cap = p.parse_size(m["max_response_bytes"])
        except ValueError as exc:
            raise _fail(_line(m, "max_response_bytes", where), str(exc)) from exc
    return HttpRule(
        _rule_id(skill, "http", i, m, where),
        str(where),
        url,
        tuple(sorted(set(methods), key=HTTP_METHODS.index)),
        cap,
        _bool(m.get("allow_private", False), _line(m, "allow_private", where), "allow_private"),
        _addresses(m.get("addresses", []), _line(m, "addresses", where)),
    )


def _tcp(skill: str, i: int, m: Mapping[str, Any], where: Where) -> TcpRule:
    _check_keys(m, ("host", "ports", "allow_private", "id"), where, "a tcp rule", ("host", "ports"))
    try:
        host = p.parse_host_pattern(m["host"], cidr=True)
    except ValueError as exc:
        raise _fail(_line(m, "host", where), str(exc)) from exc
    try:
        ports = p.parse_ports(m["ports"])
    except ValueError as exc:
        raise _fail(_line(m, "ports", where), str(exc)) from exc
    allow = _bool(m.get("allow_private", False), _line(m, "allow_private", where), "allow_private")
    return TcpRule(_rule_id(skill, "tcp", i, m, where), str(where), host, ports, allow)


def _dirs(value: object, where: Where, what: str) -> tuple[str, ...]:
    out = []
    for i, item in enumerate(_str_list(value, where, what)):
        try:
            segments = p.parse_path_pattern(item)
        except ValueError as exc:
            raise _fail(_line(value, i, where), str(exc)) from exc
        if not p.is_literal(segments):
            raise _fail(_line(value, i, where), f"{what} {item!r} must be a directory, not a glob")
        out.append(p.join_path(segments))
    return tuple(out)


def _shell(skill: str, i: int, m: Mapping[str, Any], where: Where) -> ShellRule:
    keys = ("program", "args", "cwd", "timeout", "output_bytes", "env", "id")
    _check_keys(m, keys, where, "a shell rule", ("program",))
    program = m["program"]
    pw = _line(m, "program", where)
    if not isinstance(program, str) or not program or "\x00" in program:
        raise _fail(pw, f"program must be a path or a name, got {program!r}")
    if "/" in program:
        try:
            segments = p.parse_path_pattern(program)
        except ValueError as exc:
            raise _fail(pw, f"program: {exc}") from exc
        if not p.is_literal(segments):
            raise _fail(pw, f"program {program!r} must not be a glob")
    elif any(c.isspace() for c in program) or "*" in program:
        raise _fail(pw, f"program {program!r} must be one name: arguments go in 'args'")
    args = _str_list(m.get("args", []), _line(m, "args", where), "an argument pattern")
    for k, a in enumerate(args):
        if "**" in a and (a != "**" or k != len(args) - 1):
            raise _fail(
                _line(m, "args", where), "'**' (any further arguments) only as the last pattern"
            )
    raw_env = m.get("env", [])
    env = _str_list(raw_env, _line(m, "env", where), "an environment name")
    for k, name in enumerate(env):
        ew = _line(raw_env, k, _line(m, "env", where))
        if not p.NAME_PATTERN.match(name):
            raise _fail(ew, f"bad environment variable name {name!r}")
        if name.endswith("*"):
            # The child gets each variable by name; a family would silently pass
            # nothing (or, matched, more than the operator looked at).
            raise _fail(
                ew,
                f"a shell rule's env names variables exactly, not a family: {name!r}",
                "list each variable the program needs",
            )
    timeout = output = None
    try:
        if "timeout" in m:
            timeout = p.parse_duration_ms(m["timeout"])
        if "output_bytes" in m:
            output = p.parse_size(m["output_bytes"])
    except ValueError as exc:
        key = "timeout" if "duration" in str(exc) else "output_bytes"
        raise _fail(_line(m, key, where), str(exc)) from exc
    return ShellRule(
        _rule_id(skill, "shell", i, m, where),
        str(where),
        program,
        args,
        _dirs(m.get("cwd", []), _line(m, "cwd", where), "cwd"),
        timeout,
        output,
        env,
    )


def _env(skill: str, i: int, item: object, where: Where) -> EnvRule:
    if isinstance(item, str):
        m: Mapping[str, Any] = {"name": item}
    else:
        m = _mapping(item, where, "an env entry")
        _check_keys(m, ("name", "id"), where, "an env rule", ("name",))
    name = m["name"]
    if not isinstance(name, str) or not p.NAME_PATTERN.match(name):
        raise _fail(where, f"bad environment variable name {name!r}", "use NAME or PREFIX_*")
    return EnvRule(_rule_id(skill, "env", i, m, where), str(where), name)


def _transfer(skill: str, i: int, m: Mapping[str, Any], where: Where) -> TransferRule:
    _check_keys(m, ("nodes", "paths", "mode", "id"), where, "a transfer rule", ("nodes", "paths"))
    nodes = _str_list(m["nodes"], _line(m, "nodes", where), "a node")
    for n in nodes:
        if not _NODE.match(n):
            raise _fail(_line(m, "nodes", where), f"bad node name {n!r}")
    mode = m.get("mode", "ro")
    if mode not in MODES:
        raise _fail(_line(m, "mode", where), f"mode must be ro or rw, got {mode!r}")
    paths = _dirs(m["paths"], _line(m, "paths", where), "a transfer path")
    return TransferRule(_rule_id(skill, "transfer", i, m, where), str(where), nodes, paths, mode)


def _skill_refs(value: object, where: Where, what: str, wildcard: bool) -> tuple[str, ...]:
    refs = _str_list(value, where, what)
    for i, ref in enumerate(refs):
        if not (p.SKILL_ID.match(ref) or (wildcard and ref == "*")):
            raise _fail(_line(value, i, where), f"bad skill id {ref!r} in {what}")
    return refs


def _invoke(skill: str, m: Mapping[str, Any], where: Where) -> InvokeRule:
    keys = ("calls", "called_by", "remote_calls", "remote_called_by")
    _check_keys(m, (*keys, "max_depth", "id"), where, "invoke")
    calls = _skill_refs(m.get("calls", []), _line(m, "calls", where), "calls", False)
    called_by = _skill_refs(m.get("called_by", []), _line(m, "called_by", where), "called_by", True)
    remote_calls = _skill_refs(
        m.get("remote_calls", []), _line(m, "remote_calls", where), "remote_calls", False
    )
    remote_called_by = _remote_callers(
        m.get("remote_called_by", []), _line(m, "remote_called_by", where)
    )
    depth = m.get("max_depth")
    if depth is not None and (
        not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth <= MAX_DEPTH
    ):
        raise _fail(
            _line(m, "max_depth", where), f"max_depth must be 1..{MAX_DEPTH}, got {depth!r}"
        )
    rid = f"{skill}.{m['id']}" if isinstance(m.get("id"), str) else f"{skill}.invoke"
    lines = {k: _line(m, k, where).line for k in keys if isinstance(m.get(k), list)}
    return InvokeRule(
        rid, str(where), calls, called_by, depth, lines, remote_calls, remote_called_by
    )


def _remote_callers(value: object, where: Where) -> tuple[str, ...]:
    """``remote_called_by``: ``SKILL``, ``*``, or ``NODE/SKILL`` (NODE may hold ``*``)."""
    refs = _str_list(value, where, "remote_called_by")
    for i, ref in enumerate(refs):
        node, slash, skill = ref.rpartition("/")
        node_ok = not slash or bool(_NODE.match(node))
        if not (node_ok and (skill == "*" or p.SKILL_ID.match(skill))):
            raise _fail(
                _line(value, i, where),
                f"bad entry {ref!r} in remote_called_by: write SKILL, NODE/SKILL or *",
            )
    return refs


_LIMITS: dict[str, tuple[str, Callable[[object], int]]] = {
    "memory": ("memory_bytes", p.parse_size),
    "wall_time": ("timeout_ms", p.parse_duration_ms),
    "concurrency": ("max_concurrency", lambda v: _positive_int(v)),
    "kv_quota": ("kv_total_bytes", p.parse_size),
    "kv_value": ("kv_value_bytes", p.parse_size),
    "output": ("output_bytes", p.parse_size),
    "workspace": ("workspace_bytes", p.parse_size),
    "writes": ("write_bytes", p.parse_size),
}


def _positive_int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 10_000:
        return value
    raise ValueError(f"bad count {value!r}: a whole number 1..10000")


def _limits(m: Mapping[str, Any], where: Where) -> dict[str, int]:
    _check_keys(m, tuple(_LIMITS), where, "limits")
    out = {}
    for key, value in m.items():
        name, parse = _LIMITS[key]
        try:
            out[name] = parse(value)
        except ValueError as exc:
            raise _fail(_line(m, key, where), f"limits.{key}: {exc}") from exc
    return out


# ``instances:`` (docs/runtime.md, "Warm instances"): whether one caller's calls may share
# an instance, as a word or a mapping; compiled into the limits it sets.
INSTANCE_MODES = ("warm", "fresh")
_MAX_INSTANCE_CALLS = 100_000


def _instances(value: object, where: Where) -> dict[str, int]:
    """``instances: fresh | warm`` or ``{reuse: fresh | warm, max_calls: N, idle: 30s}``."""
    m: Mapping[str, Any] = (
        {"reuse": value} if isinstance(value, str) else _mapping(value, where, "instances")
    )
    _check_keys(m, ("reuse", "max_calls", "idle"), where, "instances")
    out: dict[str, int] = {}
    reuse = m.get("reuse", "warm")
    if reuse not in INSTANCE_MODES:
        raise _fail(
            _line(m, "reuse", where) if "reuse" in m else where,
            f"instances: {reuse!r} is not one of {', '.join(INSTANCE_MODES)}",
        )
    if reuse == "fresh":
        extra = sorted(k for k in ("max_calls", "idle") if k in m)
        if extra:
            raise _fail(
                _line(m, extra[0], where),
                f"instances.{extra[0]} means nothing with a fresh instance per call: "
                "drop it or write 'reuse: warm'",
            )
        return {"instance_calls": 1}
    if "reuse" in m:
        out["instance_calls"] = Limits().instance_calls
    if "max_calls" in m:
        calls = m["max_calls"]
        if not (
            isinstance(calls, int)
            and not isinstance(calls, bool)
            and 2 <= calls <= _MAX_INSTANCE_CALLS
        ):
            raise _fail(
                _line(m, "max_calls", where),
                f"instances.max_calls: bad count {calls!r}: a whole number "
                f"2..{_MAX_INSTANCE_CALLS} (for one call per instance write 'instances: fresh')",
            )
        out["instance_calls"] = calls
    if "idle" in m:
        try:
            out["instance_idle_ms"] = p.parse_duration_ms(m["idle"])
        except ValueError as exc:
            raise _fail(_line(m, "idle", where), f"instances.idle: {exc}") from exc
    return out


def instances_text(limits: Limits) -> str:
    """What ``instances:`` decided for a skill, in words (``skilld policy explain``)."""
    if limits.fresh_instances:
        return "fresh (a new instance for every call)"
    return (
        f"warm (one caller's calls share an instance: at most {limits.instance_calls} calls, "
        f"idle at most {limits.instance_idle_ms / 1000:g} s)"
    )


def _str_map(
    value: object, where: Where, what: str, check: re.Pattern[str] | None
) -> dict[str, str]:
    m = _mapping(value, where, what)
    for k, v in m.items():
        if not isinstance(v, str) or not v or (check and not check.match(v)):
            raise _fail(_line(m, k, where), f"bad {what} value {v!r} for {k!r}")
    return dict(m)


def _mcp(m: Mapping[str, Any], where: Where, *, needs: bool = False) -> dict[str, Any]:
    keys: tuple[str, ...] = (
        "tools",
        "hidden",
        "names",
        "titles",
        "descriptions",
        "client",
        "tasks",
    )
    if needs:
        keys = ("client",)
    _check_keys(m, keys, where, "mcp")
    out: dict[str, Any] = {}
    if "tools" in m:
        if m["tools"] not in ("per-method", "per-skill"):
            raise _fail(_line(m, "tools", where), "mcp.tools must be per-method or per-skill")
        out["per_skill"] = m["tools"] == "per-skill"
    if "hidden" in m:
        out["hidden"] = _str_list(m["hidden"], _line(m, "hidden", where), "a hidden method")
    if "names" in m:
        out["names"] = _str_map(m["names"], _line(m, "names", where), "tool name", _TOOL_NAME)
    for key in ("titles", "descriptions"):
        if key in m:
            out[key] = _str_map(m[key], _line(m, key, where), key[:-1], None)
    if "client" in m:
        client = _str_list(m["client"], _line(m, "client", where), "a client feature")
        for c in client:
            if c not in _CLIENT_FEATURES:
                raise _fail(_line(m, "client", where), f"unknown client feature {c!r}")
        out["client"] = client
    if "tasks" in m:
        tasks = _str_map(m["tasks"], _line(m, "tasks", where), "task support", None)
        for method, mode in tasks.items():
            if mode not in TASK_MODES:
                raise _fail(
                    _line(m, "tasks", where),
                    f"mcp.tasks.{method} must be one of {', '.join(TASK_MODES)}, not {mode!r}",
                )
        out["tasks"] = tasks
    return out


def _telemetry(m: Mapping[str, Any], where: Where) -> dict[str, Any]:
    """The ``telemetry`` section: ``record_arguments`` (true: the spans of this skill's
    calls carry their arguments and result when tracing is on; never otherwise)."""
    _check_keys(m, ("record_arguments",), where, "telemetry")
    out: dict[str, Any] = {}
    if "record_arguments" in m:
        out["record_arguments"] = _bool(
            m["record_arguments"], _line(m, "record_arguments", where), "telemetry.record_arguments"
        )
    return out


def _scripts(m: Mapping[str, Any], where: Where) -> dict[str, Any]:
    """The ``scripts`` section: ``executor``, ``interpreters``, ``requirements``,
    ``programs`` (system programs the scripts need; the build refuses when missing),
    ``temp_paths`` (fixed directories under /tmp its programs use, made fresh for each
    call: docs/confinement.md).

    ``executor`` and ``interpreters`` are kept only when written: otherwise the build
    chooses them from what the scripts need (docs/agent-skills.md)."""
    _check_keys(
        m, ("executor", "interpreters", "requirements", "programs", "temp_paths"), where, "scripts"
    )
    out: dict[str, Any] = {}
    executor = m.get("executor")
    if executor is not None:
        if executor not in EXECUTORS:
            raise _fail(
                _line(m, "executor", where),
                f"scripts.executor must be one of {', '.join(EXECUTORS)}, got {executor!r}",
            )
        out["executor"] = executor
    iw = _line(m, "interpreters", where)
    if "interpreters" in m:
        interpreters = _str_list(m["interpreters"], iw, "an interpreter")
        for name in interpreters:
            if not _INTERPRETER.match(name):
                raise _fail(
                    iw, f"interpreter {name!r} must be a program name, not a path or command"
                )
        if executor == "wasm" and set(interpreters) - {"python"}:
            raise _fail(iw, "the wasm executor runs Python scripts only", "use executor: native")
        out["interpreters"] = sorted(set(interpreters))
    pw = _line(m, "programs", where)
    programs = _str_list(m["programs"], pw, "a program") if m.get("programs") else ()
    for name in programs:
        if not _INTERPRETER.match(name):
            raise _fail(pw, f"program {name!r} must be a program name, not a path or command")
    out["programs"] = sorted(set(programs))
    rw = _line(m, "requirements", where)
    requirements = (
        _str_list(m["requirements"], rw, "a requirement") if m.get("requirements") else ()
    )
    for req in requirements:
        if not _REQUIREMENT.match(req):
            raise _fail(rw, f"requirement {req!r} must be NAME, NAME[extra] or NAME==VERSION")
    out["requirements"] = list(requirements)
    tw = _line(m, "temp_paths", where)
    temp_paths = _str_list(m["temp_paths"], tw, "a path") if m.get("temp_paths") else ()
    for i, path in enumerate(temp_paths):
        _check_temp_path(path, _line(m["temp_paths"], i, tw))
    if temp_paths and executor == "wasm":
        raise _fail(tw, "temp_paths are for native programs", "use executor: native")
    if temp_paths:
        out["temp_paths"] = sorted(set(temp_paths))
    return out


def _check_temp_path(path: str, where: Where) -> None:
    """A temporary path must be one plain name directly under /tmp (``/tmp/NAME``)."""
    if not path.startswith("/"):
        raise _fail(where, f"temp path {path!r} must be absolute (/tmp/NAME)")
    parts = path.split("/")[1:]
    if ".." in parts or "." in parts:
        raise _fail(where, f"temp path {path!r} must not contain '.' or '..'")
    if parts[0] != "tmp":
        raise _fail(where, f"temp path {path!r} must be under /tmp")
    if not any(parts[1:]):
        raise _fail(where, "temp path '/tmp' is /tmp itself; name a directory in it")
    if not _TEMP_PATH.match(path):
        raise _fail(
            where,
            f"temp path {path!r} must be one name directly under /tmp, of letters, digits "
            "and _.+@=-",
            "the launcher makes it fresh for each call in the sticky /tmp, which keeps it "
            "the call's own",
        )


def parse_grants(
    doc: object, skill: str, source: str, *, allowed: tuple[str, ...] = POLICY_KEYS
) -> Grants:
    """Parse a policy document (or a needs mapping) for ``skill``.

    ``skill`` prefixes rule ids (``defaults`` for the defaults file); ``source``
    names the document in locations (``notes.yaml``).

    Raises:
        PolicyError: an unknown key, a bad pattern or value, with ``source:line``.
    """
    top = Where(
        source, doc.line if isinstance(doc, LMap | LList) else (1 if doc is not None else 0)
    )
    if doc is None:
        doc = {}
    m = _mapping(doc, top, "a policy document")
    _check_keys(m, allowed, top, "the document")
    rules: dict[str, tuple[Rule, ...]] = {}
    list_sections: dict[str, Callable[[str, int, Any, Where], Rule]] = {
        "fs": _fs,
        "http": _http,
        "tcp": _tcp,
        "shell": _shell,
        "transfer": _transfer,
    }
    for section, parse in list_sections.items():
        if section in m:
            sw = _line(m, section, top)
            items = _list(m[section], sw, section)
            rules[section] = tuple(
                parse(
                    skill,
                    i,
                    _mapping(item, _line(items, i, sw), f"{section} rule"),
                    _line(items, i, sw),
                )
                for i, item in enumerate(items)
            )
    if "env" in m:
        sw = _line(m, "env", top)
        items = _list(m["env"], sw, "env")
        rules["env"] = tuple(_env(skill, i, x, _line(items, i, sw)) for i, x in enumerate(items))
    if "invoke" in m and m["invoke"] is not None:
        sw = _line(m, "invoke", top)
        rules["invoke"] = (_invoke(skill, _mapping(m["invoke"], sw, "invoke"), sw),)
    if "kv" in m and m["kv"] is not False:
        sw = _line(m, "kv", top)
        kv = {} if m["kv"] is True or m["kv"] is None else _mapping(m["kv"], sw, "kv")
        _check_keys(kv, ("id",), sw, "kv")
        rid = f"{skill}.{kv['id']}" if isinstance(kv.get("id"), str) else f"{skill}.kv"
        rules["kv"] = (KvRule(rid, str(sw)),)
    seen: dict[str, str] = {}
    for group in rules.values():
        for rule in group:
            if rule.id in seen:
                raise _fail(
                    Where(rule.source), f"rule id {rule.id!r} is already used at {seen[rule.id]}"
                )
            seen[rule.id] = rule.source
    limits = (
        _limits(_mapping(m["limits"], _line(m, "limits", top), "limits"), _line(m, "limits", top))
        if "limits" in m
        else {}
    )
    if m.get("instances") is not None:
        limits = {**limits, **_instances(m["instances"], _line(m, "instances", top))}
    needs = "skill" not in allowed and "limits" not in allowed
    mcp: dict[str, Any] = {}
    if "mcp" in m and m["mcp"] is not None:
        mw = _line(m, "mcp", top)
        mcp = _mcp(_mapping(m["mcp"], mw, "mcp"), mw, needs=needs)
    if "log" in m and not (m["log"] is None or m["log"] is True or m["log"] == {}):
        raise _fail(_line(m, "log", top), "log takes no settings: write 'log: {}'")
    scripts: dict[str, Any] = {}
    if "scripts" in m and m["scripts"] is not None:
        sw = _line(m, "scripts", top)
        scripts = _scripts(_mapping(m["scripts"], sw, "scripts"), sw)
    telemetry: dict[str, Any] = {}
    if "telemetry" in m and m["telemetry"] is not None:
        tw = _line(m, "telemetry", top)
        telemetry = _telemetry(_mapping(m["telemetry"], tw, "telemetry"), tw)
    lines = {k: _line(m, k, top).line for k in m}
    return Grants(source, rules, limits, mcp, lines, scripts, telemetry)
