"""Collecting what a script left in its workspace: hostile input, budgeted before it is read.

The script chose every name, size, depth and kind of entry in its workspace. Collecting:

- walks it by descriptor, never through a link, to any depth (``paths.walk_beneath``);
- decides each file from its *size* (``st_size``; a sparse file uses no blocks, so the
  workspace's block cap lets a script leave files of any apparent size) before reading
  a byte of it, and reads no more than that size;
- holds in memory only what the answer embeds (:data:`MAX_EMBEDDED_BYTES` as sent) and
  the one small file being looked at (at most :data:`MAX_RETURNED_FILE`): larger outputs
  are copied by descriptor into the kept store (``_kept``; holes stay holes) within
  the room the caller has there, and anything past that room or the count is only
  counted (``files_omitted``);
- refuses names that are not valid UTF-8 (they cannot be sent in JSON, and one made the
  SDK's stdio writer fail, ending the server): they are listed escaped in
  ``files_refused`` (``bad\\xff.txt``), never sent as names.

So a run's outputs take the server's memory by at most :data:`COLLECT_MEMORY`, whatever
the workspace holds.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from skilld.agentskills._build import mime_type
from skilld.agentskills._kept import KeptOutputs, Reservation, Spooled
from skilld.paths import walk_beneath
from skilld.types import ContentBlock

# Workspace files returned with a result: at most this many, each at most this large
# embedded; larger ones (up to MAX_KEPT_FILE) and those past the count or the budget
# below are kept as resources of the run, up to MAX_RUN_FILES in all (an unpacked
# document's parts all come back, to be handed to the next run by URI).
MAX_RETURNED_FILES = 16
MAX_RUN_FILES = 256
MAX_RETURNED_FILE = 1 << 20
# What all embedded files of one result may take, as sent (base64 for binary): the MCP
# SDK's client refuses a server-sent event over 1 MiB, and an unpacked document is
# dozens of files. Files past this budget are kept as resources of the run instead.
MAX_EMBEDDED_BYTES = 512 << 10
MAX_KEPT_FILE = 64 << 20
# At most this many refused names are listed (escaped) in an answer; the rest counted.
MAX_REFUSED_LISTED = 16
# What collecting one run's outputs may add to the server's memory: the embedded bytes
# and the one file looked at, as read, decoded and sent (a text file is held as bytes,
# as a str and in the answer's JSON; a binary one in base64 too).
COLLECT_MEMORY = 8 * (MAX_EMBEDDED_BYTES + MAX_RETURNED_FILE)
_CHUNK = 1 << 20
_TEXT_MIME = ("text/", "application/json", "application/xml")


@dataclass(slots=True)
class Collected:
    """What a run's workspace gave: files embedded in the answer, files copied into the
    kept store (not yet kept), how many were left out (past a cap or the caller's room),
    the escaped names refused, and the client's files the script removed."""

    embedded: list[ContentBlock] = field(default_factory=list)
    spooled: list[Spooled] = field(default_factory=list)
    omitted: int = 0
    refused: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def file_block(uri: str, mime: str, data: bytes) -> ContentBlock:
    """One file as an embedded resource: text when its MIME type is text and it decodes,
    else bytes."""
    if mime.startswith(_TEXT_MIME):
        try:
            return ContentBlock("embedded", text=data.decode("utf-8"), mime_type=mime, uri=uri)
        except UnicodeDecodeError:
            pass
    return ContentBlock("embedded", data=data, mime_type=mime or None, uri=uri)


def escaped(name: str) -> str:
    """A name as ``os.fsdecode`` gave it, made printable UTF-8 (bytes that are not
    UTF-8 as ``\\xNN``)."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def collect(
    workspace: Path,
    skill_id: str,
    given: Mapping[str, tuple[int, bytes]],
    store: KeptOutputs,
    reservation: Reservation,
) -> Collected:
    """The regular files the script left in ``workspace``, in walk order (each
    directory's entries sorted): the first :data:`MAX_RETURNED_FILES` small enough
    embedded while :data:`MAX_EMBEDDED_BYTES` lasts; the others, up to
    :data:`MAX_KEPT_FILE` each and within ``reservation``'s room, copied into
    ``store``; past :data:`MAX_RUN_FILES` or that room, counted. ``given`` is the
    client's files (path to size and sha256): one comes back only if it changed, and
    those removed (or replaced by something not a file) are listed.

    Never raises for what the workspace holds; files copied into the store before an
    ``OSError`` of the store itself are removed again.

    Raises:
        OSError: the store cannot be written (its disk is full).
    """
    out = Collected()
    seen: set[str] = set()
    budget = MAX_EMBEDDED_BYTES
    room = reservation.room
    try:
        top = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        out.removed = sorted(given)
        return out
    try:
        for step in walk_beneath(top):
            if step.left or not stat.S_ISREG(step.st.st_mode):
                continue
            parts = (*step.parts, step.name)
            try:
                rel = "/".join(parts).encode("utf-8").decode("utf-8")
            except UnicodeEncodeError:
                if len(out.refused) < MAX_REFUSED_LISTED:
                    out.refused.append("/".join(escaped(p) for p in parts))
                out.omitted += 1
                continue
            seen.add(rel)
            size = step.st.st_size
            if size > MAX_KEPT_FILE or len(out.embedded) + len(out.spooled) >= MAX_RUN_FILES:
                out.omitted += 1
                continue
            try:
                fd = os.open(
                    step.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=step.dir_fd
                )
            except OSError:
                out.omitted += 1
                continue
            with contextlib.closing(_Fd(fd)):
                if rel in given and given[rel][0] == size and _sha256(fd, size) == given[rel][1]:
                    continue
                mime = mime_type(rel)
                small = (
                    size <= MAX_RETURNED_FILE
                    and size <= budget
                    and len(out.embedded) < MAX_RETURNED_FILES
                )
                if small:
                    data = os.pread(fd, size, 0) if size else b""
                    block = file_block(f"workspace://{skill_id}/{rel}", mime, data)
                    sent = _sent_size(block, data)
                    if sent <= budget:
                        budget -= sent
                        out.embedded.append(block)
                        continue
                if size > room:
                    out.omitted += 1
                    continue
                target = store.spool_path()
                try:
                    copied = _copy(fd, target, size)
                except OSError:
                    _unlink(target)
                    for spooled in out.spooled:
                        _unlink(store.directory / spooled.file)
                    raise
                room -= copied
                out.spooled.append(Spooled(rel, mime, target.name, copied))
    finally:
        os.close(top)
    out.removed = sorted(set(given) - seen)
    return out


class _Fd:
    def __init__(self, fd: int):
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)


def _sha256(fd: int, size: int) -> bytes:
    """The sha256 of the first ``size`` bytes of ``fd``, read a chunk at a time."""
    digest = hashlib.sha256()
    offset = 0
    while offset < size:
        chunk = os.pread(fd, min(_CHUNK, size - offset), offset)
        if not chunk:
            break
        digest.update(chunk)
        offset += len(chunk)
    return digest.digest()


def _copy(src: int, target: Path, size: int) -> int:
    """Copy at most ``size`` bytes of ``src`` into a new file ``target`` (mode 0600), by
    descriptor and a chunk at a time, its holes left holes (``SEEK_DATA``); the bytes
    the copy holds (its size).

    Raises:
        OSError: the target cannot be made or written.
    """
    dst = os.open(
        target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        end = min(size, os.fstat(src).st_size)
        offset = 0
        while offset < end:
            try:
                data_at = os.lseek(src, offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                break  # only a hole is left
            if data_at >= end:
                break
            hole_at = min(os.lseek(src, data_at, os.SEEK_HOLE), end)
            _copy_range(src, dst, data_at, hole_at)
            offset = hole_at
        os.ftruncate(dst, end)
        return end
    finally:
        os.close(dst)


def _copy_range(src: int, dst: int, start: int, end: int) -> None:
    """Copy bytes ``start`` to ``end`` of ``src`` to the same place in ``dst``: in the
    kernel where it can (``copy_file_range``), else a chunk at a time."""
    offset = start
    while offset < end:
        count = min(_CHUNK, end - offset)
        try:
            done = os.copy_file_range(src, dst, count, offset, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            chunk = os.pread(src, count, offset)
            done = os.pwrite(dst, chunk, offset) if chunk else 0
        if done <= 0:
            return  # the source ended early
        offset += done


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _sent_size(block: ContentBlock, data: bytes) -> int:
    """The bytes an embedded file takes in the result: text as is, the rest in base64."""
    return len(data) if block.text is not None else (len(data) + 2) // 3 * 4


__all__ = [
    "COLLECT_MEMORY",
    "MAX_EMBEDDED_BYTES",
    "MAX_KEPT_FILE",
    "MAX_RETURNED_FILE",
    "MAX_RETURNED_FILES",
    "MAX_RUN_FILES",
    "Collected",
    "collect",
    "escaped",
    "file_block",
]
