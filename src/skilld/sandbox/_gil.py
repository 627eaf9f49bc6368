"""Keep the GIL across wasmtime's quick C calls.

The wasmtime binding calls its C library through ctypes, which releases the GIL
around every foreign call. One guest call makes about 80 of them, nearly all
quick (type introspection, value conversion, store set-up), and under
concurrency each release hands the GIL to another thread and waits to get it
back: at 16 concurrent tool calls that doubled the server's CPU per call
(bench/bench_mcp.py, measured with and without). :func:`keep_gil_for_quick_calls`
rebinds those quick functions to the same symbols loaded through
``ctypes.PyDLL``, which keeps the GIL.

Only functions matched by ``_QUICK`` are rebound: none of them runs guest code,
calls back into Python or blocks. Instantiation (guest start code), calls and
post-returns (guest code), compiling, (de)serializing and freeing a store (which
resets its memory) keep releasing the GIL, so a running guest never holds up the
event loop or other calls.
"""

from __future__ import annotations

import ctypes
import re
import threading
from typing import Any

from wasmtime import _bindings, _ffi

_QUICK = re.compile(
    r"_("
    r"wasmtime_component_\w+_type_\w+"  # type introspection
    r"|wasmtime_component_func_type"
    r"|wasmtime_component_val\w*"  # component values: new, copy, delete
    r"|wasm_byte_vec_\w+"
    r"|wasm_name_\w+"
    r"|wasmtime_component_instance_get_func"
    r"|wasmtime_component_instance_get_export_index"
    r"|wasmtime_component_export_index_delete"
    r"|wasmtime_store_(new|context|limiter|epoch_deadline_callback)"
    r"|wasmtime_context_set_(epoch_deadline|wasi)"
    r"|wasi_config_\w+"
    r"|wasmtime_engine_increment_epoch"
    r")"
)

# The base class of ctypes' foreign functions (private in the stubs, public at run time).
_FUNC_PTR: type = ctypes.CFUNCTYPE(None).__mro__[1]
_lock = threading.Lock()
_done = False


def keep_gil_for_quick_calls() -> int:
    """Rebind the quick C functions once per process; returns how many were rebound."""
    global _done
    with _lock:
        if _done:
            return 0
        _done = True
        lib = ctypes.PyDLL(str(_ffi.filename))
        count = 0
        found: dict[str, Any] = vars(_bindings)
        for name, func in list(found.items()):
            if not (_QUICK.fullmatch(name) and isinstance(func, _FUNC_PTR)):
                continue
            quick = getattr(lib, name[1:])
            original: Any = func
            quick.restype = original.restype
            quick.argtypes = original.argtypes
            setattr(_bindings, name, quick)
            count += 1
        return count
