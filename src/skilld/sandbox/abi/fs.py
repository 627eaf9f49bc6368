"""``fs``: files inside the directories the policy grants, reached through descriptors only.

Paths are host paths and must be absolute. Each is folded *lexically* (``//``,
``.``, ``..`` and trailing slashes; nothing on disk is looked at) and that folded
path is checked against the tables (``check_path(path, write)``). The
host then opens the grant's root directory (the rule's path up to its first
wildcard) and resolves the rest of the path beneath that descriptor with
``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)``, and acts
on the descriptor it got: ``fstat``, reading the directory it opened, ``unlinkat``
and ``mkdirat`` relative to the parent it opened. Nothing is checked by path and then
used by path, so a path that changes in between (a directory swapped for a symlink,
a file for a directory) ends as ``not-found`` or ``not-permitted``, never somewhere
else. Where the kernel has no ``openat2`` (before Linux 5.6, or a seccomp filter that
refuses it) the same walk is done one component at a time with ``O_NOFOLLOW``.

Symlinks are never followed, not even ones that point back inside a grant: since no
component may be a symlink and ``..`` is folded before the check, the folded path
*is* the file that gets opened. A planted link or ``/proc/self/fd/N`` is refused as
``not-permitted`` (rule ``fs.no-follow``); a refusal names the path as the guest
wrote it and never where a link leads. Files open non-blocking, so a FIFO the guest
planted is refused, never waited on.

A regular file with more than one hard link is never opened for writing (rule
``fs.hardlink``): its other name may be outside every grant. Reading one is allowed;
docs/policy.md says why.

``fs.glob`` walks directory descriptors the same way, never through a symlink, with
each directory visited once however many ``**`` the pattern has, a cap on the entries
it visits and the call's deadline.

Linux paths are case-sensitive and so are the checks: a grant for ``/data/Notes``
says nothing about ``/data/notes``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import os
import stat as stat_mod
from collections.abc import Iterator

from skilld.call import CallContext
from skilld.errors import ErrorCode, HostCallError
from skilld.sandbox.abi import Functions, Question, ask, decide
from skilld.types import Decision

MAX_READ = 16 * 1024 * 1024
MAX_LIST = 10_000
MAX_GLOB = 10_000
# Entries a glob may look at (matched or not) and directories it may descend, so a
# tree the guest built cannot make one call walk for long even within its deadline.
MAX_GLOB_VISITS = 200_000
MAX_GLOB_DEPTH = 128
# How many entries a walk looks at between looks at the clock and the cancel flag.
_CLOCK_EVERY = 256

NO_FOLLOW_RULE = "fs.no-follow"
HARDLINK_RULE = "fs.hardlink"

# openat2(2): the struct open_how and its resolve flags (linux/openat2.h).
_SYS_OPENAT2 = 437  # the same number on every architecture (the unified syscall table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _openat2(dirfd: int, rel: str, flags: int, mode: int) -> int:
    how = _OpenHow(flags, mode if flags & os.O_CREAT else 0, _RESOLVE)
    path = ctypes.c_char_p(os.fsencode(rel))
    code = errno.EAGAIN
    # EAGAIN: the kernel saw a rename or mount race during a RESOLVE_BENEATH lookup
    # and asks for a retry (openat2(2)); with '..' folded away it should not happen.
    for _ in range(3):
        fd = int(
            _syscall(
                ctypes.c_long(_SYS_OPENAT2),
                ctypes.c_int(dirfd),
                path,
                ctypes.byref(how),
                ctypes.c_size_t(ctypes.sizeof(how)),
            )
        )
        if fd >= 0:
            return fd
        code = ctypes.get_errno()
        if code != errno.EAGAIN:
            break
    raise OSError(code, os.strerror(code), rel)


def _has_openat2() -> bool:
    try:
        os.close(_openat2(_ROOT_FD, ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, 0))
    except OSError:
        # ENOSYS (an old kernel) or EPERM (a seccomp filter): walk instead.
        return False
    return True


# "/" stays open for the life of the process: every resolution starts from it.
_ROOT_FD = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
USE_OPENAT2 = _has_openat2()


_RESOLVE_ATTEMPTS = 8


def canonical(path: str) -> str:
    """The canonical absolute form of ``path`` (symlinks resolved where they exist).

    ``shell`` uses it for the path arguments of commands; fs calls never resolve
    symlinks (see :func:`lexical`).

    Raises:
        HostCallError: ``invalid-argument`` for relative paths or NUL bytes,
            ``not-found`` for a path that kept changing while it was resolved.
    """
    _absolute(path)
    # realpath lstat()s each component, then readlink()s the links: a link swapped
    # for a file (or removed) between the two raises. A path under such churn is
    # retried a few times, then refused; it is never an internal error.
    for _ in range(_RESOLVE_ATTEMPTS):
        try:
            return os.path.realpath(path)
        except OSError:
            continue
    raise HostCallError("not-found", f"{path} kept changing while it was resolved")


def lexical(path: str) -> str:
    """``path`` with ``//``, ``.``, ``..`` and trailing slashes folded, without looking at disk.

    Raises:
        HostCallError: ``invalid-argument`` for relative paths or NUL bytes.
    """
    _absolute(path)
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if out:
                out.pop()
            continue
        out.append(part)
    return "/" + "/".join(out)


def _absolute(path: str) -> None:
    if not path or "\x00" in path:
        raise HostCallError("invalid-argument", "path is empty or contains a NUL byte")
    if not path.startswith("/"):
        raise HostCallError("invalid-argument", f"path {path!r} must be absolute")


def _parent(path: str) -> str:
    return path[: path.rfind("/")] or "/"


def _beneath(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root + "/")


class _Target:
    """A checked path: its folded form and the directory it is resolved beneath."""

    __slots__ = ("anchor", "lex")

    def __init__(self, lex: str, anchor: str):
        self.lex, self.anchor = lex, anchor

    def rel(self, path: str | None = None) -> str:
        """``path`` (default: the target) relative to the anchor (``.`` for the anchor)."""
        full = self.lex if path is None else path
        return full[len(self.anchor) :].lstrip("/") or "."


def _anchor(ctx: CallContext, decision: Decision, lex: str) -> str:
    """The grant's root directory, a proper ancestor of ``lex`` ("/" when not known)."""
    lookup = getattr(ctx.checker, "grant_root", None)
    root = lookup(decision.rule) if lookup is not None else None
    if not isinstance(root, str) or not _beneath(lex, root):
        return "/"
    # The grant is the path itself (a file grant, or the grant's own directory):
    # resolve its last name beneath its parent.
    return _parent(root) if lex == root else root


