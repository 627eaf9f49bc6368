"""Warm instances: an idle instance kept for the next call of the same skill by the same caller.

An instance that finished a call cleanly may serve that caller's next call of that skill
(docs/runtime.md, "Warm instances"). It is bound to a :data:`Binding` (the component and
the caller's key and authorization) and handed to no other. :class:`WarmInstances` holds
the idle ones of a whole sandbox: a few per component and a few in all, the least
recently used dropped first, and each dropped once it sat idle longer than its policy
allows. A dropped instance goes to its component to be freed (off the calls' path).
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from skilld.types import Caller

# Idle warm instances per component and in a whole sandbox. A CPython instance keeps
# 5-14 MiB resident once used (an echo call's, a runner's after a program): the totals
# bound what warm instances can cost at about 32 x 14 MiB (docs/runtime.md measures).
PER_COMPONENT = 16
TOTAL = 32

Binding = tuple[object, str, frozenset[str], frozenset[str]]

Inst = TypeVar("Inst")


def binding(component: object, caller: Caller) -> Binding:
    """What a warm instance is bound to: its component, the caller's key and authorization.

    The scopes and groups are part of it, so a caller whose authorization changed (a new
    token with other scopes, say) gets a fresh instance, never the one its old
    authorization used.
    """
    principal = caller.principal
    return (component, caller.key, principal.scopes, principal.groups)


@dataclass(slots=True)
class _Idle(Generic[Inst]):
    instance: Inst
    binding: Binding
    expires: float
    discard: Callable[[Inst], None] = field(repr=False)


class WarmInstances(Generic[Inst]):
    """The idle warm instances of one sandbox, by binding, least recently used first.

    Thread-safe. An instance taken out is the taker's alone until it is kept again or
    discarded; an instance is never in here twice.

    Args:
        per_component: at most this many idle instances of one component.
        total: at most this many in all.
    """

    def __init__(self, per_component: int = PER_COMPONENT, total: int = TOTAL):
        self.per_component = per_component
        self.total = total
        self._lock = threading.Condition()
        # id(instance) -> entry, oldest use first (the LRU order)
        self._lru: collections.OrderedDict[int, _Idle[Inst]] = collections.OrderedDict()
        # binding -> ids of its idle instances, most recently used last
        self._by_binding: dict[Binding, list[int]] = {}
        self._per_component: collections.Counter[int] = collections.Counter()
        self._sweeper: threading.Thread | None = None
        # When the sweeper wakes next (inf: not until a keep wakes it).
        self._sweep_at = math.inf
        self._closed = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._lru)

    def count(self, component: object) -> int:
        """How many idle instances ``component`` has here."""
        with self._lock:
            return self._per_component[id(component)]

    def take(self, bound: Binding) -> Inst | None:
        """An idle instance bound to ``bound`` (the most recently used), or None."""
        now = time.monotonic()
        expired: list[_Idle[Inst]] = []
        found: Inst | None = None
        with self._lock:
            ids = self._by_binding.get(bound)
            while ids:
                entry = self._remove(ids[-1])
                if entry.expires <= now:
                    expired.append(entry)
                    continue
                found = entry.instance
                break
        for entry in expired:
            entry.discard(entry.instance)
        return found

    def keep(
        self, bound: Binding, instance: Inst, idle_s: float, discard: Callable[[Inst], None]
    ) -> None:
        """Keep ``instance`` idle for ``bound``'s next call, for at most ``idle_s`` seconds.

        Past a cap, the least recently used instance (of the component, then of all) is
        dropped: ``discard`` (its own) frees it.
        """
        dropped: list[_Idle[Inst]] = []
        component = id(bound[0])
        with self._lock:
            if self._closed:
                dropped.append(_Idle(instance, bound, 0.0, discard))
            else:
                key = id(instance)
                expires = time.monotonic() + idle_s
                self._lru[key] = _Idle(instance, bound, expires, discard)
                self._by_binding.setdefault(bound, []).append(key)
                self._per_component[component] += 1
                if self._per_component[component] > self.per_component:
                    oldest = next(k for k, e in self._lru.items() if id(e.binding[0]) == component)
                    dropped.append(self._remove(oldest))
                while len(self._lru) > self.total:
                    dropped.append(self._remove(next(iter(self._lru))))
                self._start_sweeper()
                # Wake the sweeper only to bring its wake-up forward: waking it on every
                # keep cost a thread switch per call (0.9 ms of a delegate's in process).
                if expires < self._sweep_at:
                    self._lock.notify()
        for entry in dropped:
            entry.discard(entry.instance)

    def drop(self, component: object | None = None) -> None:
        """Discard every idle instance (of ``component``, or all of them)."""
        with self._lock:
            keys = [
                k for k, e in self._lru.items() if component is None or e.binding[0] is component
            ]
            dropped = [self._remove(k) for k in keys]
        for entry in dropped:
            entry.discard(entry.instance)

    def close(self) -> None:
        """Discard every idle instance and stop the sweeper; later ``keep`` discards."""
        with self._lock:
            self._closed = True
            self._lock.notify()
            sweeper = self._sweeper
        self.drop()
        if sweeper is not None and sweeper is not threading.current_thread():
            sweeper.join()

    def _remove(self, key: int) -> _Idle[Inst]:
        entry = self._lru.pop(key)
        ids = self._by_binding[entry.binding]
        ids.remove(key)
        if not ids:
            del self._by_binding[entry.binding]
        self._per_component[id(entry.binding[0])] -= 1
        return entry

    def _start_sweeper(self) -> None:
        if self._sweeper is None:
            self._sweeper = threading.Thread(
                target=self._sweep, name="skilld-warm-sweeper", daemon=True
            )
            self._sweeper.start()

    def _sweep(self) -> None:
        # Drops instances whose idle time ran out, so an idle server gives their memory
        # back without waiting for a call. Sleeps until the next expiry (or a keep).
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                expired = [k for k, e in self._lru.items() if e.expires <= now]
                dropped = [self._remove(k) for k in expired]
                if not dropped:
                    self._sweep_at = min((e.expires for e in self._lru.values()), default=math.inf)
                    wait = self._sweep_at - now
                    self._lock.wait(None if wait == math.inf else max(wait, 0.001))
                    self._sweep_at = -math.inf  # awake: a keep meanwhile need not wake it
            for entry in dropped:
                entry.discard(entry.instance)
