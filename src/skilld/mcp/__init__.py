"""The MCP server: a :class:`~skilld.registry.Dispatcher` over stdio, Streamable HTTP and SSE.

The whole API::

    from skilld.mcp import ServeConfig, serve

    serve(registry, ServeConfig(transport="http", host="0.0.0.0", port=8080,
                                allowed_hosts=("skilld.internal:*",), token_file=path))

``serve`` blocks until stdin closes (stdio) or SIGTERM/SIGINT (http, after the calls
in flight finish). ``serve_async``, ``serve_http_async`` and ``serve_stdio_async`` are
the same inside a running event loop; ``serve_http_async`` reports an
:class:`HttpServer` (port, url, ``stop()``) through ``task_status`` for ``tg.start``.

Only this package imports the ``mcp`` SDK. ``skilld.mcp.testing`` has an in-process
``StaticDispatcher`` and the behaviours the official conformance suite expects.
"""

from skilld.mcp._config import ServeConfig
from skilld.mcp._serve import HttpServer, serve, serve_async, serve_http_async, serve_stdio_async

__all__ = [
    "HttpServer",
    "ServeConfig",
    "serve",
    "serve_async",
    "serve_http_async",
    "serve_stdio_async",
]
