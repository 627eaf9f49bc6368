"""``invoke``: calls to other skills through the orchestrator, graph and depth checked."""

from __future__ import annotations

from skilld.errors import HostCallError
from skilld.sandbox._context import CallContext
from skilld.sandbox.abi import Functions

MAX_DEPTH = 4  # the policy may lower it; deeper chains are refused


def call(ctx: CallContext, skill: str, method: str, args: str) -> str:
    """Call ``skill``'s ``method`` with JSON ``args``; returns its JSON value."""
    if ctx.invoker is None:
        raise HostCallError(
            "not-permitted", "this host has no orchestrator for invoke", rule="default-deny"
        )
    if ctx.depth + 1 > MAX_DEPTH:
        raise HostCallError(
            "limit-exceeded",
            f"invoke depth {ctx.depth + 1} exceeds {MAX_DEPTH}",
            rule="invoke.max-depth",
        )
    return ctx.invoker(skill, method, args, ctx.depth + 1)


FUNCTIONS: Functions = {"call": (call, "result")}
