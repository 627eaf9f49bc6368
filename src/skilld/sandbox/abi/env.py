"""``env``: environment variables the policy lets a skill read."""

from __future__ import annotations

import os

from skilld.call import CallContext
from skilld.errors import HostCallError
from skilld.sandbox.abi import Functions, decide


def get(ctx: CallContext, name: str) -> str:
    """The variable's value; ``not-found`` when unset."""
    decide(ctx, "env", "read", name)
    value = os.environ.get(name)
    if value is None:
        raise HostCallError("not-found", f"{name} is not set")
    return value


FUNCTIONS: Functions = {"get": (get, "result")}
