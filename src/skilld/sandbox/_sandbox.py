"""Load components and run calls in their own stores, under hard limits.

A call gets an instance of the pre-compiled component in a store of its own (memory
cap, epoch deadline, sealed WASI whose stdout and stderr are captured): a warm one that
served the same caller's earlier calls of the same skill and finished them cleanly, or a
fresh one (always, under ``instances: fresh``; docs/runtime.md, "Warm instances"). An
instance never serves two callers, and one that trapped, ran past its deadline, was
cancelled, hit its memory cap, met a host fault or a refusal is never used again.
Traps, deadlines and memory exhaustion become :class:`~skilld.errors.GuestFault`
subclasses: a failing guest costs one call.
"""

from __future__ import annotations

import collections
import contextvars
import ctypes
import json
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime import component

from skilld import telemetry
from skilld.call import CallContext, NullChannel, entered
from skilld.errors import (
    CallCancelled,
    CompileError,
    DeadlineExceeded,
    GuestError,
    GuestTrap,
    LinkError,
    MemoryExhausted,
    SandboxError,
    StackExhausted,
)
from skilld.sandbox._engine import TICK_S, Engine
from skilld.sandbox._export import ExportCall
from skilld.sandbox._gil import keep_gil_for_quick_calls
from skilld.sandbox._host import INTERFACES, PACKAGE, build_linker, import_name, to_py
from skilld.sandbox._native import NativeCache, load_native
from skilld.sandbox._warm import Binding, WarmInstances, binding
from skilld.types import (
    CallOutput,
    ContentBlock,
    Limits,
    MethodSpec,
    PromptSpec,
    ResourceSpec,
    SkillSpec,
)

log = logging.getLogger("skilld.sandbox")

# Warming an instance for the pool (guest start code included) must finish within
# this; an instance made for a call has what is left of the call's own wall time.
_INSTANTIATE_BUDGET_S = 10.0
# A running guest is looked at this often (in epoch ticks): is its call cancelled?
_CHECK_TICKS = 10
# Used instances the background worker may leave unfreed before callers free them.
# Each holds a pool slot (and its resident memory) until freed, and a slot touched
# once stays resident: a long backlog under load raised the server's RSS for good.
_MAX_UNFREED = 4
# Components that instantiate faster than this are not pre-warmed (measured: a
# store and instance of echo-wat take about 10 us, a Python component 600-1000 us).
_WARM_WORTH_S = 0.0002

# The components whose background work (freeing used instances, warming new ones) waits
# for the outermost guest call running on this thread: set while one runs (Component._run).
_DEFERRED: contextvars.ContextVar[set[Component] | None] = contextvars.ContextVar(
    "skilld_deferred_tending", default=None
)

GUEST = f"{PACKAGE}/guest"
_WASI_OK = re.compile(r"^wasi:(io|clocks|random|cli|filesystem|sockets)/")


class Sandbox:
    """The engine, the linker and the native-code cache: one per process.

    Args:
        cache_dir: where native code is cached (``None``: compile in memory only).
    """

    def __init__(self, cache_dir: Path | None = None):
        keep_gil_for_quick_calls()
        self.engine = Engine()
        self.linker = build_linker(self.engine.wasmtime)
        self.cache = NativeCache(self.engine, cache_dir) if cache_dir is not None else None
        # Warms fresh instances and frees used ones off the calls' path.
        self.background = ThreadPoolExecutor(max_workers=2, thread_name_prefix="skilld-warm")
        # Idle instances kept for their caller's next call (capped per component and in all).
        self.warm: WarmInstances[_Instance] = WarmInstances()
        self._closed = False

    def close(self) -> None:
        """Free the warm instances, stop the background worker and the epoch ticker; later
        loads are refused."""
        if self._closed:
            return
        self._closed = True
        self.warm.close()
        self.background.shutdown(wait=True, cancel_futures=True)
        self.engine.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def load(self, wasm: bytes, *, name: str, granted: Iterable[str] | None = None) -> Component:
        """Compile (or load cached native code for) ``wasm`` and check its imports.

        Args:
            granted: the skilld interfaces the policy grants (``None``: all).

        Raises:
            CompileError: not a valid component.
            LinkError: it imports an interface that is not granted, or unknown imports.
            SandboxError: the sandbox was closed.
        """
        if self._closed:
            raise SandboxError(f"{name}: the sandbox is closed")
        if self.cache is not None:
            comp = self.cache.load(wasm, name=name)
        else:
            from skilld.sandbox._native import compile_component

            comp = compile_component(self.engine, wasm, name=name)
        return Component(self, comp, name, granted)

    def load_native(
        self,
        path: Path,
        sha256: str,
        *,
        name: str,
        granted: Iterable[str] | None = None,
        opened: tuple[int, str] | None = None,
    ) -> Component:
        """Load verified native code (from a bundle) and check its imports.

        Args:
            opened: ``path`` already open and hashed (see :func:`load_native`).

        Raises:
            DigestMismatch: the file is not the expected bytes.
            CompileError, LinkError: as for :meth:`load`.
        """
        return Component(self, load_native(self.engine, path, sha256, opened=opened), name, granted)


