"""Skills, methods, schemas and tool names; local and remote dispatch.

See ``_contract.py`` for the seam the MCP layer is built against.
"""

from skilld.registry._contract import (
    ClientChannel,
    Dispatcher,
    NullChannel,
    Tool,
    ToolAnnotations,
)

__all__ = ["ClientChannel", "Dispatcher", "NullChannel", "Tool", "ToolAnnotations"]
