"""The MCP server: a :class:`~skilld.registry.Dispatcher` over stdio, Streamable HTTP and SSE.

The whole API::

    from skilld.mcp import ServeConfig, serve

    serve(registry, ServeConfig(transport="http", host="0.0.0.0", port=8080,
                                allowed_hosts=("skilld.internal:*",), token_file=path))

``serve`` blocks until stdin closes (stdio) or SIGTERM/SIGINT (either transport, after
the calls in flight finish). ``serve_async``, ``serve_http_async`` and ``serve_stdio_async`` are
the same inside a running event loop; ``serve_http_async`` reports an
:class:`HttpServer` (port, url, ``stop()``) through ``task_status`` for ``tg.start``.

Only this package imports the ``mcp`` SDK. The tests' ``support/static_dispatcher.py`` has
an in-process ``StaticDispatcher`` and the behaviours the official conformance suite expects.
"""

from typing import TYPE_CHECKING, Any

from skilld.mcp._config import ServeConfig
from skilld.mcp._logging import make_logger
from skilld.mcp._serve import serve, serve_async, serve_stdio_async
from skilld.mcp._wiring import Wiring

if TYPE_CHECKING:
    from skilld.mcp._auth import create_token_file
    from skilld.mcp._serve_http import HttpServer, advertised_url, bind, serve_http_async


def __getattr__(name: str) -> Any:
    # HTTP serving pulls in uvicorn and starlette; stdio does not need them.
    if name in ("HttpServer", "advertised_url", "bind", "serve_http_async"):
        from skilld.mcp import _serve_http

        return getattr(_serve_http, name)
    if name == "create_token_file":  # the OAuth side pulls in PyJWT and an HTTP client
        from skilld.mcp import _auth

        return _auth.create_token_file
    raise AttributeError(f"module 'skilld.mcp' has no attribute {name!r}")


__all__ = [
    "HttpServer",
    "ServeConfig",
    "Wiring",
    "advertised_url",
    "bind",
    "create_token_file",
    "make_logger",
    "serve",
    "serve_async",
    "serve_http_async",
    "serve_stdio_async",
]
