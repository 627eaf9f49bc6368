"""Value types and protocols shared across subsystems.

Imports nothing internal, so that every package may depend on it without cycles.
The protocols here are the seams between packages: the sandbox talks to
permission checks, state and audit only through them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer of one permission check.

    ``rule`` is the id of the rule that decided; ``default-deny`` when none matched.
    """

    allowed: bool
    capability: str
    action: str
    target: str
    rule: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """The decision as a JSON-ready mapping (for audit records)."""
        return {
            "allowed": self.allowed,
            "capability": self.capability,
            "action": self.action,
            "target": self.target,
            "rule": self.rule,
            "reason": self.reason,
        }


# Decisions one audit record lists in full. A guest in a loop can take tens of thousands
# (one deadline-hit call wrote a 3.4 MB line of them); past the cap they are counted.
MAX_AUDITED_DECISIONS = 64

# What a decision past the cap is counted under: (capability, action, allowed, rule).
DecisionKey = tuple[str, str, bool, str]


def decision_key(decision: Decision) -> DecisionKey:
    """The key a decision past :data:`MAX_AUDITED_DECISIONS` is counted under."""
    return (decision.capability, decision.action, decision.allowed, decision.rule)


def decisions_beyond(counts: Mapping[DecisionKey, int]) -> dict[str, Any]:
    """The audit record's ``decisions_beyond_cap``: how many, and how many per rule.

    Its size is bounded by the policy (a rule, or ``default-deny``, per capability
    and action), never by what the guest did.
    """
    return {
        "count": sum(counts.values()),
        "by_rule": [
            {"capability": c, "action": a, "allowed": ok, "rule": r, "count": n}
            for (c, a, ok, r), n in sorted(counts.items())
        ],
    }


CallerKind = Literal["oauth", "token", "local", "anonymous", "skill", "node"]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a call: the one typed answer every entry gives (DESIGN.md, the call path).

    The transport authenticates a request and builds the caller; nothing downstream
    parses a header or a string to learn who it is. Kinds:

    - ``oauth``: a verified OAuth 2.1 access token; ``name`` is its subject, ``issuer``
      its issuer, ``scopes`` and ``groups`` from its claims.
    - ``token``: one of the operator's named bearer tokens; ``name`` is the token's name.
    - ``local``: the one local user (stdio, ``skilld call``, the CLI); ``name`` says which.
    - ``anonymous``: an HTTP client of a server that authenticates no one (loopback, or
      as the operator said); every such client is one caller.
    - ``skill``: a skill calling another (``invoke``, delegate); ``name`` is the calling
      skill, ``via`` the caller of the outer call.
    - ``node``: a call routed from cluster node ``name``; ``via`` is the entry node's
      verified caller.

    :attr:`principal` is who is ultimately behind a call (``via`` followed to the end) and
    :attr:`key` its stable identity: what owns kept outputs, tasks and rounds, what shares
    are counted under and what a warm instance is bound to. The key never depends on how
    a credential was spelled.
    """

    kind: CallerKind
    name: str = ""
    issuer: str = ""
    scopes: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    via: Caller | None = None

    @classmethod
    def local(cls, name: str = "stdio") -> Caller:
        """The local user (``stdio``, ``cli``)."""
        return cls("local", name)

    @classmethod
    def anonymous(cls) -> Caller:
        """An unauthenticated HTTP client (all of them are one caller)."""
        return cls("anonymous")

    @classmethod
    def token(cls, name: str, scopes: frozenset[str] = frozenset()) -> Caller:
        """The holder of the operator's bearer token named ``name``."""
        return cls("token", name, scopes=scopes)

    @classmethod
    def oauth(
        cls,
        issuer: str,
        subject: str,
        scopes: frozenset[str] = frozenset(),
        groups: frozenset[str] = frozenset(),
    ) -> Caller:
        """The subject of a verified OAuth access token."""
        return cls("oauth", subject, issuer=issuer, scopes=scopes, groups=groups)

    def as_skill(self, skill_id: str) -> Caller:
        """The caller of a nested call that skill ``skill_id`` makes on this caller's behalf."""
        return Caller("skill", skill_id, via=self)

    def routed_from(self, node: str) -> Caller:
        """This (entry node's verified) caller, as a worker sees it arriving from ``node``."""
        return Caller("node", node, via=self)

    @property
    def principal(self) -> Caller:
        """Who is behind the call in the end: ``via`` followed to a principal."""
        caller = self
        while caller.via is not None and caller.kind in ("skill", "node"):
            caller = caller.via
        return caller

    @property
    def key(self) -> str:
        """The principal's stable identity (``oauth:ISSUER#SUB``, ``token:NAME``, ``local``...)."""
        p = self.principal
        if p.kind == "oauth":
            return f"oauth:{p.issuer}#{p.name}"
        if p.kind in ("token", "skill", "node"):
            return f"{p.kind}:{p.name}"
        return p.kind

    def label(self) -> str:
        """A short text for logs and the audit record (``skill:notes<token:alice``)."""
        own = self.kind if not self.name else f"{self.kind}:{self.name}"
        if self.kind == "oauth":
            own = f"oauth:{self.issuer}#{self.name}"
        return own if self.via is None else f"{own}<{self.via.label()}"

    def as_dict(self) -> dict[str, Any]:
        """The caller as a JSON-ready mapping (audit records, the cluster envelope)."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.name:
            out["name"] = self.name
        if self.issuer:
            out["issuer"] = self.issuer
        if self.scopes:
            out["scopes"] = sorted(self.scopes)
        if self.groups:
            out["groups"] = sorted(self.groups)
        if self.via is not None:
            out["via"] = self.via.as_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, depth: int = 0) -> Caller:
        """The inverse of :meth:`as_dict`, for a caller carried in a verified message.

        Raises:
            ValueError: not a caller (unknown kind, wrong types, nested too deep).
        """
        if depth > 16 or not isinstance(data, Mapping):
            raise ValueError("not a caller")
        kind = data.get("kind")
        if kind not in ("oauth", "token", "local", "anonymous", "skill", "node"):
            raise ValueError(f"unknown caller kind {kind!r}")
        texts = [data.get(k, "") for k in ("name", "issuer")]
        sets = [data.get(k, []) for k in ("scopes", "groups")]
        if not all(isinstance(t, str) for t in texts) or not all(
            isinstance(s, list) and all(isinstance(x, str) for x in s) for s in sets
        ):
            raise ValueError("caller fields have the wrong types")
        via_data = data.get("via")
        via = None if via_data is None else cls.from_dict(via_data, depth=depth + 1)
        return cls(kind, texts[0], texts[1], frozenset(sets[0]), frozenset(sets[1]), via)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-call resource limits for one skill."""

    memory_bytes: int = 256 * 1024 * 1024
    timeout_ms: int = 10_000
    max_concurrency: int = 8
    kv_value_bytes: int = 1024 * 1024
    kv_total_bytes: int = 64 * 1024 * 1024
    output_bytes: int = 8 * 1024 * 1024
    # Agent Skill scripts: the per-call workspace's cap, and how much its rw grants may
    # grow in one call (accounted while it runs: skilld.agentskills._quota).
    workspace_bytes: int = 256 * 1024 * 1024
    write_bytes: int = 64 * 1024 * 1024
    # Warm instances (policy ``instances:``, docs/runtime.md): how many calls of one caller
    # one instance may serve (1: a fresh instance per call), and how long it may sit idle.
    instance_calls: int = 1000
    instance_idle_ms: int = 60_000

    @property
    def fresh_instances(self) -> bool:
        """Every call gets an instance no other call touched (``instances: fresh``)."""
        return self.instance_calls <= 1


