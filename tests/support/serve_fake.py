"""Serve the tests' fake dispatcher over stdio (the stdio transport tests spawn this)."""

from __future__ import annotations

from skilld.mcp import ServeConfig, serve
from support.mcp_fakes import fake_dispatcher

if __name__ == "__main__":
    serve(fake_dispatcher(), ServeConfig(transport="stdio", log_level="warning"))
