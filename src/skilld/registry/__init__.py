"""Skills, methods, schemas and tool names; the dispatch of one call to its backend.

- ``_dispatch.py``: the registry's part of a call's path, stage by stage, in its docstring
  (the whole path, MCP layer to audit: ``skilld/call.py``'s docstring);
  :class:`Registry` implements the :class:`Dispatcher` contract.
- ``_catalogue.py``: what is loaded, and what a tool name means (:class:`Catalogue`).
- ``_access.py``: what one caller may list and call (:class:`CallerView`, from the
  bundle's caller rules).
- ``_audit.py``: where the records go (built by :class:`skilld.audit.CallRecorder`).
- ``_contract.py``: the seams: :class:`Dispatcher` (what the MCP layer is built
  against) and :class:`SkillBackend` (what every kind of skill implements).
"""

# A backend's methods take the call's context: part of this package's contract, so that
# backends outside the sandbox (a cluster's remote skills) need not reach into it.
from skilld.call import Call, CallContext, CallGate, NullChannel, RemoteInvoker, Slot
from skilld.permissions import CallerPolicy, Target, TargetKind
from skilld.policy import Exposure
from skilld.registry._access import CallerView
from skilld.registry._catalogue import Catalogue, SkillEntry, annotations_for, per_skill_schema
from skilld.registry._contract import (
    Dispatcher,
    SkillBackend,
    Tool,
    ToolAnnotations,
)
from skilld.registry._dispatch import Registry
from skilld.types import ClientChannel

__all__ = [
    "Call",
    "CallContext",
    "CallGate",
    "CallerPolicy",
    "CallerView",
    "Catalogue",
    "ClientChannel",
    "Dispatcher",
    "Exposure",
    "NullChannel",
    "Registry",
    "RemoteInvoker",
    "SkillBackend",
    "SkillEntry",
    "Slot",
    "Target",
    "TargetKind",
    "Tool",
    "ToolAnnotations",
    "annotations_for",
    "per_skill_schema",
]
