"""One activation tool for many Agent Skills, as the client implementation guide shows.

With a few skills, each is its own tool ``NAME`` (tier 1 is the tool list). With many,
one tool per skill crowds the client's tool list, and the guide's answer is a single
activation tool whose ``name`` parameter is an enum of the skills, its description the
catalog (each name and description). :class:`ActivationBackend` is that tool: a registry
backend whose one method ``activate`` answers exactly what calling the skill's own tool
would (the body once, wrapped, with its file index). The node registers it, and hides
each skill's own ``instructions`` tool, when a bundle holds more than
:data:`ACTIVATION_THRESHOLD` Agent Skills. Resources, prompts, ``run_script`` and the
skills extension are unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from skilld.agentskills._backend import AgentSkillBackend
from skilld.errors import GuestError
from skilld.sandbox import CallContext
from skilld.types import CallOutput, ContentBlock, MethodSpec, SkillSpec

# More Agent Skills than this in one bundle: one activation tool instead of one each.
ACTIVATION_THRESHOLD = 8
ACTIVATION_ID = "activate-skill"
ACTIVATE = "activate"
ACTIVATION_TOOL = "activate_skill"


class ActivationBackend:
    """The activation tool over ``backends`` (skill id -> its backend)."""

    def __init__(self, backends: Mapping[str, AgentSkillBackend]):
        self.backends = dict(sorted(backends.items()))
        catalog = "\n".join(f"- {sid}: {b.spec.description}" for sid, b in self.backends.items())
        description = (
            "Load the instructions of one of these skills when a task matches its "
            f"description, before acting:\n{catalog}"
        )
        schema = {
            "type": "object",
            "properties": {
                "name": {
                    "type": "string",
                    "enum": list(self.backends),
                    "description": "the skill to activate",
                }
            },
            "required": ["name"],
            "additionalProperties": False,
        }
        self.spec = SkillSpec(
            ACTIVATION_ID, "1.0.0", description, (MethodSpec(ACTIVATE, description, schema),)
        )

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        """The named skill's tier 2.

        Raises:
            GuestError: another method, or a name that is not one of the skills.
        """
        if method != ACTIVATE:
            raise GuestError("not-found", f"the activation tool has no method '{method}'")
        args = json.loads(args_json)
        name = args.get("name") if isinstance(args, dict) else None
        backend = self.backends.get(name) if isinstance(name, str) else None
        if backend is None:
            raise GuestError(
                "invalid-argument", f"'name' must be one of: {', '.join(self.backends)}"
            )
        ctx.audit.update(activated=name)
        return CallOutput(None, (ContentBlock("text", text=backend.activation_text()),))

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        """None: the skills serve their own files.

        Raises:
            GuestError: always ``not-found``.
        """
        raise GuestError("not-found", f"no resource '{uri}' in the activation tool")

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        """None: the skills serve their own prompts.

        Raises:
            GuestError: always ``not-found``.
        """
        raise GuestError("not-found", f"no prompt '{name}' in the activation tool")


__all__ = [
    "ACTIVATE",
    "ACTIVATION_ID",
    "ACTIVATION_THRESHOLD",
    "ACTIVATION_TOOL",
    "ActivationBackend",
]
