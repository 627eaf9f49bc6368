"""The wasm sandbox: one engine, native code cached by digest, a fresh instance per call.

Only this package imports ``wasmtime``; its errors become skilld's here.
"""

from skilld.call import CallContext
from skilld.sandbox._egress import route as egress_route
from skilld.sandbox._engine import Engine, engine_fingerprint
from skilld.sandbox._host import INTERFACES
from skilld.sandbox._native import NativeCache, load_native, write_native
from skilld.sandbox._sandbox import Component, Sandbox

__all__ = [
    "INTERFACES",
    "CallContext",
    "Component",
    "Engine",
    "NativeCache",
    "Sandbox",
    "egress_route",
    "engine_fingerprint",
    "load_native",
    "write_native",
]
