"""The one wasmtime engine, its epoch ticker and its fingerprint."""

from __future__ import annotations

import hashlib
import platform
import threading
import time
from importlib.metadata import version

import wasmtime

# One epoch tick per millisecond: a deadline lands within a tick or two of its time.
TICK_S = 0.001
_CONFIG_TAG = "epoch=1;max_wasm_stack=default;cranelift=speed"


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
