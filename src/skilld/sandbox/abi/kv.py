"""``kv``: the calling skill's own key-value namespace.

A call has a store only when the skill has state; under a policy the tables
must also grant ``kv`` (``check("kv", ACTION, KEY)``), so a store handed to a
skill its policy gives none stays out of reach. No operation starts past the
call's deadline or after the client cancelled the call, and none waits past the
deadline: a store that offers ``within(seconds)`` (SQLite's busy wait, JetStream's
request timeout) is bounded by what is left of the call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from skilld.call import CallContext
from skilld.errors import ErrorCode, HostCallError, QuotaExceeded, StateError
from skilld.sandbox.abi import Functions, decide
from skilld.types import KeyValueStore

MAX_KEY = 1024
T = TypeVar("T")


def _store(ctx: CallContext, action: str, key: str | None = None) -> KeyValueStore:
    if key is not None and (not key or len(key.encode()) > MAX_KEY):
        raise HostCallError("invalid-argument", f"keys must be 1 to {MAX_KEY} bytes")
    ctx.live(f"kv.{action}")
    if ctx.checker is not None:
        decide(ctx, "kv", action, key or "*")
    if ctx.kv is None:
        raise HostCallError(ErrorCode.NOT_PERMITTED, "no key-value state for this skill", rule="kv")
    return ctx.kv


def _guard(exc: StateError, ctx: CallContext, action: str) -> HostCallError:
    if isinstance(exc, QuotaExceeded):
        return HostCallError("limit-exceeded", exc.message)
    if ctx.remaining() <= 0:
        # The store gave up waiting because the call's time ran out.
        return HostCallError("timeout", f"kv.{action}: the call's wall time ran out")
    return HostCallError("io", exc.message)


@contextmanager
def _bounded(ctx: CallContext, store: KeyValueStore) -> Iterator[None]:
    within = getattr(store, "within", None)
    left = ctx.remaining()
    if within is None or math.isinf(left):
        yield
        return
    with within(left):
        yield


def _op(ctx: CallContext, action: str, key: str | None, fn: Callable[[KeyValueStore], T]) -> T:
    store = _store(ctx, action, key)
    if action in ("set", "delete"):
        # the call's `started` audit record is on disk before its first write (crash tracing)
        ctx.will_write_state()
    try:
        with _bounded(ctx, store):
            return fn(store)
    except StateError as exc:
        raise _guard(exc, ctx, action) from exc


def get(ctx: CallContext, key: str) -> bytes:
    """The value under ``key``; ``not-found`` when absent."""
    value = _op(ctx, "get", key, lambda store: store.get(key))
    if value is None:
        raise HostCallError("not-found", f"no key {key!r}")
    return value


def set_(ctx: CallContext, key: str, value: bytes) -> None:
    """Store ``value`` durably."""
    _op(ctx, "set", key, lambda store: store.set(key, bytes(value)))


def delete(ctx: CallContext, key: str) -> bool:
    """Remove ``key``."""
    return _op(ctx, "delete", key, lambda store: store.delete(key))


def keys(ctx: CallContext, prefix: str, limit: int) -> list[str]:
    """Keys with ``prefix``, in order."""
    return list(_op(ctx, "keys", None, lambda store: store.keys(prefix, min(limit, 10_000))))


FUNCTIONS: Functions = {
    "get": (get, "result"),
    "set": (set_, "result"),
    "delete": (delete, "result"),
    "keys": (keys, "result"),
}