def _path_question(path: str, action: str) -> Question:
    """The typed question for ``action`` (``read`` or ``write``) on the folded ``path``."""
    write = action == "write"
    return lambda c: c.check_path(path, write)


def _checked(ctx: CallContext, path: str, action: str) -> _Target:
    lex = lexical(path)
    decision = decide(ctx, "fs", action, lex, path, _path_question(lex, action))
    return _Target(lex, _anchor(ctx, decision, lex))


def _errno(exc: OSError, path: str) -> HostCallError:
    """What a failed descriptor operation means for the guest (``path`` as it wrote it)."""
    code = exc.errno
    if code in (errno.ENOENT, errno.ENOTDIR):
        return HostCallError("not-found", f"{path} does not exist")
    if code in (errno.ELOOP, errno.EXDEV):
        return HostCallError(
            ErrorCode.NOT_PERMITTED,
            f"{path}: a symlink is on the way, and fs calls do not follow symlinks",
            rule=NO_FOLLOW_RULE,
        )
    if code in (errno.EACCES, errno.EPERM):
        return HostCallError(
            ErrorCode.NOT_PERMITTED,
            f"{path}: the host refused access ({exc.strerror})",
            rule="host",
        )
    if code in (errno.EISDIR, errno.ENXIO):
        return HostCallError("invalid-argument", f"{path} is not a regular file")
    if code == errno.ENOTEMPTY:
        return HostCallError("invalid-argument", f"{path} is a directory that is not empty")
    if code == errno.EEXIST:
        return HostCallError("invalid-argument", f"{path} exists and is not a directory")
    if code == errno.ENAMETOOLONG:
        return HostCallError("invalid-argument", f"{path}: a name is too long")
    if code == errno.EAGAIN:
        return HostCallError("unavailable", f"{path} kept changing while it was opened; try again")
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EMFILE, errno.ENFILE):
        return HostCallError("limit-exceeded", f"{path}: {exc.strerror}")
    return HostCallError("io", f"{path}: {exc.strerror or 'I/O error'}")


