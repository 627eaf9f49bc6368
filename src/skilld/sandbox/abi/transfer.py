"""``transfer``: files between the nodes of a cluster, within granted nodes and directories.

The bytes move through the cluster (``skilld.cluster``, reached as the call's
``services["transfer"]``, a :class:`TransferService`); this module holds the guest's
side and the file side of both ends:

- the sending side checks the skill's ``transfer`` grant for the node and the local
  path (``send``: read under the grant; ``fetch``: write, so an ``rw`` rule) before
  anything moves, and reads or writes the file as ``fs`` does: canonical path,
  opened by walking from ``/`` with ``O_NOFOLLOW``;
- a received file is written to an unnamed file (``O_TMPFILE``) in the destination
  directory, its size and sha256 verified, synced, and only then linked into place
  under a temporary name and renamed over the destination: no partial or
  unverified file is ever visible, and a failed transfer leaves nothing behind.

Paths name files on this node only: a path naming another node (``NODE:/path``) is a
remote-to-remote transfer, refused.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from typing import Protocol

from skilld.call import CallContext
from skilld.errors import ErrorCode, HostCallError
from skilld.sandbox.abi import Functions, decide
from skilld.sandbox.abi.fs import _errno, _open, _parent, _Target, canonical, read_regular

# The largest file one transfer moves (either way).
MAX_TRANSFER = 64 * 1024 * 1024


class TransferService(Protocol):
    """What a cluster provides to move files (``skilld.cluster``'s transfer service)."""

    def nodes(self) -> list[str]:
        """The other nodes of the cluster, by name."""
        ...

    def send(self, ctx: CallContext, node: str, data: bytes, remote_path: str) -> int:
        """Deliver ``data`` to ``remote_path`` on ``node``; returns the bytes sent."""
        ...

    def fetch(self, ctx: CallContext, node: str, remote_path: str, sink: Incoming) -> int:
        """Pull ``remote_path`` from ``node`` into ``sink`` (committed); returns its size."""
        ...


def read_file(canon: str, shown: str) -> bytes:
    """The bytes of a regular file at the canonical path ``canon`` (at most ``MAX_TRANSFER``).

    Raises:
        HostCallError: not a regular file, too large, missing, or refused by the host.
    """
    # Resolved from / without following links (fs's walk); the grant was checked on
    # the canonical path.
    data = read_regular(_Target(canon, "/"), shown, MAX_TRANSFER, "transfer")
    if len(data) > MAX_TRANSFER:
        raise HostCallError("limit-exceeded", f"{shown} grew past the transfer limit")
    return data


class Incoming:
    """A file being received into the canonical path ``canon``; invisible until committed.

    Raises:
        HostCallError: the destination directory cannot be opened (missing, a symlink
            planted after the check, refused by the host).
    """

    def __init__(self, canon: str, shown: str):
        self.shown = shown
        self._hash = hashlib.sha256()
        self.size = 0
        self._fd = -1
        self._dir = -1
        self._name = canon.rsplit("/", 1)[-1]
        try:
            if not self._name:
                raise HostCallError("invalid-argument", f"{shown} names no file")
            target = _Target(canon, "/")
            self._dir = _open(target, os.O_RDONLY | os.O_DIRECTORY, path=_parent(canon))
            self._fd = os.open(
                ".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=self._dir
            )
        except OSError as exc:
            self.abort()
            raise _errno(exc, shown) from exc

    def write(self, data: bytes) -> None:
        """Append a chunk.

        Raises:
            HostCallError: over the transfer limit, or the disk refused it.
        """
        self.size += len(data)
        if self.size > MAX_TRANSFER:
            raise HostCallError(
                "limit-exceeded", f"{self.shown}: over the {MAX_TRANSFER}-byte limit"
            )
        self._hash.update(data)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            raise _errno(exc, self.shown) from exc

    def commit(self, size: int, sha256: str) -> None:
        """Verify size and digest, then make the file visible at its path in one rename.

        Raises:
            HostCallError: ``io`` when the bytes are not what the sender announced (the
                file is discarded), or the disk refused.
        """
        try:
            if self.size != size or self._hash.hexdigest() != sha256:
                raise HostCallError(
                    "io",
                    f"{self.shown}: the received bytes do not match the sender's sha256 "
                    f"({self.size} of {size} bytes); nothing was written",
                )
            os.fsync(self._fd)
            temp = f".{self._name}.skilld-{secrets.token_hex(6)}"
            os.link(f"/proc/self/fd/{self._fd}", temp, dst_dir_fd=self._dir, follow_symlinks=True)
            try:
                os.replace(temp, self._name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
            except OSError:
                os.unlink(temp, dir_fd=self._dir)
                raise
            os.fsync(self._dir)
        except OSError as exc:
            raise _errno(exc, self.shown) from exc
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop the unnamed file (nothing was ever visible)."""
        for fd in (self._fd, self._dir):
            if fd >= 0:
                os.close(fd)
        self._fd = self._dir = -1


def _service(ctx: CallContext) -> TransferService:
    service: TransferService | None = ctx.services.get("transfer")
    if service is None:
        raise HostCallError(
            "unavailable", "this node is not part of a cluster", rule="transfer.no-cluster"
        )
    return service


def _local(ctx: CallContext, path: str) -> str:
    if ":" in path.split("/", 1)[0]:
        raise HostCallError(
            ErrorCode.NOT_PERMITTED,
            f"{path!r} names a file on another node: remote-to-remote transfers are refused; "
            "transfer to or from this node",
            rule="transfer.remote-to-remote",
        )
    return canonical(path)


def _granted(
    ctx: CallContext, action: str, node: str, local_path: str, remote_path: str
) -> tuple[str, TransferService]:
    """The canonical local path of a ``send`` or ``fetch`` (``action``) with ``node`` and
    the cluster's transfer service, once neither path names another node and the skill's
    ``transfer`` grant allows the action on the local path.

    Raises:
        HostCallError: a remote-to-remote path, no grant, or no cluster.
    """
    canon = _local(ctx, local_path)
    _local(ctx, remote_path)
    decide(ctx, "transfer", action, f"{node}:{canon}")
    return canon, _service(ctx)


def nodes(ctx: CallContext) -> list[str]:
    """The nodes this skill may transfer with (its grants' node patterns, among the members)."""
    service = _service(ctx)
    may = getattr(ctx.checker, "may_transfer_with", None)
    return sorted(n for n in service.nodes() if may is not None and may(n))


def send(ctx: CallContext, node: str, local_path: str, remote_path: str) -> int:
    """Push a local file to ``remote_path`` on ``node``."""
    canon, service = _granted(ctx, "send", node, local_path, remote_path)
    data = read_file(canon, local_path)
    return service.send(ctx, node, data, remote_path)


def fetch(ctx: CallContext, node: str, remote_path: str, local_path: str) -> int:
    """Pull ``remote_path`` from ``node`` into a local file."""
    canon, service = _granted(ctx, "fetch", node, local_path, remote_path)
    sink = Incoming(canon, local_path)
    try:
        return service.fetch(ctx, node, remote_path, sink)
    finally:
        sink.abort()


FUNCTIONS: Functions = {
    "nodes": (nodes, "result"),
    "send": (send, "result"),
    "fetch": (fetch, "result"),
}
