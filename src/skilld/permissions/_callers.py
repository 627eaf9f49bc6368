"""Who may list and call what: the one typed question, answered from the ``callers`` table.

::

    policy = CallerPolicy.from_tables(tables)
    policy.may(caller, "call", Target("tool", "notes/add", "notes"))   # a Decision

The principal behind the caller decides (``caller.principal``: a nested call acts for
the client of the outer call, a routed call for the entry node's verified caller).
A deny rule that covers the question wins; else the first allow rule that does; else
an unauthenticated principal (``local``, ``anonymous``) that no allow rule names keeps
every right (the table's ``open``), and everyone else gets ``default-deny``.

The rules of one principal are gathered once into dictionaries (skill, exact name) and
a short list of wildcard patterns, and kept per principal, so a question is a few dict
lookups: ``bench/bench_callers.py`` measures it beside Cedar's evaluator.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from skilld.permissions._checker import DEFAULT_DENY
from skilld.policy import Tables
from skilld.types import Caller, Decision

CAPABILITY = "caller"
TargetKind = Literal["tool", "prompt", "resource", "skill"]
Action = Literal["list", "call"]
TARGET_KINDS: tuple[TargetKind, ...] = ("tool", "prompt", "resource", "skill")
# The table's target lists, by the kind of target they name.
_SECTION: dict[str, TargetKind] = {"tools": "tool", "prompts": "prompt", "resources": "resource"}
# Principals kept per policy; past it the cache starts over (a bounded table, never a leak).
_CACHE_MAX = 4096
# What callers keep without any caller policy: the two unauthenticated principals.
_NO_POLICY: Mapping[str, Any] = {"rules": [], "open": ["anonymous", "local"]}


@dataclass(frozen=True, slots=True)
class Target:
    """What a caller lists or calls: a tool, prompt, resource (or template) or skill.

    ``name`` is the tool's or prompt's name, the resource's URI (a template's URI
    template when listing it) or the skill id; ``skill`` is the skill serving it.
    """

    kind: TargetKind
    name: str
    skill: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def open_rule(kind: str) -> str:
    """The id of the implicit rule that keeps an unnamed ``local``/``anonymous`` open."""
    return f"callers.open-{kind}"


def _pattern(text: str) -> re.Pattern[str]:
    """``*`` within a ``/``-separated segment, ``**`` (a whole segment) any depth, or none."""
    out = []
    parts = text.split("/")
    for i, seg in enumerate(parts):
        last = i == len(parts) - 1
        if seg == "**":
            # Any number of whole segments, with their separators.
            out.append(".*" if last else "(?:[^/]*/)*")
            continue
        out.append("[^/]*".join(re.escape(s) for s in seg.split("*")) + ("" if last else "/"))
    return re.compile("".join(out))


@dataclass(frozen=True, slots=True)
class _Rule:
    """One compiled caller rule, ready to match a target."""

    id: str
    source: str
    deny: bool
    actions: frozenset[str]
    who: tuple[Mapping[str, str], ...]
    all_skills: bool
    skills: frozenset[str]
    exact: frozenset[tuple[str, str]]
    patterns: tuple[tuple[str, re.Pattern[str]], ...]

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> _Rule:
        exact: set[tuple[str, str]] = set()
        patterns: list[tuple[str, re.Pattern[str]]] = []
        for section, kind in _SECTION.items():
            for text in raw.get(section, ()):
                if "*" in text:
                    patterns.append((kind, _pattern(text)))
                else:
                    exact.add((kind, text))
        skills = frozenset(raw.get("skills", ()))
        return cls(
            str(raw["id"]),
            str(raw.get("source", "")),
            raw.get("effect") == "deny",
            frozenset(raw.get("may", ())),
            tuple(raw.get("who", ())),
            "*" in skills,
            skills - {"*"},
            frozenset(exact),
            tuple(patterns),
        )

    def names(self, principal: Caller) -> bool:
        """Whether one of the rule's ``who`` entries is ``principal``."""
        return any(_is(entry, principal) for entry in self.who)


def _is(entry: Mapping[str, str], p: Caller) -> bool:
    word = entry.get("principal")
    if word is not None:
        if word == "authenticated":
            return p.kind in ("oauth", "token")
        return p.kind == word
    if "token" in entry:
        return p.kind == "token" and p.name == entry["token"]
    if "issuer" in entry and (p.kind != "oauth" or p.issuer != entry["issuer"]):
        return False
    if "subject" in entry:
        return p.name == entry["subject"]
    if "group" in entry and (p.kind != "oauth" or entry["group"] not in p.groups):
        return False
    if "scope" in entry and (p.kind not in ("oauth", "token") or entry["scope"] not in p.scopes):
        return False
    # Every constraint written held (an issuer alone names every subject it vouches for);
    # an entry with none names nobody.
    return bool(entry.keys() & {"issuer", "group", "scope"})


def _key(entry: Mapping[str, str]) -> tuple[str, ...]:
    """The name a ``who`` entry is indexed under: the most particular thing it names."""
    if "principal" in entry:
        return ("principal", entry["principal"])
    if "token" in entry:
        return ("token", entry["token"])
    if "subject" in entry:
        return ("subject", entry["issuer"], entry["subject"])
    if "group" in entry:
        return ("group", entry["group"])
    if "scope" in entry:
        return ("scope", entry["scope"])
    return ("issuer", entry.get("issuer", ""))


def _keys(p: Caller) -> list[tuple[str, ...]]:
    """Every index name that may hold a rule naming ``p`` (each candidate is then checked)."""
    keys: list[tuple[str, ...]] = [("principal", p.kind)]
    if p.kind in ("oauth", "token"):
        keys.append(("principal", "authenticated"))
        keys.extend(("scope", s) for s in p.scopes)
    if p.kind == "token":
        keys.append(("token", p.name))
    if p.kind == "oauth":
        keys.append(("subject", p.issuer, p.name))
        keys.append(("issuer", p.issuer))
        keys.extend(("group", g) for g in p.groups)
    return keys


