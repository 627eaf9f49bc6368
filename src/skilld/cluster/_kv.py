"""Skills' key-value state in JetStream KV, shared by the replicas of a skill.

One bucket per skill (``skilld-kv-SKILL``), so one skill never sees another's keys.
Any key the SDK accepts (1 to 1024 bytes of UTF-8) round-trips: it is stored as
``k`` + its unpadded base64url, which uses only characters NATS allows in keys. A
``set`` returns once JetStream acknowledged the write (file storage), so an
acknowledged write outlives the node that made it.

The quotas are the SQLite backend's: the value limit per value, and the total of
key and value bytes per skill. The total is kept under ``_usage`` and changed by
compare-and-set before the value is written, so replicas writing at once never
exceed it; a node dying between the two can only over-count, never under-count.

The KV ABI has no per-key TTL today, so nothing depends on the server's
``allow_msg_ttl``; a TTL feature must check the server for it and refuse without.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    BadRequestError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
)
from nats.js.kv import KeyValue

from skilld.cluster._link import NatsLink
from skilld.errors import ClusterError, QuotaExceeded, StateError

_USAGE = "_usage"
_TIMEOUT_S = 5.0
_CAS_ATTEMPTS = 32
_KEYS_ATTEMPTS = 5
_WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed compare-and-set


def bucket_name(skill_id: str) -> str:
    """The bucket of one skill's state."""
    return f"skilld-kv-{skill_id}"


def encode_key(key: str) -> str:
    """A NATS KV key for any SDK key (``k`` + unpadded base64url of its UTF-8)."""
    return "k" + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_key(stored: str) -> str | None:
    """The SDK key of a stored key, or None for the bucket's own bookkeeping."""
    if not stored.startswith("k"):
        return None
    body = stored[1:]
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


class JetStreamKV:
    """One skill's namespace in JetStream KV; a :class:`~skilld.types.KeyValueStore`."""

    def __init__(
        self, link: NatsLink, kv: KeyValue, skill_id: str, value_limit: int, total_limit: int
    ):
        self._link = link
        self._kv = kv
        self.skill_id = skill_id
        self.value_limit = value_limit
        self.total_limit = total_limit
        # per thread: how long an operation may wait for JetStream (``within``)
        self._limit = threading.local()

    @classmethod
    async def open(
        cls, link: NatsLink, skill_id: str, value_limit: int, total_limit: int
    ) -> JetStreamKV:
        """Open (creating it when missing) the skill's bucket; on the link's loop.

        Raises:
            ClusterError: JetStream is not enabled on the server, or refused the bucket.
        """
        name = bucket_name(skill_id)
        try:
            kv = await link.bucket(
                KeyValueConfig(
                    bucket=name,
                    description=f"skilld key-value state of skill {skill_id}",
                    history=1,
                    storage=StorageType.FILE,
                    # the value, its key and headers: the value limit is checked exactly here
                    max_value_size=value_limit + 4096,
                )
            )
        except Exception as exc:
            raise ClusterError(
                f"cannot open the JetStream KV bucket {name}: {exc!r}",
                location=skill_id,
                hint="clustered state needs JetStream: run nats-server with -js",
            ) from exc
        return cls(link, kv, skill_id, value_limit, total_limit)

    @contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        """Wait at most ``seconds`` for JetStream in the operations inside (this thread)."""
        before = getattr(self._limit, "s", _TIMEOUT_S)
        self._limit.s = min(before, seconds)
        try:
            yield
        finally:
            self._limit.s = before

    def _run(self, coro: Any, what: str) -> Any:
        try:
            return self._link.run(coro, timeout=getattr(self._limit, "s", _TIMEOUT_S))
        except (QuotaExceeded, StateError):
            raise
        except Exception as exc:
            raise StateError(
                f"{what} failed in JetStream KV: {exc!r}", location=self.skill_id
            ) from exc

    def get(self, key: str) -> bytes | None:
        """The value under ``key`` or None.

        Raises:
            StateError: JetStream failed or did not answer in time.
        """
        return self._run(self._get(encode_key(key)), f"reading {key!r}")  # type: ignore[no-any-return]

    async def _get(self, stored: str) -> bytes | None:
        try:
            entry = await self._kv.get(stored)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        # An empty value arrives as no payload at all.
        return bytes(entry.value or b"")

    def set(self, key: str, value: bytes) -> None:
        """Store ``value``; returns once JetStream acknowledged it.

        Raises:
            QuotaExceeded: the value, or the skill's total, is over its limit.
            StateError: JetStream failed or did not answer in time.
        """
        if len(value) > self.value_limit:
            raise QuotaExceeded(
                f"value of {len(value)} bytes exceeds the {self.value_limit}-byte limit per value",
                location=self.skill_id,
            )
        self._run(self._set(key, value), f"writing {key!r}")

    async def _set(self, key: str, value: bytes) -> None:
        stored = encode_key(key)
        old = await self._get(stored)
        freed = len(key.encode()) + len(old) if old is not None else 0
        await self._account(len(key.encode()) + len(value) - freed, key)
        await self._kv.put(stored, value)

    async def _account(self, delta: int, key: str) -> None:
        for _ in range(_CAS_ATTEMPTS):
            try:
                entry = await self._kv.get(_USAGE)
                used, revision = int(json.loads(entry.value or b"0")), entry.revision
            except (KeyNotFoundError, KeyDeletedError):
                used, revision = 0, 0
            total = max(0, used + delta)
            if delta > 0 and total > self.total_limit:
                raise QuotaExceeded(
                    f"storing {key!r} would use {total} bytes, over the "
                    f"{self.total_limit}-byte quota",
                    location=self.skill_id,
                )
            try:
                if revision:
                    await self._kv.update(_USAGE, str(total).encode(), last=revision)
                else:
                    await self._kv.create(_USAGE, str(total).encode())
            except KeyWrongLastSequenceError:
                continue  # another writer changed it first: count again
            except BadRequestError as exc:
                if exc.err_code != _WRONG_LAST_SEQUENCE:
                    raise
                continue
            return
        raise StateError("the usage counter is contended; try again", location=self.skill_id)

    def delete(self, key: str) -> bool:
        """Remove ``key``; True when it existed.

        Raises:
            StateError: JetStream failed or did not answer in time.
        """
        return bool(self._run(self._delete(key), f"deleting {key!r}"))

    async def _delete(self, key: str) -> bool:
        stored = encode_key(key)
        old = await self._get(stored)
        if old is None:
            return False
        await self._kv.purge(stored)
        await self._account(-(len(key.encode()) + len(old)), key)
        return True

    def keys(self, prefix: str, limit: int) -> list[str]:
        """Keys starting with ``prefix``, in order, at most ``limit``.

        Raises:
            StateError: JetStream failed or did not answer in time.
        """
        return self._run(self._keys(prefix, limit), "listing keys")  # type: ignore[no-any-return]

    async def _keys(self, prefix: str, limit: int) -> list[str]:
        for _ in range(_KEYS_ATTEMPTS):
            try:
                stored = await self._kv.keys()
                break
            except NoKeysError:
                # nats-py's keys() can end before the first key arrives (it compares the
                # consumer's pending count with what it has processed, and races with
                # delivery). A bucket that was ever written holds _usage, so "no keys at
                # all" there is that race: ask again.
                if await self._get(_USAGE) is None:
                    return []
        else:
            raise StateError("JetStream KV did not list the keys", location=self.skill_id)
        found = sorted(
            k for k in (decode_key(s) for s in stored) if k is not None and k.startswith(prefix)
        )
        return found[: max(0, limit)]
