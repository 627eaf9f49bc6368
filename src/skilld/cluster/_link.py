"""The node's one NATS connection, on an event loop of its own thread.

Guest calls block on worker threads; the NATS client is asyncio. The link runs the
client on a private loop in a daemon thread and gives the rest of the cluster
package two ways in: :meth:`NatsLink.run` (wait for a coroutine's result, bounded)
and :meth:`NatsLink.spawn` (fire and forget). nats-py's exceptions become
:class:`~skilld.errors.ClusterError` here and in the modules that call NATS.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.aio.client import Client
from nats.js.api import KeyValueConfig
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from skilld.cluster._config import ClusterConfig
from skilld.errors import ClusterError, UsageError
from skilld.package import nkeys
from skilld.paths import read_private

T = TypeVar("T")
log = logging.getLogger("skilld.cluster")


def _read_secret(path: Any, what: str) -> str:
    """A NATS secret file's text; it must be private (``skilld.paths.read_private``)."""
    data = read_private(Path(path), what)
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise UsageError(f"the {what} is not UTF-8 text", location=str(path)) from exc


class NatsLink:
    """One NATS connection on its own loop thread.

    ``on_disconnect`` and ``on_reconnect`` are called on the link's loop.
    """

    def __init__(
        self,
        config: ClusterConfig,
        *,
        on_disconnect: Callable[[], None] = lambda: None,
        on_reconnect: Callable[[], None] = lambda: None,
    ):
        self.config = config
        self._on_disconnect = on_disconnect
        self._on_reconnect = on_reconnect
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name=f"skilld-nats-{config.node}", daemon=True
        )
        self._nc: Client | None = None
        self._closed = False
        self._publishing: set[asyncio.Task[None]] = set()

    @property
    def nc(self) -> Client:
        """The connected client (after :meth:`start`)."""
        assert self._nc is not None, "NatsLink.start() first"
        return self._nc

    def start(self) -> None:
        """Connect to NATS (bounded by ``connect_timeout_s``).

        Raises:
            UsageError: a credentials or TLS file cannot be read.
            ClusterError: no server answered, or it refused the credentials.
        """
        options = self._options()
        self._thread.start()
        try:
            self._nc = self.run(nats.connect(**options), timeout=self.config.connect_timeout_s + 1)
        except ClusterError:
            self._stop_loop()
            raise
        except Exception as exc:  # nats-py raises its own tree and OSError: map at the boundary
            self._stop_loop()
            raise ClusterError(
                f"cannot connect to NATS at {self.config.url}: {exc!r}",
                location=self.config.url,
                hint="check --cluster, that nats-server runs, and the NATS credentials",
            ) from exc

    def _options(self) -> dict[str, Any]:
        cfg = self.config

        async def disconnected() -> None:
            log.warning("cluster: lost the NATS connection (%s)", cfg.node)
            self._on_disconnect()

        async def reconnected() -> None:
            log.info("cluster: NATS connection back (%s)", cfg.node)
            self._on_reconnect()

        async def error(exc: Exception) -> None:
            log.info("cluster: NATS: %r", exc)

        options: dict[str, Any] = {
            "servers": cfg.servers(),
            "name": f"skilld-{cfg.node}",
            "connect_timeout": cfg.connect_timeout_s,
            "reconnect_time_wait": cfg.reconnect_wait_s,
            "max_reconnect_attempts": -1,
            "allow_reconnect": True,
            "ping_interval": 5,
            "max_outstanding_pings": 2,
            "disconnected_cb": disconnected,
            "reconnected_cb": reconnected,
            "error_cb": error,
            # Replies to this node land under _INBOX.NODE: the bus `skilld cluster
            # nats-config` writes lets a node subscribe to its own inbox only.
            "inbox_prefix": f"_INBOX.{cfg.node}",
        }
        if cfg.creds_file is not None:
            _read_secret(cfg.creds_file, "NATS creds file")  # fail early and clearly
            options["user_credentials"] = str(cfg.creds_file)
        if cfg.nkey_seed_file is not None:
            # nats-py imports ``nkeys`` to answer the server's challenge: skilld's own
            # (skilld.package.nkeys) stands in where that package is not installed.
            sys.modules.setdefault("nkeys", nkeys.NATS_MODULE)
            options["nkeys_seed_str"] = _read_secret(cfg.nkey_seed_file, "NATS nkey seed file")
        if cfg.user_password_file is not None:
            user, sep, password = _read_secret(cfg.user_password_file, "NATS user file").partition(
                ":"
            )
            if not sep or not user:
                raise UsageError(
                    "the NATS user file must hold one line USER:PASSWORD",
                    location=str(cfg.user_password_file),
                )
            options["user"], options["password"] = user, password
        context = self._tls()
        if context is not None:
            options["tls"] = context
        return options

    def _tls(self) -> ssl.SSLContext | None:
        cfg = self.config
        if not (cfg.tls_ca or cfg.tls_cert or any(u.startswith("tls://") for u in cfg.servers())):
            return None
        try:
            context = ssl.create_default_context(cafile=str(cfg.tls_ca) if cfg.tls_ca else None)
            if cfg.tls_cert and cfg.tls_key:
                context.load_cert_chain(str(cfg.tls_cert), str(cfg.tls_key))
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"cannot load the TLS files: {exc}", location="--nats-tls-*") from exc
        return context

    async def bucket(self, config: KeyValueConfig, timeout: float | None = None) -> KeyValue:
        """The JetStream key-value bucket ``config.bucket``, made with ``config`` when missing.

        An existing bucket is used as it is (its configuration is the first maker's).

        Raises:
            Exception: whatever nats-py raises (no JetStream, a refused bucket): the
                callers map it to their own error or fallback.
        """
        js = self.nc.jetstream() if timeout is None else self.nc.jetstream(timeout=timeout)
        try:
            return await js.key_value(config.bucket)
        except BucketNotFoundError:
            return await js.create_key_value(config)

    async def anonymous_can_listen(self, timeout: float = 2.0) -> bool:
        """Whether a connection with no credentials can subscribe to skilld's subjects.

        The probe the node runs at start-up: connect as nobody (with the same TLS trust,
        so only the credentials differ) and subscribe to ``skilld.>``. A refused
        connection or a permissions violation is the answer hoped for.
        """
        violated = asyncio.Event()

        async def error(exc: Exception) -> None:
            if "permissions violation" in str(exc).lower():
                violated.set()

        options: dict[str, Any] = {
            "servers": self.config.servers(),
            "name": f"skilld-{self.config.node}-probe",
            "connect_timeout": timeout,
            "allow_reconnect": False,
            "max_reconnect_attempts": 0,
            "error_cb": error,
        }
        context = self._tls()
        if context is not None:
            options["tls"] = context
        try:
            nc = await nats.connect(**options)
        except Exception:  # noqa: BLE001 - refused (no credentials) is the good answer
            return False
        try:
            await nc.subscribe("skilld.>")
            await nc.flush(timeout=max(1, int(timeout)))
            # The server answers the SUB before the flush's PONG; its -ERR is read by now
            # and handed to error_cb as a task: give that task its turn.
            await asyncio.wait_for(violated.wait(), timeout=0.2)
        except TimeoutError:
            return True  # subscribed, and no violation came back
        except Exception:  # noqa: BLE001 - the server closed on us: it refused
            return False
        else:
            return False
        finally:
            try:
                await nc.close()
            except Exception:  # noqa: BLE001 - the probe's connection: nothing to tell
                log.debug("cluster: the probe connection did not close cleanly")

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the link's loop and wait at most ``timeout`` seconds for it.

        Raises:
            ClusterError: it did not finish in time (it is cancelled), or the link is closed.
            Whatever ``coro`` raises.
        """
        if self._closed and self._nc is not None:
            coro.close()
            raise ClusterError("the cluster link is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ClusterError(f"NATS did not answer within {timeout:.3g}s") from None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Start ``coro`` on the link's loop without waiting for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def publish(
        self, subject: str, data: bytes, headers: dict[str, str] | None = None, reply: str = ""
    ) -> None:
        """Publish from any thread without waiting (NATS buffers it; order is kept)."""
        if self._nc is None or self._closed:
            return
        # A task made on the loop itself, not run_coroutine_threadsafe: no cross-thread
        # future to settle, which is most of the cost of a routed call's hand-off.
        self.loop.call_soon_threadsafe(self._start_publish, subject, data, headers, reply)

    def _start_publish(
        self, subject: str, data: bytes, headers: dict[str, str] | None, reply: str
    ) -> None:
        task = self.loop.create_task(
            _quiet(self.nc.publish(subject, data, reply=reply, headers=headers))
        )
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    def close(self) -> None:
        """Drain the connection (subscriptions finish what they received) and stop the loop."""
        if self._closed:
            return
        self._closed = True
        if self._nc is not None:
            try:
                self.run(self._nc.drain(), timeout=5)
            except Exception:  # noqa: BLE001 - closing: nothing left to tell anyone
                log.info("cluster: NATS drain did not finish cleanly")
        self._stop_loop()

    def _stop_loop(self) -> None:
        if self._thread.is_alive():
            # nats-py leaves its reader, pinger and flusher tasks behind: end them here, on
            # their loop, rather than have the garbage collector find them on a closed one.
            try:
                asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(5)
            except (concurrent.futures.TimeoutError, RuntimeError):
                log.info("cluster: NATS tasks did not stop in time")
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _quiet(coro: Coroutine[Any, Any, Any]) -> None:
    try:
        await coro
    except Exception as exc:  # noqa: BLE001 - fire and forget: a lost notification is logged
        log.info("cluster: publish failed: %r", exc)
