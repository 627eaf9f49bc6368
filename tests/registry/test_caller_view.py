"""The registry's per-caller view: what each caller may list, and the decision for its calls."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skilld.errors import GuestError
from skilld.registry import Call, NullChannel, Registry
from skilld.types import Caller
from support.callers import IDP, caller_registry

RULES = f"""\
rules:
  - id: writers
    who: [{{issuer: {IDP}, group: writers}}]
    skills: [notes]
    tools: [echo/echo]
  - id: reporters
    who: [{{token: ci}}]
    skills: [reporter]
  - id: report-lister
    who: [{{issuer: {IDP}, subject: alice}}]
    may: [list]
    resources: ['skill://reporter/report.txt']
  - id: no-mallory
    effect: deny
    who: [{{issuer: {IDP}, subject: mallory}}]
    skills: ['*']
  - id: local-echo
    who: local
    tools: ['echo/*']
    prompts: [echo-prompt]
"""
ALICE = Caller.oauth(IDP, "alice", groups=frozenset({"writers"}))
MALLORY = Caller.oauth(IDP, "mallory", groups=frozenset({"writers"}))
CI = Caller.token("ci")


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    """The three host skills under RULES."""
    return caller_registry(tmp_path, RULES)[0]


def names(registry: Registry, caller: Caller) -> dict[str, list[str]]:
    """Everything ``caller`` may list, by kind."""
    view = registry.view(caller)
    return {
        "tools": sorted(t.name for t in view.tools()),
        "prompts": sorted(p.name for p in view.prompts()),
        "resources": sorted(r.uri for r in view.resources()),
        "skills": [s.spec.id for s in registry.skills() if view.lists_skill(s.spec.id)],
    }


def test_each_caller_lists_what_its_rules_name(registry: Registry) -> None:
    """alice (a writer): notes and echo/echo, and the report she may list; ci: reporter."""
    assert names(registry, ALICE) == {
        "tools": ["echo/echo", "notes/add", "notes/list"],
        "prompts": ["note-prompt"],
        "resources": ["skill://reporter/report.txt"],
        "skills": ["notes"],
    }
    assert names(registry, CI) == {
        "tools": ["reporter/run"],
        "prompts": [],
        "resources": ["skill://reporter/report.txt", "skill://reporter/runs/{run}"],
        "skills": ["reporter"],
    }


def test_a_denied_or_unnamed_caller_lists_nothing(registry: Registry) -> None:
    """mallory is denied everything; a token no rule names gets nothing."""
    nothing = {"tools": [], "prompts": [], "resources": [], "skills": []}
    assert names(registry, MALLORY) == nothing
    assert names(registry, Caller.token("stranger")) == nothing
    assert names(registry, Caller.oauth("https://evil.example", "alice")) == nothing


def test_local_gets_what_its_rule_names_and_anonymous_stays_open(registry: Registry) -> None:
    """local is named by an allow rule (echo only); anonymous, named by none, sees everything."""
    assert names(registry, Caller.local()) == {
        "tools": ["echo/echo"],
        "prompts": ["echo-prompt"],
        "resources": [],
        "skills": [],
    }
    everything = names(registry, Caller.anonymous())
    assert everything["tools"] == sorted(t.name for t in registry.tools())
    assert len(everything["resources"]) == 2 and everything["skills"] == [
        "notes",
        "echo",
        "reporter",
    ]


def test_permit_names_the_rule(registry: Registry) -> None:
    """An allowed call's decision names its rule; a refused one is not-permitted with its rule."""
    assert registry.view(ALICE).permit("tool", "notes/add", "notes").rule == "callers.writers"
    with pytest.raises(GuestError) as refused:
        registry.view(MALLORY).permit("tool", "notes/add", "notes")
    assert refused.value.code == "not-permitted" and refused.value.rule == "callers.no-mallory"
    assert "oauth:https://idp.example.com#mallory may not call tool notes/add" in str(refused.value)
    with pytest.raises(GuestError) as unnamed:
        registry.view(CI).permit("tool", "notes/add", "notes")
    assert unnamed.value.rule == "default-deny"


