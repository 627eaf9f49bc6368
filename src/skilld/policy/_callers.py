"""Who may call what: ``policies/callers/*.yaml`` → the ``callers`` table.

A caller rule says which principals may ``list`` and ``call`` which skills, tools,
prompts and resources (docs/policy.md, "Callers")::

    # policies/callers/teams.yaml
    rules:
      - id: notes-writers             # rule id callers.notes-writers
        who:
          - issuer: https://idp.example.com
            group: notes-writers
          - token: ci
        may: [list, call]             # default: both
        skills: [notes]               # every tool, prompt and resource of notes
        tools: [echo/*]               # '*' within a segment, '**' a whole segment: any depth
      - id: no-mallory
        effect: deny                  # a deny rule wins over every allow rule
        who: [{issuer: https://idp.example.com, subject: mallory}]
        skills: ['*']

The compiled table is ``{"rules": [...], "open": [...]}``: each rule normalised, with
its ``id`` and ``source``, and ``open``, the unauthenticated principals (``local``,
``anonymous``) that no rule names, which keep every right they had before caller rules
existed until an allow rule names them (``skilld.permissions.CallerPolicy``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from skilld.errors import PolicyError
from skilld.policy import patterns as p
from skilld.policy._schema import (
    _ID,
    Where,
    _check_keys,
    _fail,
    _line,
    _list,
    _mapping,
    _str_list,
)

ACTIONS = ("list", "call")
EFFECTS = ("allow", "deny")
TARGET_KINDS = ("skills", "tools", "prompts", "resources")
# Principals named by a word: the two unauthenticated ones, and any authenticated caller.
PRINCIPAL_WORDS = ("local", "anonymous", "authenticated")
UNAUTHENTICATED = ("anonymous", "local")
_RULE_KEYS = ("id", "description", "effect", "who", "may", *TARGET_KINDS)
_WHO_KEYS = ("token", "issuer", "subject", "group", "scope")
_DOC_KEYS = ("description", "rules")
# A token's name, a subject, a group or a scope: printable, no spaces, bounded.
_VALUE = re.compile(r"^[\x21-\x7e]{1,256}\Z")
_TOKEN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}\Z")
# What a tool or prompt name may hold (mcp.names' alphabet, plus ':'), besides '*'.
_NAME_CHARS = re.compile(r"^[A-Za-z0-9_.:/*-]+\Z")
_URI_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://")
_URI_FORBIDDEN = set("?[]{}\\#") | {chr(c) for c in range(0x21)} | {"\x7f"}
PREFIX = "callers."


def _who(item: object, where: Where) -> dict[str, str]:
    """One entry of ``who``: a word (``local``, ``anonymous``, ``authenticated``) or a mapping."""
    if isinstance(item, str):
        if item not in PRINCIPAL_WORDS:
            raise _fail(
                where,
                f"unknown principal {item!r} in who",
                "write local, anonymous, authenticated, or a mapping with token, issuer, "
                "subject, group or scope",
            )
        return {"principal": item}
    m = _mapping(item, where, "an entry of who")
    _check_keys(m, _WHO_KEYS, where, "an entry of who")
    if not m:
        raise _fail(where, "an empty entry in who names nobody")
    out: dict[str, str] = {}
    for key, value in m.items():
        at = _line(m, key, where)
        if not isinstance(value, str) or not _VALUE.match(value):
            raise _fail(at, f"who.{key} must be a non-empty printable string without spaces")
        out[key] = value
    if "token" in out:
        if len(out) > 1:
            raise _fail(where, "a token entry names the token alone (a token has no issuer)")
        if not _TOKEN_NAME.match(out["token"]):
            raise _fail(_line(m, "token", where), f"bad token name {out['token']!r}")
    if "subject" in out and "issuer" not in out:
        raise _fail(
            _line(m, "subject", where),
            "a subject is only unique within its issuer: name the issuer too",
        )
    if "subject" in out and ("group" in out or "scope" in out):
        raise _fail(where, "name a subject, or a group or scope, not both in one entry")
    if "issuer" in out:
        parts = urlsplit(out["issuer"])
        if parts.scheme not in ("https", "http") or not parts.hostname or parts.query:
            raise _fail(
                _line(m, "issuer", where),
                f"issuer {out['issuer']!r} must be the issuer's URL, as its tokens' 'iss' has it",
                "e.g. https://idp.example.com",
            )
    return out


def _segments_ok(text: str, where: Where, what: str) -> None:
    for seg in text.split("/"):
        if "**" in seg and seg != "**":
            raise _fail(where, f"bad {what} pattern {text!r}: '**' must be a whole segment")


def _target(
    kind: str,
    text: object,
    where: Where,
    skills: Mapping[str, Any] | None,
    notes: list[tuple[str, str]],
) -> str:
    if not isinstance(text, str) or not text:
        raise _fail(where, f"an entry of {kind} must be a non-empty string, got {text!r}")
    if kind == "skills":
        if text == "*":
            return text
        if not p.SKILL_ID.match(text):
            raise _fail(where, f"bad skill id {text!r} in skills")
        if skills is not None and text not in skills:
            # Not provable here: in a cluster another node may serve it (an entry node
            # lists its workers' skills under its own caller rules); likely a typo if close.
            close = difflib.get_close_matches(text, list(skills), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            notes.append(
                (str(where), f"skills names '{text}', which this bundle does not hold{hint}")
            )
        return text
    if kind == "resources":
        if not _URI_SCHEME.match(text) or text.split("://", 1)[1] == "":
            raise _fail(where, f"resource pattern {text!r} must be a URI: scheme://...")
        bad = _URI_FORBIDDEN.intersection(text)
        if bad:
            raise _fail(
                where,
                f"bad resource pattern {text!r}: {''.join(sorted(bad))!r} cannot match "
                "(only '*' within a segment and '**' as a whole segment)",
            )
        _segments_ok(text.split("://", 1)[1], where, "resource")
        return text
    if not _NAME_CHARS.match(text) or len(text) > 128:
        raise _fail(
            where,
            f"bad {kind[:-1]} name pattern {text!r}: letters, digits and _.:/- with '*', "
            "at most 128",
        )
    _segments_ok(text, where, kind[:-1])
    return text


def _rule(
    doc: str,
    index: int,
    m: Mapping[str, Any],
    where: Where,
    skills: Mapping[str, Any] | None,
    notes: list[tuple[str, str]],
) -> dict[str, Any]:
    _check_keys(m, _RULE_KEYS, where, "a caller rule", ("who",))
    explicit = m.get("id")
    if explicit is None:
        rid = f"{PREFIX}{doc}[{index}]"
    elif isinstance(explicit, str) and _ID.match(explicit):
        rid = PREFIX + explicit
    else:
        raise _fail(
            _line(m, "id", where),
            f"bad rule id {explicit!r}: letters, digits and _.:- only, at most 64",
        )
    effect = m.get("effect", "allow")
    if effect not in EFFECTS:
        raise _fail(_line(m, "effect", where), f"effect must be allow or deny, got {effect!r}")
    ww = _line(m, "who", where)
    # One entry may stand alone (``who: local``); a list gives each its own line.
    raw_who = m["who"] if isinstance(m["who"], list) else [m["who"]]
    if not raw_who:
        raise _fail(ww, "who is empty: the rule would name nobody")
    who = [_who(item, _line(raw_who, i, ww)) for i, item in enumerate(raw_who)]
    may: tuple[str, ...] = ACTIONS
    if "may" in m:
        mw = _line(m, "may", where)
        may = _str_list(m["may"], mw, "an action")
        for action in may:
            if action not in ACTIONS:
                raise _fail(mw, f"unknown action {action!r} in may", "list, call")
    targets: dict[str, list[str]] = {}
    for kind in TARGET_KINDS:
        if kind not in m:
            continue
        kw = _line(m, kind, where)
        items = _list(m[kind], kw, kind)
        targets[kind] = sorted(
            {
                _target(kind, item, _line(items, i, kw), skills, notes)
                for i, item in enumerate(items)
            }
        )
    if not any(targets.values()):
        raise _fail(
            where,
            f"caller rule {rid} names nothing to {'/'.join(may)}",
            "add skills, tools, prompts or resources (['*'] under skills: everything)",
        )
    return {
        "id": rid,
        "source": str(where),
        "effect": effect,
        "who": sorted(who, key=lambda w: sorted(w.items())),
        "may": sorted(set(may)),
        **{kind: targets.get(kind, []) for kind in TARGET_KINDS},
    }


def compile_callers(
    documents: Mapping[str, tuple[str, object]], skills: Mapping[str, Any] | None
) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    """The ``callers`` table of ``policies/callers/*.yaml`` (file name → (label, YAML)),
    and warnings as (location, message).

    ``skills`` are the skills of the bundle when known: ``skills:`` naming another is
    warned about (another node of a cluster may serve it). The table is ``None`` when
    there is no caller document at all (the tables then hold no ``callers`` key, and
    every bundle built before caller rules keeps its digest).

    Raises:
        PolicyError: an unknown key, an impossible pattern or a duplicate rule id, with
            ``file:line``.
    """
    notes: list[tuple[str, str]] = []
    if not documents:
        return None, notes
    rules: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for name, (label, doc) in sorted(documents.items()):
        stem = name.rsplit(".", 1)[0]
        top = Where(label, getattr(doc, "line", 1) or 1)
        if not _ID.match(stem):
            raise _fail(
                top, f"'{stem}' is not a valid caller document name", "letters, digits, _.-"
            )
        m = _mapping({} if doc is None else doc, top, "a caller document")
        _check_keys(m, _DOC_KEYS, top, "a caller document")
        rw = _line(m, "rules", top)
        items = _list(m.get("rules", []), rw, "rules")
        for i, item in enumerate(items):
            at = _line(items, i, rw)
            rule = _rule(stem, i, _mapping(item, at, "a caller rule"), at, skills, notes)
            if rule["id"] in seen:
                raise PolicyError(
                    f"rule id {rule['id']!r} is already used at {seen[rule['id']]}",
                    location=str(at),
                )
            seen[rule["id"]] = str(at)
            rules.append(rule)
    # Deny rules only take away: local and anonymous stay open until an allow rule names them.
    named = {
        w["principal"]
        for r in rules
        if r["effect"] == "allow"
        for w in r["who"]
        if "principal" in w
    }
    return {"rules": rules, "open": [k for k in UNAUTHENTICATED if k not in named]}, notes