class _Streams:
    """Guest stdout/stderr, routed to whichever call currently owns the instance."""

    def __init__(self) -> None:
        self.ctx: CallContext | None = None

    def stdout(self, data: bytes) -> None:
        if self.ctx is not None:
            self.ctx.capture(self.ctx.stdout, bytes(data))

    def stderr(self, data: bytes) -> None:
        if self.ctx is not None:
            self.ctx.capture(self.ctx.stderr, bytes(data))


# wasmtime's epoch-deadline callback: (context, data, *delta, *update kind) -> error or 0
_EpochCallback = ctypes.CFUNCTYPE(
    ctypes.c_size_t,
    ctypes.POINTER(ffi.wasmtime_context_t),
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_uint64),
    ctypes.POINTER(ctypes.c_uint8),
)
_NO_FINALIZER = ctypes.cast(0, ctypes.CFUNCTYPE(None, ctypes.c_void_p))
_STOPPED_TEXT = "skilld: call stopped"
_STOPPED = re.compile(re.escape(_STOPPED_TEXT) + r" \((deadline|cancelled)\)")
_CONTINUE = 0  # WASMTIME_UPDATE_DEADLINE_CONTINUE


def _stop_reason(text: str) -> str | None:
    """Why the host stopped a guest, read back from the trap's message (None: it did not)."""
    found = _STOPPED.search(text)
    return found.group(1) if found else None


class _Interrupt:
    """Stops a running guest at its deadline or when its client cancels the call.

    wasmtime calls back into the host when a store's epoch deadline is reached, on
    the guest's own thread. The deadline is set at most ``_CHECK_TICKS`` ahead, so the
    callback sees the guest at least that often: it traps the guest when the wall
    clock passed the call's deadline or the channel says cancelled, and otherwise
    lets it run to the next check. A store is only ever touched from the thread
    running it, which a cancel from another thread could not do safely.
    """

    __slots__ = ("at", "callback", "ctx", "reason")

    def __init__(self, store: wasmtime.Store, budget_s: float):
        self.at = time.monotonic() + budget_s
        self.ctx: CallContext | None = None
        self.reason: str | None = None
        # kept alive with the store (None once it is freed)
        self.callback: Any = _EpochCallback(self._on_deadline)
        ffi.wasmtime_store_epoch_deadline_callback(store.ptr(), self.callback, None, _NO_FINALIZER)
        store.set_epoch_deadline(self._next_check())

    def arm(self, store: wasmtime.Store, ctx: CallContext | None, budget_s: float) -> None:
        """Start the clock for one call (or warm-up) of ``budget_s`` seconds."""
        self.at = time.monotonic() + budget_s
        self.ctx = ctx
        self.reason = None
        store.set_epoch_deadline(self._next_check())

    def _next_check(self) -> int:
        remaining = math.ceil((self.at - time.monotonic()) / TICK_S)
        return max(1, min(remaining, _CHECK_TICKS))

    def _on_deadline(self, _context: Any, _data: Any, delta: Any, kind: Any) -> int:
        try:
            now = time.monotonic()
            if self.ctx is not None and self.ctx.channel.cancelled():
                self.reason = "cancelled"
            elif now >= self.at:
                self.reason = "deadline"
            else:
                delta[0] = self._next_check()
                kind[0] = _CONTINUE
                return 0
        except Exception:  # noqa: BLE001 - an exception must not unwind through wasm frames
            self.reason = "deadline"
        error = ffi.wasmtime_error_new(f"{_STOPPED_TEXT} ({self.reason})".encode())
        return ctypes.cast(error, ctypes.c_void_p).value or 0


