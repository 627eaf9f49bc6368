"""A registry of host-implemented skills under compiled caller rules, for the caller tests.

Three skills answer from Python (no wasm: what is tested is who may list and call, not
the guest): ``notes`` (tools ``notes/add`` and ``notes/list``, prompt ``note-prompt``),
``echo`` (tool ``echo/echo``, prompt ``echo-prompt``) and ``reporter`` (tool
``reporter/run``, resource ``skill://reporter/report.txt``, template
``skill://reporter/runs/{run}``, and an entry for ``skills/list``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skilld.audit import MemorySink
from skilld.call import CallContext
from skilld.permissions import CallerPolicy
from skilld.policy import compile_documents, compile_policies, load_yaml
from skilld.registry import Registry, SkillEntry
from skilld.types import CallOutput, ContentBlock, MethodSpec, PromptSpec, ResourceSpec, SkillSpec

IDP = "https://idp.example.com"
_OBJECT = {"type": "object", "properties": {"text": {"type": "string"}}}


class HostSkill:
    """A skill answering every method, read and prompt with what it was asked."""

    def __init__(self, skill_id: str):
        self.skill_id = skill_id

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        """``SKILL/METHOD ARGS`` as text."""
        text = f"{self.skill_id}/{method} {args_json}"
        return CallOutput(text, (ContentBlock("text", text=text),))

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        """The URI as the resource's text."""
        return [CallOutput(uri, (ContentBlock("text", text=f"contents of {uri}"),))]

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        """One user message naming the prompt."""
        return [{"role": "user", "content": {"type": "text", "text": f"{name} {args_json}"}}]

    def skill_entry(self) -> dict[str, Any]:
        """The skills extension's entry (as an Agent Skill's backend answers it)."""
        return {"name": self.skill_id, "uri": f"skill://{self.skill_id}/SKILL.md"}


def _spec(sid: str, methods: list[str], prompts: list[str], resources: list[ResourceSpec]) -> Any:
    return SkillSpec(
        sid,
        "1.0.0",
        f"the {sid} skill",
        tuple(MethodSpec(m, f"{sid} {m}", _OBJECT) for m in methods),
        tuple(resources),
        tuple(PromptSpec(p, f"prompt {p}", {"type": "object"}) for p in prompts),
    )


SPECS = (
    _spec("notes", ["add", "list"], ["note-prompt"], []),
    _spec("echo", ["echo"], ["echo-prompt"], []),
    _spec(
        "reporter",
        ["run"],
        [],
        [
            ResourceSpec("skill://reporter/report.txt", "report", "the report", "text/plain"),
            ResourceSpec("skill://reporter/runs/{run}", "runs", "a run's output", None, True),
        ],
    ),
)


def caller_registry(tmp_path: Path, rules: str | None) -> tuple[Registry, MemorySink]:
    """The three skills in a registry under ``rules`` (``policies/callers/team.yaml``),
    compiled the way ``skilld build`` does; ``None``: no caller rules at all."""
    root = tmp_path / "policies"
    (root / "callers").mkdir(parents=True, exist_ok=True)
    for spec in SPECS:
        (root / f"{spec.id}.yaml").write_text("{}\n")
    if rules is not None:
        (root / "callers" / "team.yaml").write_text(rules)
    tables = compile_policies(root, {spec.id: None for spec in SPECS}).tables
    sink = MemorySink()
    registry = Registry(audit=sink)
    for spec in SPECS:
        registry.add(SkillEntry(spec=spec, component=HostSkill(spec.id)))
    registry.use_callers(CallerPolicy.from_tables(tables))
    registry.mark_ready()
    return registry, sink



def policy_of(text: str) -> CallerPolicy:
    """The caller policy compiled from one ``policies/callers/team.yaml`` holding ``text``."""
    doc = load_yaml(text, "policies/callers/team.yaml")
    tables = compile_documents({}, callers={"team.yaml": ("policies/callers/team.yaml", doc)})
    return CallerPolicy.from_tables(tables.tables)


# For tests about something else than caller rules: every authenticated caller may list
# and call everything (with authentication on, a caller no rule names gets nothing).
ALL_AUTHENTICATED = "rules:\n  - id: all\n    who: authenticated\n    skills: ['*']\n"


def open_to_authenticated(registry: Any) -> Any:
    """``registry`` (anything with ``use_callers``) under :data:`ALL_AUTHENTICATED`; returned."""
    registry.use_callers(policy_of(ALL_AUTHENTICATED))
    return registry
