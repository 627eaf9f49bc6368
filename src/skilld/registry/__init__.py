"""Skills, methods, schemas and tool names; local and remote dispatch.

One tool call, end to end:

1. An MCP client sends ``tools/call`` for ``notes/add`` (stdio, Streamable HTTP or SSE);
   ``skilld.mcp`` validates the arguments against the tool's input schema.
2. :meth:`Registry.call` resolves the tool name to (skill, method) and takes a slot
   of the skill's concurrency limit.
3. It builds a ``CallContext``: the skill's limits, its key-value namespace, its
   permission checker (compiled policy tables), the client channel and the
   orchestrator for ``invoke``.
4. ``skilld.sandbox`` creates a fresh store (memory cap, epoch deadline),
   instantiates the pre-compiled component and calls its ``call`` export.
5. Every host function the guest calls checks the tables first; a denial
   returns to the guest as a typed ``not-permitted`` error with the rule id, and
   the decision is kept on the context.
6. One audit record (digests of input and output, timing, outcome, every
   decision) goes to the audit sink; the result goes back to the client.

See ``_contract.py`` for the seam the MCP layer is built against.
"""

# A backend's methods take the call's context: part of this package's contract, so that
# backends outside the sandbox (a cluster's remote skills) need not reach into it.
from skilld.call import CallContext
from skilld.policy import Exposure
from skilld.registry._contract import (
    Dispatcher,
    NullChannel,
    SkillBackend,
    Tool,
    ToolAnnotations,
)
from skilld.registry._registry import Registry, SkillEntry, annotations_for, per_skill_schema
from skilld.types import ClientChannel

__all__ = [
    "CallContext",
    "ClientChannel",
    "Dispatcher",
    "Exposure",
    "NullChannel",
    "Registry",
    "SkillBackend",
    "SkillEntry",
    "Tool",
    "ToolAnnotations",
    "annotations_for",
    "per_skill_schema",
]
