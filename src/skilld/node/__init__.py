"""One running node: a verified bundle, its sandbox, state, audit and registry.

The whole API::

    from skilld.node import Node, NodeConfig

    with Node.open(NodeConfig(bundle=path, state_dir=state)) as node:
        config = ServeConfig(...)
        serve(node.registry, config, wiring=node.serving(config.task_ttl_ms / 1000))

The CLI (``skilld serve``), MCP serving, the benchmarks and the tests all build a
node this way, so they run the same code. ``demo_bundle`` finds (or builds) the demo
bundle that ``skilld serve`` without ``--bundle`` serves.
"""

from skilld.node._demo import demo_bundle, demo_sources
from skilld.node._node import Node, NodeConfig, Serving

__all__ = ["Node", "NodeConfig", "Serving", "demo_bundle", "demo_sources"]
