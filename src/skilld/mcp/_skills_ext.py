"""The MCP skills extension (SEP-2640, ``io.modelcontextprotocol/skills``).

The server declares the extension in ``capabilities.extensions`` (2026-07-28) and in
``capabilities.experimental`` (the handshake revisions, whose capabilities have no
``extensions`` field), and answers two methods besides the resources it
already serves (every file of an Agent Skill is ``skill://NAME/PATH``):

- ``skills/list``: one entry per Agent Skill: the URI of its ``SKILL.md``, its
  frontmatter as the author wrote it (every field, as JSON), and every file with its
  ``sha256:`` digest (the bundle lock's) and size;
- ``skills/get`` (``{"uri": "skill://NAME/SKILL.md"}``): the same entry for one skill;
  any other URI is ``-32602`` (Invalid params), as the extension says.

The entries come from the dispatcher's skills whose backend answers ``skill_entry()``
(``skilld.agentskills.AgentSkillBackend``): this module never imports the Agent Skills
package (``mcp`` imports only ``registry``). Clients without the extension keep the tiers
(tools, resources, prompts); nothing here changes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from mcp import types
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError

from skilld.errors import GuestError
from skilld.mcp._caller import caller_of, refused_error
from skilld.registry import Dispatcher

EXTENSION = "io.modelcontextprotocol/skills"
# How long a client may treat a listing or entry as current: the bundle is immutable,
# but a cluster's skills come and go.
TTL_MS = 300_000


class ListSkillsParams(types.PaginatedRequestParams):
    """``skills/list`` parameters (a cursor, unused: the listing is one page)."""


class GetSkillParams(types.RequestParams):
    """``skills/get`` parameters: the URI of a skill's ``SKILL.md``."""

    uri: str


class ListSkillsResult(types.CacheableResult):
    """``skills/list``'s answer: every skill's entry."""

    result_type: str = "complete"
    skills: list[dict[str, Any]]


class GetSkillResult(types.CacheableResult):
    """``skills/get``'s answer: one skill's entry."""

    result_type: str = "complete"
    skill: dict[str, Any]


def _entries(dispatcher: Dispatcher) -> dict[str, tuple[str, Callable[[], dict[str, Any]]]]:
    """The SKILL.md URI of each Agent Skill the dispatcher serves here: its id and entry."""
    skills = getattr(dispatcher, "skills", None)
    if skills is None:
        return {}
    out = {}
    for entry in skills():
        answer = getattr(entry.component, "skill_entry", None)
        if callable(answer):
            out[f"skill://{entry.spec.id}/SKILL.md"] = (entry.spec.id, answer)
    return out


def register(server: Server[Any], dispatcher: Dispatcher) -> None:
    """Declare the extension on ``server`` and answer its two methods from ``dispatcher``."""

    async def list_skills(ctx: Any, _params: ListSkillsParams) -> ListSkillsResult:
        # Only the skills the caller may list; the listing is then its own, not public.
        view = dispatcher.view(caller_of(ctx))
        makers = [
            make
            for _uri, (sid, make) in sorted(_entries(dispatcher).items())
            if view.lists_skill(sid)
        ]
        skills = await anyio.to_thread.run_sync(lambda: [make() for make in makers])
        return ListSkillsResult(skills=skills, ttl_ms=TTL_MS, cache_scope="private")

    async def get_skill(ctx: Any, params: GetSkillParams) -> GetSkillResult:
        found_entry = _entries(dispatcher).get(params.uri)
        if found_entry is not None:
            sid, make = found_entry
            try:
                dispatcher.view(caller_of(ctx)).permit("skill", sid, sid)
            except GuestError as exc:
                raise refused_error(exc) from exc
            found = await anyio.to_thread.run_sync(make)
            return GetSkillResult(skill=found, ttl_ms=TTL_MS, cache_scope="private")
        raise MCPError(
            types.INVALID_PARAMS,
            f"no skill at '{params.uri}' (give the URI of a skill's SKILL.md, as skills/list "
            "shows it)",
            data={"uri": params.uri},
        )

    # 2026-07-28 clients read ``capabilities.extensions``; the handshake revisions
    # (2025-11-25) have no such field, and their capabilities are sieved to their
    # schema, so the declaration is also made where those revisions carry extensions:
    # ``capabilities.experimental``.
    server.extensions[EXTENSION] = {}
    build_options = server.create_initialization_options

    def with_experimental(
        notification_options: Any = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> Any:
        experimental = {**(experimental_capabilities or {}), EXTENSION: {}}
        return build_options(notification_options, experimental, extensions)

    setattr(server, "create_initialization_options", with_experimental)  # noqa: B010 - an instance's own options
    server.add_request_handler("skills/list", ListSkillsParams, list_skills)
    server.add_request_handler("skills/get", GetSkillParams, get_skill)


__all__ = ["EXTENSION", "register"]
