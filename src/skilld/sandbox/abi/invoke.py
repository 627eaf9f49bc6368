"""``invoke``: calls to other skills through the orchestrator, graph and depth checked.

The orchestrator asks the caller's tables (``check_invoke``), whose ``max_depth``
(1..64, per skill) is the limit. The host adds one ceiling of its own, 64 (the
largest ``max_depth`` a policy may set), for checkers that know no depth; a call
past it is refused and recorded like any other decision. A nested call ends by
the smaller of its own wall time and what is left of its caller's (the registry
hands the caller's deadline on), and none starts past it or after a cancel.
"""

from __future__ import annotations

from skilld.call import CallContext
from skilld.errors import ErrorCode, HostCallError
from skilld.sandbox.abi import Functions
from skilld.types import Decision

MAX_DEPTH = 64
DEPTH_RULE = "invoke.max-depth"


def call(ctx: CallContext, skill: str, method: str, args: str) -> str:
    """Call ``skill``'s ``method`` with JSON ``args``; returns its JSON value.

    Raises:
        HostCallError: ``not-permitted`` without an orchestrator, past the depth
            ceiling, or when the tables refuse the call; ``timeout`` and
            ``cancelled``; the callee's own errors.
    """
    if ctx.invoker is None:
        raise HostCallError(
            ErrorCode.NOT_PERMITTED, "this host has no orchestrator for invoke", rule="default-deny"
        )
    depth = ctx.depth + 1
    if depth > MAX_DEPTH:
        reason = f"depth {depth} exceeds the host's ceiling of {MAX_DEPTH}"
        ctx.record(Decision(False, "invoke", "call", skill, DEPTH_RULE, reason))
        raise HostCallError(
            ErrorCode.NOT_PERMITTED, f"invoke.call {skill} denied: {reason}", rule=DEPTH_RULE
        )
    ctx.live("invoke.call")
    return ctx.invoker(skill, method, args, depth)


FUNCTIONS: Functions = {"call": (call, "result")}