@runtime_checkable
class PermissionChecker(Protocol):
    """Answers whether one skill may perform one action on one target.

    Questions are asked typed, never formatted into text and parsed back: a file as
    its canonical path, a request as (URL, method), a command as its argv, an address
    as (ip, port, host), a connection as (host, port). :meth:`check` asks the rest,
    whose target is one plain name (a kv key, an env name, a skill to invoke, a
    working directory, a transfer's ``NODE:PATH``, an MCP client request). Implementations must be
    cheap (microseconds) and must never raise for a well-formed question: a refusal
    is a :class:`Decision` with ``allowed=False``.
    """

    def check(self, capability: str, action: str, target: str) -> Decision:
        """Decide ``action`` (e.g. ``read``) on ``target`` (e.g. a path) for ``capability``."""
        ...

    def check_path(self, path: str, write: bool = False, *, action: str | None = None) -> Decision:
        """May the skill read (or write) the canonical absolute ``path`` (``fs``)?

        ``action`` names the host call in the decision (``list``, ``mkdir``, ...);
        ``write`` says whether it needs a writable grant.
        """
        ...

    def check_url(self, url: str, method: str = "GET") -> Decision:
        """May the skill send ``method`` to ``url`` (``http``, before resolution)?"""
        ...

    def check_argv(self, argv: Sequence[str], cwd: str | None = None) -> Decision:
        """May the skill run ``argv`` (``shell.run``)? Every argument is data."""
        ...

    def check_address(
        self, ip: str, port: int, capability: str = "http", host: str | None = None
    ) -> Decision:
        """May ``capability`` (http or tcp) connect to ``ip``, which ``host`` resolved to?"""
        ...

    def check_tcp(self, host: str, port: int) -> Decision:
        """May the skill open a TCP connection to ``host`` on ``port`` (before resolution)?"""
        ...