@dataclass(slots=True)
class _Instance:
    store: wasmtime.Store
    instance: component.Instance
    streams: _Streams
    memory_bytes: int
    interrupt: _Interrupt
    # Calls served so far (a warm instance serves one caller's, up to its policy's cap).
    calls: int = 0
    # Its exports' functions, looked up once (by the export index's id): a warm instance
    # is called many times, and a lookup builds a new Func each time.
    funcs: dict[int, component.Func] = field(default_factory=dict)


def _free(inst: _Instance) -> None:
    """Free a used instance's store (its pool slot is reset for the next tenant)."""
    inst.store.close()
    # The epoch callback refers back to its _Interrupt: drop it now that no guest can
    # run, so freeing the rest needs no garbage collection.
    inst.interrupt.callback = None


_NO_CLIENT = NullChannel("no client during warm-up")


@dataclass(frozen=True, slots=True)
class _Exports:
    describe: component.ExportIndex
    call: component.ExportIndex
    read_resource: component.ExportIndex
    get_prompt: component.ExportIndex


class Component:
    """A loaded skill component; :meth:`call` runs one method in a fresh instance."""

    def __init__(
        self, sandbox: Sandbox, comp: component.Component, name: str, granted: Iterable[str] | None
    ):
        self.sandbox = sandbox
        self.native = comp
        self.name = name
        self.imports = self._check_imports(granted)
        guest = comp.get_export_index(f"{GUEST}@{_abi()}")
        if guest is None:
            raise LinkError(
                f"{name}: does not export {GUEST}@{_abi()}",
                hint="build it with 'skilld skill build'",
            )
        idx = {
            n: comp.get_export_index(n, guest)
            for n in ("describe", "call", "read-resource", "get-prompt")
        }
        found = {n: i for n, i in idx.items() if i is not None}
        missing = sorted(set(idx) - set(found))
        if missing:
            raise LinkError(f"{name}: guest export lacks {', '.join(missing)}")
        self._exports = _Exports(
            found["describe"], found["call"], found["read-resource"], found["get-prompt"]
        )
        # Each export's call with its types read once (keyed by id of its ExportIndex).
        self._calls: dict[int, ExportCall] = {}
        self._pool: queue.SimpleQueue[_Instance] = queue.SimpleQueue()
        self._pool_limits: Limits | None = None
        self._pool_depth = 0
        self._warm_call = ("", "{}")
        self._closed = False
        # How fast this component instantiates (decides whether warming is worth it).
        self._instantiate_s = math.inf
        # Used instances wait here until the background worker frees them.
        self._used: collections.deque[_Instance] = collections.deque()
        self._tend_lock = threading.Lock()
        self._tending = False

    def _check_imports(self, granted: Iterable[str] | None) -> frozenset[str]:
        allowed = set(INTERFACES if granted is None else granted) | {"log"}
        used: set[str] = set()
        # A component that imports no WASI (one written in WAT, say) gets no WASI context.
        self._wasi = False
        for imp in self.native.type.imports(self.sandbox.engine.wasmtime):
            if _WASI_OK.match(imp):
                self._wasi = True
                continue
            for interface in INTERFACES:
                if imp == import_name(interface):
                    used.add(interface)
                    break
            else:
                if imp != f"{PACKAGE}/types@{_abi()}":
                    raise LinkError(f"{self.name}: imports {imp}, which skilld does not provide")
        denied = sorted(used - allowed)
        if denied:
            raise LinkError(
                f"{self.name}: imports {', '.join(denied)} but its policy does not grant "
                f"{'it' if len(denied) == 1 else 'them'}",
                hint="grant the capability in policies/, or rebuild the skill without the need",
            )
        return frozenset(used)

    # -- instances ---------------------------------------------------------
    #
    # Every call gets an instance no other call has touched. Creating one costs
    # instantiation (about 0.5 ms for a Python component, from the engine's pooling
    # allocator) plus the guest runtime's first run through its call path (page faults
    # and lazy set-up), so with ``prewarm`` a background worker keeps a few fresh
    # instances ready, each already run once by a host-chosen ``call`` (by default of
    # the method named "", which no skill has: the guest answers "not found") with no
    # user input. A call takes one, uses it once and throws it away: nothing of one
    # call can reach the next (tests/sandbox/test_isolation.py checks it under
    # concurrency, pooled slots included).

    def prewarm(
        self, limits: Limits, depth: int = 3, *, warm_call: tuple[str, str] = ("", "{}")
    ) -> None:
        """Keep ``depth`` fresh, initialised instances ready for calls under ``limits``.

        Three by default: a delegate program calls a kit's skill several times in a row,
        faster than the background worker refills, and with two ready instances about
        one nested call in seven instantiated on its path (five in ninety with three;
        bench numbers in docs/runtime.md).

        Args:
            warm_call: the (method, JSON arguments) each instance runs once before a
                call takes it, chosen by the host and never user input. The default
                runs the guest's call path up to "unknown method"; a component whose
                calls go much further (delegate's runner compiles and runs a program)
                is warmed better by a constant call of its own: the page faults and
                lazy set-up of that path are then paid off the call's path.
        """
        # Filled after the first call, not now: warming at start-up would compete
        # with serving's own start for the CPU.
        self._pool_limits = limits
        self._pool_depth = depth
        self._warm_call = warm_call

    def _fresh(
        self,
        memory_bytes: int,
        preopens: tuple[tuple[str, str, bool], ...] = (),
        *,
        ctx: CallContext | None = None,
    ) -> _Instance:
        """A new store and instance; the caller keeps the epoch ticker running.

        For a call (``ctx``), instantiation and the guest's start code count against
        the call's wall time and stop when the client cancels it.
        """
        engine = self.sandbox.engine
        holder = _Streams()
        store = wasmtime.Store(engine.wasmtime)
        if self._wasi:
            wasi = wasmtime.WasiConfig()
            wasi.stdout_custom = holder.stdout
            wasi.stderr_custom = holder.stderr
            for host, guest, writable in preopens:
                wasi.preopen_dir(host, guest, fs_mutable=writable)
            store.set_wasi(wasi)
        store.set_limits(memory_size=memory_bytes)
        # Instantiation runs guest start code, which the epoch interrupts too; the
        # deadline of the call proper is armed again right before the call.
        budget = _INSTANTIATE_BUDGET_S if ctx is None else ctx.remaining()
        interrupt = _Interrupt(store, budget)
        interrupt.ctx = ctx
        started = time.perf_counter()
        instance = self.sandbox.linker.instantiate(store, self.native)
        # The fastest one seen: a slow one says more about the machine's load than us.
        self._instantiate_s = min(self._instantiate_s, time.perf_counter() - started)
        return _Instance(store, instance, holder, memory_bytes, interrupt)

    def _warm_one(self) -> bool:
        limits = self._pool_limits
        if limits is None or self._closed:
            return False
        engine = self.sandbox.engine
        warm_ctx = CallContext(f"{self.name} (warm-up)", limits, _NO_CLIENT)
        try:
            # The ticker runs from before instantiation: guest start code can loop too.
            engine.ticker.enter()
            try:
                inst = self._fresh(limits.memory_bytes)
                inst.streams.ctx = warm_ctx
                inst.interrupt.arm(inst.store, None, _INSTANTIATE_BUDGET_S)
                with entered(warm_ctx):
                    # ``call`` (by default of the method named "", which no method has:
                    # the guest runs its call path up to the "unknown method" error). Its
                    # answer is a small record, where describe's would be lifted into
                    # Python objects while holding the GIL the calls need.
                    func = inst.instance.get_func(inst.store, self._exports.call)
                    if func is None:  # pragma: no cover - checked at load
                        return False
                    inst.funcs[id(self._exports.call)] = func
                    self._export_call(self._exports.call, func, inst.store)(
                        func, inst.store, *self._warm_call
                    )
                    func.post_return(inst.store)
            finally:
                engine.ticker.leave()
        except wasmtime.WasmtimeError:
            log.warning("warming an instance of %s failed; calls will instantiate", self.name)
            return False
        self._pool.put(inst)
        return True

    def _take(self, ctx: CallContext) -> _Instance:
        if ctx.preopens:
            return self._fresh(ctx.limits.memory_bytes, ctx.preopens, ctx=ctx)
        limits = self._pool_limits
        if limits is not None and ctx.limits.memory_bytes == limits.memory_bytes:
            try:
                inst = self._pool.get_nowait()
            except queue.Empty:
                pass
            else:
                telemetry.annotate({"skilld.instance": "warm"})
                return inst
        return self._fresh(ctx.limits.memory_bytes, ctx=ctx)

    def _retire(self, inst: _Instance, deferred: set[Component] | None = None) -> None:
        """Hand a used instance to the background worker, which frees it.

        Freeing (and warming a replacement) during a call slows it: both map and
        unmap memory, which stalls the running guest's page faults. One tending task
        per component does the work, so a burst of calls queues instances, not tasks;
        if it still falls behind, the caller frees an instance itself, so the used
        ones can never fill the engine's instance pool.

        A nested call (``invoke``: a delegate program's tool calls, say) leaves the
        worker alone while ready instances are left: this component goes into
        ``deferred``, and the outermost guest call starts its worker when it ends. A
        program's calls come back to back, and a refill running meanwhile took the
        cores from the program (in process, a delegate of three notes calls with three
        warm instances: p50 10.6 / 9.3 ms refilling during the program, 9.2 / 8.7 ms
        after it; docs/runtime.md).
        """
        if self._instantiate_s < _WARM_WORTH_S:
            # A small component's store frees in microseconds: no worker needed.
            _free(inst)
            return
        if self._pool.qsize() == 0:
            # The program already runs out of ready instances: refill now, or each of
            # its next calls would instantiate on its path.
            deferred = None
        with self._tend_lock:
            self._used.append(inst)
            behind = len(self._used) > _MAX_UNFREED
            start = not self._tending and deferred is None
            self._tending = self._tending or start
        if behind:
            with self._tend_lock:
                oldest = self._used.popleft() if self._used else None
            if oldest is not None:
                _free(oldest)
        if deferred is not None:
            deferred.add(self)
        elif start:
            self.sandbox.background.submit(self._tend)

    def _kick(self) -> None:
        """Start the background worker if it is idle and has work (see :meth:`_retire`)."""
        with self._tend_lock:
            start = not self._tending and (bool(self._used) or self._wants_warm())
            self._tending = self._tending or start
        if start:
            self.sandbox.background.submit(self._tend)

    def _tend(self) -> None:
        # Free what calls used, then top the pool of warm instances up to its depth.
        # After a failed warm-up only free: the next call's retirement tries again.
        warm = True
        while True:
            with self._tend_lock:
                used = self._used.popleft() if self._used else None
                if used is None and not (warm and self._wants_warm()):
                    self._tending = False
                    return
            if used is not None:
                _free(used)
            else:
                warm = self._warm_one()

    def _wants_warm(self) -> bool:
        return (
            self._pool_limits is not None
            and not self._closed
            # Warming pays where instantiating is slow (a guest runtime such as
            # CPython); for a small component it only doubles the work of a call.
            and self._instantiate_s >= _WARM_WORTH_S
            and self._pool.qsize() < self._pool_depth
        )

    def close(self) -> None:
        """Stop refilling the pool and drop the ready and the warm instances."""
        self._closed = True
        self.sandbox.warm.drop(self)
        while True:
            try:
                self._pool.get_nowait()
            except queue.Empty:
                return

    def _run(
        self,
        ctx: CallContext,
        export: component.ExportIndex,
        *args: Any,
        clean: Callable[[Any], bool] | None = None,
    ) -> Any:
        """Run ``export`` for ``ctx`` on an instance: a warm one of its caller, or fresh.

        ``clean`` says whether the guest's answer leaves its instance fit for the same
        caller's next call (``call`` passes one); without it, and under ``instances:
        fresh`` or with preopens, the instance serves this call only.
        """
        # Guest code never runs inline (on the server's event loop), decided here, before
        # any of it runs: an inline attempt gives up unseen and the call runs once, on a
        # worker thread. A guest stopped inline and run again on a thread would run its
        # body twice (its host calls' side effects too), and one that ran to its end
        # inline would hold up every session for as long as it liked. A thread costs
        # about what the attempt saved (docs/runtime.md) and lets the guest run on
        # another core while the event loop serves other sessions.
        ctx.thread_only()
        engine = self.sandbox.engine
        # The outermost guest call on this thread collects the components its nested
        # calls used, and starts their background work when it ends (see _retire).
        deferred = _DEFERRED.get()
        token = _DEFERRED.set(set()) if deferred is None else None
        limits = ctx.limits
        bound = (
            binding(self, ctx.caller)
            if clean is not None and not limits.fresh_instances and not ctx.preopens
            else None
        )
        engine.ticker.enter()
        inst: _Instance | None = None
        keep = False
        try:
            if ctx.deadline is None:
                ctx.deadline = time.monotonic() + limits.timeout_ms / 1000
            with telemetry.stage("skilld.instance", {"skilld.instance": "fresh"}):
                inst = self._take_warm(bound, limits.memory_bytes) if bound else None
                if inst is None:
                    inst = self._take(ctx)
                else:
                    # The caller's own instance, used before ("warm" is a pre-warmed one).
                    telemetry.annotate({"skilld.instance": "reused"})
            inst.calls += 1
            ctx.audit["instances"] = "fresh" if bound is None else "warm"
            ctx.audit["instance_call"] = inst.calls
            inst.streams.ctx = ctx
            inst.interrupt.arm(inst.store, ctx, ctx.remaining())
            with entered(ctx), telemetry.run_span("skilld.guest.run"):
                func = inst.funcs.get(id(export))
                if func is None:
                    func = inst.instance.get_func(inst.store, export)
                    if func is None:  # pragma: no cover - checked at load
                        raise LinkError(f"{self.name}: export vanished")
                    inst.funcs[id(export)] = func
                result = self._export_call(export, func, inst.store)(func, inst.store, *args)
                func.post_return(inst.store)
            keep = (
                bound is not None
                and clean is not None
                and inst.calls < limits.instance_calls
                and clean(result)
                and _left_clean(ctx)
            )
        except wasmtime.WasmtimeError as exc:
            stopped = inst.interrupt.reason if inst else _stop_reason(str(exc))
            raise self._fault(exc, ctx, stopped) from None
        finally:
            try:
                engine.ticker.leave()
                ctx.close_handles()
                if inst is not None:
                    inst.streams.ctx = None
                    if keep and bound is not None:
                        # The idle instance must not keep its last call's context alive.
                        inst.interrupt.ctx = None
                        self.sandbox.warm.keep(
                            bound, inst, limits.instance_idle_ms / 1000, self._discard
                        )
                        # Ready instances still serve other callers' first calls.
                        if deferred is not None:
                            deferred.add(self)
                        else:
                            self._kick()
                    else:
                        self._retire(inst, deferred)
            finally:
                if token is not None:
                    nested = _DEFERRED.get() or set()
                    _DEFERRED.reset(token)
                    for comp in nested:
                        comp._kick()
        return result

    def _export_call(
        self, export: component.ExportIndex, func: component.Func, store: wasmtime.Store
    ) -> ExportCall:
        """How to call ``export`` (its types read from ``func`` on the first call)."""
        call = self._calls.get(id(export))
        if call is None:
            # Two threads may both build it; either result is the same.
            call = self._calls[id(export)] = ExportCall(func, store)
        return call

    def _take_warm(self, bound: Binding, memory_bytes: int) -> _Instance | None:
        """The caller's warm instance of this component, if one is idle (and fits)."""
        inst = self.sandbox.warm.take(bound)
        if inst is not None and inst.memory_bytes != memory_bytes:
            # Its store's memory cap was set for other limits (a policy that changed).
            self._discard(inst)
            return None
        return inst

    def _discard(self, inst: _Instance) -> None:
        """Free an idle warm instance (its idle time ran out, or a cap dropped it)."""
        self._retire(inst)

    def _fault(
        self, exc: wasmtime.WasmtimeError, ctx: CallContext, stopped: str | None
    ) -> SandboxError:
        text = str(exc)
        cause = (
            text.split("Caused by:")[-1].strip().splitlines()[0]
            if "Caused by:" in text
            else text.splitlines()[0]
        )
        where = f"skill '{ctx.skill_id}'"
        # What the host itself did (stopped the guest) decides first: a guest cannot
        # make a deadline look like anything else. Without an instance (stopped while
        # instantiating) the reason is read back from the interrupt's own message.
        if stopped is None:
            stopped = _stop_reason(text)
        if stopped == "cancelled":
            return CallCancelled(f"{where} was stopped: the client cancelled the call")
        if stopped == "deadline":
            return DeadlineExceeded(
                f"{where} ran past its deadline of {ctx.limits.timeout_ms} ms and was stopped"
            )
        if "call stack exhausted" in text:
            return StackExhausted(f"{where} overflowed its stack")
        stderr = bytes(ctx.stderr).decode(errors="replace")
        # CPython in the guest reports a failed memory.grow as MemoryError and may then
        # abort; wasmtime does not say the cap was the cause. A guest could print
        # MemoryError itself, but that only mislabels its own failed call.
        if "MemoryError" in stderr or ("memory" in cause and "limit" in cause):
            return MemoryExhausted(
                f"{where} exceeded its memory cap of {ctx.limits.memory_bytes // (1 << 20)} MiB"
            )
        tail = f"; guest stderr: {stderr.strip()[-500:]}" if stderr.strip() else ""
        # The trap's text goes to the audit record only: a panic message or a traceback
        # can quote the guest's data or the host's internals.
        return GuestTrap(
            f"{where} trapped (the audit record has the trap's text)", detail=f"{cause}{tail}"
        )

    def _guest_error(self, rec: Any, ctx: CallContext) -> SandboxError | GuestError:
        err = to_py(rec)
        if err["code"] == "limit-exceeded" and "out of memory" in err["message"]:
            return MemoryExhausted(
                f"skill '{ctx.skill_id}' exceeded its memory cap of "
                f"{ctx.limits.memory_bytes // (1 << 20)} MiB"
            )
        return GuestError(
            err["code"], err["message"], rule=err["rule"], location=f"skill '{ctx.skill_id}'"
        )

    def describe(self, ctx: CallContext) -> SkillSpec:
        """Ask the guest what it is and offers.

        Raises:
            GuestFault: the guest failed; CompileError: its answer is malformed.
        """
        info = to_py(self._run(ctx, self._exports.describe))
        try:
            return SkillSpec(
                id=info["id"],
                version=info["version"],
                description=info["description"],
                methods=tuple(
                    MethodSpec(
                        m["name"],
                        m["description"],
                        json.loads(m["params_schema"]),
                        json.loads(m["result_schema"]) if m["result_schema"] else None,
                    )
                    for m in info["methods"]
                ),
                resources=tuple(
                    ResourceSpec(
                        r["uri"], r["name"], r["description"], r["mime_type"], r["template"]
                    )
                    for r in info["resources"]
                ),
                prompts=tuple(
                    PromptSpec(p["name"], p["description"], json.loads(p["arguments_schema"]))
                    for p in info["prompts"]
                ),
            )
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise CompileError(f"{self.name}: describe returned malformed data: {exc}") from exc

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        """Run ``method`` with JSON arguments in a fresh instance.

        With ``ctx.inline`` set (an inline attempt, on the server's event loop) it
        raises :class:`RunOnThread` before any guest code runs: guests run on threads.

        Raises:
            GuestError: the guest returned a typed error.
            GuestFault: trap, deadline, memory or stack exhaustion.
            RunOnThread: an inline attempt gave up.
        """
        result = self._run(ctx, self._exports.call, method, args_json, clean=_answered)
        if result.tag == "err":
            raise self._guest_error(result.payload, ctx)
        out = to_py(result.payload)
        _check_size(_raw_size(out), ctx)
        return _output(out)

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        """Read a resource the skill serves.

        Raises:
            GuestError, GuestFault: as for :meth:`call`.
        """
        result = self._run(ctx, self._exports.read_resource, uri)
        if isinstance(result, component.Record):
            raise self._guest_error(result, ctx)
        outs = [to_py(o) for o in result]
        _check_size(sum(_raw_size(o) for o in outs), ctx)
        return [_output(o) for o in outs]

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        """Render a prompt to MCP messages.

        Raises:
            GuestError, GuestFault: as for :meth:`call`.
        """
        result = self._run(ctx, self._exports.get_prompt, name, args_json)
        if isinstance(result, component.Record):
            raise self._guest_error(result, ctx)
        _check_size(_utf8_len(result), ctx)
        try:
            messages = json.loads(result)
        except json.JSONDecodeError as exc:
            raise GuestError("internal", f"get-prompt returned invalid JSON: {exc}") from exc
        if not isinstance(messages, list):
            raise GuestError("internal", "get-prompt did not return a JSON array")
        return messages


