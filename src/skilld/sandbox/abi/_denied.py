"""Capabilities whose host side is not implemented yet answer ``not-permitted``.

Guests already handle denials; the policy work replaces these one by one.
"""

from __future__ import annotations

from typing import Any

from skilld.errors import HostCallError
from skilld.sandbox._context import CallContext
from skilld.sandbox.abi import Functions, Kind

SIGNATURES: dict[str, dict[str, Kind]] = {
    # File transfer between nodes is specified in the WIT and lands with the cluster.
    "transfer": {"nodes": "result", "send": "result", "fetch": "result"},
}


def _deny(interface: str, name: str, kind: Kind) -> Any:
    def deny(ctx: CallContext, *args: Any) -> None:
        if kind == "plain":
            return
        raise HostCallError(
            "not-permitted",
            f"{interface}.{name} is not permitted for skill '{ctx.skill_id}'",
            rule="default-deny",
        )

    return deny


def functions(interface: str) -> Functions:
    """Denying implementations for every function of ``interface``."""
    return {
        name: (_deny(interface, name, kind), kind) for name, kind in SIGNATURES[interface].items()
    }