def test_listing_is_not_calling(registry: Registry) -> None:
    """alice may list the report, not read it; ci may read any of reporter's resources."""
    with pytest.raises(GuestError) as refused:
        registry.view(ALICE).permit("resource", "skill://reporter/report.txt", "reporter")
    assert refused.value.rule == "default-deny"
    decision = registry.view(CI).permit("resource", "skill://reporter/runs/7", "reporter")
    assert decision.rule == "callers.reporters"


def test_nested_calls_are_decided_for_their_principal(registry: Registry) -> None:
    """A call notes makes for alice, or a call routed from another node for mallory."""
    assert registry.view(ALICE.as_skill("notes")).permit("tool", "echo/echo", "echo").allowed
    with pytest.raises(GuestError):
        registry.view(MALLORY.routed_from("entry-1")).permit("tool", "echo/echo", "echo")


def test_without_caller_rules_tokens_get_nothing(tmp_path: Path) -> None:
    """A bundle without policies/callers/: local and anonymous as before, a token nothing."""
    registry = caller_registry(tmp_path, None)[0]
    every = sorted(t.name for t in registry.tools())
    assert names(registry, Caller.local())["tools"] == every
    assert names(registry, Caller.anonymous())["tools"] == every
    assert names(registry, CI)["tools"] == []


def test_a_fresh_registry_has_the_policy_of_no_rules() -> None:
    """A registry nobody gave caller rules answers as a bundle without them."""
    registry = Registry()
    with pytest.raises(GuestError):
        registry.view(CI).permit("tool", "x/y", "x")
    assert registry.view(Caller.local()).permit("tool", "x/y", "x").rule == "callers.open-local"


_STRANGERS = st.one_of(
    st.builds(Caller.token, st.text("xyz", min_size=1, max_size=6)),
    st.builds(
        lambda sub, groups: Caller.oauth(IDP, sub, groups=frozenset(groups)),
        st.text("xyz", min_size=1, max_size=6),
        st.sets(st.text("xyz", min_size=1, max_size=4), max_size=3),
    ),
    st.builds(lambda sub: Caller.oauth("https://evil.example", sub), st.text("xyz", min_size=1)),
)


# The registry is only read: one for every example is what the test means.
@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(stranger=_STRANGERS)
def test_a_stranger_lists_nothing_and_calls_nothing(registry: Registry, stranger: Caller) -> None:
    """A caller none of the rules names (its names drawn from x, y, z) gets nothing at all."""
    assert names(registry, stranger) == {"tools": [], "prompts": [], "resources": [], "skills": []}
    view = registry.view(stranger)
    for tool in registry.tools():
        with pytest.raises(GuestError):
            view.permit("tool", tool.name, tool.skill_id)


def test_the_ring_checks_every_entry_but_a_nested_call(tmp_path: Path) -> None:
    """``call_method`` refuses a caller the rules refuse, whichever entry built the Call (a
    routed call's principal is the entry node's caller) and audits it with the caller; a
    nested call, acting for the same caller through a skill, is left to the skill's grant."""
    registry, sink = caller_registry(tmp_path, RULES)
    routed = MALLORY.routed_from("node-a")
    with pytest.raises(GuestError) as refused:
        registry.call_method(Call("notes", "add", {"text": "x"}, caller=routed))
    assert (refused.value.code, refused.value.rule) == ("not-permitted", "callers.no-mallory")
    record = sink.records[-1]
    assert record["refused"] is True and record["method"] == "add", record
    assert record["caller"] == f"node:node-a<oauth:{IDP}#mallory", record
    assert record["principal"] == f"oauth:{IDP}#mallory", record
    # By the tool's name, as the MCP adapter's Registry.call gives it: the same rules.
    with pytest.raises(GuestError, match=r"callers\.no-mallory"):
        registry.call("notes/add", {"text": "x"}, NullChannel(), caller=MALLORY)
    nested = registry.call_method(
        Call("notes", "add", {"text": "x"}, caller=MALLORY.as_skill("echo"), depth=1)
    )
    assert nested.value == 'notes/add {"text":"x"}'
    assert registry.call_method(Call("notes", "add", {}, caller=ALICE)).value.startswith("notes/")