def _answered(result: Any) -> bool:
    """Whether a ``call``'s answer leaves its instance fit for the caller's next call.

    A value or a typed error of the guest's own is a clean finish; running out of memory
    (reported as ``limit-exceeded``) or an ``internal`` error is not.
    """
    if result.tag == "ok":
        return True
    return str(to_py(result.payload)["code"]) not in ("limit-exceeded", "internal")


def _left_clean(ctx: CallContext) -> bool:
    """Whether nothing in the call rules its instance out of further calls.

    No host fault, no refused permission (a guest that met a refusal may hold state
    that only makes sense under it), not cancelled, not past its deadline.
    """
    if ctx.host_faults or any(not d.allowed for d in ctx.decisions):
        return False
    if any(not allowed for _c, _a, allowed, _r in ctx.decisions_beyond):
        return False
    return not ctx.channel.cancelled() and ctx.remaining() > 0


def _raw_size(out: dict[str, Any]) -> int:
    """Bytes of a guest output record: its JSON value and every content payload."""
    size = _utf8_len(out["value"])
    for tag, payload in out["content"]:
        if tag == "text":
            size += _utf8_len(payload)
        else:
            size += len(payload.get("data") or payload.get("blob") or b"")
            size += _utf8_len(payload.get("text") or "")
    return size


