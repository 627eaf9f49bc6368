"""``fs``: files inside the directories the policy grants.

Paths are host paths and must be absolute. Each is made canonical before the
check: symlinks resolved (``os.path.realpath``), ``.`` and ``..`` folded,
trailing slashes dropped. The canonical path is checked against the tables
(``check("fs", "read" | "write", path)``), then opened by walking it from ``/``
one component at a time with ``O_NOFOLLOW``: a symlink planted after the check
(by the guest through another capability, or by anyone) makes the open fail
instead of leading outside the grant. Files open non-blocking, so a FIFO the
guest planted (through an allowed ``shell`` rule) is refused, never waited on.

Linux paths are case-sensitive and so are the checks: a grant for ``/data/Notes``
says nothing about ``/data/notes``. ``//``, ``.``, ``..`` and trailing slashes
are folded by the canonicalisation, so they can neither widen nor dodge a check.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat as stat_mod
from collections.abc import Iterator
from contextlib import contextmanager

from skilld.errors import HostCallError
from skilld.sandbox._context import CallContext
from skilld.sandbox.abi import Functions, ask, decide

MAX_READ = 16 * 1024 * 1024
MAX_LIST = 10_000
MAX_GLOB = 10_000


def canonical(path: str) -> str:
    """The canonical absolute form of ``path`` (symlinks resolved where they exist).

    Raises:
        HostCallError: ``invalid-argument`` for relative paths or NUL bytes.
    """
    if not path or "\x00" in path:
        raise HostCallError("invalid-argument", "path is empty or contains a NUL byte")
    if not path.startswith("/"):
        raise HostCallError("invalid-argument", f"path {path!r} must be absolute")
    return os.path.realpath(path)


def _checked(ctx: CallContext, path: str, action: str) -> str:
    canon = canonical(path)
    decide(
        ctx, "fs", action, canon, shown=path if canon == path else f"{path} (resolves to {canon})"
    )
    return canon


def _errno(exc: OSError, path: str) -> HostCallError:
    if exc.errno == errno.ENOENT:
        return HostCallError("not-found", f"{path} does not exist")
    if exc.errno == errno.ELOOP:
        return HostCallError(
            "not-permitted", f"{path} changed to a symlink after the check", rule="fs.no-follow"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return HostCallError(
            "not-permitted", f"{path}: the host refused access ({exc.strerror})", rule="host"
        )
    return HostCallError("io", f"{path}: {exc.strerror or exc}")


@contextmanager
def _parent_fd(canon: str) -> Iterator[tuple[int, str]]:
    """Open the parent directory of ``canon`` without following any symlink; yield (fd, name)."""
    parts = [p for p in canon.split("/") if p]
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except NotADirectoryError:
                # Linux answers ENOTDIR, not ELOOP, for a symlink opened with
                # O_DIRECTORY | O_NOFOLLOW: say which it was.
                if stat_mod.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), part) from None
                raise
            os.close(fd)
            fd = nxt
        yield fd, (parts[-1] if parts else ".")
    finally:
        os.close(fd)


def _open(canon: str, flags: int, mode: int = 0o644) -> int:
    with _parent_fd(canon) as (dfd, name):
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dfd)


def read(ctx: CallContext, path: str) -> bytes:
    """The bytes of a file (at most 16 MiB)."""
    canon = _checked(ctx, path, "read")
    try:
        fd = _open(canon, os.O_RDONLY)
        try:
            info = os.fstat(fd)
            if not stat_mod.S_ISREG(info.st_mode):
                raise HostCallError("invalid-argument", f"{path} is not a regular file")
            if info.st_size > MAX_READ:
                raise HostCallError(
                    "limit-exceeded",
                    f"{path} is {info.st_size} bytes, over the {MAX_READ}-byte read limit",
                )
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)[:MAX_READ]
        finally:
            os.close(fd)
    except OSError as exc:
        raise _errno(exc, path) from exc


def write(ctx: CallContext, path: str, data: bytes, append: bool) -> None:
    """Write or append to a regular file (created when missing)."""
    canon = _checked(ctx, path, "write")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    try:
        fd = _open(canon, flags)
        try:
            if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
                raise HostCallError("invalid-argument", f"{path} is not a regular file")
            view = memoryview(bytes(data))
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError as exc:
        raise _errno(exc, path) from exc


def list_dir(ctx: CallContext, path: str) -> list[str]:
    """Names in a directory, sorted."""
    canon = _checked(ctx, path, "read")
    try:
        fd = _open(canon, os.O_RDONLY | os.O_DIRECTORY)
        try:
            names = sorted(os.listdir(fd))
        finally:
            os.close(fd)
    except OSError as exc:
        raise _errno(exc, path) from exc
    if len(names) > MAX_LIST:
        raise HostCallError("limit-exceeded", f"{path} has {len(names)} entries, over {MAX_LIST}")
    return names


def stat(ctx: CallContext, path: str) -> dict[str, object]:
    """Size, kind and modification time."""
    canon = _checked(ctx, path, "read")
    try:
        with _parent_fd(canon) as (dfd, name):
            info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError as exc:
        raise _errno(exc, path) from exc
    return {
        "size": info.st_size,
        "is_dir": stat_mod.S_ISDIR(info.st_mode),
        "modified_ms": int(info.st_mtime * 1000),
    }


def mkdir(ctx: CallContext, path: str) -> None:
    """Create a directory and its missing parents (each parent checked too)."""
    canon = _checked(ctx, path, "write")
    missing = []
    probe = canon
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    for directory in reversed(missing):
        _checked(ctx, directory, "write")
        try:
            with _parent_fd(directory) as (dfd, name):
                os.mkdir(name, 0o755, dir_fd=dfd)
        except FileExistsError:
            continue
        except OSError as exc:
            raise _errno(exc, path) from exc


def remove(ctx: CallContext, path: str) -> None:
    """Remove a file, or an empty directory."""
    canon = _checked(ctx, path, "write")
    try:
        with _parent_fd(canon) as (dfd, name):
            info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat_mod.S_ISDIR(info.st_mode):
                os.rmdir(name, dir_fd=dfd)
            else:
                os.unlink(name, dir_fd=dfd)
    except OSError as exc:
        raise _errno(exc, path) from exc


def glob(ctx: CallContext, pattern: str) -> list[str]:
    """Paths matching an absolute pattern (``*`` one segment, ``**`` any depth).

    The walk starts at the longest literal prefix, which must itself be readable;
    every match is checked on its own canonical path (each decision recorded), and
    matches the policy refuses are left out. ``?`` and ``[...]`` are refused: the
    policy language has only ``*`` and ``**``, and so does the request.

    Raises:
        HostCallError: ``invalid-argument`` for a relative pattern, a NUL byte or an
            unsupported wildcard; ``not-permitted`` when the literal prefix is not
            readable; ``limit-exceeded`` past 10,000 matches.
    """
    if not pattern.startswith("/") or "\x00" in pattern:
        raise HostCallError("invalid-argument", f"glob pattern {pattern!r} must be absolute")
    unsupported = sorted(set("?[]").intersection(pattern))
    if unsupported:
        raise HostCallError(
            "invalid-argument",
            f"glob pattern {pattern!r}: {''.join(unsupported)!r} is not supported; "
            "use '*' (within one segment) and '**' (any depth)",
        )
    parts = pattern.split("/")
    literal = []
    for part in parts[1:]:
        if "*" in part:
            break
        literal.append(part)
    base = "/" + "/".join(literal)
    root = _checked(ctx, base, "read")
    rest = parts[1 + len(literal) :]
    out: list[str] = []
    for found in _walk(root, rest):
        if len(out) >= MAX_GLOB:
            raise HostCallError("limit-exceeded", f"glob matched more than {MAX_GLOB} paths")
        if ask(ctx, "fs", "read", os.path.realpath(found)).allowed:
            out.append(found)
    return sorted(out)


def _walk(directory: str, parts: list[str]) -> Iterator[str]:
    if not parts:
        yield directory
        return
    head, rest = parts[0], parts[1:]
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return
    if head == "**":
        yield from _walk(directory, rest)
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                yield from _walk(entry.path, parts)
        return
    for entry in entries:
        if fnmatch.fnmatchcase(entry.name, head) and (
            rest == [] or entry.is_dir(follow_symlinks=False)
        ):
            yield from _walk(entry.path, rest)


FUNCTIONS: Functions = {
    "read": (read, "result"),
    "write": (write, "result"),
    "list-dir": (list_dir, "result"),
    "stat": (stat, "result-tagged"),
    "mkdir": (mkdir, "result"),
    "remove": (remove, "result"),
    "glob": (glob, "result"),
}