def _step(dirfd: int, name: str, flags: int, mode: int = 0o644) -> int:
    """Open ``name`` in ``dirfd`` without following it; a symlink raises ELOOP."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dirfd)
    except NotADirectoryError:
        # Linux answers ENOTDIR, not ELOOP, for a symlink opened with O_DIRECTORY |
        # O_NOFOLLOW: say which it was (a lookup only, to choose the error).
        try:
            info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except OSError:
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), name) from None
        if stat_mod.S_ISLNK(info.st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise


def _walk_open(dirfd: int, rel: str, flags: int, mode: int) -> int:
    """``openat2``'s resolution done by hand: one component at a time, none followed."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts:
        return _step(dirfd, ".", flags, mode)
    fd = os.dup(dirfd)
    try:
        for part in parts[:-1]:
            nxt = _step(fd, part, os.O_PATH | os.O_DIRECTORY)
            os.close(fd)
            fd = nxt
        final = _step(fd, parts[-1], flags, mode)
    finally:
        os.close(fd)
    if flags & os.O_PATH and stat_mod.S_ISLNK(os.fstat(final).st_mode):
        # O_PATH | O_NOFOLLOW opens a symlink itself rather than failing.
        os.close(final)
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), parts[-1])
    return final


def _resolve(dirfd: int, rel: str, flags: int, mode: int = 0o644) -> int:
    flags |= os.O_CLOEXEC
    if USE_OPENAT2:
        return _openat2(dirfd, rel, flags, mode)
    return _walk_open(dirfd, rel, flags, mode)


