"""``kv``: the calling skill's own key-value namespace.

A call has a store only when the skill has state; under a policy the tables
must also grant ``kv`` (``check("kv", ACTION, KEY)``), so a store handed to a
skill its policy gives none stays out of reach. No operation starts past the
call's deadline or after the client cancelled the call.
"""

from __future__ import annotations

from skilld.errors import HostCallError, QuotaExceeded, StateError
from skilld.sandbox._context import CallContext
from skilld.sandbox.abi import Functions, decide
from skilld.types import KeyValueStore

MAX_KEY = 1024


def _store(ctx: CallContext, action: str, key: str | None = None) -> KeyValueStore:
    if key is not None and (not key or len(key.encode()) > MAX_KEY):
        raise HostCallError("invalid-argument", f"keys must be 1 to {MAX_KEY} bytes")
    ctx.live(f"kv.{action}")
    if ctx.checker is not None:
        decide(ctx, "kv", action, key or "*")
    if ctx.kv is None:
        raise HostCallError("not-permitted", "no key-value state for this skill", rule="kv")
    return ctx.kv


def _guard(exc: StateError) -> HostCallError:
    code = "limit-exceeded" if isinstance(exc, QuotaExceeded) else "io"
    return HostCallError(code, exc.message)


def get(ctx: CallContext, key: str) -> bytes:
    """The value under ``key``; ``not-found`` when absent."""
    try:
        value = _store(ctx, "get", key).get(key)
    except StateError as exc:
        raise _guard(exc) from exc
    if value is None:
        raise HostCallError("not-found", f"no key {key!r}")
    return value


def set_(ctx: CallContext, key: str, value: bytes) -> None:
    """Store ``value`` durably."""
    try:
        store = _store(ctx, "set", key)
        ctx.will_write_state()
        store.set(key, bytes(value))
    except StateError as exc:
        raise _guard(exc) from exc


def delete(ctx: CallContext, key: str) -> bool:
    """Remove ``key``."""
    try:
        store = _store(ctx, "delete", key)
        ctx.will_write_state()
        return store.delete(key)
    except StateError as exc:
        raise _guard(exc) from exc


def keys(ctx: CallContext, prefix: str, limit: int) -> list[str]:
    """Keys with ``prefix``, in order."""
    try:
        return list(_store(ctx, "keys").keys(prefix, min(limit, 10_000)))
    except StateError as exc:
        raise _guard(exc) from exc


FUNCTIONS: Functions = {
    "get": (get, "result"),
    "set": (set_, "result"),
    "delete": (delete, "result"),
    "keys": (keys, "result"),
}