def _utf8_len(text: str) -> int:
    # ASCII (the common case: JSON values are ASCII-escaped) is counted without a copy.
    return len(text) if text.isascii() else len(text.encode())


def _check_size(size: int, ctx: CallContext) -> None:
    limit = ctx.limits.output_bytes
    if size > limit:
        raise GuestError(
            "limit-exceeded",
            f"the result is {size} bytes, over the skill's output limit of {limit} bytes",
            location=f"skill '{ctx.skill_id}'",
        )


def _output(out: dict[str, Any]) -> CallOutput:
    try:
        value = json.loads(out["value"])
    except json.JSONDecodeError as exc:
        raise GuestError("internal", f"the skill returned invalid JSON: {exc}") from exc
    blocks = []
    for tag, payload in out["content"]:
        if tag == "text":
            blocks.append(ContentBlock("text", text=payload))
        elif tag in ("image", "audio"):
            blocks.append(
                ContentBlock(tag, mime_type=payload["mime_type"], data=bytes(payload["data"]))
            )
        else:
            blocks.append(
                ContentBlock(
                    "embedded",
                    uri=payload["uri"],
                    mime_type=payload["mime_type"],
                    text=payload["text"],
                    data=None if payload["blob"] is None else bytes(payload["blob"]),
                )
            )
    return CallOutput(value=value, content=tuple(blocks))


def _abi() -> str:
    from skilld import ABI_VERSION

    return ABI_VERSION