@contextlib.contextmanager
def _anchor_fd(target: _Target) -> Iterator[int]:
    """The grant's root directory, opened from ``/`` without following a symlink."""
    fd = _resolve(_ROOT_FD, target.anchor.lstrip("/") or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def _open(target: _Target, flags: int, path: str | None = None) -> int:
    """Open the target (or ``path``, an ancestor of it) beneath its grant's root."""
    # O_PATH takes no other open flags (openat2 refuses them); the rest open
    # non-blocking, so a FIFO is never waited on.
    extra = 0 if flags & os.O_PATH else os.O_NONBLOCK
    with _anchor_fd(target) as root:
        return _resolve(root, target.rel(path), flags | extra)


def read(ctx: CallContext, path: str) -> bytes:
    """The bytes of a file (at most 16 MiB).

    Raises:
        HostCallError: ``not-permitted`` (denied, or a symlink on the way), ``not-found``,
            ``invalid-argument`` (not a regular file), ``limit-exceeded``, ``io``.
    """
    target = _checked(ctx, path, "read")
    # A file that grew while it was read ends at the cap.
    return read_regular(target, path, MAX_READ, "read")[:MAX_READ]


def read_regular(target: _Target, shown: str, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``target`` resolves to: at most ``limit + 1``, so a
    caller sees a file that grew past ``limit`` while it was read, and never holds more.

    Raises:
        HostCallError: ``invalid-argument`` (not a regular file), ``limit-exceeded`` (its
            size is over ``limit``), or the error of the failed system call.
    """
    try:
        fd = _open(target, os.O_RDONLY)
        try:
            info = os.fstat(fd)
            if not stat_mod.S_ISREG(info.st_mode):
                raise HostCallError("invalid-argument", f"{shown} is not a regular file")
            if info.st_size > limit:
                raise HostCallError(
                    "limit-exceeded",
                    f"{shown} is {info.st_size} bytes, over the {limit}-byte {what} limit",
                )
            chunks = []
            size = 0
            while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _errno(exc, shown) from exc


def write(ctx: CallContext, path: str, data: bytes, append: bool) -> None:
    """Write or append to a regular file (created when missing).

    The file is truncated only after its descriptor shows a regular file with one
    link: a FIFO, a device or a second name of a file elsewhere is refused untouched.

    Raises:
        HostCallError: ``not-permitted`` (denied, a symlink on the way, or a file with
            more than one hard link), ``not-found``, ``invalid-argument``, ``io``.
    """
    target = _checked(ctx, path, "write")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0)
    try:
        fd = _open(target, flags)
        try:
            info = os.fstat(fd)
            if not stat_mod.S_ISREG(info.st_mode):
                raise HostCallError("invalid-argument", f"{path} is not a regular file")
            if info.st_nlink > 1:
                raise HostCallError(
                    ErrorCode.NOT_PERMITTED,
                    f"{path} has {info.st_nlink} hard links; fs writes only files with one",
                    rule=HARDLINK_RULE,
                )
            if not append:
                os.ftruncate(fd, 0)
            view = memoryview(bytes(data))
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError as exc:
        raise _errno(exc, path) from exc


def list_dir(ctx: CallContext, path: str) -> list[str]:
    """Names in a directory, sorted (symlinks are listed by their own names).

    Raises:
        HostCallError: as for :func:`read`; ``limit-exceeded`` past 10,000 entries.
    """
    target = _checked(ctx, path, "read")
    try:
        fd = _open(target, os.O_RDONLY | os.O_DIRECTORY)
        try:
            names = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    names.append(entry.name)
                    if len(names) > MAX_LIST:
                        raise HostCallError(
                            "limit-exceeded", f"{path} has more than {MAX_LIST} entries"
                        )
        finally:
            os.close(fd)
    except OSError as exc:
        raise _errno(exc, path) from exc
    return sorted(names)


def stat(ctx: CallContext, path: str) -> dict[str, object]:
    """Size, kind and modification time (of the path itself; a symlink is refused).

    Raises:
        HostCallError: as for :func:`read`.
    """
    target = _checked(ctx, path, "read")
    try:
        fd = _open(target, os.O_PATH)
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _errno(exc, path) from exc
    return {
        "size": info.st_size,
        "is_dir": stat_mod.S_ISDIR(info.st_mode),
        "modified_ms": int(info.st_mtime * 1000),
    }


def mkdir(ctx: CallContext, path: str) -> None:
    """Create a directory and its missing parents below the grant's root (each checked too).

    Raises:
        HostCallError: ``not-permitted`` for a refused directory or a symlink on the
            way, ``not-found`` when the grant's root is missing, ``invalid-argument``
            when a file is in the way, ``io``.
    """
    target = _checked(ctx, path, "write")
    rel = target.rel()
    parts = [] if rel == "." else rel.split("/")
    try:
        with _anchor_fd(target) as root:
            fd = os.dup(root)
            try:
                here = target.anchor.rstrip("/")
                for part in parts:
                    here = f"{here}/{part}"
                    try:
                        nxt = _step(fd, part, os.O_PATH | os.O_DIRECTORY)
                    except FileNotFoundError:
                        if here != target.lex:
                            decide(ctx, "fs", "write", here, here, _path_question(here, "write"))
                        # Made meanwhile by someone else: opened below like any other.
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(part, 0o755, dir_fd=fd)
                        nxt = _step(fd, part, os.O_PATH | os.O_DIRECTORY)
                    os.close(fd)
                    fd = nxt
            finally:
                os.close(fd)
    except NotADirectoryError as exc:
        raise HostCallError("invalid-argument", f"{path}: a file is in the way") from exc
    except OSError as exc:
        raise _errno(exc, path) from exc


def remove(ctx: CallContext, path: str) -> None:
    """Remove a file or a symlink (never what it points to), or an empty directory.

    Raises:
        HostCallError: ``not-permitted``, ``not-found``, ``invalid-argument`` (a
            directory that is not empty), ``io``.
    """
    target = _checked(ctx, path, "write")
    if target.lex == "/":
        raise HostCallError("invalid-argument", "/ cannot be removed")
    name = target.lex[target.lex.rfind("/") + 1 :]
    try:
        parent = _open(target, os.O_PATH | os.O_DIRECTORY, _parent(target.lex))
        try:
            try:
                os.unlink(name, dir_fd=parent)
            except IsADirectoryError:
                os.rmdir(name, dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as exc:
        raise _errno(exc, path) from exc


def glob(ctx: CallContext, pattern: str) -> list[str]:
    """Paths matching an absolute pattern (``*`` one segment, ``**`` any depth).

    The walk starts at the longest literal prefix, which must itself be readable,
    and goes on through directory descriptors; symlinks are neither followed nor
    matched (no fs call would follow one). Every match is checked on its own
    folded path (each decision recorded), and matches the policy refuses are left
    out. ``?`` and ``[...]`` are refused: the policy language has only ``*`` and
    ``**``, and so does the request.

    Raises:
        HostCallError: ``invalid-argument`` for a relative pattern, a NUL byte or an
            unsupported wildcard; ``not-permitted`` when the literal prefix is not
            readable; ``limit-exceeded`` past 10,000 matches or 200,000 entries
            visited; ``timeout`` at the call's deadline; ``cancelled``.
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
    target = _checked(ctx, "/" + "/".join(literal), "read")
    rest = [p for p in parts[1 + len(literal) :] if p not in ("", ".")]
    if ".." in rest:
        # After a wildcard '..' could only climb back over what the walk matched.
        return []
    try:
        fd = _open(target, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return []
        raise _errno(exc, pattern) from exc
    walk = _Glob(ctx, rest)
    try:
        walk.directory(fd, target.lex, walk.closure({0}), 0)
    finally:
        os.close(fd)
    return sorted(walk.found)


class _Glob:
    """One glob walk: each directory is visited once, with the set of pattern positions
    (an NFA's states) that reach it, so ``**/**/**`` costs what ``**`` does."""

    def __init__(self, ctx: CallContext, parts: list[str]):
        self.ctx = ctx
        self.parts = parts
        self.end = len(parts)
        self.found: list[str] = []
        self.visits = 0

    def closure(self, states: set[int]) -> frozenset[int]:
        """``states`` plus every position a ``**`` may skip to (it matches no segment too)."""
        out = set(states)
        for i in sorted(states):
            while i < self.end and self.parts[i] == "**":
                i += 1
                out.add(i)
        return frozenset(out)

    def match(self, path: str) -> None:
        if len(self.found) >= MAX_GLOB:
            raise HostCallError("limit-exceeded", f"glob matched more than {MAX_GLOB} paths")
        if ask(self.ctx, "fs", "read", path, _path_question(path, "read")).allowed:
            self.found.append(path)

    def tick(self) -> None:
        self.visits += 1
        if self.visits > MAX_GLOB_VISITS:
            raise HostCallError(
                "limit-exceeded", f"glob looked at more than {MAX_GLOB_VISITS} entries"
            )
        if self.visits % _CLOCK_EVERY == 0:
            self.ctx.live("fs.glob")

    def directory(self, fd: int, path: str, states: frozenset[int], depth: int) -> None:
        """Visit the open directory ``fd`` at ``path``, reached with ``states``."""
        if self.end in states:
            self.match(path)
        if all(s == self.end for s in states):
            return
        if depth >= MAX_GLOB_DEPTH:
            raise HostCallError(
                "limit-exceeded", f"glob went deeper than {MAX_GLOB_DEPTH} directories"
            )
        entries = []
        try:
            with os.scandir(fd) as it:
                for e in it:
                    # Counted as read, so one huge directory meets the cap and the clock too.
                    self.tick()
                    # A symlink is neither walked nor matched: no fs call would follow it.
                    if not e.is_symlink():
                        entries.append((e.name, e.is_dir(follow_symlinks=False)))
        except OSError as exc:
            _out_of_descriptors(exc)
            return  # gone or unreadable meanwhile: nothing below it matches
        base = path.rstrip("/")
        for name, is_dir in sorted(entries):
            stepped = {i + 1 for i in states if i < self.end and self._fits(i, name)}
            if not is_dir:
                # Only a last segment that is not '**' matches a file, as it always has.
                if self.end in stepped:
                    self.match(f"{base}/{name}")
                continue
            stepped |= {i for i in states if i < self.end and self.parts[i] == "**"}
            nxt = self.closure(stepped)
            if not nxt:
                continue
            try:
                child = _step(fd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
            except OSError as exc:
                _out_of_descriptors(exc)
                continue  # swapped for a file or a symlink, or gone: not walked
            try:
                self.directory(child, f"{base}/{name}", nxt, depth + 1)
            finally:
                os.close(child)

    def _fits(self, i: int, name: str) -> bool:
        part = self.parts[i]
        return part != "**" and fnmatch.fnmatchcase(name, part)


def _out_of_descriptors(exc: OSError) -> None:
    """A walk that cannot open what it found must say so, not return fewer matches.

    Raises:
        HostCallError: ``limit-exceeded`` when the process is out of file descriptors.
    """
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        raise HostCallError("limit-exceeded", "fs.glob: the host is out of file descriptors")


FUNCTIONS: Functions = {
    "read": (read, "result"),
    "write": (write, "result"),
    "list-dir": (list_dir, "result"),
    "stat": (stat, "result-tagged"),
    "mkdir": (mkdir, "result"),
    "remove": (remove, "result"),
    "glob": (glob, "result"),
}