@runtime_checkable
class KeyValueStore(Protocol):
    """One skill's private key-value namespace.

    Raises ``StateError`` (or ``QuotaExceeded``) from every method on failure. A
    ``set`` that returns has reached stable storage.

    A store may also offer ``within(seconds)``, a context manager bounding how long the
    operations made inside it may wait (for a lock, for a server); the ``kv`` host
    interface uses it to keep every operation inside the guest call's deadline.
    """

    def get(self, key: str) -> bytes | None:
        """The value stored under ``key``, or ``None``."""
        ...

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``, durably, before returning."""
        ...

    def delete(self, key: str) -> bool:
        """Remove ``key``; True when it existed."""
        ...

    def keys(self, prefix: str, limit: int) -> Sequence[str]:
        """Keys starting with ``prefix`` in order, at most ``limit``."""
        ...


@runtime_checkable
class AuditSink(Protocol):
    """Receives one audit record (a JSON-ready mapping) per call.

    Raises ``AuditError`` when the record cannot be kept.
    """

    def emit(self, record: Mapping[str, Any]) -> None:
        """Record one finished call."""
        ...


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """One method a skill describes: JSON Schemas as parsed objects."""

    name: str
    description: str
    params_schema: Mapping[str, Any]
    result_schema: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """A resource or URI template a skill serves."""

    uri: str
    name: str
    description: str
    mime_type: str | None = None
    template: bool = False


@dataclass(frozen=True, slots=True)
class PromptSpec:
    """A prompt a skill serves."""

    name: str
    description: str
    arguments_schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SkillSpec:
    """What a skill's ``describe`` export says about it."""

    id: str
    version: str
    description: str
    methods: tuple[MethodSpec, ...] = ()
    resources: tuple[ResourceSpec, ...] = ()
    prompts: tuple[PromptSpec, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form (kept in ``bundle.lock``; printed by ``skilld call --describe``)."""
        return {
            "id": self.id,
            "version": self.version,
            "description": self.description,
            "methods": [
                {
                    "name": m.name,
                    "description": m.description,
                    "params": m.params_schema,
                    "result": m.result_schema,
                }
                for m in self.methods
            ],
            "resources": [
                {
                    "uri": r.uri,
                    "name": r.name,
                    "description": r.description,
                    "mime_type": r.mime_type,
                    "template": r.template,
                }
                for r in self.resources
            ],
            "prompts": [
                {"name": p.name, "description": p.description, "arguments": p.arguments_schema}
                for p in self.prompts
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SkillSpec:
        """The inverse of :meth:`as_dict`.

        Raises:
            KeyError, TypeError: ``data`` is not in that form.
        """
        return cls(
            id=data["id"],
            version=data["version"],
            description=data["description"],
            methods=tuple(
                MethodSpec(m["name"], m["description"], m["params"], m["result"])
                for m in data["methods"]
            ),
            resources=tuple(
                ResourceSpec(r["uri"], r["name"], r["description"], r["mime_type"], r["template"])
                for r in data["resources"]
            ),
            prompts=tuple(
                PromptSpec(p["name"], p["description"], p["arguments"]) for p in data["prompts"]
            ),
        )


@dataclass(frozen=True, slots=True)
class ContentBlock:
    """Rich content beside a result's JSON value (``kind``: text, image, audio, embedded)."""

    kind: str
    text: str | None = None
    mime_type: str | None = None
    data: bytes | None = None
    uri: str | None = None


@dataclass(frozen=True, slots=True)
class CallOutput:
    """What one successful guest call returned."""

    value: Any
    content: tuple[ContentBlock, ...] = field(default_factory=tuple)


LOG_LEVELS: tuple[str, ...] = (
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
)
"""The levels a guest may log at: RFC 5424's, in the order MCP's ``logging/setLevel`` uses."""

LOG_LEVEL_ALIASES: Mapping[str, str] = {"warn": "warning", "fatal": "critical", "trace": "debug"}
"""Other names guests use for a level (any case), and the level each stands for."""


class ClientChannel(Protocol):
    """The MCP client on the other end of one call, as the guest sees it.

    Called from the worker thread that runs the guest. ``sample`` and ``elicit``
    block until the client answers and raise ``GuestError`` (code ``unavailable``)
    when the client cannot do it.
    """

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Send a progress notification if the client asked for progress."""
        ...

    def log(self, level: str, data: Any) -> None:
        """Send a log message notification to the client."""
        ...

    def sample(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Send ``sampling/createMessage`` and return the client's result."""
        ...

    def elicit(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Send ``elicitation/create`` and return the client's result."""
        ...

    def cancelled(self) -> bool:
        """True once the client cancelled this call."""
        ...
