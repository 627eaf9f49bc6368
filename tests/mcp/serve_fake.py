"""Serve the tests' fake dispatcher over stdio (the stdio transport tests spawn this)."""

from __future__ import annotations

from mcp_fakes import fake_dispatcher

from skilld.mcp import ServeConfig, serve

if __name__ == "__main__":
    serve(fake_dispatcher(), ServeConfig(transport="stdio", log_level="warning"))
