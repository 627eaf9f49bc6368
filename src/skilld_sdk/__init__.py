"""The Python SDK for skilld skills.

A skill is a module with one :class:`Skill` object and decorated functions::

    from skilld_sdk import Skill, SkillError, kv

    skill = Skill()

    @skill.method
    def add(title: str, body: str) -> dict[str, str]:
        \"\"\"Store a note.

        Args:
            title: the note's title.
            body: the note's text.
        \"\"\"
        kv.set(f"note:{title}", body.encode())
        return {"title": title}

``skilld skill build DIR`` compiles it to a WebAssembly component with
componentize-py. The skill's id, version and description come from its
``skill.yaml``; the parameter schemas come from the type hints and docstrings.
Raising :class:`SkillError` returns a typed error to the caller; the host
wrappers (``kv``, ``fs``, ``http``, ...) raise :class:`HostError` when the host
refuses (``code == "not-permitted"``, ``rule`` names the policy rule).
"""

from __future__ import annotations

from skilld_sdk._skill import (
    Audio,
    Embedded,
    HostError,
    Image,
    Method,
    Prompt,
    Resource,
    Rich,
    Skill,
    SkillError,
    Text,
)
from skilld_sdk.schema import SchemaError, u8, u16, u32, u64

__all__ = [
    "Audio",
    "Embedded",
    "HostError",
    "Image",
    "Method",
    "Prompt",
    "Resource",
    "Rich",
    "SchemaError",
    "Skill",
    "SkillError",
    "Text",
    "u8",
    "u16",
    "u32",
    "u64",
]

from skilld_sdk import host as _host

env = _host.env
fs = _host.fs
http = _host.http
invoke = _host.invoke
kv = _host.kv
log = _host.log
mcp = _host.mcp
shell = _host.shell
tcp = _host.tcp
transfer = _host.transfer
