"""What a server is wired to besides its dispatcher and its values (:class:`ServeConfig`).

The node builds it (``skilld.node.Node.serving``): ``skilld serve``, the tests and the
benchmarks serve a node's registry with the same wiring. The MCP layer only reads it.
"""

from __future__ import annotations

from typing import Protocol

from skilld.mcp._rounds import RoundPeers
from skilld.mcp._tasks import TaskBoard


class Wiring(Protocol):
    """The live objects serving is wired to; None where the node has none."""

    @property
    def round_peers(self) -> RoundPeers | None:
        """The cluster's other entry nodes: a retry whose ``requestState`` names one of
        them is forwarded there, and retries they forward here continue this node's calls.
        None: a node on its own."""
        ...

    @property
    def task_board(self) -> TaskBoard | None:
        """Task records shared by a cluster's entry nodes, so that any of them answers
        ``tasks/*``. None: this node's memory."""
        ...
