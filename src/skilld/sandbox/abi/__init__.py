"""Host implementations of the ``skilld:skill`` imports, one module per capability.

Each module exposes ``FUNCTIONS``: WIT function name → (implementation, kind),
where an implementation takes the current :class:`~skilld.sandbox._context.CallContext`
and plain Python arguments (records arrive as dicts with snake_case keys) and
returns plain Python values (records as dicts), raising
:class:`~skilld.errors.HostCallError` to refuse. ``kind`` says how the WIT result
is shaped: ``plain`` (no result), ``result`` or ``result-tagged`` (the ok type is a
record, so the value must be tagged). No module here imports wasmtime.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

Kind = Literal["plain", "result", "result-tagged"]
HostFn = Callable[..., Any]
Functions = dict[str, tuple[HostFn, Kind]]
