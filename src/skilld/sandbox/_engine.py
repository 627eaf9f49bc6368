"""The one wasmtime engine, its epoch ticker and its fingerprint."""

from __future__ import annotations

import hashlib
import logging
import platform
import resource
import threading
import time
from importlib.metadata import version

import wasmtime
from wasmtime import _ffi as ffi

log = logging.getLogger("skilld.sandbox")

# One epoch tick per millisecond: a deadline lands within a tick or two of its time.
TICK_S = 0.001
# The allocation strategy (pooling or on demand) is not in the tag: it does not change
# the compiled code (checked: both engines serialize the same bytes and load each other's).
_CONFIG_TAG = "epoch=1;max_wasm_stack=default;cranelift=speed"

# The pooling allocator's bounds. Memory and tables are virtual reservations, touched
# only when used; what stays resident is what live instances use (see below).
POOL_INSTANCES = 512  # component instances alive at once (calls, warm instances, invokes)
POOL_MAX_MEMORY = 4 << 30  # a 32-bit memory's whole range: policy caps are enforced per store
_POOL_TABLE_ELEMENTS = 1 << 18
_POOL_INSTANCE_SIZE = 16 << 20
# A freed slot keeps nothing of its linear memory resident: wasmtime decommits it
# (and re-maps the guest's initial image) for the next tenant. Keeping 16 MiB resident
# spared the next instance its page faults, but every slot ever touched kept it, not just
# the warm ones, and while fewer than _POOL_WARM_SLOTS freed slots are warm the
# allocator takes an untouched slot rather than reuse one: a soak at concurrency 16 held
# 600-900 MB with 32 warm slots and still crept upwards (368 -> 437 MB over minutes 2-10)
# with 8. Kept at 0 it stays near 160 MB and comes back down between bursts, at no
# throughput cost seen: calls mostly run on instances pre-warmed off their path, where
# the page faults are taken (bench/bench_soak.py, docs/runtime.md).
_POOL_KEEP_RESIDENT = 0
_POOL_WARM_SLOTS = 8


class Ticker:
    """Advances the engine's epoch every millisecond while any call is running.

    Idle when no call is in flight, so an idle host burns no CPU.
    """

    def __init__(self, engine: wasmtime.Engine):
        self._engine = engine
        self._active = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="skilld-epoch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # The epoch follows the monotonic clock (one tick per elapsed millisecond of
        # active time), so sleep overshoot never stretches a deadline. Idle time is
        # not caught up: a burst of ticks could fire a deadline set just before it.
        ticks = 0
        base = time.monotonic()
        while True:
            with self._cond:
                if self._active == 0 and not self._closed:
                    while self._active == 0 and not self._closed:
                        self._cond.wait()
                    ticks, base = 0, time.monotonic()
                if self._closed:
                    return
            time.sleep(TICK_S)
            due = int((time.monotonic() - base) / TICK_S)
            while ticks < due:
                self._engine.increment_epoch()
                ticks += 1

    def enter(self) -> None:
        """A call starts: keep ticking."""
        with self._cond:
            self._active += 1
            self._cond.notify()

    def leave(self) -> None:
        """A call ended."""
        with self._cond:
            self._active -= 1

    def close(self) -> None:
        """Stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=1)


def _address_space_unlimited() -> bool:
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return soft == resource.RLIM_INFINITY


def _use_pooling(config: wasmtime.Config) -> None:
    """Allocate instances from a pool of pre-reserved slots instead of mapping each anew.

    A fresh instance per call is the sandbox's rule; the pool makes it cheap. A slot's
    memory is reset when its instance is freed (zeroed and re-filled from the
    component's initial image, as wasmtime does between tenants), so nothing of one
    call reaches the next, and a kept-resident slot spares the next guest the page
    faults that otherwise dominate a Python component's first call (measured in
    bench/bench_sandbox.py). The Python binding has no wrapper for these settings,
    so the C API is called directly.
    """
    pool = ffi.wasmtime_pooling_allocation_config_new()
    try:
        ffi.wasmtime_pooling_allocation_config_total_component_instances_set(pool, POOL_INSTANCES)
        ffi.wasmtime_pooling_allocation_config_total_core_instances_set(pool, POOL_INSTANCES * 8)
        ffi.wasmtime_pooling_allocation_config_total_memories_set(pool, POOL_INSTANCES * 2)
        ffi.wasmtime_pooling_allocation_config_total_tables_set(pool, POOL_INSTANCES * 4)
        ffi.wasmtime_pooling_allocation_config_total_stacks_set(pool, POOL_INSTANCES)
        ffi.wasmtime_pooling_allocation_config_max_memory_size_set(pool, POOL_MAX_MEMORY)
        ffi.wasmtime_pooling_allocation_config_table_elements_set(pool, _POOL_TABLE_ELEMENTS)
        ffi.wasmtime_pooling_allocation_config_max_core_instance_size_set(pool, _POOL_INSTANCE_SIZE)
        ffi.wasmtime_pooling_allocation_config_max_component_instance_size_set(
            pool, _POOL_INSTANCE_SIZE
        )
        ffi.wasmtime_pooling_allocation_config_linear_memory_keep_resident_set(
            pool, _POOL_KEEP_RESIDENT
        )
        ffi.wasmtime_pooling_allocation_config_table_keep_resident_set(pool, 1 << 20)
        ffi.wasmtime_pooling_allocation_config_max_unused_warm_slots_set(pool, _POOL_WARM_SLOTS)
        ffi.wasmtime_pooling_allocation_strategy_set(config.ptr(), pool)
    finally:
        ffi.wasmtime_pooling_allocation_config_delete(pool)


def _cpu_features() -> str:
    # Cranelift compiles for the host CPU's features: native code built on a newer CPU
    # may not run on an older one, so the features belong in the fingerprint.
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
                    return hashlib.sha256(flags.encode()).hexdigest()[:8]
    except OSError:
        pass
    return "unknown"


def engine_fingerprint() -> tuple[str, str]:
    """(description, 16-hex fingerprint) of the engine this process creates."""
    ident = (
        f"wasmtime {version('wasmtime')};{platform.machine()};{platform.system()};"
        f"cpu {_cpu_features()};{_CONFIG_TAG}"
    )
    return ident, hashlib.sha256(ident.encode()).hexdigest()[:16]


class Engine:
    """The wasmtime engine skilld runs every guest on, with epoch interruption.

    ``fingerprint`` names everything that makes compiled native code valid:
    the wasmtime version, the target and the configuration. Native code compiled
    under another fingerprint is never loaded.
    """

    def __init__(self) -> None:
        config = wasmtime.Config()
        config.epoch_interruption = True
        config.cranelift_opt_level = "speed"
        # The pool reserves its address space up front; under a hard address-space limit
        # (ulimit -v) wasmtime would fail to map it and abort the process, so instances
        # are then allocated on demand (slower calls, same isolation).
        self.pooling = _address_space_unlimited()
        if self.pooling:
            _use_pooling(config)
        else:
            log.warning(
                "the address space is limited (ulimit -v): wasm instances are allocated on "
                "demand instead of from a pool, so calls are slower"
            )
        self.wasmtime = wasmtime.Engine(config)
        self.ticker = Ticker(self.wasmtime)
        self.description, self.fingerprint = engine_fingerprint()

    def close(self) -> None:
        """Stop the ticker thread."""
        self.ticker.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
