"""Who may list and call what: ``CallerPolicy.may`` over compiled caller rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skilld.permissions import CallerPolicy, Target, open_rule
from skilld.policy import compile_documents
from skilld.types import Caller
from support.callers import policy_of

IDP = "https://idp.example.com"
ADD = Target("tool", "notes/add", "notes")
ECHO = Target("tool", "echo/echo", "echo")
DEEP = Target("tool", "echo/a/b", "echo")
REPORT = Target("resource", "skill://reporter/runs/1/report.txt", "reporter")
GREETING = Target("prompt", "greeting", "echo")
TARGETS = (ADD, ECHO, DEEP, REPORT, GREETING, Target("skill", "reporter", "reporter"))
ALICE = Caller.oauth(IDP, "alice", groups=frozenset({"writers"}))
MALLORY = Caller.oauth(IDP, "mallory", groups=frozenset({"writers"}))
CI = Caller.token("ci", scopes=frozenset({"notes:read"}))

RULES = f"""\
rules:
  - id: writers
    who:
      - issuer: {IDP}
        group: writers
      - token: ci
    skills: [notes]
    tools: ['echo/*']
  - id: no-mallory
    effect: deny
    who: [{{issuer: {IDP}, subject: mallory}}]
    skills: ['*']
  - id: local-reports
    who: local
    may: [list]
    resources: ['skill://reporter/**']
  - id: readers
    who: [{{scope: notes:read}}]
    prompts: [greeting]
