"""One running node: a verified bundle, its sandbox, state, audit and registry.

The whole API::

    from skilld.node import Node, NodeConfig

    with Node.open(NodeConfig(bundle=path, state_dir=state)) as node:
        serve(node.registry, ServeConfig(...))      # skilld.mcp, in the CLI

The CLI (``skilld serve``), MCP serving, the benchmarks and the tests all build a
node this way, so they run the same code. ``demo_bundle`` finds (or builds) the demo
bundle that ``skilld serve`` without ``--bundle`` serves.
"""

from skilld.node._demo import demo_bundle, demo_sources
from skilld.node._node import Node, NodeConfig

__all__ = ["Node", "NodeConfig", "demo_bundle", "demo_sources"]
