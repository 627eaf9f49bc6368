"""skilld: serve signed WebAssembly skills to AI agents as MCP tools.

Start at ``skilld.cli`` (the ``skilld`` command) and ``skilld.registry`` (one tool
call, end to end). Kept import-free on purpose: the SDK runs inside guests.
"""

__version__ = "0.1.0"
ABI_VERSION = "0.1.0"