"""


POLICY = policy_of(RULES)


def test_an_allow_rule_names_itself() -> None:
    """A caller a rule names may list and call what it names, and the rule is given."""
    for caller in (ALICE, CI):
        for action in ("list", "call"):
            decision = POLICY.may(caller, action, ADD)
            assert decision.allowed and decision.rule == "callers.writers"
            assert decision.capability == "caller" and decision.target == "tool notes/add"


def test_a_deny_rule_wins_over_an_allow_rule() -> None:
    """mallory is in the writers group, but the deny rule naming her decides."""
    for target in TARGETS:
        decision = POLICY.may(MALLORY, "call", target)
        assert not decision.allowed and decision.rule == "callers.no-mallory"


def test_star_stays_within_a_segment_and_doublestar_does_not() -> None:
    """``echo/*`` names echo/echo, not echo/a/b; ``skill://reporter/**`` any depth."""
    assert POLICY.may(CI, "call", ECHO).allowed
    assert not POLICY.may(CI, "call", DEEP).allowed
    assert POLICY.may(Caller.local(), "list", REPORT).rule == "callers.local-reports"


def test_list_is_not_call() -> None:
    """A rule that lets a caller list a target does not let it call it."""
    decision = POLICY.may(Caller.local(), "call", REPORT)
    assert not decision.allowed and decision.rule == "default-deny"


def test_scopes_of_tokens_and_oauth_callers() -> None:
    """A scope entry names token and OAuth callers holding the scope."""
    assert POLICY.may(CI, "call", GREETING).rule == "callers.readers"
    reader = Caller.oauth("https://other.example", "bob", scopes=frozenset({"notes:read"}))
    assert POLICY.may(reader, "call", GREETING).allowed
    assert not POLICY.may(ALICE, "call", GREETING).allowed


def test_issuer_is_part_of_the_name() -> None:
    """The same subject and group from another issuer is another principal."""
    other = Caller.oauth("https://evil.example", "alice", groups=frozenset({"writers"}))
    assert not POLICY.may(other, "call", ADD).allowed


def test_nested_and_routed_calls_act_for_their_principal() -> None:
    """A skill's nested call and a routed call are decided for the caller behind them."""
    assert POLICY.may(ALICE.as_skill("notes"), "call", ADD).rule == "callers.writers"
    assert not POLICY.may(MALLORY.routed_from("entry-1"), "call", ADD).allowed
    # A skill or node with nobody behind it is no principal any rule can name.
    assert not POLICY.may(Caller("node", "entry-1"), "call", ADD).allowed


def test_unnamed_unauthenticated_principals_stay_open() -> None:
    """anonymous, which no allow rule names, keeps every right; local is named, so closed."""
    decision = POLICY.may(Caller.anonymous(), "call", ADD)
    assert decision.allowed and decision.rule == open_rule("anonymous")
    assert not POLICY.may(Caller.local(), "call", ADD).allowed


def test_without_caller_rules_only_local_and_anonymous() -> None:
    """A bundle without caller rules: local and anonymous keep every right, tokens get nothing."""
    none = CallerPolicy()
    assert none.may(Caller.local(), "call", ADD).allowed
    assert none.may(Caller.anonymous(), "list", ADD).allowed
    for caller in (CI, ALICE):
        decision = none.may(caller, "list", ADD)
        assert not decision.allowed and decision.rule == "default-deny"


def test_names_authenticated() -> None:
    """Whether some allow rule can name a token or OAuth caller (serve warns when none can)."""
    assert POLICY.names_authenticated()
    assert not CallerPolicy().names_authenticated()
    only_local = policy_of("rules:\n  - who: local\n    skills: ['*']\n")
    assert not only_local.names_authenticated()
    deny_only = policy_of("rules:\n  - effect: deny\n    who: authenticated\n    skills: ['*']\n")
    assert not deny_only.names_authenticated()


def test_an_unknown_action_is_denied() -> None:
    """An action other than list and call is never allowed, even to an open principal."""
    assert not CallerPolicy().may(Caller.local(), "delete", ADD).allowed  # type: ignore[arg-type]


# -- property: a caller no rule names gets nothing ---------------------------------------

_NAMES = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
_ENTRY = st.one_of(
    st.builds(lambda n: {"token": n}, _NAMES),
    st.builds(lambda n: {"issuer": IDP, "subject": n}, _NAMES),
    st.builds(lambda n: {"issuer": IDP, "group": n}, _NAMES),
    st.builds(lambda n: {"scope": n}, _NAMES),
    st.builds(lambda n: {"issuer": f"https://{n}.example"}, _NAMES),
    st.sampled_from(["local", "anonymous"]),
)
_RULE = st.fixed_dictionaries(
    {
        "who": st.lists(_ENTRY, min_size=1, max_size=3),
        "effect": st.sampled_from(["allow", "deny"]),
        "may": st.sampled_from([["list"], ["call"], ["list", "call"]]),
        "skills": st.sampled_from([["*"], ["notes"], ["echo", "reporter"]]),
        "tools": st.sampled_from([["echo/*"], ["**"], ["notes/add"]]),
        "resources": st.sampled_from([["skill://**"], ["skill://reporter/*"]]),
    }
)


def _document(rules: list[dict[str, Any]]) -> object:
    return {"rules": rules}


@settings(max_examples=200, deadline=None)
@given(rules=st.lists(_RULE, max_size=8), name=st.text(alphabet="xyz", min_size=1, max_size=4))
def test_a_caller_no_rule_names_gets_nothing(rules: list[dict[str, Any]], name: str) -> None:
    """Whatever the rules, an authenticated caller none of them names may list and call nothing.

    The names in rules are drawn from a-h and the caller's from x-z: no rule names it, by
    token, subject, group, scope or issuer.
    """
    tables = compile_documents({}, callers={"t.yaml": ("callers/t.yaml", _document(rules))})
    policy = CallerPolicy.from_tables(tables.tables)
    callers = (
        Caller.token(name, scopes=frozenset({name})),
        Caller.oauth(f"https://{name}.example", name, frozenset({name}), frozenset({name})),
        Caller.oauth(IDP, name, frozenset({name}), frozenset({name})),
        Caller.token(name).as_skill("notes"),
    )
    for caller in callers:
        for target in TARGETS:
            for action in ("list", "call"):
                decision = policy.may(caller, action, target)  # type: ignore[arg-type]
                assert not decision.allowed, (caller, action, target, decision)
                assert decision.rule == "default-deny"


@pytest.mark.parametrize("kind", ["local", "anonymous"])
@settings(max_examples=100, deadline=None)
@given(rules=st.lists(_RULE, max_size=8))
def test_an_unauthenticated_principal_named_by_no_allow_rule_keeps_everything(
    kind: str, rules: list[dict[str, Any]]
) -> None:
    """local and anonymous are open exactly until an allow rule names them; deny rules still win."""
    tables = compile_documents({}, callers={"t.yaml": ("callers/t.yaml", _document(rules))})
    policy = CallerPolicy.from_tables(tables.tables)
    named = any(r["effect"] == "allow" and kind in r["who"] for r in rules)
    caller = Caller.local() if kind == "local" else Caller.anonymous()
    for target in TARGETS:
        for action in ("list", "call"):
            decision = policy.may(caller, action, target)  # type: ignore[arg-type]
            if named:
                assert decision.rule != open_rule(kind)
            else:
                # Only a deny rule takes anything away from an open principal.
                assert decision.allowed or decision.rule != "default-deny", decision