@dataclass(slots=True)
class _Side:
    """One effect's rules for one principal and action, indexed by what they name."""

    everything: str | None = None
    skills: dict[str, str] = field(default_factory=dict)
    exact: dict[tuple[str, str], str] = field(default_factory=dict)
    patterns: list[tuple[str, re.Pattern[str], str]] = field(default_factory=list)

    def add(self, rule: _Rule) -> None:
        # The first rule (in the compiled order) to name a target answers for it.
        if rule.all_skills and self.everything is None:
            self.everything = rule.id
        for sid in rule.skills:
            self.skills.setdefault(sid, rule.id)
        for key in rule.exact:
            self.exact.setdefault(key, rule.id)
        self.patterns.extend((kind, rx, rule.id) for kind, rx in rule.patterns)

    def find(self, target: Target) -> str | None:
        if self.everything is not None:
            return self.everything
        found = self.skills.get(target.skill) or self.exact.get((target.kind, target.name))
        if found is not None:
            return found
        for kind, rx, rid in self.patterns:
            if kind == target.kind and rx.fullmatch(target.name):
                return rid
        return None


@dataclass(slots=True)
class _Grant:
    """Everything one principal's rules say, per action: the deny side and the allow side,
    and the principal's key (what decisions name)."""

    deny: dict[str, _Side]
    allow: dict[str, _Side]
    key: str


class CallerPolicy:
    """The compiled ``callers`` table: :meth:`may` answers who may list and call what.

    Build one with :meth:`from_tables`; tables without caller rules give the policy of
    a bundle built before them: ``local`` and ``anonymous`` may do everything, an
    authenticated caller nothing.
    """

    def __init__(self, table: Mapping[str, Any] | None = None):
        table = _NO_POLICY if table is None else table
        self._rules = tuple(_Rule.of(r) for r in table.get("rules", ()))
        self._by_id = {r.id: r for r in self._rules}
        # Each rule under every name its who entries give a principal by (a token's name,
        # an issuer's subject, a group, a scope, an issuer, a word): a principal's rules are
        # found by its own names, whatever the number of rules.
        self._index: dict[tuple[str, ...], list[int]] = {}
        for n, rule in enumerate(self._rules):
            for entry in rule.who:
                self._index.setdefault(_key(entry), []).append(n)
        self._open = frozenset(table.get("open", ()))
        self._grants: dict[Caller, _Grant] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_tables(cls, tables: Tables) -> CallerPolicy:
        """The caller policy compiled into ``tables`` (none: see the class)."""
        return cls(tables.callers)

    @property
    def open(self) -> frozenset[str]:
        """The unauthenticated principals no allow rule names, who keep every right."""
        return self._open

    def source(self, rule_id: str) -> str | None:
        """Where the rule ``rule_id`` was written (``policies/callers/x.yaml:LINE``)."""
        rule = self._by_id.get(rule_id)
        return rule.source if rule is not None else None

    def names_authenticated(self) -> bool:
        """Whether some allow rule can name an authenticated (OAuth or token) caller: if
        none can, a server that authenticates its callers serves them nothing."""
        words = {"local", "anonymous"}
        return any(
            not rule.deny and any(e.get("principal") not in words for e in rule.who)
            for rule in self._rules
        )

    def rules(self) -> Sequence[str]:
        """Every rule id, in the order the rules are consulted."""
        return [r.id for r in self._rules]

    def _grant(self, principal: Caller) -> _Grant:
        grant = self._grants.get(principal)
        if grant is not None:
            return grant
        deny = {a: _Side() for a in ("list", "call")}
        allow = {a: _Side() for a in ("list", "call")}
        candidates: set[int] = set()
        for key in _keys(principal):
            candidates.update(self._index.get(key, ()))
        for n in sorted(candidates):  # in the compiled order: the first rule answers
            rule = self._rules[n]
            if rule.names(principal):
                for action in rule.actions:
                    (deny if rule.deny else allow)[action].add(rule)
        grant = _Grant(deny, allow, principal.key)
        with self._lock:
            if len(self._grants) >= _CACHE_MAX:
                self._grants.clear()
            self._grants[principal] = grant
        return grant

    def may(self, caller: Caller, action: Action, target: Target) -> Decision:
        """May ``caller`` (its principal) ``list`` or ``call`` ``target``?

        Never raises: an action other than ``list``/``call`` is a ``default-deny``.
        """
        # Most callers are their own principal: skip the walk along ``via`` for them.
        principal = caller if caller.via is None else caller.principal
        grant = self._grant(principal)
        text = str(target)
        deny = grant.deny.get(action)
        rid = deny.find(target) if deny is not None else None
        if rid is not None:
            return Decision(
                False, CAPABILITY, action, text, rid, f"{rid} forbids {grant.key} to {action} it"
            )
        allow = grant.allow.get(action)
        rid = allow.find(target) if allow is not None else None
        if rid is not None:
            return Decision(
                True, CAPABILITY, action, text, rid, f"{rid} lets {grant.key} {action} it"
            )
        if principal.kind in self._open and action in ("list", "call"):
            return Decision(
                True,
                CAPABILITY,
                action,
                text,
                open_rule(principal.kind),
                f"no allow rule names {principal.kind} callers, who keep every right",
            )
        return Decision(
            False,
            CAPABILITY,
            action,
            text,
            DEFAULT_DENY,
            f"no caller rule lets {grant.key} {action} the {text}; add one to policies/callers/",
        )
