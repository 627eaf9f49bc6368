"""One caller's view of the catalogue: what it may list, and whether it may call.

The MCP layer asks the dispatcher for ``view(caller)`` at every list (``tools/list``,
``resources/list`` and its templates, ``prompts/list``, ``skills/list``) and before
every call (``tools/call``, ``resources/read``, ``prompts/get``, ``skills/get``); the
answers come from the bundle's compiled caller rules (``skilld.permissions.CallerPolicy``,
docs/policy.md "Callers"). A refused call is a ``not-permitted``
:class:`~skilld.errors.GuestError` naming the deciding rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from skilld.errors import ErrorCode, GuestError, RegistryError
from skilld.permissions import CallerPolicy, Target, TargetKind
from skilld.registry._contract import Tool
from skilld.types import Caller, Decision, PromptSpec, ResourceSpec


class Listing(Protocol):
    """What a view filters: everything a dispatcher serves, and who serves it."""

    def tools(self) -> Sequence[Tool]:
        """Every exposed tool."""
        ...

    def resources(self) -> Sequence[ResourceSpec]:
        """Every resource and resource template."""
        ...

    def resource_skill(self, uri: str) -> str:
        """The skill serving ``uri`` (``RegistryError`` when none does)."""
        ...

    def prompts(self) -> Sequence[PromptSpec]:
        """Every prompt."""
        ...

    def prompt_skill(self, name: str) -> str:
        """The skill serving the prompt ``name`` (``RegistryError`` when none does)."""
        ...


class CallerView:
    """What ``caller`` may list of ``listing``, and the decision for each call it makes.

    Cheap to make (one per request): it holds the policy, the caller and the listing,
    and asks :meth:`CallerPolicy.may` for each entry it is asked about.
    """

    def __init__(self, policy: CallerPolicy, caller: Caller, listing: Listing):
        self.policy = policy
        self.caller = caller
        self._listing = listing

    def decide(self, action: str, kind: TargetKind, name: str, skill: str) -> Decision:
        """May the caller ``list``/``call`` the ``kind`` named ``name`` that ``skill`` serves?"""
        return self.policy.may(
            self.caller, "call" if action == "call" else "list", Target(kind, name, skill)
        )

    def permit(self, kind: TargetKind, name: str, skill: str) -> Decision:
        """The decision allowing the caller to call ``name``; a refusal raises.

        Raises:
            GuestError: ``not-permitted``, naming the rule that refused (or
                ``default-deny``) and the caller.
        """
        decision = self.decide("call", kind, name, skill)
        if not decision.allowed:
            raise GuestError(
                ErrorCode.NOT_PERMITTED,
                f"{self.caller.key} may not call {kind} {name}: {decision.reason}",
                rule=decision.rule,
            )
        return decision

    def tools(self) -> list[Tool]:
        """The tools the caller may list."""
        return [
            t
            for t in self._listing.tools()
            if self.decide("list", "tool", t.name, t.skill_id).allowed
        ]

    def resources(self) -> list[ResourceSpec]:
        """The resources and templates the caller may list (a template by its URI template)."""
        out = []
        for spec in self._listing.resources():
            try:
                skill = self._listing.resource_skill(spec.uri)
            except RegistryError:
                continue
            if self.decide("list", "resource", spec.uri, skill).allowed:
                out.append(spec)
        return out

    def prompts(self) -> list[PromptSpec]:
        """The prompts the caller may list."""
        out = []
        for spec in self._listing.prompts():
            try:
                skill = self._listing.prompt_skill(spec.name)
            except RegistryError:
                continue
            if self.decide("list", "prompt", spec.name, skill).allowed:
                out.append(spec)
        return out

    def lists_skill(self, skill_id: str) -> bool:
        """Whether the caller may see the skill's entry (``skills/list``)."""
        return self.decide("list", "skill", skill_id, skill_id).allowed
